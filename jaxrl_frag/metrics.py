"""Metrics: what a step reports, how a chunk reduces it on device, how the host reads it.

A step returns a flat dict of scalars. Over a chunk of iterations, metrics named
``*_sum`` or ``*_count`` are summed, running totals named ``*_total`` keep their
last value and all others are averaged, so episode statistics stay exact however
episodes fall across iterations and memory does not grow with the run.
``finalize`` turns sums into means on the host.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Metrics = dict[str, jax.Array]


def is_summed(name: str) -> bool:
    """Whether metric ``name`` is summed over a chunk (it ends in ``_sum`` or ``_count``)."""
    return name.endswith(("_sum", "_count"))


def is_running_total(name: str) -> bool:
    """Whether metric ``name`` is a running total, whose last value a chunk keeps (it ends in ``_total``)."""
    return name.endswith("_total")


def episode_metrics(done: jax.Array, episode_return: jax.Array, episode_length: jax.Array,
                    stats: dict[str, jax.Array] | None = None) -> Metrics:
    """Count, return sum and length sum of the episodes that ended where ``done``, and the
    sum of each of their further statistics ``stats`` (named ``episode_*``).

    Args:
        done: Where an episode ended, any shape (``[T, N]`` for a rollout).
        episode_return: The return of the episode so far, shaped like ``done``
            (``EpisodeStatistics`` reports it in ``info``).
        episode_length: Its length so far, shaped like ``done``.
        stats: More statistics of the episode so far by name (``episode_won``, say),
            each shaped like ``done``.

    Returns:
        ``episode_count``, and ``<name>_sum`` of ``episode_return``, ``episode_length``
        and each of ``stats``: summed over a chunk, and turned into means by ``finalize``.
    """
    done = done.astype(jnp.float32)
    named = {"episode_return": episode_return, "episode_length": episode_length, **(stats or {})}
    return {"episode_count": done.sum(), **{f"{name}_sum": (value * done).sum() for name, value in named.items()}}


def accumulate(total: Metrics, new: Metrics) -> Metrics:
    """Running chunk totals: running totals are replaced, every other metric is summed;
    ``reduce`` divides the averaged ones.

    Args:
        total: The chunk's totals so far (float32 scalars, or ``[members]`` in a population).
        new: One iteration's metrics, with the same names.

    Returns:
        The totals with ``new`` taken in.
    """
    return {k: new[k].astype(jnp.float32) if is_running_total(k) else total[k] + new[k].astype(jnp.float32)
            for k in total}


def reduce(total: Metrics, iterations: jax.Array) -> Metrics:
    """Chunk totals to chunk metrics: sums and running totals stay, the rest become means.

    Args:
        total: The chunk's totals, as ``accumulate`` left them.
        iterations: The iterations the chunk ran.

    Returns:
        The chunk's row of metrics, still on the device.
    """
    return {k: v if is_summed(k) or is_running_total(k) else v / iterations for k, v in total.items()}


def finalize(row: dict[str, np.ndarray]) -> dict[str, float | np.ndarray]:
    """Host side: the means ``<prefix>_<name>`` (``episode_return``, ``episode_length``,
    ``eval_return``, ...) from the sums ``<prefix>_<name>_sum`` over ``<prefix>_count``
    (NaN where the count is 0). Scalars become floats;
    a population's per-member values stay arrays.

    Args:
        row: A chunk's metrics as fetched from the device.

    Returns:
        The row as ``History`` holds it: ``episode_return``, ``episode_length`` and
        ``episode_count`` first, then the other metrics by name.
    """
    out = {k: np.asarray(v, np.float64) for k, v in row.items()}
    # "<prefix>_<name>_sum" beside "<prefix>_count" becomes the mean "<prefix>_<name>" (episodes, evaluations, ...)
    for prefix in [k.removesuffix("_count") for k in row if k.endswith("_count")]:
        count = out[f"{prefix}_count"]
        for name in [k for k in out if k.startswith(f"{prefix}_") and k.endswith("_sum")]:
            out[name.removesuffix("_sum")] = np.where(count > 0, out.pop(name) / np.maximum(count, 1), np.nan)
    first = [k for k in ("episode_return", "episode_length", "episode_count") if k in out]
    return {k: float(out[k]) if out[k].ndim == 0 else out[k] for k in first + sorted(set(out) - set(first))}
