"""Sixteen seeds of PPO as one population, against the yardstick's vmapped seeds and
against sixteen solo runs one after another.

    python benchmarks/population.py [--seeds 16] [--repeats 3]

PPO on CartPole-v1 with the yardstick's settings (4 envs, 5e5 steps per seed).
Each contender is compiled once, run once to warm up, then the three alternate
``--repeats`` times. Prints median train seconds, the ratio population /
fused (target <= 1.00) and the speedup of the population over sequential solo runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np
from overhead import DEFAULT_FUSED, alternate, compile_fused, load_fused

import jaxrl_frag as jf
from jaxrl_frag.transforms import Population

ENV, NUM_ENVS, TOTAL = "CartPole-v1", 4, 500_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    algo = jf.recipes.PPO.create(ENV, num_envs=NUM_ENVS, total_steps=TOTAL)
    t0 = time.perf_counter()
    population = jf.compile(Population.of([algo] * args.seeds, list(range(args.seeds))))
    compile_pop = time.perf_counter() - t0
    solo = jf.compile(algo)
    compile_fused_s, fused_run = compile_fused(load_fused(DEFAULT_FUSED), ENV, NUM_ENVS, TOTAL, seeds=args.seeds)

    def run_population() -> float:
        history = population.run(jax.random.PRNGKey(0))
        jax.block_until_ready(history.state)
        return float(np.nanmean(history.final["episode_return"]))

    def run_solo_sequentially() -> float:
        finals = []
        for seed in range(args.seeds):
            history = solo.run(jax.random.PRNGKey(seed))
            finals.append(history.final["episode_return"])
        jax.block_until_ready(history.state)
        return float(np.nanmean(finals))

    runs = {"population": run_population, "fused --seeds": fused_run, "sequential solo": run_solo_sequentially}
    returns = {name: run() for name, run in runs.items()}
    seconds = alternate(runs, args.repeats)
    med = {name: statistics.median(s) for name, s in seconds.items()}
    print(f"{args.seeds} seeds of PPO {ENV}, {NUM_ENVS} envs, {TOTAL:,} steps each; {args.repeats} alternating rounds")
    print({name: [round(s, 2) for s in v] for name, v in seconds.items()})
    print(f"compile s: population {compile_pop:.2f}, fused {compile_fused_s:.2f}")
    print("| contender | median train s | mean final return |")
    print("|---|---|---|")
    for name in runs:
        print(f"| {name} | {med[name]:.2f} | {returns[name]:.1f} |")
    print(f"population / fused: {med['population'] / med['fused --seeds']:.3f}; "
          f"speedup over sequential solo runs: {med['sequential solo'] / med['population']:.2f}x")


if __name__ == "__main__":
    main()
