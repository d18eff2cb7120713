"""The framework's PPO against the hand-fused yardstick, side by side.

    python benchmarks/overhead.py [--repeats 3] [--configs 4:5e5,1024:5e6] [--fused PATH]

For each configuration (environments : total steps) it alternates the two
implementations ``--repeats`` times each in this one process, compiling afresh
every time (no persistent cache), and prints the median compile and train
seconds, their ratios (framework / fused; below 1.00 the framework is faster)
and both final returns (the mean return of the last 10% of finished episodes).
Hyperparameters are the yardstick's: CartPole-v1, 128 steps per env per
iteration, 4 epochs of 4 minibatches, Adam 2.5e-4 annealed, clip 0.2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path
from types import ModuleType

import jax
import numpy as np

import jaxrl_frag as jf

DEFAULT_FUSED = Path(__file__).resolve().parents[2] / "shared" / "bench" / "fused_ppo.py"


def load_fused(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("fused_ppo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_fused(fused: ModuleType, env: str, num_envs: int, total_steps: int) -> dict[str, float]:
    train, _ = fused.make_train(env, num_envs, total_steps)
    keys = jax.random.split(jax.random.PRNGKey(0), 1)
    t0 = time.perf_counter()
    compiled = jax.jit(jax.vmap(train)).lower(keys).compile()
    t1 = time.perf_counter()
    _, done, returns = jax.block_until_ready(compiled(keys))
    t2 = time.perf_counter()
    done, returns = np.asarray(done)[0], np.asarray(returns)[0]
    tail = max(1, done.shape[0] // 10)
    return {"compile_s": t1 - t0, "train_s": t2 - t1, "final_return": float(returns[-tail:][done[-tail:]].mean())}


def time_framework(env: str, num_envs: int, total_steps: int) -> dict[str, float]:
    algo = jf.recipes.PPO.create(env, num_envs=num_envs, total_steps=total_steps)
    t0 = time.perf_counter()
    program = jf.compile(algo)  # as the CLI runs it: 50 rows of metrics, a call every ~2 s
    t1 = time.perf_counter()
    history = program.run(jax.random.PRNGKey(0))
    jax.block_until_ready(history.state)
    t2 = time.perf_counter()
    last = history["iteration"] > 0.9 * algo.num_iterations
    count, total = history["episode_count"][last], history["episode_return"][last]
    final = float(np.nansum(np.nan_to_num(total) * count) / count.sum())
    return {"compile_s": t1 - t0, "train_s": t2 - t1, "final_return": final}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", default="4:5e5,1024:5e6", help="comma-separated NUM_ENVS:TOTAL_STEPS")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--fused", type=Path, default=DEFAULT_FUSED, help="path to fused_ppo.py")
    args = parser.parse_args()
    fused = load_fused(args.fused)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {args.repeats} alternating repeats, fresh compiles")
    summary = []
    for config in args.configs.split(","):
        num_envs, total = int(config.split(":")[0]), int(float(config.split(":")[1]))
        results: dict[str, list[dict[str, float]]] = {"fused": [], "framework": []}
        for repeat in range(args.repeats):
            order = ["fused", "framework"] if repeat % 2 == 0 else ["framework", "fused"]
            for impl in order:
                jax.clear_caches()
                r = time_fused(fused, args.env, num_envs, total) if impl == "fused" else time_framework(args.env, num_envs, total)
                results[impl].append(r)
                print(json.dumps({"impl": impl, "num_envs": num_envs, "total_steps": total, "repeat": repeat,
                                  **{k: round(v, 3) for k, v in r.items()}}), flush=True)
        med = {impl: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for impl, rs in results.items()}
        summary.append((num_envs, total, med))
    print()
    print("| envs | steps | fused train s | framework train s | train ratio | fused compile s | framework compile s "
          "| compile ratio | fused return | framework return |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for num_envs, total, med in summary:
        f, w = med["fused"], med["framework"]
        print(f"| {num_envs} | {total:.0e} | {f['train_s']:.2f} | {w['train_s']:.2f} | {w['train_s'] / f['train_s']:.3f} "
              f"| {f['compile_s']:.2f} | {w['compile_s']:.2f} | {w['compile_s'] / f['compile_s']:.3f} "
              f"| {f['final_return']:.1f} | {w['final_return']:.1f} |")


if __name__ == "__main__":
    main()
