"""The errors a user can cause, and the command line's exit status for each."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

USAGE_ERROR = 2  # a setting that cannot work, or the parser's own errors
NON_FINITE = 3  # the run went non-finite; the last good checkpoint is kept
ENV_WORKER_FAILED = 4  # a host environment's worker process failed
WRITE_FAILED = 5  # the run directory could not be written (a full disk)
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process that Ctrl-C ended


class ConfigError(ValueError):
    """A configuration value that cannot work, raised before anything is traced.

    The message names the parameter, the value given and how to fix it.
    """

    def __init__(self, field: str, value: Any, fix: str):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}={value!r}: {fix}")


def check(condition: bool, field: str, value: Any, fix: str | Callable[[], str]) -> None:
    """Raise ``ConfigError(field, value, fix)`` unless ``condition`` holds; a callable
    ``fix`` (a message that costs work to build) is called only then."""
    if not condition:
        raise ConfigError(field, value, fix() if callable(fix) else fix)


def did_you_mean(name: str, known: Iterable[str], shown: Callable[[str], str] = str) -> str:
    """``"did you mean A, B? "``: the (at most three) entries of ``known`` spelled closest
    to ``name``, each written as ``shown`` writes it; ``""`` where none is close."""
    close = difflib.get_close_matches(name, list(known), n=3)
    return f"did you mean {', '.join(map(shown, close))}? " if close else ""


class NonFiniteError(FloatingPointError):
    """A run's state or metrics held a NaN or an infinity after ``iteration``.

    ``outputs`` are the state fields and metrics affected (``"state.params"``,
    ``"metrics.loss"``); ``fragment`` is the first fragment, in execution order, that
    produces one of them (``None`` when none does).
    """

    def __init__(self, iteration: int, outputs: list[str], fragment: str | None):
        self.iteration, self.outputs, self.fragment = iteration, outputs, fragment
        where = f"produced by fragment {fragment}" if fragment else "outside any fragment"
        super().__init__(f"non-finite values at iteration {iteration} in {', '.join(outputs)}, first {where}")
