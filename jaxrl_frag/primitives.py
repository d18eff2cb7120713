"""Operations whose distributed meaning a policy decides.

Algorithm code is written for one device and the global batch. Where an
operation reduces over the batch or reorders it, the algorithm calls one of
these rather than ``jnp`` directly, so that a distribution policy can lower it
(global statistics, local or exact shuffling, sharded sample layouts) without
the algorithm knowing. Under ``SingleDevice`` each is the plain operation.

Reductions over a sharded batch (``batch_moments``, ``standardize``, a loss
mean and so its gradient) need nothing more: the program is partitioned as a
whole, so XLA inserts the all-reduce that keeps their meaning global.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_frag.errors import ConfigError

PyTree = Any

SHUFFLES = ("local", "exact")


class Shared:
    """Base of state nodes whose leaves describe the whole environment batch (running
    statistics, say) although they sit inside a batched value: never split across devices."""


@dataclasses.dataclass(frozen=True)
class Lowering:
    """How the primitives lower: on one device (no mesh), or with the batch sharded
    along ``axis`` of ``mesh`` and minibatches shuffled ``local``-ly or ``exact``-ly.
    A policy that lowers more (fragments of a role on a device group of their own, a
    vmap split over a mesh axis) extends it, overriding ``for_role`` or
    ``spmd_axis_name``."""

    mesh: Mesh | None = None
    axis: str = "data"
    shuffle: str = "exact"

    def for_role(self, role: str) -> Lowering:
        """The lowering of a fragment with ``role``: this one."""
        return self

    @property
    def spmd_axis_name(self) -> str | None:
        """The mesh axis that a ``jax.vmap`` over independent copies of an algorithm (a
        population's members) is split along (its ``spmd_axis_name``): none."""
        return None

    @property
    def shards(self) -> int:
        return 1 if self.mesh is None else self.mesh.shape[self.axis]

    @property
    def local_shards(self) -> int:
        """How many shards draw samples from their own share only: every shard with
        ``local`` shuffling, else one (the batch as a whole)."""
        return self.shards if self.shuffle == "local" else 1

    def constrain(self, x: jax.Array, batch_axis: int) -> jax.Array:
        """``x`` laid out with ``batch_axis`` split over the mesh (a no-op on one device)."""
        if self.mesh is None:
            return x
        spec = [None] * x.ndim
        spec[batch_axis] = self.axis
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, PartitionSpec(*spec)))

    def constrain_tree(self, tree: PyTree, batch_axis: int) -> PyTree:
        """Every leaf of ``tree`` split on ``batch_axis``, but ``Shared`` nodes replicated."""
        if self.mesh is None:
            return tree
        replicated = NamedSharding(self.mesh, PartitionSpec())

        def place(node: Any) -> Any:
            if isinstance(node, Shared):
                return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, replicated), node)
            return self.constrain(node, batch_axis) if node.ndim > batch_axis else node

        return jax.tree.map(place, tree, is_leaf=lambda n: isinstance(n, Shared))


_CURRENT: contextvars.ContextVar[Lowering | None] = contextvars.ContextVar("jaxrl_frag_lowering", default=None)


def current() -> Lowering:
    """The lowering in force: the policy's while it lowers a program, else one device."""
    return _CURRENT.get() or Lowering()


@contextlib.contextmanager
def lowering(rule: Lowering) -> Iterator[None]:
    """Trace the primitives under ``rule`` (a policy sets this while it lowers a program)."""
    token = _CURRENT.set(rule)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def on_host(callback: Any, result_shape: PyTree, *args: PyTree) -> PyTree:
    """``callback(*args)`` run by the host (``io_callback``). Within one process, on whole
    arrays: on a mesh the arguments are gathered once for it and its results replicated,
    for the consumers to take their shares (rather than a resharding XLA can only do the
    slow way). On a mesh across processes, every process runs it on its own rows: the
    leading axis of every argument and result of one axis or more (the batch, split
    along the mesh's ``axis`` with one device of it per process), whole scalars."""
    rule = current()
    if rule.mesh is None:
        return io_callback(callback, result_shape, *args)
    if jax.process_count() > 1:
        return _on_each_host(rule, callback, result_shape, *args)
    replicated = NamedSharding(rule.mesh, PartitionSpec())

    def pin(tree: PyTree) -> PyTree:
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, replicated), tree)

    return pin(io_callback(callback, result_shape, *pin(args)))


def _on_each_host(rule: Lowering, callback: Any, result_shape: PyTree, *args: PyTree) -> PyTree:
    """``on_host`` across processes: the callback once per process, on its rows."""
    local = rule.mesh.local_mesh.shape
    if any(size != 1 for size in local.values()):
        raise ConfigError("devices", local[rule.axis], "a host call across processes runs once in each process, on "
                          "that process's rows of the batch: give the batch one device in each process")
    shards = rule.mesh.shape[rule.axis]

    def spec(x: Any) -> PartitionSpec:
        return PartitionSpec(rule.axis) if len(x.shape) else PartitionSpec()

    def own(x: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((x.shape[0] // shards, *x.shape[1:]), x.dtype) if len(x.shape) else x

    def each(*own_args: PyTree) -> PyTree:
        return io_callback(callback, jax.tree.map(own, result_shape), *own_args)

    return jax.shard_map(each, mesh=rule.mesh, in_specs=jax.tree.map(spec, args),
                         out_specs=jax.tree.map(spec, result_shape), check_vma=False)(*args)


def batch_moments(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Mean, variance and count of ``x`` over its leading (batch) axis."""
    return x.mean(axis=0), x.var(axis=0), jnp.asarray(x.shape[0], jnp.float32)


def standardize(x: jax.Array, eps: float = 1e-8) -> jax.Array:
    """``x`` shifted and scaled to zero mean and unit standard deviation over the batch."""
    return (x - x.mean()) / (x.std() + eps)


def flatten_batch(tree: PyTree, batch_axis: int) -> PyTree:
    """Merge the axes up to ``batch_axis`` (the environments) of every leaf into one
    sample axis, environments outermost: ``[T, N, ...]`` with ``batch_axis=1`` becomes
    ``[N * T, ...]``, each environment's samples contiguous (so each device keeps its own)."""
    rule = current()

    def flatten(x: jax.Array) -> jax.Array:
        x = jnp.moveaxis(x, batch_axis, 0)
        x = x.reshape(math.prod(x.shape[: batch_axis + 1]), *x.shape[batch_axis + 1 :])  # explicit: a leaf may be empty
        return rule.constrain(x, 0)

    return jax.tree.map(flatten, tree)


def minibatches(key: jax.Array, batch: PyTree, num_minibatches: int) -> PyTree:
    """The samples (leading axis of every leaf) shuffled and split into ``num_minibatches``
    equal minibatches, stacked on a new leading axis.

    One device, or ``exact`` shuffling: one permutation of the whole batch. ``local``
    shuffling on a sharded batch: each device permutes its own samples and every
    minibatch takes an equal share from each device, so no sample crosses devices.
    """
    rule = current()
    sizes = {x.shape[0] for x in jax.tree.leaves(batch)}
    if len(sizes) != 1:
        raise ValueError(f"minibatches: every leaf needs the same number of samples on axis 0, got {sorted(sizes)}")
    (size,) = sizes
    shards = rule.local_shards
    if size % shards:
        raise ConfigError("devices", shards, f"the batch of {size} samples does not divide across {shards} devices; "
                          "use a device count that divides the number of environments")
    if size % (shards * num_minibatches):
        raise ConfigError(
            "num_minibatches", num_minibatches,
            f"the batch of {size} samples does not split into {num_minibatches} minibatches"
            + (f" across {shards} devices" if shards > 1 else "")
            + "; choose a number of minibatches (and devices) that divides it",
        )
    local = size // shards
    if shards == 1:
        perm = jax.random.permutation(key, size)

        def shuffle(x: jax.Array) -> jax.Array:
            return x[perm]
    else:
        perms = jax.vmap(jax.random.permutation, (0, None))(jax.random.split(key, shards), local)

        def shuffle(x: jax.Array) -> jax.Array:
            # device d's samples, permuted in place; minibatch m takes slice m of every device's share
            blocks = jax.vmap(lambda b, p: b[p])(x.reshape(shards, local, *x.shape[1:]), perms)
            blocks = blocks.reshape(shards, num_minibatches, local // num_minibatches, *x.shape[1:])
            return blocks.swapaxes(0, 1).reshape(size, *x.shape[1:])

    def split(x: jax.Array) -> jax.Array:
        x = shuffle(x).reshape(num_minibatches, size // num_minibatches, *x.shape[1:])
        return rule.constrain(x, 1)

    return jax.tree.map(split, batch)
