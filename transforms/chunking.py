"""``run_chunk``: many training iterations as one compiled call."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_frag import metrics as metrics_lib
from jaxrl_frag.algorithm import Algorithm

PyTree = Any


def run_chunk(algo: Algorithm, state: PyTree, n: jax.Array) -> tuple[PyTree, metrics_lib.Metrics]:
    """``n`` iterations of ``algo.step`` in one loop, metrics reduced over them on device.

    ``n`` is traced, so one executable serves every chunk length.
    """
    _, shapes = jax.eval_shape(algo.step, state)
    zeros = {k: jnp.zeros(v.shape, jnp.float32) for k, v in shapes.items()}

    def body(_: jax.Array, carry: tuple[PyTree, metrics_lib.Metrics]) -> tuple[PyTree, metrics_lib.Metrics]:
        state, total = carry
        state, metrics = algo.step(state)
        return state, metrics_lib.accumulate(total, metrics)

    state, total = jax.lax.fori_loop(0, n, body, (state, zeros))
    return state, metrics_lib.reduce(total, n.astype(jnp.float32))
