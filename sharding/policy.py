"""Distribution policies: how a training program is placed on devices.

A policy turns the program's state (its shape and which of its fields carry the
environment batch, read from the fragment declarations) into shardings, and
sets how the framework primitives lower. ``Program`` does the rest with
``jax.jit``; the algorithm never sees devices.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from jaxrl_frag import primitives
from jaxrl_frag.errors import ConfigError, check
from jaxrl_frag.primitives import Shared
from jaxrl_frag.transforms.precision import check_dtype

STALENESS_MAX = 1024  # ActorLearner's: copies of the parameters queued for the actors

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


def make_mesh(devices: Sequence[jax.Device] | None = None, **axes: int | None) -> Mesh:
    """A mesh over the first of ``devices`` (default: all global devices), one named
    axis per keyword: ``make_mesh(data=4)``, ``make_mesh(pop=2, data=2)``. One axis may
    be ``None``: it takes every device the others leave."""
    available = list(jax.devices() if devices is None else devices)
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


@dataclasses.dataclass(frozen=True)
class ActorLearner(Policy):
    """MSRL's multi-actor / single-learner placement (Podracer's Sebulba): the actor
    fragments run on ``actor_devices`` devices, every other fragment on a disjoint group
    of ``learner_devices`` devices, each group data-parallel over its devices.

    The step is cut at its fragment boundaries into two programs (``partition``),
    compiled for the two groups and dispatched asynchronously on a fixed schedule.
    Each iteration the actor's results (the trajectory) move to the learner group, and
    the learner's parameters back to the actor group, as device-to-device copies, in
    ``transfer_dtype`` (``float32``, ``bfloat16``, or ``int8`` with a per-tensor scale;
    the receiver computes in float32). Narrowed are the parameters and the per-sample
    vectors of the trajectory (observations); its per-sample scalars (log-probabilities,
    values, rewards) stay float32: they are few bytes, and V-trace's importance ratios
    lose the return when they are rounded (benchmarks/RESULTS.md). With ``staleness=k`` the actor acts with the
    parameters of ``k`` updates before the learner's: ``k = 0`` runs the groups in
    turn and equals ``SingleDevice`` (float tolerance, ``exact`` shuffling, float32
    transfers); ``k >= 1`` overlaps acting and learning, the actor running one
    iteration ahead, deterministic for a given seed. The learner's ``shuffle`` is as in
    ``DataParallel``.
    """

    actor_devices: int = 1
    learner_devices: int = 1
    staleness: int = 1
    transfer_dtype: str = "float32"
    shuffle: str = "local"
    actor: DataParallel = dataclasses.field(init=False)
    learner: DataParallel = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        for name in ("actor_devices", "learner_devices"):
            value = getattr(self, name)
            check(isinstance(value, int) and value > 0, name, value, "must be a positive device count")
        check(isinstance(self.staleness, int) and self.staleness >= 0, "staleness", self.staleness,
              "must be 0 (synchronous) or a positive number of updates the actor may lag")
        check(self.staleness <= STALENESS_MAX, "staleness", self.staleness,
              f"must be at most {STALENESS_MAX}: the actors' devices hold a copy of the parameters for every update "
              "they may lag")
        check_dtype(self.transfer_dtype)
        check(jax.process_count() == 1, "policy", "ActorLearner",
              "runs within one process for now; across hosts use DataParallel or Population")
        devices = jax.devices()
        wanted = self.actor_devices + self.learner_devices
        check(wanted <= len(devices), "devices", wanted,
              f"actor_devices + learner_devices must not exceed the {len(devices)} {devices[0].platform} device(s) "
              "(on CPU the command line forces that many host devices)")
        object.__setattr__(self, "actor", DataParallel(
            mesh=make_mesh(devices[: self.actor_devices], data=self.actor_devices), shuffle=self.shuffle))
        object.__setattr__(self, "learner", DataParallel(
            mesh=make_mesh(devices[self.actor_devices: wanted], data=self.learner_devices), shuffle=self.shuffle))

    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes]) -> tuple[Sharding, PyTree]:
        """The learner group's placement; each group places its own fields (``pipeline``)."""
        return self.learner.shardings(state, batch_axes)

    def lowering(self) -> primitives.Lowering:
        return dataclasses.replace(self.learner.lowering(), roles=(("actor", self.actor.lowering()),))

    @property
    def device_count(self) -> int:
        return self.actor_devices + self.learner_devices

    def describe(self) -> str:
        def ids(group: DataParallel) -> str:
            return ",".join(str(d.id) for d in group.mesh.devices.flat)

        platform = self.actor.mesh.devices.flat[0].platform
        return (f"ActorLearner: actor fragments on {self.actor_devices} {platform} device(s) [{ids(self.actor)}], "
                f"learner fragments on {self.learner_devices} [{ids(self.learner)}], each group data-parallel; "
                f"staleness {self.staleness}, transfers in {self.transfer_dtype}, {self.shuffle} minibatch shuffling")


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
    on its batch axis (``Shared`` nodes and leaves without that axis excepted); with ``member_axis``, every leaf's
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
            split = axis if axis is not None and len(node.shape) > axis + lead else None  # counters stay whole
            if split is not None:
                check_divides(field, node.shape[split + lead], data_axis, "environment batch")
            return spec(len(node.shape), split)

        return jax.tree.map(place, subtree, is_leaf=lambda n: isinstance(n, Shared))

    return _map_fields(field_shardings, state)


def _map_fields(fn: Callable[[str, PyTree], PyTree], state: PyTree) -> PyTree:
    """Apply ``fn(field name, subtree)`` to each top-level field of a dataclass or dict state."""
    if isinstance(state, Mapping):
        return type(state)({k: fn(str(k), v) for k, v in state.items()})
    if dataclasses.is_dataclass(state):
        return dataclasses.replace(state, **{f.name: fn(f.name, getattr(state, f.name)) for f in dataclasses.fields(state)})
    return fn("", state)
