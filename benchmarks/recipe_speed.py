"""Recipes side by side at the same environment count: training time per environment step.

    python benchmarks/recipe_speed.py [--recipes pqn,ppo] [--env Asterix-MinAtar] [--num-envs 128]
        [--total-steps 1e6] [--repeats 3]

Each recipe trains at its defaults for the environment but for ``num_envs`` (so the same
environments are stepped: what differs is how each learns from them), compiled once,
SingleDevice; after one warm-up run each, ``--repeats`` runs alternate. Prints each
recipe's median train seconds, environment steps per second, final return, and the ratio
of every recipe's time to the first one's (median of the per-round ratios).
"""

from __future__ import annotations

import argparse
import statistics

from overhead import compare_programs

import jaxrl_frag as jf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", default="pqn,ppo", help="comma-separated recipe names; ratios against the first")
    parser.add_argument("--env", default="Asterix-MinAtar")
    parser.add_argument("--num-envs", type=int, default=128)
    parser.add_argument("--total-steps", type=float, default=1e6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    names = args.recipes.split(",")
    algos = {name: jf.recipes.get(name).create(args.env, num_envs=args.num_envs, total_steps=int(args.total_steps))
             for name in names}
    programs = {name: jf.compile(algo) for name, algo in algos.items()}
    seconds, returns = compare_programs(programs, args.repeats)
    print(f"{args.env}, {args.num_envs} environments, {int(args.total_steps):,} steps, {args.repeats} alternating runs")
    print({name: [round(s, 2) for s in v] for name, v in seconds.items()})
    print("| recipe | steps per iteration | median train s | env steps/s | final return | time / " + names[0] + " |")
    print("|---|---|---|---|---|---|")
    for name, algo in algos.items():
        median = statistics.median(seconds[name])
        ratio = statistics.median(b / a for a, b in zip(seconds[names[0]], seconds[name], strict=True))
        print(f"| {name} | {algo.num_envs} x {algo.num_steps} | {median:.2f} | {algo.total_steps / median:,.0f} | "
              f"{returns[name]:.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
