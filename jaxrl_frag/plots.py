"""Plots of a run's metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

LOSSES = ("policy_loss", "value_loss", "entropy")


def learning_curve(metrics: Mapping[str, Sequence[float]], title: str) -> Figure:
    """Mean episode return against environment steps, with the losses beside it."""
    losses = [name for name in LOSSES if name in metrics]
    fig, axes = plt.subplots(1, 1 + bool(losses), figsize=(11 if losses else 6.5, 4), squeeze=False)
    ax = axes[0, 0]
    ax.plot(metrics["env_steps"], metrics["episode_return"], color="tab:blue", lw=1.8)
    ax.set(xlabel="environment steps", ylabel="mean episode return", title=title)
    ax.grid(alpha=0.3)
    if losses:
        ax = axes[0, 1]
        for name in losses:
            ax.plot(metrics["env_steps"], metrics[name], label=name, lw=1.2)
        ax.set(xlabel="environment steps", title="losses (per-chunk mean)")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
