"""Plots of a run's metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

PANELS = (("value loss", ("value_loss",)), ("policy loss and entropy", ("policy_loss", "entropy")))


def learning_curve(metrics: Mapping[str, Sequence[float]], title: str) -> Figure:
    """Mean episode return against environment steps, with the losses beside it
    (each panel only if the run reports its metrics)."""
    panels = [(name, [m for m in keys if m in metrics]) for name, keys in PANELS]
    panels = [(name, keys) for name, keys in panels if keys]
    fig, axes = plt.subplots(1, 1 + len(panels), figsize=(5.5 * (1 + len(panels)), 4), squeeze=False)
    steps = metrics["env_steps"]
    ax = axes[0, 0]
    ax.plot(steps, metrics["episode_return"], color="tab:blue", lw=1.8)
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
