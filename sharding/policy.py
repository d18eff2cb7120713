"""Distribution policies: how a training program is placed on devices.

A policy turns the program's state (its shape and which of its fields carry the
environment batch, read from the fragment declarations) into shardings, and
sets how the framework primitives lower. ``Program`` does the rest with
``jax.jit``; the algorithm never sees devices.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from jaxrl_frag import primitives
from jaxrl_frag.errors import ConfigError, check
from jaxrl_frag.primitives import Shared

PyTree = Any
BatchAxes = Mapping[str, int]  # state field -> axis that carries the environment batch


class Policy(abc.ABC):
    """Places a training program's state and chooses how the primitives lower."""

    @abc.abstractmethod
    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes]) -> tuple[Sharding, PyTree]:
        """The sharding of replicated values, and one sharding per leaf of ``state``
        (shapes); ``batch_axes`` is called if the policy needs to know the batched fields."""

    def lowering(self) -> primitives.Lowering:
        """How the primitives lower under this policy."""
        return primitives.Lowering()

    @property
    def device_count(self) -> int:
        """How many devices the program runs on."""
        return 1

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for ``explain``: the devices and how the program is spread on them."""


@dataclasses.dataclass(frozen=True)
class SingleDevice(Policy):
    """Everything on one device (by default the first one)."""

    device: jax.Device | None = None

    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes]) -> tuple[Sharding, PyTree]:
        sharding = SingleDeviceSharding(self.device or jax.devices()[0])
        return sharding, jax.tree.map(lambda _: sharding, state)

    def describe(self) -> str:
        device = self.device or jax.devices()[0]
        return f"SingleDevice: {device.platform}:{device.id}"


def make_mesh(**axes: int | None) -> Mesh:
    """A mesh over the first devices of all (global) devices, one named axis per keyword:
    ``make_mesh(data=4)``, ``make_mesh(pop=2, data=2)``. One axis may be ``None``: it
    takes every device the others leave."""
    available = jax.devices()
    for name, size in axes.items():
        check(size is None or size > 0, "devices", size, f"the {name!r} axis needs a positive device count")
    fixed = int(np.prod([s for s in axes.values() if s is not None], dtype=np.int64))
    sizes = {name: (len(available) // fixed if size is None else size) for name, size in axes.items()}
    count = int(np.prod(list(sizes.values()), dtype=np.int64))
    if count > len(available) or count == 0:
        raise ConfigError(
            "devices", count,
            f"only {len(available)} {available[0].platform} device(s) exist; ask for at most {len(available)} "
            "(on CPU the command line's --devices forces that many host devices)",
        )
    return Mesh(np.array(available[:count]).reshape(tuple(sizes.values())), tuple(sizes))


@dataclasses.dataclass(frozen=True)
class DataParallel(Policy):
    """Anakin-style data parallelism: every device acts and learns on its share of the
    environments; parameters and optimizer state are replicated and gradients averaged.

    The whole program is partitioned with ``jax.jit`` and ``NamedSharding``: each
    environment-batched state field is split along ``axis``, so rollouts run on
    each device's own environments with no traffic, and XLA inserts the
    all-reduces that keep batch reductions (the loss, hence the gradient; batch
    statistics; episode metrics) global. Exactness: with ``shuffle="exact"`` a run
    equals the ``SingleDevice`` run of the same global batch and seed to float
    tolerance, at the price of moving trajectory samples between devices for the
    global permutation. With ``shuffle="local"`` (the default) each device
    shuffles its own samples: statistically the same, not bitwise the same.

    Why ``jit`` + ``NamedSharding`` rather than ``shard_map`` or ``pmap``: the
    whole chunked training loop is partitioned as one program from the global
    view the algorithm is written in, so no axis names or collectives appear in
    algorithm code, and the collectives XLA chooses are read back and audited
    (``Program.explain``). ``pmap`` would need a per-device program and explicit
    ``pmean``s in the algorithm.
    """

    devices: int | None = None
    shuffle: str = "local"
    axis: str = "data"
    mesh: Mesh | None = None

    def __post_init__(self) -> None:
        _set_up_mesh(self, {self.axis: self.devices})

    @property
    def size(self) -> int:
        return self.mesh.shape[self.axis]

    @property
    def device_count(self) -> int:
        return self.mesh.devices.size

    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes]) -> tuple[Sharding, PyTree]:
        return NamedSharding(self.mesh, PartitionSpec()), _split_state(state, batch_axes(), self.mesh, self.axis)

    def lowering(self) -> primitives.Lowering:
        return primitives.Lowering(self.mesh, self.axis, self.shuffle)

    def describe(self) -> str:
        kinds = sorted({d.platform for d in self.mesh.devices.flat})
        return (f"DataParallel: environment batch split over {self.size} {'/'.join(kinds)} devices "
                f"(mesh axis {self.axis!r}), parameters replicated, {self.shuffle} minibatch shuffling")


@dataclasses.dataclass(frozen=True)
class Population(Policy):
    """A population's members split over ``pop`` devices, each member data-parallel
    over ``data`` devices: a 2-D mesh ``pop x data``. Pair it with
    ``transforms.Population``. Members never communicate; within a member, the
    ``DataParallel`` rewrite applies unchanged (same ``shuffle`` modes and exactness)."""

    pop: int | None = None
    data: int = 1
    shuffle: str = "local"
    mesh: Mesh | None = None

    def __post_init__(self) -> None:
        _set_up_mesh(self, {"pop": self.pop, "data": self.data})

    @property
    def device_count(self) -> int:
        return self.mesh.devices.size

    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes]) -> tuple[Sharding, PyTree]:
        return NamedSharding(self.mesh, PartitionSpec()), _split_state(state, batch_axes(), self.mesh, "data", "pop")

    def lowering(self) -> primitives.Lowering:
        return primitives.Lowering(self.mesh, "data", self.shuffle, population_axis="pop")

    def describe(self) -> str:
        pop, data = self.mesh.shape["pop"], self.mesh.shape["data"]
        return (f"Population: members split over {pop} devices (mesh axis 'pop'), each member's environment batch "
                f"over {data} (mesh axis 'data'), {self.shuffle} minibatch shuffling")


def _set_up_mesh(policy: DataParallel | Population, axes: dict[str, int | None]) -> None:
    """Check a mesh policy's ``shuffle``, build its mesh from ``axes`` unless one was
    given, and check that the mesh has those axes."""
    check(policy.shuffle in primitives.SHUFFLES, "shuffle", policy.shuffle,
          f"choose one of {', '.join(primitives.SHUFFLES)}")
    if policy.mesh is None:
        object.__setattr__(policy, "mesh", make_mesh(**axes))
    check(set(axes) <= set(policy.mesh.axis_names), "mesh", policy.mesh.axis_names,
          f"this policy needs mesh axes {', '.join(map(repr, axes))}")


def _split_state(state: PyTree, batch_axes: BatchAxes, mesh: Mesh, data_axis: str,
                 member_axis: str | None = None) -> PyTree:
    """Shardings for ``state``: each environment-batched field split along ``data_axis``
    on its batch axis (``Shared`` nodes excepted); with ``member_axis``, every leaf's
    leading (member) axis split along it too, and batch axes counted after it."""
    lead = 0 if member_axis is None else 1

    def spec(ndim: int, axis: int | None) -> NamedSharding:
        parts: list[str | None] = [None] * ndim
        if member_axis is not None:
            parts[0] = member_axis
        if axis is not None:
            parts[axis + lead] = data_axis
        return NamedSharding(mesh, PartitionSpec(*parts))

    def check_divides(field: str, size: int, axis_name: str, what: str) -> None:
        count = mesh.shape[axis_name]
        if size % count:
            raise ConfigError(
                "devices", count,
                f"the {what} of {size} (state field {field!r}) does not divide across {count} devices; "
                f"use a device count that divides it, or a multiple of {count}",
            )

    def field_shardings(field: str, subtree: PyTree) -> PyTree:
        axis = batch_axes.get(field)

        def place(node: Any) -> Any:
            if isinstance(node, Shared):
                return jax.tree.map(lambda x: spec(len(x.shape), None), node)
            if member_axis is not None:
                check_divides(field, node.shape[0], member_axis, "population")
            if axis is not None:
                check_divides(field, node.shape[axis + lead], data_axis, "environment batch")
            return spec(len(node.shape), axis)

        return jax.tree.map(place, subtree, is_leaf=lambda n: isinstance(n, Shared))

    return _map_fields(field_shardings, state)


def _map_fields(fn: Callable[[str, PyTree], PyTree], state: PyTree) -> PyTree:
    """Apply ``fn(field name, subtree)`` to each top-level field of a dataclass or dict state."""
    if isinstance(state, Mapping):
        return type(state)({k: fn(str(k), v) for k, v in state.items()})
    if dataclasses.is_dataclass(state):
        return dataclasses.replace(state, **{f.name: fn(f.name, getattr(state, f.name)) for f in dataclasses.fields(state)})
    return fn("", state)
