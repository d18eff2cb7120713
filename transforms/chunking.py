"""Many training iterations as one compiled call, metrics reduced on device.

A *chunk* is ``k`` iterations whose metrics are reduced to one row; a *call*
runs several chunks back to back and returns their rows. Rows fix the
resolution of the learning curve; calls fix how often the host wakes up. Both
counts are traced, so one executable serves every chunk and call length.

With ``check_finite`` every iteration also reduces each state field and each
metric to one flag, "holds only finite numbers"; the first iteration whose flags
are not all set ends the call, so the host learns where a run went non-finite
without a host sync per iteration. An algorithm that ends itself (``finished``:
a spent budget) ends the call the same way, before its next iteration.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_frag import metrics as metrics_lib
from jaxrl_frag.algorithms import Algorithm

PyTree = Any
Flags = dict[str, jax.Array]


def finite_flags(state: PyTree, metrics: metrics_lib.Metrics) -> Flags:
    """For each state field (``"state.params"``, ...) and each metric (``"metrics.loss"``):
    whether every floating-point value in it is finite."""
    zeros: dict[str, jax.Array] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path({"state": state, "metrics": metrics}):
        if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            name = ".".join(field_name(k) for k in path[:2])
            # x * 0 is 0 for every finite x and NaN for NaN and infinities: a plain sum finds them
            # without overflowing, and fuses into the leaf's producer (few ops to compile)
            zeros[name] = zeros.get(name, 0.0) + jnp.sum(leaf * 0, dtype=jnp.float32)
    return {name: total == 0 for name, total in zeros.items()}


def run_chunk(
    algo: Algorithm, state: PyTree, iterations: jax.Array, check_finite: bool = False
) -> tuple[PyTree, metrics_lib.Metrics, jax.Array, Flags]:
    """Up to ``iterations`` steps of ``algo``, fewer once it is ``finished``; metrics
    summed or averaged over those run (see ``metrics``). Returns the state, the metrics,
    the iterations run and the finite flags of the last one (all set unless it went
    non-finite, which ends the chunk there, its metrics then meaningless)."""
    state_shape, shapes = jax.eval_shape(algo.step, state)
    zeros = {k: jnp.zeros(v.shape, jnp.float32) for k, v in shapes.items()}
    no_flags = _all_set(state_shape, shapes) if check_finite else {}

    def running(carry: tuple[jax.Array, PyTree, metrics_lib.Metrics, Flags]) -> jax.Array:
        i, state, _, flags = carry
        return (i < iterations) & _all(flags) & ~algo.finished(state)

    def body(carry: tuple[jax.Array, PyTree, metrics_lib.Metrics, Flags]) -> tuple[Any, ...]:
        i, state, total, _ = carry
        state, metrics = algo.step(state)
        flags = finite_flags(state, metrics) if check_finite else {}
        return i + 1, state, metrics_lib.accumulate(total, metrics), flags

    ran, state, total, flags = jax.lax.while_loop(running, body, (jnp.int32(0), state, zeros, no_flags))
    return state, metrics_lib.reduce(total, jnp.maximum(ran, 1).astype(jnp.float32)), ran, flags


def run_chunks(
    algo: Algorithm, state: PyTree, num_chunks: jax.Array, chunk_iterations: jax.Array, *, max_chunks: int,
    check_finite: bool = False,
) -> tuple[PyTree, metrics_lib.Metrics, jax.Array, Flags]:
    """``num_chunks <= max_chunks`` chunks of ``chunk_iterations`` iterations (fewer once
    ``algo`` is ``finished``, the last chunk then partial); returns the state, each
    metric's rows shaped ``[max_chunks, ...]`` (rows past those run are NaN), the
    iterations run and the finite flags of the last (see ``run_chunk``)."""
    state_shape, shapes = jax.eval_shape(algo.step, state)
    rows = {k: jnp.full((max_chunks, *v.shape), jnp.nan, jnp.float32) for k, v in shapes.items()}
    no_flags = _all_set(state_shape, shapes) if check_finite else {}

    def running(carry: tuple[jax.Array, jax.Array, PyTree, metrics_lib.Metrics, Flags]) -> jax.Array:
        c, _, state, _, flags = carry
        return (c < num_chunks) & _all(flags) & ~algo.finished(state)

    def body(carry: tuple[jax.Array, jax.Array, PyTree, metrics_lib.Metrics, Flags]) -> tuple[Any, ...]:
        c, ran, state, rows, _ = carry
        state, metrics, chunk_ran, flags = run_chunk(algo, state, chunk_iterations, check_finite)
        return c + 1, ran + chunk_ran, state, {k: rows[k].at[c].set(metrics[k]) for k in rows}, flags

    _, ran, state, rows, flags = jax.lax.while_loop(running, body, (jnp.int32(0), jnp.int32(0), state, rows, no_flags))
    return state, rows, ran, flags


def _all_set(state: PyTree, metrics: metrics_lib.Metrics) -> Flags:
    return {name: jnp.bool_(True) for name in jax.eval_shape(finite_flags, state, metrics)}


def _all(flags: Flags) -> jax.Array:
    return jnp.stack(list(flags.values())).all() if flags else jnp.bool_(True)


def field_name(key: Any) -> str:
    """The name in one step of a pytree path (a dataclass field, dict key or index)."""
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)
