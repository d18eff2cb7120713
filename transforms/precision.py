"""Reduced-precision encodings for data that crosses between device groups.

``encode`` stores every ``float32`` (or wider) leaf of a pytree in a narrower
form; ``decode`` restores the original dtypes, so the receiving side computes
in full precision. Integer and boolean leaves pass unchanged.

- ``float32``: unchanged;
- ``bfloat16``: rounded to bfloat16 (8 bits of mantissa), half the bytes;
- ``int8``: symmetric linear quantisation with one ``float32`` scale per tensor,
  ``x ~ q * scale`` with ``scale = max|x| / 127``: a quarter of the bytes, and an
  error of at most ``scale / 2`` per element.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_frag.errors import check

PyTree = Any

TRANSFER_DTYPES = ("float32", "bfloat16", "int8")


@struct.dataclass
class Int8:
    """A tensor quantised to int8 with a per-tensor scale."""

    values: jax.Array
    scale: jax.Array


def check_dtype(dtype: str) -> None:
    check(dtype in TRANSFER_DTYPES, "transfer_dtype", dtype, f"choose one of {', '.join(TRANSFER_DTYPES)}")


def _narrowed(leaf: Any, dtype: str) -> bool:
    kind = np.dtype(leaf.dtype)
    return dtype != "float32" and jnp.issubdtype(kind, jnp.floating) and kind.itemsize >= 4


def encode(tree: PyTree, dtype: str) -> PyTree:
    """``tree`` with its float32 leaves stored as ``dtype`` (one of ``TRANSFER_DTYPES``)."""

    def one(x: jax.Array) -> Any:
        if not _narrowed(x, dtype):
            return x
        if dtype == "bfloat16":
            return x.astype(jnp.bfloat16)
        scale = jnp.max(jnp.abs(x)).astype(jnp.float32) / 127.0
        scale = jnp.where(scale > 0, scale, 1.0)
        return Int8(jnp.round(x / scale).astype(jnp.int8), scale)

    return jax.tree.map(one, tree)


def decode(tree: PyTree, like: PyTree) -> PyTree:
    """An encoded ``tree`` back in the dtypes of ``like`` (arrays or shapes)."""

    def one(x: Any, original: Any) -> jax.Array:
        if isinstance(x, Int8):
            return (x.values.astype(jnp.float32) * x.scale).astype(original.dtype)
        return x.astype(original.dtype)

    return jax.tree.map(one, tree, like, is_leaf=lambda n: isinstance(n, Int8))


def encoded_bytes(leaf: Any, dtype: str) -> int:
    """Bytes of ``leaf`` (an array or shape) once encoded as ``dtype``."""
    count = int(np.prod(leaf.shape, dtype=np.int64))
    if not _narrowed(leaf, dtype):
        return count * np.dtype(leaf.dtype).itemsize
    return count * 2 if dtype == "bfloat16" else count + 4
