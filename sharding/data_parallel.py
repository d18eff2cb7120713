"""``DataParallel``: Anakin-style data parallelism over one mesh axis."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from jaxrl_frag import primitives
from jaxrl_frag.envs.core import AGENT_AXIS
from jaxrl_frag.errors import check
from jaxrl_frag.policy import BatchAxes, NamedAxes, Policy
from jaxrl_frag.sharding.mesh import check_runs, set_up_mesh, split_state

PyTree = Any
SHUFFLE_HELP = ("minibatch shuffling: local (each device its own samples, no trajectory traffic) or exact (equals "
                "single-device; moves samples)")


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

    name: ClassVar[str] = "data-parallel"
    # splits one run's environment batch; a population's member axis and a boosted run's rungs (slices of its
    # environment pool, which would not split evenly) are not placed (``sharding.runs``)
    populations: ClassVar[str] = "refused"
    boosts: ClassVar[bool] = False
    devices: int | None = dataclasses.field(default=None, metadata={
        "help": "devices to split the environment batch over (default: all)"})
    shuffle: str = dataclasses.field(default="local", metadata={"choices": primitives.SHUFFLES, "help": SHUFFLE_HELP})
    agent_shards: int = dataclasses.field(default=1, metadata={
        "help": "of the devices, how many split the state an algorithm keeps per agent (parameters per agent and "
                "their optimizer state) over a second mesh axis 'agents'; the environment batch is split over the "
                "devices // agent_shards of the other axis"})
    axis: str = "data"
    mesh: Mesh | None = None

    def __post_init__(self) -> None:
        check(self.agent_shards > 0, "agent_shards", self.agent_shards, "must be a positive device count")
        if self.agent_shards == 1:
            set_up_mesh(self, {self.axis: self.devices})
            return
        devices = self.devices or (len(self.mesh.devices.flat) if self.mesh is not None else jax.device_count())
        check(devices % self.agent_shards == 0, "agent_shards", self.agent_shards,
              f"must divide devices={devices}: the mesh is devices // agent_shards x agent_shards")
        data = devices // self.agent_shards
        set_up_mesh(self, {self.axis: data, AGENT_AXIS: self.agent_shards})

    @property
    def size(self) -> int:
        return self.mesh.shape[self.axis]

    @property
    def device_count(self) -> int:
        return self.mesh.devices.size

    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes],
                  named_axes: NamedAxes) -> tuple[Sharding, PyTree]:
        """Replicated over the mesh; environment-batched fields split along ``axis``, and
        an algorithm's per-agent fields along the ``agents`` axis where the mesh has one."""
        check(AGENT_AXIS not in self.mesh.axis_names or AGENT_AXIS in named_axes, "agent_shards",
              self.mesh.shape.get(AGENT_AXIS), f"the algorithm declares no state with an {AGENT_AXIS!r} axis to split "
              "(a multi-agent recipe keeps its parameters per agent with --no-shared-params): drop --agent-shards")
        return NamedSharding(self.mesh, PartitionSpec()), split_state(
            state, batch_axes(), self.mesh, self.axis, named_axes=named_axes, settings={AGENT_AXIS: "agent_shards"})

    def executor(self, algorithm: Any, max_rows: int, check_finite: bool) -> Any:
        """The SPMD program, for an algorithm this policy runs (``populations``)."""
        check_runs(self, algorithm)
        return super().executor(algorithm, max_rows, check_finite)

    def lowering(self) -> primitives.Lowering:
        """The primitives over the batch split along ``axis``, shuffled as ``shuffle`` says."""
        return primitives.Lowering(self.mesh, self.axis, self.shuffle)

    def describe(self) -> str:
        """The devices, the mesh axes and the shuffling."""
        kinds = sorted({d.platform for d in self.mesh.devices.flat})
        if AGENT_AXIS in self.mesh.axis_names:
            return (f"DataParallel: {self.device_count} {'/'.join(kinds)} devices as a mesh of {self.size} "
                    f"(axis {self.axis!r}: the environment batch) x {self.mesh.shape[AGENT_AXIS]} (axis "
                    f"{AGENT_AXIS!r}: state kept per agent), the rest replicated, {self.shuffle} minibatch shuffling")
        return (f"DataParallel: environment batch split over {self.size} {'/'.join(kinds)} devices "
                f"(mesh axis {self.axis!r}), parameters replicated, {self.shuffle} minibatch shuffling")
