"""Every recipe at its defaults: training speed and final return, next to a published figure.

    python benchmarks/recipes.py [--seeds 3] [--recipes ppo,a2c,impala,dqn,sac]

Each recipe trains on its benchmark environment at its defaults, one seed after
another (one compilation per recipe, SingleDevice). Printed per recipe: compile
seconds, environment steps per second of training (after compilation), and the
final return (the mean of the last five rows that saw an episode end) per seed.
The reference column is rl-baselines3-zoo's benchmark.md (one trained agent,
evaluated deterministically over about 150k steps, at its own step budget).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import jaxrl_frag as jf

# recipe -> (environment, rl-baselines3-zoo benchmark.md: "mean +- std at steps")
BENCHMARKS = {
    "ppo": ("CartPole-v1", "500.0 +- 0.0 at 100k"),
    "a2c": ("CartPole-v1", "500.0 +- 0.0 at 500k"),
    "impala": ("CartPole-v1", "(not in the zoo)"),
    "dqn": ("CartPole-v1", "500.0 +- 0.0 at 50k"),
    "sac": ("Pendulum-v1", "-157.0 +- 88.7 at 20k"),
}


def final_return(history: jf.History, rows: int = 5) -> float:
    returns = history["episode_return"]
    return float(np.mean(returns[np.isfinite(returns)][-rows:]))


def main() -> None:
    jax.config.update("jax_enable_compilation_cache", False)  # compile times of fresh compiles, not cache reads
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--recipes", default=",".join(BENCHMARKS))
    args = parser.parse_args()
    print("| recipe | environment | steps | compile s | steps/s (median) | final return per seed | mean | reference |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.recipes.split(","):
        env, reference = BENCHMARKS[name]
        algorithm = jf.recipes.RECIPES[name].create(env)
        start = time.perf_counter()
        program = jf.compile(algorithm)
        compile_s = time.perf_counter() - start
        speeds, returns = [], []
        for seed in range(args.seeds):
            start = time.perf_counter()
            history = program.run(jax.random.PRNGKey(seed))
            speeds.append(history.final["env_steps"] / (time.perf_counter() - start))
            returns.append(final_return(history))
        steps = algorithm.num_iterations * algorithm.steps_per_iteration
        print(f"| {name} | {env} | {steps:,} | {compile_s:.1f} | {np.median(speeds):,.0f} | "
              f"{', '.join(f'{r:.1f}' for r in returns)} | {np.mean(returns):.1f} | {reference} |", flush=True)


if __name__ == "__main__":
    main()
