"""Progress display for a training run: a live bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO

from tqdm import tqdm


def _eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Shows env steps, steps/s, the recent mean return and the ETA, chunk by chunk.

    On a terminal it is a ``tqdm`` bar; elsewhere (a log file, CI) one line every
    ``every_seconds`` and at the end.
    """

    def __init__(self, total_steps: int, stream: TextIO | None = None, every_seconds: float = 5.0, initial: int = 0):
        self.total = total_steps
        self.stream = stream or sys.stdout
        self.every = every_seconds
        self.start = self.last_print = time.perf_counter()
        self.recent_return = float("nan")
        tty = self.stream.isatty()
        self.bar = tqdm(total=total_steps, initial=initial, unit="step", unit_scale=True, dynamic_ncols=True) if tty else None
        self.steps = self.first = initial

    def update(self, row: dict[str, float]) -> None:
        ret = row.get("episode_return", float("nan"))
        if math.isfinite(ret):
            self.recent_return = ret
        steps = int(row["env_steps"])
        if self.bar is not None:
            self.bar.update(steps - self.steps)
            self.bar.set_postfix(sps=f"{row['sps']:,.0f}", ret=f"{self.recent_return:.1f}", refresh=False)
        self.steps = steps
        now = time.perf_counter()
        if self.bar is None and (now - self.last_print >= self.every or steps >= self.total):
            elapsed = now - self.start
            eta = (self.total - steps) * elapsed / (steps - self.first) if steps > self.first else float("inf")
            print(
                f"[{100 * steps / self.total:5.1f}%] {steps:>12,} steps  {row['sps']:>10,.0f} steps/s  "
                f"return {self.recent_return:8.2f}  elapsed {_eta(elapsed)}  eta {_eta(eta)}",
                file=self.stream, flush=True,
            )
            self.last_print = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
