"""Adaptive actor boosting against fixed actor counts: PPO under one environment-step
budget, five strategies, seeds as populations.

    python benchmarks/boost.py --env CartPole-v1 [--seeds 5] [--budget 5e5] [--ladder 8,16,32,64]
        [--minibatches batch|size|count] [--out DIR]

Strategies: ``fixed-small`` and ``fixed-large`` (plain PPO at the ladder's bottom and
top environment counts, for the whole budget, at the recipe's settings), ``nitro``,
``gns`` and ``random`` (``jaxrl_frag.transforms.boost``), whose rungs keep what
``--minibatches`` says: the bottom rung's batch (``batch``, the default), its minibatch
size (``size``) or the recipe's minibatch count (``count``). Also on request (not among
the defaults): ``fixed-top``, plain PPO at the boosted top rung's settings (its
environments, steps and minibatches under ``--minibatches``), that rung run alone.
Every strategy's seeds run as one population. The rounds' device-seconds come from
``boost.calibrate`` on this machine (each rung's actor, learner and probe fragments
timed alone): one table for the boosted strategies, ``fixed-small`` (their bottom
rung) and ``fixed-top``, and unless their rungs keep the minibatch count another at the
recipe's settings for ``fixed-large``.

Reported per strategy: the final return (each seed's mean episode return over its
last 10% of the budget; mean over seeds with a 95% bootstrap interval), environment
steps and device-seconds spent (means over seeds), and the environment steps at which
the seeds' mean return curve (a moving average) first reaches fixed-large's final
return, as a fraction of fixed-large's steps (Nitro's claim: at most 0.6). Writes
``boost-ENV.json`` and ``boost-ENV.png`` (return against environment steps for each
strategy, the actor count underneath) to ``--out``, and prints a Markdown table and
each seed's final return.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from matplotlib.figure import Figure

import jaxrl_frag as jf
from jaxrl_frag.app.summary import bootstrap_ci
from jaxrl_frag.recipes import PPO
from jaxrl_frag.transforms import Population, boost

STRATEGIES = ("fixed-small", "fixed-large", "nitro", "gns", "random")
EXTRA = ("fixed-top",)
KEPT = {"batch": "the bottom rung's batch", "size": "the minibatch size", "count": "the minibatch count"}
GRID = 200  # points of the common environment-step axis the seeds' curves are read on


def table_of(strategy: str, minibatches: str) -> str:
    """Which calibration a strategy's rounds are priced by: the boosted rungs' (keeping
    ``minibatches``; ``fixed-small`` is their bottom rung run alone), or for plain PPO
    at the top count and the recipe's settings that of rungs keeping the ``count``."""
    return "count" if strategy == "fixed-large" else minibatches


def run_strategy(strategy: str, env: str, ladder: tuple[int, ...], budget: int, seeds: int,
                 tables: dict[str, np.ndarray], overrides: dict[str, Any], minibatches: str = "size") -> dict[str, Any]:
    """One strategy's population: per seed, its curve (env steps, return, actors), and
    the compile and run wall times."""
    seconds = tables[table_of(strategy, minibatches)]
    top = PPO.create(env, **overrides, num_envs=ladder[-1], total_steps=budget)
    if strategy.startswith("fixed"):
        count = ladder[0] if strategy == "fixed-small" else ladder[-1]
        settings = {**overrides, "num_envs": count, "total_steps": budget}
        if strategy == "fixed-top":
            boosted = boost.Boosted.create(top, ladder=ladder, budget_steps=budget, minibatches=minibatches)
            settings |= {"num_steps": boosted.rung_steps[-1], "num_minibatches": boosted.rung_minibatches[-1]}
        algo = PPO.create(env, **settings)
        round_seconds = seconds[ladder.index(count), :2].sum()
    else:
        table = seconds if strategy in boost.PROBING else seconds * np.array([1, 1, 0])
        algo = boost.Boosted.create(top, round_seconds=table, strategy=strategy, ladder=ladder, budget_steps=budget,
                                    minibatches=minibatches)
    t0 = time.perf_counter()
    program = jf.compile(Population.of([algo] * seeds, list(range(seeds))), chunk_iterations=1)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    history = program.run(jax.random.PRNGKey(0))
    run_s = time.perf_counter() - t0
    returns = history["episode_return"]  # [rounds, seeds]
    if strategy.startswith("fixed"):
        steps = np.repeat(history["env_steps"][:, None], seeds, axis=1)
        actors = np.full_like(steps, count)
        device_seconds = np.arange(1, len(steps) + 1)[:, None] * round_seconds * np.ones(seeds)
    else:
        steps, actors, device_seconds = history["env_steps"], history["actors"], history["device_seconds_total"]
    return {"steps": steps, "returns": returns, "actors": actors, "device_seconds": device_seconds,
            "compile_s": compile_s, "run_s": run_s, "rounds": len(steps)}


def ran(steps: np.ndarray) -> np.ndarray:
    """Per round and seed, whether the seed played the round (a finished seed idles
    until the population finishes)."""
    return np.diff(steps, axis=0, prepend=0) > 0


def on_grid(steps: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Each seed's ``values`` (rows of rounds, NaN where no episode ended) read at the
    environment steps ``grid``: the last value at or before each point."""
    out = np.full((len(grid), steps.shape[1]), np.nan)
    for seed in range(steps.shape[1]):
        ok = ~np.isnan(values[:, seed]) & ran(steps)[:, seed]
        if ok.any():
            at = np.searchsorted(steps[ok, seed], grid, side="right") - 1
            out[:, seed] = np.where(at >= 0, values[ok, seed][np.maximum(at, 0)], np.nan)
    return out


def summarize(result: dict[str, Any], budget: int) -> dict[str, Any]:
    """Final return (last 10% of the budget, per seed), steps and device-seconds spent."""
    steps, returns = result["steps"], result["returns"]
    finals = []
    for seed in range(steps.shape[1]):
        played = ran(steps)[:, seed]
        late = played & (steps[:, seed] > 0.9 * steps[played, seed].max()) & ~np.isnan(returns[:, seed])
        finals.append(float(returns[late, seed].mean()))
    finals = np.array(finals)
    low, high = bootstrap_ci(finals)
    return {"final_mean": float(finals.mean()), "ci_low": float(low), "ci_high": float(high),
            "finals": finals.tolist(), "env_steps": float(steps[-1].mean()),
            "device_seconds": float(result["device_seconds"][-1].mean()), "rounds": result["rounds"],
            "mean_actors": float(np.nanmean(np.where(ran(steps), result["actors"], np.nan))),
            "compile_s": result["compile_s"], "run_s": result["run_s"]}


def steps_to_reach(result: dict[str, Any], target: float, grid: np.ndarray, smooth: int) -> float:
    """The first environment step at which the seeds' mean return (moving average over
    ``smooth`` grid points) reaches ``target``; NaN if it never does."""
    mean = np.nanmean(on_grid(result["steps"], result["returns"], grid), axis=1)
    averaged = np.convolve(np.nan_to_num(mean, nan=-np.inf), np.ones(smooth) / smooth, mode="full")[: len(grid)]
    reached = np.flatnonzero(averaged >= target)
    return float(grid[reached[0]]) if reached.size else float("nan")


def plot(results: dict[str, dict[str, Any]], grid: np.ndarray, env: str) -> Figure:
    fig = Figure(figsize=(9, 7))
    ret_ax, act_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    for name, result in results.items():
        values = on_grid(result["steps"], result["returns"], grid)
        mean = np.nanmean(values, axis=1)
        line = ret_ax.plot(grid, mean, lw=1.6, label=name)[0]
        filled = np.where(np.isnan(values), np.nanmean(values, axis=1, keepdims=True), values)
        ok = ~np.isnan(filled).any(axis=1)
        low, high = bootstrap_ci(filled[ok], axis=1)
        ret_ax.fill_between(grid[ok], low, high, color=line.get_color(), alpha=0.15, lw=0)
        actors = np.nanmean(on_grid(result["steps"], result["actors"].astype(float), grid), axis=1)
        act_ax.step(grid, actors, where="post", color=line.get_color(), lw=1.2)
    ret_ax.set(ylabel="mean episode return", title=f"PPO on {env}: boosting strategies (shaded: 95% bootstrap CI)")
    act_ax.set(xlabel="environment steps", ylabel="actors (mean over seeds)")
    for ax in (ret_ax, act_ax):
        ax.grid(alpha=0.3)
    ret_ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main() -> None:
    jax.config.update("jax_enable_compilation_cache", False)  # compile times of fresh compiles, not cache reads
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=5e5, help="environment steps per seed")
    parser.add_argument("--ladder", default="8,16,32,64")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--minibatches", choices=boost.MINIBATCHES, default=boost.Boosted.defaults()["minibatches"],
                        help="what the boosted strategies' rungs keep: the bottom rung's batch, its minibatch size, "
                             "or the minibatch count")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a PPO setting for every strategy, e.g. torso=mlp")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/boost"))
    args = parser.parse_args()
    ladder = tuple(int(n) for n in args.ladder.split(","))
    budget = int(args.budget)
    overrides = {k: json.loads(v) if v[:1].isdigit() or v[:1] in "-[" else v
                 for k, v in (s.split("=", 1) for s in args.set)}
    args.out.mkdir(parents=True, exist_ok=True)

    strategies = args.strategies.split(",")
    unknown = sorted(set(strategies) - set(STRATEGIES) - set(EXTRA))
    if unknown:
        parser.error(f"unknown strategies {unknown}; they are {', '.join(STRATEGIES + EXTRA)}")
    tables: dict[str, np.ndarray] = {}
    for minibatches in sorted({table_of(s, args.minibatches) for s in strategies}, reverse=True):
        t0 = time.perf_counter()
        probe = boost.Boosted.create(PPO.create(args.env, **overrides, num_envs=ladder[-1], total_steps=budget),
                                     strategy="nitro", ladder=ladder, budget_steps=budget, minibatches=minibatches)
        tables[minibatches] = seconds = np.asarray(boost.calibrate(probe).round_seconds)
        print(f"calibrated rungs keeping {KEPT[minibatches]} in {time.perf_counter() - t0:.0f} s on "
              f"{jax.devices()[0].platform}; per round (actor, learner, probe seconds) at rungs {ladder}: "
              f"{np.round(seconds, 4).tolist()}; probe share {np.round(seconds[:, 2] / seconds.sum(axis=1), 3).tolist()}",
              flush=True)

    results: dict[str, dict[str, Any]] = {}
    for strategy in strategies:
        results[strategy] = run_strategy(strategy, args.env, ladder, budget, args.seeds, tables, overrides,
                                         args.minibatches)
        r = results[strategy]
        print(f"{strategy}: compiled {r['compile_s']:.0f} s, ran {r['run_s']:.0f} s, {r['rounds']} rounds", flush=True)
        report(results, args, ladder, budget, overrides, tables)  # after each: a cut-short run keeps its results


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace, ladder: tuple[int, ...], budget: int,
           overrides: dict[str, Any], tables: dict[str, np.ndarray]) -> None:
    """Print the table and write the JSON record and the plot."""
    grid = np.linspace(0, budget, GRID + 1)[1:]
    summary = {name: summarize(r, budget) for name, r in results.items()}
    if "fixed-large" in summary:
        target = summary["fixed-large"]["final_mean"]
        for name, r in results.items():
            reach = steps_to_reach(r, target, grid, smooth=GRID // 20)
            summary[name] |= {"steps_to_fixed_large": reach, "fraction_of_fixed_large": reach / budget}
    print(f"\nPPO on {args.env}, budget {budget:.3g} steps per seed, {args.seeds} seeds, ladder {ladder}, "
          f"boosted rungs keep {KEPT[args.minibatches]}\n")
    print("| strategy | final return (95% CI) | env steps | device-seconds | mean actors | steps to fixed-large's "
          "final (fraction) |")
    print("|---|---|---|---|---|---|")
    for name, s in summary.items():
        reach = s.get("steps_to_fixed_large", float("nan"))
        print(f"| {name} | {s['final_mean']:.1f} [{s['ci_low']:.1f}, {s['ci_high']:.1f}] | {s['env_steps']:.3g} | "
              f"{s['device_seconds']:.1f} | {s['mean_actors']:.1f} | "
              + ("never" if np.isnan(reach) else f"{reach:.3g} ({s['fraction_of_fixed_large']:.2f})") + " |")
    print()
    for name, s in summary.items():
        print(f"{name}: final return per seed {', '.join(f'{x:.1f}' for x in s['finals'])}")
    stem = f"boost-{args.env}"
    plot(results, grid, args.env).savefig(args.out / f"{stem}.png", dpi=120)
    record = {"env": args.env, "budget": budget, "seeds": args.seeds, "ladder": ladder, "overrides": overrides,
              "minibatches": args.minibatches, "platform": jax.devices()[0].platform,
              **{("round_seconds" if m == args.minibatches else f"round_seconds_{m}"): t.tolist()
                 for m, t in tables.items()},
              **{("probe_share" if m == args.minibatches else f"probe_share_{m}"): (t[:, 2] / t.sum(axis=1)).tolist()
                 for m, t in tables.items()},
              "summary": summary,
              "curves": {name: {k: np.asarray(r[k]).tolist() for k in ("steps", "returns", "actors")}
                         for name, r in results.items()}}
    (args.out / f"{stem}.json").write_text(json.dumps(record))
    print(f"\nwrote {args.out / stem}.json and .png", flush=True)


if __name__ == "__main__":
    main()
