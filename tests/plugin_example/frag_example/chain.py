"""A corridor of cells, as a pure JAX environment.

The agent starts in the leftmost cell; action 1 moves it right, action 0 left, and
with probability ``slip`` it moves the other way. Reaching the rightmost cell pays 1
and ends the episode; an episode is cut (truncated) after ``max_steps`` steps. The
observation is the cell, one-hot.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_frag import ConfigError, envs


@struct.dataclass
class ChainState:
    cell: jax.Array
    steps: jax.Array


@dataclasses.dataclass(frozen=True)
class Chain(envs.Env):
    """``length`` cells; see the module docstring."""

    name: str
    length: int = 8
    max_steps: int = 32
    slip: float = 0.1
    num_envs: None = None  # one environment; jaxrl_frag.envs.make batches it

    @property
    def observation_space(self) -> envs.Box:
        return envs.Box((0.0,) * self.length, (1.0,) * self.length, (self.length,))

    @property
    def action_space(self) -> envs.Discrete:
        return envs.Discrete(2)

    def _obs(self, cell: jax.Array) -> jax.Array:
        return jax.nn.one_hot(cell, self.length, dtype=jnp.float32)

    def reset(self, key: jax.Array) -> tuple[ChainState, jax.Array]:
        state = ChainState(jnp.int32(0), jnp.int32(0))
        return state, self._obs(state.cell)

    def step(self, key: jax.Array, state: ChainState, action: jax.Array) -> tuple[ChainState, envs.TimeStep]:
        move = jnp.where(action == 1, 1, -1) * jnp.where(jax.random.uniform(key) < self.slip, -1, 1)
        cell = jnp.clip(state.cell + move, 0, self.length - 1)
        steps = state.steps + 1
        terminated = cell == self.length - 1
        truncated = (steps >= self.max_steps) & ~terminated
        done = terminated | truncated
        final_obs = self._obs(cell)
        state = ChainState(jnp.where(done, 0, cell), jnp.where(done, 0, steps))
        return state, envs.TimeStep(self._obs(state.cell), terminated.astype(jnp.float32), terminated, truncated,
                                    final_obs, {})


def make_chain(env_id: str, num_envs: int | None = None, **options: Any) -> Chain:
    """The entry point's factory: ``Chain-v0`` (8 cells) or ``chain:<cells>``; one
    environment, which ``jaxrl_frag.envs.make`` batches (``num_envs``)."""
    if env_id == "Chain-v0":
        return Chain(env_id, **options)
    cells = env_id.partition(":")[2]
    if not (cells.isdigit() and int(cells) >= 2):
        raise ConfigError("env", env_id, "write chain:<cells>, a whole number of at least 2 cells, e.g. chain:12")
    return Chain(env_id, length=int(cells), max_steps=4 * int(cells), **options)
