"""DataParallel on one device against SingleDevice: the cost of the rewrite itself.

    python benchmarks/policies.py [--repeats 5] [--num-envs 64] [--total-steps 1e6] [--json PATH]

Compiles PPO on CartPole-v1 under both policies, then trains with each
``--repeats`` times, alternating (after one warm-up run each), and prints the
median train seconds and their ratio (DataParallel / SingleDevice); ``--json
benchmarks/results/policies.json`` puts them into RESULTS.md's records.
"""

from __future__ import annotations

import argparse
import statistics

import jax
import results
from overhead import compare_programs

import jaxrl_frag as jf
from jaxrl_frag.sharding import DataParallel, SingleDevice


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--total-steps", type=float, default=1e6)
    parser.add_argument("--json", help="put the figures into this records file (benchmarks/results/policies.json)")
    args = parser.parse_args()
    algo = jf.recipes.PPO.create("CartPole-v1", num_envs=args.num_envs, total_steps=int(args.total_steps))
    programs = {"single": jf.compile(algo, SingleDevice()), "data-parallel(1)": jf.compile(algo, DataParallel(1))}
    seconds, returns = compare_programs(programs, args.repeats)
    single, dp = statistics.median(seconds["single"]), statistics.median(seconds["data-parallel(1)"])
    pairs = statistics.median(b / a for a, b in zip(seconds["single"], seconds["data-parallel(1)"], strict=True))
    print(f"PPO CartPole-v1, {args.num_envs} envs, {int(args.total_steps):,} steps, {args.repeats} alternating runs")
    print({name: [round(s, 3) for s in v] for name, v in seconds.items()})
    print("| policy | median train s | final return |")
    print("|---|---|---|")
    for name, med in (("SingleDevice", single), ("DataParallel(1)", dp)):
        key = "single" if name == "SingleDevice" else "data-parallel(1)"
        print(f"| {name} | {med:.2f} | {returns[key]:.1f} |")
    print(f"ratio DataParallel(1) / SingleDevice: {dp / single:.3f} (median of per-round ratios {pairs:.3f})")
    if args.json:
        workload = f"PPO CartPole-v1, {algo.num_envs} envs x {algo.num_steps} steps, {results.steps(args.total_steps)} steps"
        results.save(args.json, [results.record(
            {"policy": "DataParallel(1)", "workload": workload},
            {"ratio": [round(dp / single, 3)], "per_round": pairs, "train_s": dp, "single_train_s": single,
             "final_return": returns["data-parallel(1)"], "single_return": returns["single"]},
            f"{jax.devices()[0].device_kind}; jax {jax.__version__}")])


if __name__ == "__main__":
    main()
