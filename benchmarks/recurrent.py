"""Recurrent against feed-forward PPO on tasks that need memory, each seed's return.

    python benchmarks/recurrent.py [--env CartPole-v1@obs=0,2] [--total-steps 5e5] [--seeds 3]
                                   [--memory gru none] [--lr 1e-3] [SETTING=VALUE ...]

PPO with 16 environments of 32 steps (minibatches: 4 sets of 4 environments' whole
sequences), every seed of one memory kind as one population. Prints, per memory
kind, the mean return per twentieth of the run and each seed's mean return over the
last tenth of the steps.
"""

from __future__ import annotations

import argparse
import ast
import time

SETTINGS = dict(num_envs=16, num_steps=32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="CartPole-v1@obs=0,2")
    parser.add_argument("--total-steps", type=float, default=5e5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--memory", nargs="+", default=["gru", "none"])
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("settings", nargs="*", metavar="SETTING=VALUE", help="more PPO settings")
    args = parser.parse_args()

    import jax
    import numpy as np

    import jaxrl_frag as jf
    from jaxrl_frag.transforms import Population

    extra = {k: ast.literal_eval(v) for k, v in (s.split("=", 1) for s in args.settings)}
    for memory in args.memory:
        algo = jf.recipes.PPO.create(args.env, memory=memory, lr=args.lr, total_steps=int(args.total_steps),
                                     **{**SETTINGS, **extra})
        start = time.perf_counter()
        program = jf.compile(Population.of([algo] * args.seeds, list(range(args.seeds))),
                             chunk_iterations=max(1, algo.num_iterations // 20))
        history = program.run(jax.random.PRNGKey(0))
        returns = np.asarray(history["episode_return"])  # [rows, seeds]
        last = np.nanmean(returns[-(len(returns) // 10 or 1):], axis=0)
        print(f"{args.env} memory={memory} lr={args.lr} {int(args.total_steps):,} steps, "
              f"{time.perf_counter() - start:.0f} s")
        print("  curve:", np.round(np.nanmean(returns, axis=1), 1).tolist())
        print("  per seed (last tenth):", np.round(last, 2).tolist(), "mean", round(float(last.mean()), 2), flush=True)


if __name__ == "__main__":
    main()
