"""Distribution policies: how a training program is placed on devices."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Sharding, SingleDeviceSharding


class Policy(abc.ABC):
    """Places a training program's state and compiles its functions for devices."""

    @abc.abstractmethod
    def jit(self, fn: Callable[..., Any], *, donate_argnums: Sequence[int] = ()) -> Any:
        """``fn`` jitted for this placement."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for ``explain``: the devices and how the program is spread on them."""


@dataclasses.dataclass(frozen=True)
class SingleDevice(Policy):
    """Everything on one device (by default the first one)."""

    device: jax.Device | None = None

    @property
    def sharding(self) -> Sharding:
        return SingleDeviceSharding(self.device or jax.devices()[0])

    def jit(self, fn: Callable[..., Any], *, donate_argnums: Sequence[int] = ()) -> Any:
        return jax.jit(fn, in_shardings=self.sharding, out_shardings=self.sharding,
                       donate_argnums=tuple(donate_argnums))

    def describe(self) -> str:
        device = self.device or jax.devices()[0]
        return f"SingleDevice: {device.platform}:{device.id}"
