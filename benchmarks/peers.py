"""Running a peer library's own script beside the framework: each side a fresh process
under its own Python (the peer's pinned dependencies stay in its own environment),
alternating round by round, compared as ratios."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from collections.abc import Callable
from typing import Any


def run_python(python: str, code: str) -> dict[str, Any]:
    """Run ``code`` with the interpreter ``python``, JAX's persistent compilation cache off
    (compile times of fresh compiles, not cache reads); its last line of output, as JSON."""
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise SystemExit(f"{python} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def alternate_rounds(ours: Callable[[], dict[str, Any]], theirs: Callable[[], dict[str, Any]], rounds: int,
                     peer: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``rounds`` rounds of one run of each side, the framework first in even rounds and
    the peer first in odd ones; prints every round's compile and train seconds and final
    return, then the ratios framework / peer of both (median of the rounds; below 1 the
    framework is faster). Each side's result has ``compile_s``, ``train_s`` and
    ``final_return``."""
    done = []
    for r in range(rounds):
        first, second = (ours, theirs) if r % 2 == 0 else (theirs, ours)
        a, b = first(), second()
        pair = (a, b) if r % 2 == 0 else (b, a)
        done.append(pair)
        print(f"round {r}: framework compile {pair[0]['compile_s']:.1f} s train {pair[0]['train_s']:.1f} s "
              f"return {pair[0]['final_return']:.2f} | {peer} compile {pair[1]['compile_s']:.1f} s train "
              f"{pair[1]['train_s']:.1f} s return {pair[1]['final_return']:.2f}", flush=True)
    for what in ("train_s", "compile_s"):
        ratios = [o[what] / t[what] for o, t in done]
        print(f"{what.removesuffix('_s')} ratio framework / {peer}: median {statistics.median(ratios):.3f} "
              f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})")
    return done
