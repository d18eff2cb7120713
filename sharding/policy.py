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


def make_mesh(devices: int | None = None, axis: str = "data") -> Mesh:
    """A 1-D mesh named ``axis`` over the first ``devices`` of all (global) devices."""
    available = jax.devices()
    count = len(available) if devices is None else devices
    check(count > 0, "devices", count, "must be a positive device count")
    if count > len(available):
        raise ConfigError(
            "devices", count,
            f"only {len(available)} {available[0].platform} device(s) exist; ask for at most {len(available)} "
            "(on CPU the command line's --devices forces that many host devices)",
        )
    return Mesh(np.array(available[:count]), (axis,))


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
        check(self.shuffle in primitives.SHUFFLES, "shuffle", self.shuffle,
              f"choose one of {', '.join(primitives.SHUFFLES)}")
        if self.mesh is None:
            object.__setattr__(self, "mesh", make_mesh(self.devices, self.axis))
        check(self.axis in self.mesh.shape, "axis", self.axis, f"the mesh's axes are {tuple(self.mesh.shape)}")

    @property
    def size(self) -> int:
        return self.mesh.shape[self.axis]

    @property
    def device_count(self) -> int:
        return self.mesh.devices.size

    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes]) -> tuple[Sharding, PyTree]:
        replicated = NamedSharding(self.mesh, PartitionSpec())
        axes = batch_axes()

        def field_shardings(field: str, subtree: PyTree) -> PyTree:
            axis = axes.get(field)

            def place(node: Any) -> Any:
                if axis is None or isinstance(node, Shared):
                    return jax.tree.map(lambda _: replicated, node)
                if node.shape[axis] % self.size:
                    raise ConfigError(
                        "devices", self.size,
                        f"the environment batch of {node.shape[axis]} (state field {field!r}) does not divide across "
                        f"{self.size} devices; use a device count that divides it, or a multiple of {self.size} "
                        "environments",
                    )
                spec = [None] * len(node.shape)
                spec[axis] = self.axis
                return NamedSharding(self.mesh, PartitionSpec(*spec))

            return jax.tree.map(place, subtree, is_leaf=lambda n: isinstance(n, Shared))

        return replicated, _map_fields(field_shardings, state)

    def lowering(self) -> primitives.Lowering:
        return primitives.Lowering(self.mesh, self.axis, self.shuffle)

    def describe(self) -> str:
        kinds = sorted({d.platform for d in self.mesh.devices.flat})
        return (f"DataParallel: environment batch split over {self.size} {'/'.join(kinds)} devices "
                f"(mesh axis {self.axis!r}), parameters replicated, {self.shuffle} minibatch shuffling")


def _map_fields(fn: Callable[[str, PyTree], PyTree], state: PyTree) -> PyTree:
    """Apply ``fn(field name, subtree)`` to each top-level field of a dataclass or dict state."""
    if isinstance(state, Mapping):
        return type(state)({k: fn(str(k), v) for k, v in state.items()})
    if dataclasses.is_dataclass(state):
        return dataclasses.replace(state, **{f.name: fn(f.name, getattr(state, f.name)) for f in dataclasses.fields(state)})
    return fn("", state)
