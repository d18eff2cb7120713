"""One MDP, two implementations: PPO on Gymnasium's CartPole-v1 (a host environment,
stepped in worker processes) against gymnax's CartPole-v1 (traced into the program),
at identical settings over many seeds, with a test of whether they differ.

    python benchmarks/cartpole_host_vs_gymnax.py [--seeds 10] [--steps 5e5] [--num-envs 8] [--num-steps 128]

gymnax's seeds run as one population; the host environment's one after another (host
environments run one program at a time). Per seed it records the last row's return
(what ``tests/test_host_envs.py`` asserts on) and the mean return over the last 10% of
the environment steps, and for each measure reports both samples' means with 95%
bootstrap intervals, the Mann-Whitney U test (two-sided; no assumption of normality:
CartPole returns pile up at the 500 ceiling) and Welch's t-test on the location, and
the Ansari-Bradley and Brown-Forsythe tests on the spread.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np
from scipy import stats

import jaxrl_frag as jf
from jaxrl_frag.app.summary import bootstrap_ci
from jaxrl_frag.recipes import PPO
from jaxrl_frag.transforms import Population

sys.path.insert(0, str(Path(__file__).parent))
from parity import final_returns  # the parity table's final return


def measures(history: jf.History) -> tuple[np.ndarray, np.ndarray]:
    """Per seed: the last row's return, and the mean over the last 10% of the steps."""
    return np.atleast_1d(np.asarray(history.last("episode_return"), np.float64)), np.array(final_returns(history))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--steps", type=float, default=5e5)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    args = parser.parse_args()
    settings = dict(num_envs=args.num_envs, num_steps=args.num_steps, total_steps=int(args.steps))
    seeds = list(range(args.seeds))

    start = time.perf_counter()
    gymnax = jf.compile(Population.of([PPO.create("CartPole-v1", **settings)] * args.seeds, seeds)).run(
        jax.random.PRNGKey(0))
    print(f"gymnax: {args.seeds} seeds as one population in {time.perf_counter() - start:.0f} s", flush=True)
    results = {"gymnax": measures(gymnax)}

    host = jf.compile(PPO.create("gymnasium:CartPole-v1", **settings))
    last, tails = [], []
    for seed in seeds:
        start = time.perf_counter()
        history = host.run(jax.random.PRNGKey(seed))
        (one_last,), (one_tail,) = measures(history)
        last.append(one_last)
        tails.append(one_tail)
        print(f"gymnasium: seed {seed}: last row {one_last:.1f}, last 10% {one_tail:.1f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    results["gymnasium"] = (np.array(last), np.array(tails))

    print(f"\nPPO, {args.num_envs} envs x {args.num_steps} steps, {int(args.steps):,} steps, seeds 0-{args.seeds - 1}\n")
    print("| measure | env | per seed | mean [95% CI] |")
    print("|---|---|---|---|")
    for index, measure in enumerate(("last row's return", "mean return, last 10% of steps")):
        for name, values in results.items():
            low, high = bootstrap_ci(values[index])
            per_seed = ", ".join(f"{v:.0f}" for v in values[index])
            print(f"| {measure} | {name} | {per_seed} | {np.mean(values[index]):.1f} [{low:.1f}, {high:.1f}] |")
    print()
    for index, measure in enumerate(("last row's return", "mean return, last 10% of steps")):
        a, b = results["gymnax"][index], results["gymnasium"][index]
        u = stats.mannwhitneyu(a, b, alternative="two-sided")
        t = stats.ttest_ind(a, b, equal_var=False)
        spread = stats.ansari(a, b)
        print(f"{measure}: Mann-Whitney U = {u.statistic:.1f}, p = {u.pvalue:.3f}; "
              f"Welch t = {t.statistic:.2f}, p = {t.pvalue:.3f}; spread: Ansari-Bradley p = {spread.pvalue:.3f}, "
              f"Brown-Forsythe p = {stats.levene(a, b).pvalue:.3f}")


if __name__ == "__main__":
    main()
