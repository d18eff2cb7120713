"""Plots of a run's metrics, as matplotlib ``Figure``s made without pyplot: no global
backend is chosen or changed (a notebook's inline plots keep working)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from jaxrl_frag.app.summary import bootstrap_ci

PANELS = (("value loss", ("value_loss",)), ("policy loss and entropy", ("policy_loss", "entropy")),
          ("environments per round (boosted)", ("actors",)))
_DRAWN = ("episode_return", "episode_length", "episode_count")


def learning_curve(metrics: Mapping[str, Sequence[float]], title: str) -> Figure:
    """Mean episode return against environment steps (and the greedy evaluations' mean
    return, where the run evaluates during training), with the environment's further
    episode statistics (a win rate, say) and the losses beside it (each panel only if
    the run reports its metrics; per-agent returns are left to ``metrics.csv``)."""
    statistics = tuple(k for k in metrics if k.startswith("episode_") and k not in _DRAWN
                       and not k.startswith("episode_return_"))
    panels = [(name, [m for m in keys if m in metrics])
              for name, keys in (("episode statistics", statistics), *PANELS)]
    panels = [(name, keys) for name, keys in panels if keys]
    fig = Figure(figsize=(5.5 * (1 + len(panels)), 4))
    axes = fig.subplots(1, 1 + len(panels), squeeze=False)
    steps = metrics["env_steps"]
    ax = axes[0, 0]
    ax.plot(steps, metrics["episode_return"], color="tab:blue", lw=1.8, label="training")
    if "eval_return" in metrics:  # drawn at the rows whose chunk held an evaluation
        evaluated = np.isfinite(np.asarray(metrics["eval_return"], np.float64))
        ax.plot(np.asarray(steps)[evaluated], np.asarray(metrics["eval_return"])[evaluated], "o-", color="tab:orange",
                lw=1.2, ms=3, label="greedy evaluation")
        ax.legend()
    ax.set(xlabel="environment steps", ylabel="mean episode return", title=title)
    for ax, (name, keys) in zip(axes[0, 1:], panels, strict=True):
        for key in keys:
            ax.plot(steps, metrics[key], label=key.replace("_", " "), lw=1.2)
        ax.set(xlabel="environment steps", title=f"{name} (mean per row)")
        if len(keys) > 1:
            ax.legend()
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def population_curves(env_steps: Sequence[float], returns: np.ndarray, groups: Sequence[tuple[str, Sequence[int]]],
                      title: str) -> Figure:
    """Mean episode return of each group of members (a hyperparameter setting over its
    seeds) against environment steps, shaded with its 95% bootstrap interval.
    ``returns`` is ``[rows, members]``; ``env_steps`` is ``[rows]``, or ``[rows, members]``
    where members' iterations vary in size (a group is then drawn at its mean)."""
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    steps_of = np.asarray(env_steps, np.float64)
    for label, members in groups:
        values = returns[:, list(members)]
        steps = steps_of[:, list(members)].mean(axis=1) if steps_of.ndim == 2 else steps_of
        mean = np.nanmean(values, axis=1)
        line = ax.plot(steps, mean, lw=1.6, label=f"{label} (n={len(members)})")[0]
        if len(members) > 1:
            low, high = bootstrap_ci(np.nan_to_num(values, nan=np.nanmean(values)), axis=1)
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, lw=0)
    ax.set(xlabel="environment steps", ylabel="mean episode return", title=f"{title} (shaded: 95% bootstrap CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
