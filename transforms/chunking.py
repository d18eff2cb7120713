"""Many training iterations as one compiled call, metrics reduced on device.

A *chunk* is ``k`` iterations whose metrics are reduced to one row; a *call*
runs several chunks back to back and returns their rows. Rows fix the
resolution of the learning curve; calls fix how often the host wakes up. Both
counts are traced, so one executable serves every chunk and call length.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_frag import metrics as metrics_lib
from jaxrl_frag.algorithms import Algorithm

PyTree = Any


def run_chunk(algo: Algorithm, state: PyTree, iterations: jax.Array) -> tuple[PyTree, metrics_lib.Metrics]:
    """``iterations`` steps of ``algo``; metrics summed or averaged over them (see ``metrics``)."""
    _, shapes = jax.eval_shape(algo.step, state)
    zeros = {k: jnp.zeros(v.shape, jnp.float32) for k, v in shapes.items()}

    def body(_: jax.Array, carry: tuple[PyTree, metrics_lib.Metrics]) -> tuple[PyTree, metrics_lib.Metrics]:
        state, total = carry
        state, metrics = algo.step(state)
        return state, metrics_lib.accumulate(total, metrics)

    state, total = jax.lax.fori_loop(0, iterations, body, (state, zeros))
    return state, metrics_lib.reduce(total, iterations.astype(jnp.float32))


def run_chunks(
    algo: Algorithm, state: PyTree, num_chunks: jax.Array, chunk_iterations: jax.Array, *, max_chunks: int
) -> tuple[PyTree, metrics_lib.Metrics]:
    """``num_chunks <= max_chunks`` chunks of ``chunk_iterations`` iterations; returns the
    state and each metric's rows, shaped ``[max_chunks, ...]`` (rows past ``num_chunks`` are NaN)."""
    _, shapes = jax.eval_shape(algo.step, state)
    rows = {k: jnp.full((max_chunks, *v.shape), jnp.nan, jnp.float32) for k, v in shapes.items()}

    def body(c: jax.Array, carry: tuple[PyTree, metrics_lib.Metrics]) -> tuple[PyTree, metrics_lib.Metrics]:
        state, rows = carry
        state, metrics = run_chunk(algo, state, chunk_iterations)
        return state, {k: rows[k].at[c].set(metrics[k]) for k in rows}

    return jax.lax.fori_loop(0, num_chunks, body, (state, rows))
