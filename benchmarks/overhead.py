"""The framework's PPO against the hand-fused yardstick, side by side.

    python benchmarks/overhead.py --fused PATH [--repeats 3] [--configs 4:5e5,1024:5e6] [--json PATH]

The yardstick is a file of its own that a clone of this repository does not hold
(``bench/fused_ppo.py`` of the project's shared workspace): give its path with
``--fused``, or in ``$FUSED_PPO`` (which ``population.py`` reads too).

For each configuration (environments : total steps) it compiles the two
implementations ``--repeats`` times each, alternating and afresh (no persistent
cache), then trains with each compiled program ``--repeats`` times,
alternating, after one warm-up run each. It prints the median compile and train
seconds, their ratios (framework / fused, of the medians and the median of the
per-round ratios; below 1.00 the framework is faster) and both final returns
(the mean return of the last 10% of finished episodes). ``--json
benchmarks/results/overhead.json`` puts each configuration's figures into that records
file, whose table ``benchmarks/results.py`` renders into RESULTS.md.
Hyperparameters are the yardstick's: CartPole-v1, 128 steps per env per
iteration, 4 epochs of 4 minibatches, Adam 2.5e-4 annealed, clip 0.2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import jax
import numpy as np
import results

import jaxrl_frag as jf

DEFAULT_FUSED = Path(os.environ["FUSED_PPO"]) if os.environ.get("FUSED_PPO") else None  # the yardstick's path


def load_fused(path: Path | None) -> ModuleType:
    """The yardstick's module, from ``path``; exits saying what to give where there is none."""
    if path is None or not path.is_file():
        raise SystemExit(f"{'no yardstick given' if path is None else f'{path}: no such file'}: give the path of "
                         "fused_ppo.py, the hand-fused PPO yardstick (bench/fused_ppo.py of the project's shared "
                         "workspace, not part of this repository), with --fused PATH or in $FUSED_PPO")
    spec = importlib.util.spec_from_file_location("fused_ppo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_fused(fused: ModuleType, env: str, num_envs: int, total_steps: int,
                  seeds: int = 1) -> tuple[float, Callable[[], float]]:
    """Compile seconds, and a function that trains once and returns the mean return
    of the last 10% of finished episodes (of the first seed)."""
    train, _ = fused.make_train(env, num_envs, total_steps)
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    t0 = time.perf_counter()
    compiled = jax.jit(jax.vmap(train)).lower(keys).compile()
    seconds = time.perf_counter() - t0

    def run() -> float:
        _, done, returns = jax.block_until_ready(compiled(keys))
        done, returns = np.asarray(done)[0], np.asarray(returns)[0]
        tail = max(1, done.shape[0] // 10)
        return float(returns[-tail:][done[-tail:]].mean())

    return seconds, run


def compile_framework(env: str, num_envs: int, total_steps: int) -> tuple[float, Callable[[], float]]:
    """The same for the framework's PPO, compiled and run as the CLI does (50 rows of metrics)."""
    algo = jf.recipes.PPO.create(env, num_envs=num_envs, total_steps=total_steps)
    t0 = time.perf_counter()
    program = jf.compile(algo)
    seconds = time.perf_counter() - t0

    def run() -> float:
        history = program.run(jax.random.PRNGKey(0))
        jax.block_until_ready(history.state)
        last = history["iteration"] > 0.9 * algo.num_iterations
        count, returns = history["episode_count"][last], history["episode_return"][last]
        return float(np.nansum(np.nan_to_num(returns) * count) / count.sum())

    return seconds, run


def alternate(tasks: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each task, ``repeats`` times, alternating and swapping the order each round."""
    seconds: dict[str, list[float]] = {name: [] for name in tasks}
    for repeat in range(repeats):
        for name in (list(tasks) if repeat % 2 == 0 else list(reversed(tasks))):
            t0 = time.perf_counter()
            tasks[name]()
            seconds[name].append(time.perf_counter() - t0)
    return seconds


def compare_programs(programs: dict[str, jf.Program], repeats: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Train seconds of each compiled program, ``repeats`` runs alternating after one
    warm-up run each, and each one's final mean episode return (from the warm-up)."""

    def runner(program: jf.Program) -> Callable[[], float]:
        def run() -> float:
            history = program.run(jax.random.PRNGKey(0))
            jax.block_until_ready(history.state)
            return float(np.nanmean(history.final["episode_return"]))

        return run

    runs = {name: runner(program) for name, program in programs.items()}
    returns = {name: run() for name, run in runs.items()}
    return alternate(runs, repeats), returns


def main() -> None:
    jax.config.update("jax_enable_compilation_cache", False)  # compile times of fresh compiles, not cache reads
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", default="4:5e5,1024:5e6", help="comma-separated NUM_ENVS:TOTAL_STEPS")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--fused", type=Path, default=DEFAULT_FUSED,
                        help="path to fused_ppo.py, the hand-fused yardstick (default $FUSED_PPO)")
    parser.add_argument("--json", type=Path, help="put the figures into this records file "
                                                  "(benchmarks/results/overhead.json: RESULTS.md's table)")
    args = parser.parse_args()
    fused = load_fused(args.fused)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {args.repeats} alternating repeats, fresh compiles")
    summary = []
    for config in args.configs.split(","):
        num_envs, total = int(config.split(":")[0]), int(float(config.split(":")[1]))
        compile_s: dict[str, list[float]] = {"fused": [], "framework": []}
        runs: dict[str, Callable[[], float]] = {}
        for repeat in range(args.repeats):  # fresh compiles, alternating
            for impl in (["fused", "framework"] if repeat % 2 == 0 else ["framework", "fused"]):
                jax.clear_caches()
                seconds, runs[impl] = (compile_fused(fused, args.env, num_envs, total) if impl == "fused"
                                       else compile_framework(args.env, num_envs, total))
                compile_s[impl].append(seconds)
        returns = {impl: run() for impl, run in runs.items()}  # also the warm-up
        train_s = alternate(runs, args.repeats)
        for impl in runs:
            print(json.dumps({"impl": impl, "num_envs": num_envs, "total_steps": total,
                              "compile_s": [round(x, 3) for x in compile_s[impl]],
                              "train_s": [round(x, 3) for x in train_s[impl]], "final_return": round(returns[impl], 1)}),
                  flush=True)
        summary.append((num_envs, total, compile_s, train_s, returns))
    print()
    print("ratios are framework / fused: of the medians, and the median of the per-repeat ratios")
    print("| envs | steps | fused train s | framework train s | train ratio | per-repeat | fused compile s "
          "| framework compile s | compile ratio | per-repeat | fused return | framework return |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    records = []
    for num_envs, total, compile_s, train_s, returns in summary:
        cells = [str(num_envs), f"{total:.0e}"]
        values: dict[str, float] = {}
        for what, seconds in (("train", train_s), ("compile", compile_s)):
            f, w = statistics.median(seconds["fused"]), statistics.median(seconds["framework"])
            pairs = statistics.median(b / a for a, b in zip(seconds["fused"], seconds["framework"], strict=True))
            cells += [f"{f:.2f}", f"{w:.2f}", f"{w / f:.3f}", f"{pairs:.3f}"]
            values |= {f"fused_{what}_s": f, f"framework_{what}_s": w, f"{what}_ratio": w / f,
                       f"{what}_per_repeat": pairs}
        cells += [f"{returns['fused']:.1f}", f"{returns['framework']:.1f}"]
        print("| " + " | ".join(cells) + " |")
        values |= {"fused_return": returns["fused"], "framework_return": returns["framework"]}
        records.append(results.record({"env": args.env, "envs": num_envs, "steps": total}, values,
                                      f"{jax.devices()[0].device_kind}; jax {jax.__version__}"))
    if args.json:
        results.save(args.json, records)


if __name__ == "__main__":
    main()
