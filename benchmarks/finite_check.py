"""What the per-iteration non-finite check costs: a recipe (PPO by default) compiled with
``check_finite=True`` (the default) against ``False``, side by side.

    python benchmarks/finite_check.py [--num-envs 1024] [--total-steps 5e6] [--repeats 3]
    python benchmarks/finite_check.py --recipe dqn --env Breakout-MinAtar --num-envs 8 --total-steps 1e5 \
        --set buffer_size=100000 --set learning_starts=5000    # a replay buffer in the state

Both programs are compiled once, run once to warm up, then alternate ``--repeats``
times. Prints median train seconds and the ratio checked / unchecked.
"""

from __future__ import annotations

import argparse
import statistics

from overhead import compare_programs

import jaxrl_frag as jf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--total-steps", type=float, default=5e6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recipe", default="ppo", choices=sorted(jf.recipes.RECIPES))
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="another setting of the recipe (a number), repeatable")
    args = parser.parse_args()
    settings = {name: float(value) if "." in value or "e" in value else int(value)
                for name, value in (item.split("=", 1) for item in args.set)}
    algo = jf.recipes.RECIPES[args.recipe].create(args.env, num_envs=args.num_envs, total_steps=int(args.total_steps),
                                                  **settings)
    programs = {name: jf.compile(algo, check_finite=name == "checked") for name in ("checked", "unchecked")}
    seconds, _ = compare_programs(programs, args.repeats)
    med = {name: statistics.median(s) for name, s in seconds.items()}
    print({name: [round(x, 2) for x in s] for name, s in seconds.items()})
    print(f"{args.recipe} on {args.env}, {args.num_envs} envs, {int(args.total_steps):,} steps: checked {med['checked']:.2f} s, "
          f"unchecked {med['unchecked']:.2f} s, ratio {med['checked'] / med['unchecked']:.3f}")


if __name__ == "__main__":
    main()
