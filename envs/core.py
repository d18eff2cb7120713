"""The environment protocol: pure, batched-by-wrapper, auto-resetting.

An environment object holds no state. ``reset`` and ``step`` are pure functions
of a key and a state pytree, so they trace into XLA programs and compose with
``vmap``. ``step`` resets a finished episode itself and reports the observation
that ended it in ``TimeStep.final_obs``: on a time-limit truncation a value
target bootstraps from V(final_obs); on a termination it does not.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import numpy as np

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Discrete:
    """``n`` actions, ``0 .. n-1``."""

    n: int

    @property
    def shape(self) -> tuple[int, ...]:
        return ()


@dataclasses.dataclass(frozen=True)
class Box:
    """A real vector in ``[low, high]`` per dimension."""

    low: tuple[float, ...]
    high: tuple[float, ...]
    shape: tuple[int, ...]
    dtype: Any = np.float32


Space = Discrete | Box


class TimeStep(NamedTuple):
    """What one environment step returns besides the new state.

    ``obs`` is the next observation, already reset where the episode ended;
    ``final_obs`` is the observation that ended it (equal to ``obs`` elsewhere).
    """

    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array
    info: dict[str, jax.Array]

    @property
    def done(self) -> jax.Array:
        return self.terminated | self.truncated


class Env:
    """Base of every environment and wrapper.

    Subclasses are frozen dataclasses, so an environment is hashable and can sit
    in a static field of an algorithm.
    """

    name: str  # the id it was made from
    num_envs: int | None  # batch size; None for one unbatched environment

    @property
    def observation_space(self) -> Box:
        raise NotImplementedError

    @property
    def action_space(self) -> Space:
        raise NotImplementedError

    def reset(self, key: jax.Array) -> tuple[PyTree, jax.Array]:
        """Returns ``(state, obs)``."""
        raise NotImplementedError

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        """Returns ``(state, timestep)``; a finished episode is reset in the same call."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Wrapper(Env):
    """An environment around ``inner``; by default everything passes through."""

    inner: Env

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not yet set during unpickling/copy
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def observation_space(self) -> Box:
        return self.inner.observation_space

    @property
    def action_space(self) -> Space:
        return self.inner.action_space

    def reset(self, key: jax.Array) -> tuple[PyTree, jax.Array]:
        return self.inner.reset(key)

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        return self.inner.step(key, state, action)
