"""gymnax 1.0 environments behind the ``Env`` protocol."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from jaxrl_frag.envs.core import Box, Discrete, Env, PyTree, Space, TimeStep

# gymnax is imported where it is first needed: importing it runs jax operations, which start jax's backend and fix
# its CPU device count before a command line can set it


@functools.cache
def ids() -> frozenset[str]:
    """gymnax's environment ids."""
    import gymnax

    return frozenset(gymnax.registered_envs)


def _space(space: Any) -> Space:
    from gymnax.environments import spaces as gymnax_spaces

    if isinstance(space, gymnax_spaces.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, gymnax_spaces.Box):
        shape = tuple(space.shape)
        low = np.broadcast_to(np.asarray(space.low, np.float64), shape).ravel().tolist()
        high = np.broadcast_to(np.asarray(space.high, np.float64), shape).ravel().tolist()
        return Box(tuple(low), tuple(high), shape)
    raise TypeError(f"gymnax space {space!r} is not supported (Discrete and Box are)")


@dataclasses.dataclass(frozen=True)
class GymnaxEnv(Env):
    """One gymnax environment; ``step`` auto-resets and keeps terminated/truncated apart.

    Equal to another made from the same id and arguments, so algorithms built
    separately on the same environment have the same structure."""

    name: str
    kwargs: tuple[tuple[str, Any], ...]
    env: Any = dataclasses.field(compare=False)
    params: Any = dataclasses.field(compare=False)
    num_envs: None = None

    @classmethod
    def make(cls, name: str, **kwargs: Any) -> GymnaxEnv:
        """One unbatched gymnax environment.

        Args:
            name: A gymnax id (``CartPole-v1``, ``Breakout-MinAtar``, ...).
            **kwargs: Passed to ``gymnax.make``.

        Returns:
            The environment, with gymnax's default parameters.
        """
        import gymnax

        env, params = gymnax.make(name, **kwargs)
        return cls(name, tuple(sorted(kwargs.items())), env, params)

    @property
    def observation_space(self) -> Box:
        with jax.ensure_compile_time_eval():  # concrete bounds even while a program is traced
            return _space(self.env.observation_space(self.params))

    @property
    def action_space(self) -> Space:
        with jax.ensure_compile_time_eval():
            return _space(self.env.action_space(self.params))

    def reset(self, key: jax.Array) -> tuple[PyTree, jax.Array]:
        obs, state = self.env.reset(key, self.params)
        return state, obs

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        obs, state, reward, terminated, truncated, info = self.env.step(key, state, action, self.params)
        final_obs = info.pop("final_observation")
        info = {k: v for k, v in info.items() if k not in ("terminated", "truncated")}
        return state, TimeStep(obs, reward, terminated, truncated, final_obs, info)
