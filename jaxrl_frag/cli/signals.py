"""Signals: SIGINT outside training ends a command with ``INTERRUPTED``; during training,
SIGINT and SIGTERM stop the run after its current call, with a checkpoint."""

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
    """SIGINT outside training ends the command with ``INTERRUPTED``. Python drops a
    ``KeyboardInterrupt`` raised inside a garbage-collector callback or a finaliser (jax
    runs some), reporting it as "unraisable" with a traceback, so the signal is also
    recorded, the report left out, and ``raise_if_received`` raises it again where the
    command is about to write."""

    received = False

    @classmethod
    @contextlib.contextmanager
    def handled(cls) -> Iterator[None]:
        """SIGINT handled so for the duration (in the main thread; elsewhere as it was)."""
        cls.received = False
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous, report = signal.signal(signal.SIGINT, cls._handle), sys.unraisablehook

        def unraisable(failure: Any) -> None:
            if not isinstance(failure.exc_value, KeyboardInterrupt):
                report(failure)

        sys.unraisablehook = unraisable
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
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
    size); a second one ends the process at once with ``INTERRUPTED``, the checkpoint
    being written then left unfinished (orbax commits a step by renaming it, so the
    newest complete one is untouched)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __call__(self) -> bool:
        return self.requested

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name  # written unbuffered: the handler may run inside a print
        if self.requested:
            os.write(2, f"\njaxrl-frag: second {name}: exiting now; the newest complete checkpoint is kept\n".encode())
            os._exit(INTERRUPTED)
        self.requested = True
        os.write(2, f"\njaxrl-frag: {name} received: stopping after the current call (a few seconds) and saving a "
                    "checkpoint; send it again to exit at once\n".encode())

    def __enter__(self) -> StopOnSignal:
        self.requested = Interrupt.received  # one that reached the command's set-up, where Python dropped it
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *_: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

