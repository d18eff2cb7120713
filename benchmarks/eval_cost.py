"""What evaluation during training costs: PPO trained without evaluation and with
``Evaluated`` (greedy episodes every K iterations, inside the compiled program), side by side.

    python benchmarks/eval_cost.py [--repeats 5] [--total-steps 5e5] [--settings 10:10,1:10,100000:10]

Each setting is EVERY:EPISODES. Every program is compiled once and run once to warm up
(its final training and evaluation returns come from that run), then the programs
alternate ``--repeats`` times, the order reversed every round. Prints the median train
seconds of each and its ratio to the run without evaluation: of the medians, and the
median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import jax
import numpy as np
from overhead import alternate

import jaxrl_frag as jf
from jaxrl_frag.transforms.evaluated import Evaluated

NONE = "none"


def runner(program: jf.Program) -> Callable[[], jf.History]:
    def run() -> jf.History:
        history = program.run(jax.random.PRNGKey(0))
        jax.block_until_ready(history.state)
        return history

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--total-steps", type=float, default=5e5)
    parser.add_argument("--settings", default="10:10,1:10,100000:10",
                        help="comma-separated EVERY:EPISODES (100000: never due, the predicate alone)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    recipe = jf.recipes.PPO.create(args.env, total_steps=int(args.total_steps))
    algorithms = {NONE: recipe}
    for setting in args.settings.split(","):
        every, episodes = (int(x) for x in setting.split(":"))
        algorithms[f"every {every}, {episodes} episodes"] = Evaluated.create(recipe, every, episodes)
    runs = {name: runner(jf.compile(algo)) for name, algo in algorithms.items()}
    warm = {name: run() for name, run in runs.items()}
    seconds = alternate(runs, args.repeats)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, PPO {args.env}, {recipe.num_iterations} iterations "
          f"({int(args.total_steps):,} steps), {args.repeats} alternating repeats")
    print({name: [round(x, 2) for x in s] for name, s in seconds.items()})
    print("| evaluation | train s (median) | ratio of medians | median per-round ratio | final training return "
          "| last evaluation return |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(seconds[NONE])
    for name, s in seconds.items():
        pairs = statistics.median(a / b for a, b in zip(s, seconds[NONE], strict=True))
        final = warm[name].final
        evaluation = f"{warm[name].last('eval_return'):.1f}" if np.isfinite(final.get("eval_return", np.nan)) else "-"
        print(f"| {name} | {statistics.median(s):.2f} | {statistics.median(s) / base:.3f} | {pairs:.3f} "
              f"| {float(np.nanmean(final['episode_return'])):.1f} | {evaluation} |")


if __name__ == "__main__":
    main()
