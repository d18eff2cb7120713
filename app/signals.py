"""Signals: SIGINT or SIGTERM outside training ends a command with ``INTERRUPTED``; during
training, either stops the run after its current call, with a checkpoint."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from jaxrl_frag.errors import INTERRUPTED


class Interrupt:
    """SIGINT (Ctrl-C) or SIGTERM outside training ends the command with ``INTERRUPTED``. Python drops a
    ``KeyboardInterrupt`` raised inside a garbage-collector callback or a finaliser (jax
    runs some), reporting it as "unraisable" with a traceback, so the signal is also
    recorded, the report left out, and ``raise_if_received`` raises it again where the
    command is about to write."""

    received = False

    @classmethod
    @contextlib.contextmanager
    def handled(cls) -> Iterator[None]:
        """SIGINT and SIGTERM handled so for the duration (in the main thread; elsewhere as it was)."""
        cls.received = False
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {signum: signal.signal(signum, cls._handle) for signum in (signal.SIGINT, signal.SIGTERM)}
        report = sys.unraisablehook

        def unraisable(failure: Any) -> None:
            if not isinstance(failure.exc_value, KeyboardInterrupt):
                report(failure)

        sys.unraisablehook = unraisable
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            sys.unraisablehook = report

    @classmethod
    def _handle(cls, _signum: int, _frame: Any) -> None:
        cls.received = True
        raise KeyboardInterrupt

    @classmethod
    def raise_if_received(cls) -> None:
        if cls.received:
            raise KeyboardInterrupt


class StopOnSignal:
    """While active, SIGINT and SIGTERM (a preemption notice) ask the run to stop after
    its current call (calls last about ``Program.seconds_per_call``, whatever the chunk
    size), or to end once what it is writing is written, and say so; a second one ends the
    process at once with ``INTERRUPTED``, and so does the first where the call in progress
    has not ended ``GRACE`` seconds after it (a call that never returns). Either way the
    checkpoint being written is left unfinished (orbax commits a step by renaming it, so
    the newest complete one is untouched), and the line printed says how to resume."""

    GRACE = 4.0  # seconds a call may still take after the first signal

    def __init__(self, resume: str) -> None:
        self.requested = False
        self.resume = resume  # the command that continues the run
        self._previous: dict[int, Any] = {}
        self._watchdog: threading.Timer | None = None

    def __call__(self) -> bool:
        """Whether a stop was asked for; asked between calls, so the call in progress has ended."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        return self.requested

    def _exit_now(self, why: str) -> None:
        os.write(2, f"\njaxrl-frag: {why}: exiting now; the newest complete checkpoint is kept. "
                    f"Resume with: {self.resume}\n".encode())
        os._exit(INTERRUPTED)

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name  # written unbuffered: the handler may run inside a print
        if self.requested:
            self._exit_now(f"second {name}")
        self.requested = True
        os.write(2, f"\njaxrl-frag: {name} received: stopping within seconds (after the current call, with a "
                    "checkpoint, or once the file being written is whole); send it again to exit at once\n".encode())
        self._watchdog = threading.Timer(
            self.GRACE, self._exit_now, [f"still busy {self.GRACE:g} s after {name}"])
        self._watchdog.daemon = True
        self._watchdog.start()

    def __enter__(self) -> StopOnSignal:
        self.requested = Interrupt.received  # one that reached the command's set-up, where Python dropped it
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *_: Any) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
