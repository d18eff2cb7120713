"""Many arrays as two byte buffers, so that a copy between device groups moves two
arrays instead of one per leaf (each array a ``device_put`` moves costs tens of
microseconds of host time, more than the copy itself at RL sizes).

A ``Layout`` records each leaf's shape, dtype and batch axis. ``pack`` lays the
leaves' bytes side by side: those that carry the batch axis in one ``uint8[N, B]``
buffer, batch axis first (so a buffer split along ``N`` keeps each device's share on
its device), all others in one ``uint8[R]`` buffer; a buffer with nothing to hold
is left out. ``unpack`` inverts it; both are bitcasts, slices and concatenations,
which XLA fuses into the programs around them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Leaf:
    shape: tuple[int, ...]
    dtype: np.dtype
    batch_axis: int | None  # None: in the replicated buffer

    @property
    def row_bytes(self) -> int:
        """Bytes per batch element (batched) or in all (replicated)."""
        count = int(np.prod(self.shape, dtype=np.int64))
        per = count // self.shape[self.batch_axis] if self.batch_axis is not None else count
        return per * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each leaf of a list of arrays lies in a ``(batched, replicated)`` buffer pair."""

    leaves: tuple[Leaf, ...]
    batch: int  # N, the batch size every batched leaf shares

    @classmethod
    def of(cls, leaves: Sequence[Any], batch_axes: Sequence[int | None]) -> Layout:
        """The layout of ``leaves`` (arrays or shapes); ``batch_axes[i]`` is leaf ``i``'s
        batch axis or ``None``. Leaves whose batch size differs from the first batched
        leaf's go to the replicated buffer."""
        sizes = [x.shape[a] for x, a in zip(leaves, batch_axes, strict=True) if a is not None]
        batch = sizes[0] if sizes else 0
        return cls(tuple(Leaf(tuple(x.shape), np.dtype(x.dtype), a if a is not None and x.shape[a] == batch else None)
                         for x, a in zip(leaves, batch_axes, strict=True)), batch)

    @property
    def batched(self) -> bool:
        """Whether there is a batched buffer (some leaf carries the batch axis)."""
        return any(leaf.batch_axis is not None for leaf in self.leaves)

    @property
    def replicated(self) -> bool:
        """Whether there is a replicated buffer."""
        return any(leaf.batch_axis is None for leaf in self.leaves)

    def pack(self, values: Sequence[jax.Array]) -> tuple[jax.Array, ...]:
        """``values`` (laid out as ``leaves``) as ``(uint8[N, B], uint8[R])``, either one
        left out when it would be empty."""
        batched = [_bytes(jnp.moveaxis(v, leaf.batch_axis, 0)).reshape(self.batch, -1)
                   for v, leaf in zip(values, self.leaves, strict=True) if leaf.batch_axis is not None]
        replicated = [_bytes(v).reshape(-1) for v, leaf in zip(values, self.leaves, strict=True)
                      if leaf.batch_axis is None]
        return ((jnp.concatenate(batched, axis=1),) if batched else ()) + (
            (jnp.concatenate(replicated),) if replicated else ())

    def unpack(self, buffers: tuple[jax.Array, ...]) -> list[jax.Array]:
        """The arrays ``pack`` laid into ``buffers``."""
        batched = buffers[0] if self.batched else None
        replicated = buffers[-1] if self.replicated else None
        offsets = [0, 0]
        out = []
        for leaf in self.leaves:
            size = leaf.row_bytes
            if leaf.batch_axis is None:
                chunk, offsets[1] = replicated[offsets[1]: offsets[1] + size], offsets[1] + size
                out.append(_array(chunk, leaf.dtype, leaf.shape))
            else:
                chunk, offsets[0] = batched[:, offsets[0]: offsets[0] + size], offsets[0] + size
                moved = (leaf.shape[leaf.batch_axis], *leaf.shape[: leaf.batch_axis], *leaf.shape[leaf.batch_axis + 1:])
                out.append(jnp.moveaxis(_array(chunk, leaf.dtype, moved), 0, leaf.batch_axis))
        return out

    def nbytes(self) -> int:
        return sum(leaf.row_bytes * (self.batch if leaf.batch_axis is not None else 1) for leaf in self.leaves)


def _bytes(x: jax.Array) -> jax.Array:
    """``x`` as bytes, one more trailing axis of ``itemsize``."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)[..., None]
    if x.dtype.itemsize == 1:
        return jax.lax.bitcast_convert_type(x, jnp.uint8)[..., None]
    return jax.lax.bitcast_convert_type(x, jnp.uint8)


def _array(chunk: jax.Array, dtype: np.dtype, shape: tuple[int, ...]) -> jax.Array:
    """Bytes back into an array of ``dtype`` and ``shape``."""
    chunk = chunk.reshape(*shape, dtype.itemsize)
    if dtype == np.bool_:
        return chunk[..., 0].astype(jnp.bool_)
    if dtype.itemsize == 1:
        return jax.lax.bitcast_convert_type(chunk[..., 0], dtype)
    return jax.lax.bitcast_convert_type(chunk, dtype)
