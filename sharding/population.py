"""``PopulationParallel``: a population's members over one mesh axis, each member
data-parallel over another."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from jaxrl_frag import primitives
from jaxrl_frag.policy import BatchAxes, NamedAxes, Policy
from jaxrl_frag.sharding.data_parallel import SHUFFLE_HELP
from jaxrl_frag.sharding.mesh import check_runs, set_up_mesh, split_state

PyTree = Any


@dataclasses.dataclass(frozen=True)
class MemberLowering(primitives.Lowering):
    """``DataParallel``'s lowering, with a vmap over a population's members split along
    the mesh axis ``member_axis`` (constraints inside a member keep it there)."""

    member_axis: str = "pop"

    @property
    def spmd_axis_name(self) -> str | None:
        """``member_axis``."""
        return self.member_axis


@dataclasses.dataclass(frozen=True)
class PopulationParallel(Policy):
    """A population's members split over ``pop`` devices, each member data-parallel
    over ``data`` devices: a 2-D mesh ``pop x data``. Pair it with
    ``transforms.Population``. Members never communicate; within a member, the
    ``DataParallel`` rewrite applies unchanged (same ``shuffle`` modes and exactness)."""

    name: ClassVar[str] = "population"
    # places a population's members (``sharding.runs``); not boosted members: their controller's state is not
    # declared to its placement (a population of boosted runs runs on one device, ``SingleDevice``)
    populations: ClassVar[str] = "required"
    boosts: ClassVar[bool] = False
    pop: int | None = dataclasses.field(default=None, metadata={
        "flag": "devices", "help": "devices to split the members over (default: all)"})
    data: int = 1
    shuffle: str = dataclasses.field(default="local", metadata={"choices": primitives.SHUFFLES, "help": SHUFFLE_HELP})
    mesh: Mesh | None = None

    def __post_init__(self) -> None:
        set_up_mesh(self, {"pop": self.pop, "data": self.data})

    @property
    def device_count(self) -> int:
        return self.mesh.devices.size

    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes],
                  named_axes: NamedAxes) -> tuple[Sharding, PyTree]:
        """Every leaf's member axis split along ``pop``, environment-batched fields along ``data`` too."""
        return NamedSharding(self.mesh, PartitionSpec()), split_state(state, batch_axes(), self.mesh, "data", "pop", named_axes)

    def executor(self, algorithm: Any, max_rows: int, check_finite: bool) -> Any:
        """The SPMD program, for a population (``populations``)."""
        check_runs(self, algorithm)
        return super().executor(algorithm, max_rows, check_finite)

    def lowering(self) -> primitives.Lowering:
        """As ``DataParallel`` over ``data``, members kept on ``pop``."""
        return MemberLowering(self.mesh, "data", self.shuffle)

    def describe(self) -> str:
        """The member and data axes and the shuffling."""
        pop, data = self.mesh.shape["pop"], self.mesh.shape["data"]
        return (f"Population: members split over {pop} devices (mesh axis 'pop'), each member's environment batch "
                f"over {data} (mesh axis 'data'), {self.shuffle} minibatch shuffling")
