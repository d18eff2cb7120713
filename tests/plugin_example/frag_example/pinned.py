"""A distribution policy of a user's own: the whole program on one chosen device (a
particular GPU of a machine, say), as a package would add one to ``--policy``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
from jax.sharding import Sharding, SingleDeviceSharding

from jaxrl_frag.errors import check
from jaxrl_frag.policy import BatchAxes, NamedAxes, Policy

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Pinned(Policy):
    """Everything on device ``device_index`` of ``jax.devices()``."""

    name: ClassVar[str] = "pinned"
    devices: int | None = dataclasses.field(default=None, metadata={
        "help": "devices the process has, to choose from (on CPU, forces that many host devices)"})
    device_index: int = dataclasses.field(default=0, metadata={"help": "the device to run on: an index into jax.devices()"})

    def __post_init__(self) -> None:
        count = len(jax.devices())
        check(0 <= self.device_index < count, "device_index", self.device_index,
              f"this process has {count} devices: choose one of 0 to {count - 1}")

    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes],
                  named_axes: NamedAxes) -> tuple[Sharding, PyTree]:
        sharding = SingleDeviceSharding(jax.devices()[self.device_index])
        return sharding, jax.tree.map(lambda _: sharding, state)

    def describe(self) -> str:
        device = jax.devices()[self.device_index]
        return f"Pinned: {device.platform}:{device.id}"
