"""gymnax 1.0 environments behind the ``Env`` protocol."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from jaxrl_frag.envs import id_options
from jaxrl_frag.envs.core import Box, Discrete, Env, PyTree, Space, TimeStep
from jaxrl_frag.errors import ConfigError

# gymnax is imported where it is first needed: importing it runs jax operations, which start jax's backend and fix
# its CPU device count before a command line can set it. Its environment modules import seaborn and pyplot, which
# only Pong's and Catch's renderers use: 1.7 s of each command's start, deferred to a render
RENDER_ONLY = ("seaborn", "matplotlib.pyplot")


class _Deferred(types.ModuleType):
    """Stands in for a module that was not imported: the first attribute read from it imports the module."""

    def __getattr__(self, name: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        module = importlib.import_module(self.__name__)
        vars(self).update(vars(module))
        return getattr(module, name)


@contextlib.contextmanager
def _deferring(names: tuple[str, ...]) -> Iterator[None]:
    """Modules imported within get stand-ins (``_Deferred``) for those of ``names`` not imported yet; they leave
    ``sys.modules`` on the way out, so a later import anywhere gets the module itself."""
    stand_ins = {name: _Deferred(name) for name in names if name not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]


@functools.cache
def _gymnax() -> types.ModuleType:
    with _deferring(RENDER_ONLY):
        import gymnax
    return gymnax


@functools.cache
def ids() -> frozenset[str]:
    """gymnax's environment ids."""
    return frozenset(_gymnax().registered_envs)


def _space(space: Any) -> Space:
    gymnax_spaces = _gymnax().environments.spaces

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
            **kwargs: Passed to ``gymnax.make`` (the environment's constructor).

        Returns:
            The environment, with gymnax's default parameters, named with ``kwargs``
            (``Breakout-MinAtar@use_minimal_action_set=false``; ``envs.id_options``).

        Raises:
            ConfigError: For ``kwargs`` the environment's constructor does not take.
        """
        named = id_options.named(name, kwargs)
        try:
            env, params = _gymnax().make(name, **kwargs)
        except TypeError as error:  # an option its constructor does not take
            if not kwargs:
                raise
            raise ConfigError("env", named, f"{name} refuses its options: {error}") from None
        return cls(named, tuple(sorted(kwargs.items())), env, params)

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
