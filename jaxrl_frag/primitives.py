"""Operations whose distributed meaning a policy decides.

Algorithm code is written for one device and the global batch. Where an
operation reduces over the batch or reorders it, the algorithm calls one of
these rather than ``jnp`` directly, so that a distribution policy can lower it
(global statistics, gradient averaging, local or exact shuffling) without the
algorithm knowing. Under ``SingleDevice`` each is the plain operation below.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def batch_moments(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Mean, variance and count of ``x`` over its leading (batch) axis."""
    return x.mean(axis=0), x.var(axis=0), jnp.asarray(x.shape[0], jnp.float32)


def standardize(x: jax.Array, eps: float = 1e-8) -> jax.Array:
    """``x`` shifted and scaled to zero mean and unit standard deviation over the batch."""
    return (x - x.mean()) / (x.std() + eps)


def minibatches(key: jax.Array, batch: PyTree, num_minibatches: int) -> PyTree:
    """One random permutation of the batch (leading axis of every leaf), split into
    ``num_minibatches`` equal minibatches stacked on a new leading axis."""
    size = jax.tree.leaves(batch)[0].shape[0]
    perm = jax.random.permutation(key, size)
    return jax.tree.map(lambda x: x[perm].reshape((num_minibatches, size // num_minibatches, *x.shape[1:])), batch)
