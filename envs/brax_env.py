"""Brax environments behind the ``Env`` protocol, as ids ``brax:<name>``.

Only ``brax.envs`` is used (not ``brax.training``), and only when a Brax
environment is made: importing brax is slow and prints import warnings. The time
limit and action repeat are kept here rather than in Brax's ``EpisodeWrapper``,
which goes on stepping the physics for the rest of a repeat after a termination:
here a termination ends the repeat, reaching the time limit is a truncation (never
a termination), and ``step`` resets a finished episode itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import re
import sys
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_frag.envs import id_options
from jaxrl_frag.envs.core import Box, Env, PyTree, TimeStep
from jaxrl_frag.envs.family import unknown_id
from jaxrl_frag.errors import check

PREFIX = "brax:"
# the physics environments of brax 0.14 (``brax.envs``' registry less its test environment "fast")
NAMES = (
    "ant", "halfcheetah", "hopper", "humanoid", "humanoidstandup", "inverted_double_pendulum", "inverted_pendulum",
    "pusher", "reacher", "swimmer", "walker2d",
)
BACKENDS = ("generalized", "positional", "spring", "mjx")
# what mujoco.mjx (which brax imports) prints on stdout, once per module, where the optional NVIDIA warp is not
# installed: a notice, not an error (a warp that is installed and fails to load is still reported)
_WARP_ABSENT = re.compile(r"Failed to import (mujoco_)?warp: No module named '(warp|mujoco_warp)[\w.]*'")


def import_brax_envs() -> ModuleType:
    """``brax.envs``, imported without mujoco.mjx's notices that the optional warp package is
    absent; whatever else the import prints reaches stdout as it would have."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return importlib.import_module("brax.envs")
    finally:
        sys.stdout.write("".join(line for line in printed.getvalue().splitlines(keepends=True)
                                 if not _WARP_ABSENT.fullmatch(line.rstrip("\n"))))


def ids() -> list[str]:
    """Every Brax environment id that ``make`` accepts."""
    return [PREFIX + name for name in NAMES]


@struct.dataclass
class BraxState:
    inner: Any  # brax.envs.State, with float32 reward and done
    steps: jax.Array  # physics-environment steps taken in this episode


@dataclasses.dataclass(frozen=True)
class BraxEnv(Env):
    """One Brax environment; ``step`` repeats the action ``action_repeat`` times, auto-resets,
    and keeps terminated (the environment's ``done``) apart from truncated (``episode_length``
    steps of the physics environment reached, counting every repeat).

    Actions lie in [-1, 1] per dimension; observations are unbounded vectors. Equal to
    another made from the same id and arguments."""

    name: str
    backend: str
    episode_length: int
    action_repeat: int
    env: Any = dataclasses.field(compare=False)
    obs_size: int = dataclasses.field(compare=False)
    num_envs: None = None

    @classmethod
    def make(cls, name: str, *, backend: str = "generalized", episode_length: int = 1000,
             action_repeat: int = 1) -> BraxEnv:
        """``brax:<name>`` with physics ``backend``; ``ConfigError`` for an unknown name or
        backend or a non-positive length or repeat, before brax is imported. Named with the
        options that differ from these defaults (``brax:ant@backend=positional``; ``envs.id_options``),
        which ``envs.make`` takes in the id.

        Args:
            name: The id, ``brax:<name>`` (``brax:hopper``; the prefix may be left out).
            backend: The physics: ``generalized``, ``positional``, ``spring`` or ``mjx``.
            episode_length: Physics steps (every repeat counted) after which an episode
                is truncated.
            action_repeat: Physics steps per ``step``, each with the same action.

        Returns:
            One unbatched environment.

        Raises:
            ConfigError: For an unknown name or backend, or a length or repeat that is
                not a positive integer.
        """
        short = name.removeprefix(PREFIX)
        if short not in NAMES:
            raise unknown_id(name, "Brax", ids())
        check(backend in BACKENDS, "backend", backend, f"unknown Brax physics backend; choose one of {', '.join(BACKENDS)}")
        for field, value in (("episode_length", episode_length), ("action_repeat", action_repeat)):
            check(isinstance(value, int | np.integer) and value > 0, field, value, "must be a positive integer")
        env = import_brax_envs().get_environment(short, backend=backend)
        obs = jax.eval_shape(env.reset, jax.random.PRNGKey(0)).obs
        options = {"backend": backend, "episode_length": int(episode_length), "action_repeat": int(action_repeat)}
        defaults = inspect.signature(cls.make).parameters
        named = id_options.named(name, {option: v for option, v in options.items() if v != defaults[option].default})
        return cls(named, **options, env=env, obs_size=int(obs.shape[-1]))

    @property
    def observation_space(self) -> Box:
        n = self.obs_size
        return Box((-np.inf,) * n, (np.inf,) * n, (n,))

    @property
    def action_space(self) -> Box:
        n = self.env.action_size
        return Box((-1.0,) * n, (1.0,) * n, (n,))

    def reset(self, key: jax.Array) -> tuple[BraxState, jax.Array]:
        inner = self._normalized(self.env.reset(key))
        return BraxState(inner, jnp.zeros((), jnp.int32)), inner.obs

    def step(self, key: jax.Array, state: BraxState, action: jax.Array) -> tuple[BraxState, TimeStep]:
        def physics_step(carry: tuple[Any, jax.Array, jax.Array], _: None) -> tuple[Any, None]:
            inner, reward, terminated = carry
            stepped = self._normalized(self.env.step(inner, action))
            # after a termination the rest of the repeat is skipped
            inner = jax.tree.map(lambda old, new: jnp.where(terminated, old, new), inner, stepped)
            reward = reward + jnp.where(terminated, 0.0, stepped.reward)
            return (inner, reward, terminated | (stepped.done > 0)), None

        start = (state.inner, jnp.zeros((), jnp.float32), jnp.zeros((), bool))
        (inner, reward, terminated), _ = jax.lax.scan(physics_step, start, None, self.action_repeat)
        steps = state.steps + self.action_repeat
        truncated = (steps >= self.episode_length) & ~terminated
        done = terminated | truncated
        fresh, fresh_obs = self.reset(key)
        state = jax.tree.map(lambda new, old: jnp.where(done, new, old), fresh, BraxState(inner, steps))
        obs = jnp.where(done, fresh_obs, inner.obs)
        return state, TimeStep(obs, reward, terminated, truncated, inner.obs, {})

    @staticmethod
    def _normalized(inner: PyTree) -> PyTree:
        """``inner`` with float32 reward and done (some environments return Python floats)."""
        return inner.replace(reward=jnp.asarray(inner.reward, jnp.float32), done=jnp.asarray(inner.done, jnp.float32))
