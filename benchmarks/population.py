"""Sixteen seeds of PPO as one population, against the yardstick's vmapped seeds and
against sixteen solo runs one after another.

    python benchmarks/population.py [--seeds 16] [--repeats 3] [--total-steps 5e5] [--json PATH]

PPO on CartPole-v1 with the yardstick's settings (4 envs, 5e5 steps per seed). Each
measurement is a fresh process that compiles its contender and times one training
run (as ``fused_ppo.py`` does); the three contenders alternate, the order swapped
every round. One program per process also keeps clear of an XLA CPU runtime hang
seen when several large vmapped executables take turns in one process. Prints
median train seconds, the ratio population / fused (target <= 1.00) and the speedup
of the population over the sequential solo runs; ``--json benchmarks/results/population.json``
puts them into RESULTS.md's records.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

ENV, NUM_ENVS = "CartPole-v1", 4
CONTENDERS = ("population", "fused --seeds", "sequential solo")


def measure(contender: str, seeds: int, total: int) -> dict[str, Any]:
    """Compile ``contender`` and time one training run of it, in this process."""
    import jax
    import numpy as np
    from overhead import DEFAULT_FUSED, compile_fused, load_fused

    import jaxrl_frag as jf
    from jaxrl_frag.transforms import Population

    jax.config.update("jax_enable_compilation_cache", False)  # compile times of fresh compiles, not cache reads
    algo = jf.recipes.PPO.create(ENV, num_envs=NUM_ENVS, total_steps=total)
    t0 = time.perf_counter()
    if contender == "fused --seeds":
        _, run = compile_fused(load_fused(DEFAULT_FUSED), ENV, NUM_ENVS, total, seeds=seeds)
    else:
        program = jf.compile(Population.of([algo] * seeds, list(range(seeds))) if contender == "population" else algo)

        def run() -> float:
            starts = [0] if contender == "population" else range(seeds)
            finals = []
            for seed in starts:
                history = program.run(jax.random.PRNGKey(seed))
                finals.append(np.nanmean(history.final["episode_return"]))
            jax.block_until_ready(history.state)
            return float(np.mean(finals))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    final = run()
    return {"compile_s": compile_s, "train_s": time.perf_counter() - t0, "return": final,
            "device": f"{jax.devices()[0].device_kind}; jax {jax.__version__}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--total-steps", type=float, default=5e5, help="environment steps per seed")
    parser.add_argument("--json", help="put the figures into this records file (benchmarks/results/population.json)")
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)  # one measurement, in a child
    args = parser.parse_args()
    total = int(args.total_steps)
    if args.contender:
        print(json.dumps(measure(args.contender, args.seeds, total)))
        return
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    for repeat in range(args.repeats):
        for name in (CONTENDERS if repeat % 2 == 0 else tuple(reversed(CONTENDERS))):
            child = subprocess.run([sys.executable, __file__, "--contender", name, "--seeds", str(args.seeds),
                                    "--total-steps", str(total)], capture_output=True, text=True, check=True)
            results[name].append(json.loads(child.stdout.strip().splitlines()[-1]))
            print(name, results[name][-1], flush=True)
    med = {name: statistics.median(r["train_s"] for r in rs) for name, rs in results.items()}
    print(f"\n{args.seeds} seeds of PPO {ENV}, {NUM_ENVS} envs, {total:,} steps each; {args.repeats} alternating rounds")
    print("| contender | train s (each round) | median train s | median compile s | mean final return |")
    print("|---|---|---|---|---|")
    for name, rs in results.items():
        rounds = ", ".join(f"{r['train_s']:.1f}" for r in rs)
        print(f"| {name} | {rounds} | {med[name]:.2f} | "
              f"{statistics.median(r['compile_s'] for r in rs):.2f} | {statistics.mean(r['return'] for r in rs):.1f} |")
    pairs = statistics.median(p["train_s"] / f["train_s"] for p, f in zip(results["population"], results["fused --seeds"],
                                                                          strict=True))
    print(f"population / fused: {med['population'] / med['fused --seeds']:.3f} (median of per-round ratios {pairs:.3f}); "
          f"speedup over sequential solo runs: {med['sequential solo'] / med['population']:.2f}x")
    if args.json:
        import results as tables

        ratios = {"vs_fused": med["population"] / med["fused --seeds"], "vs_fused_per_round": pairs,
                  "sequential_over_population": med["sequential solo"] / med["population"]}
        tables.save(args.json, [tables.record(
            {"contender": name}, {"train_s": [r["train_s"] for r in rs], "median_train_s": med[name],
                                  "median_compile_s": statistics.median(r["compile_s"] for r in rs),
                                  "final_return": statistics.mean(r["return"] for r in rs),
                                  **(ratios if name == "population" else {})},
            f"{rs[0]['device']}; one process a measurement") for name, rs in results.items()])


if __name__ == "__main__":
    main()
