"""What the per-iteration non-finite check costs: the framework's PPO compiled with
``check_finite=True`` (the default) against ``False``, side by side.

    python benchmarks/finite_check.py [--num-envs 1024] [--total-steps 5e6] [--repeats 3]

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
    args = parser.parse_args()
    algo = jf.recipes.PPO.create("CartPole-v1", num_envs=args.num_envs, total_steps=int(args.total_steps))
    programs = {name: jf.compile(algo, check_finite=name == "checked") for name in ("checked", "unchecked")}
    seconds, _ = compare_programs(programs, args.repeats)
    med = {name: statistics.median(s) for name, s in seconds.items()}
    print({name: [round(x, 2) for x in s] for name, s in seconds.items()})
    print(f"{args.num_envs} envs, {int(args.total_steps):,} steps: checked {med['checked']:.2f} s, "
          f"unchecked {med['unchecked']:.2f} s, ratio {med['checked'] / med['unchecked']:.3f}")


if __name__ == "__main__":
    main()
