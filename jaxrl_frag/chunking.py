"""Many training iterations as one compiled call, metrics reduced on device.

A *chunk* is ``k`` iterations whose metrics are reduced to one row; a *call*
runs any number of iterations and returns the rows of the chunks it completed.
Rows fix the resolution of the learning curve; calls fix how often the host
wakes up. A call may end inside a chunk: the chunk's running totals are carried
to the next call (or into a checkpoint), so a row is the same wherever calls
begin and end. Every count is traced, so one executable serves every length.

An iteration is the algorithm's ``checked_step``: its step, with one flag for each
state field and each metric, "holds only finite numbers" (by default). With
``check_finite`` the first iteration whose flags are not all set ends the call, so
the host learns where a run went non-finite without a host sync per iteration
(without it the flags go unused, and XLA drops them). An algorithm that ends itself
(``finished``: a spent budget) ends the call the same way, before its next iteration.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frag import metrics as metrics_lib
from jaxrl_frag.algorithms import Algorithm, Flags

PyTree = Any


class Chunk(NamedTuple):
    """A chunk in progress: its metrics' running totals (``metrics.accumulate``) over the
    ``count`` iterations it has run."""

    totals: metrics_lib.Metrics
    count: Any

    @classmethod
    def empty(cls, metric_shapes: dict[str, jax.ShapeDtypeStruct]) -> Chunk:
        """No iteration run yet: zero totals shaped like the metrics (host arrays)."""
        return cls({k: np.zeros(v.shape, np.float32) for k, v in metric_shapes.items()}, np.int32(0))

    def row(self) -> metrics_lib.Metrics:
        """The chunk's metrics so far (``metrics.reduce``), on the host."""
        totals = jax.device_get(self.totals)
        return metrics_lib.reduce(totals, np.float32(max(int(self.count), 1)))


def run_iterations(
    algo: Algorithm, state: PyTree, chunk: Chunk, iterations: jax.Array, chunk_iterations: jax.Array,
    offset: jax.Array, *, max_rows: int, check_finite: bool = False,
) -> tuple[PyTree, Chunk, metrics_lib.Metrics, jax.Array, jax.Array, Flags]:
    """Up to ``iterations`` steps of ``algo`` continuing ``chunk``, whose first lies
    ``offset`` iterations into its chunk of ``chunk_iterations``; fewer once ``algo`` is
    ``finished`` or an iteration goes non-finite.

    Returns the state, the chunk in progress, each metric's rows shaped
    ``[max_rows, ...]`` (one per chunk completed, averaged over the iterations it ran;
    only the first ``num_rows`` are written), ``num_rows``, the iterations run and the
    finite flags of the last one (all set unless it went non-finite, which ends the call
    there, its row then meaningless). The caller keeps the chunks completed within
    ``max_rows``: ``offset + iterations <= max_rows * chunk_iterations``.
    """
    _, shapes, flag_shapes = jax.eval_shape(algo.checked_step, state)
    rows = {k: jnp.zeros((max_rows, *v.shape), jnp.float32) for k, v in shapes.items()}
    no_flags = {name: jnp.bool_(True) for name in flag_shapes} if check_finite else {}
    Carry = tuple[jax.Array, PyTree, Chunk, metrics_lib.Metrics, jax.Array, Flags]

    def running(carry: Carry) -> jax.Array:
        i, state, _, _, _, flags = carry
        return (i < iterations) & _all(flags) & ~algo.finished(state)

    def body(carry: Carry) -> Carry:
        i, state, chunk, rows, num_rows, _ = carry
        state, metrics, flags = algo.checked_step(state)
        flags = flags if check_finite else {}
        totals, count = metrics_lib.accumulate(chunk.totals, metrics), chunk.count + 1
        row = metrics_lib.reduce(totals, count.astype(jnp.float32))
        rows = {k: rows[k].at[num_rows].set(row[k]) for k in rows}  # kept once the chunk completes
        complete = (offset + i + 1) % chunk_iterations == 0
        chunk = Chunk({k: jnp.where(complete, 0.0, v) for k, v in totals.items()}, jnp.where(complete, 0, count))
        return i + 1, state, chunk, rows, num_rows + complete.astype(jnp.int32), flags

    chunk = Chunk({k: jnp.asarray(v, jnp.float32) for k, v in chunk.totals.items()}, jnp.asarray(chunk.count, jnp.int32))
    ran, state, chunk, rows, num_rows, flags = jax.lax.while_loop(
        running, body, (jnp.int32(0), state, chunk, rows, jnp.int32(0), no_flags))
    return state, chunk, rows, num_rows, ran, flags


def _all(flags: Flags) -> jax.Array:
    return jnp.stack(list(flags.values())).all() if flags else jnp.bool_(True)
