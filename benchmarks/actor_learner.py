"""ActorLearner against SingleDevice: what splitting the step over two device groups
costs or gains, synchronous (staleness 0) and pipelined (staleness 1).

    python benchmarks/actor_learner.py [--recipe ppo] [--repeats 3] [--num-envs N] [--total-steps N] [--json PATH]

Compiles the recipe on CartPole-v1 under the three placements (two forced CPU
devices: actor on one, learner on the other), trains with each ``--repeats``
times alternating after a warm-up run, and prints median train seconds and the
ratios to SingleDevice; ``--json benchmarks/results/policies.json`` puts the ratios into
RESULTS.md's records.
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

import jax
import results
from overhead import compare_programs

import jaxrl_frag as jf
from jaxrl_frag.sharding import ActorLearner, SingleDevice


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="ppo")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-envs", type=int, default=None)
    parser.add_argument("--total-steps", type=float, default=None)
    parser.add_argument("--json", help="put the ratios into this records file (benchmarks/results/policies.json)")
    args = parser.parse_args()
    overrides = {k: int(v) for k, v in (("num_envs", args.num_envs), ("total_steps", args.total_steps)) if v}
    algo = jf.recipes.RECIPES[args.recipe].create("CartPole-v1", **overrides)
    programs = {"single": jf.compile(algo, SingleDevice()),
                "actor-learner, staleness 0": jf.compile(algo, ActorLearner(1, 1, staleness=0)),
                "actor-learner, staleness 1": jf.compile(algo, ActorLearner(1, 1, staleness=1))}
    seconds, returns = compare_programs(programs, args.repeats)
    single = statistics.median(seconds["single"])
    print(f"{args.recipe} CartPole-v1, {algo.num_envs} envs x {algo.num_steps} steps, {algo.total_steps:,} steps, "
          f"{algo.num_iterations} iterations, {args.repeats} alternating runs")
    print({name: [round(s, 2) for s in v] for name, v in seconds.items()})
    print("| placement | median train s | / single | ms per iteration | final return |")
    print("|---|---|---|---|---|")
    for name, runs in seconds.items():
        median = statistics.median(runs)
        print(f"| {name} | {median:.2f} | {median / single:.2f} | {1e3 * median / algo.num_iterations:.2f} | "
              f"{returns[name]:.1f} |")
    if args.json:
        workload = (f"{args.recipe.upper()} CartPole-v1, {algo.num_envs} envs x {algo.num_steps} steps, "
                    f"{results.steps(algo.total_steps)} steps")
        device = f"2 forced {jax.devices()[0].device_kind} devices; jax {jax.__version__}"
        results.save(args.json, [
            results.record({"policy": f"ActorLearner(1, 1), staleness {k}", "workload": workload},
                           {"ratio": [round(statistics.median(seconds[name]) / single, 2)],
                            "train_s": statistics.median(seconds[name]), "single_train_s": single,
                            "final_return": returns[name], "single_return": returns["single"]}, device)
            for k, name in ((1, "actor-learner, staleness 1"), (0, "actor-learner, staleness 0"))])


if __name__ == "__main__":
    main()
