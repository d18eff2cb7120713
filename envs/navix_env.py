"""Navix's MiniGrid tasks (Pignatelli et al., 2024) behind the ``Env`` protocol, as ids
``navix:<name>``.

``navix:Navix-Empty-5x5-v0``, ``navix:Navix-DoorKey-8x8-v0``, ``navix:Navix-FourRooms-v0``,
... take every name of Navix's registry (``navix.registry()``). The observation is
Navix's default, the whole grid symbolically (``[height, width, 3]``: each cell's
object, colour and state, as MiniGrid encodes them), as float32; ``observation_fn``
(one of ``navix.observations``: ``symbolic_first_person``, ``rgb``, ...) and
``max_steps`` (Navix's default: 100) go to ``navix.make`` as options. The seven
MiniGrid actions (turn left, turn right, forward, pick up, drop, toggle, done). A step's
reward is Navix's (1 where the goal is reached); an episode ends in a termination where
the task's termination holds (the goal reached, lava stepped on) and in a truncation at
``max_steps``. ``render`` draws the grid with Navix's sprites, for ``evaluate --video``.

The family reaches ``envs.make`` through this package's entry point (group
``jaxrl_frag.envs``, name ``navix:``); the ``navix`` package is an optional extra
(``pip install 'jaxrl-frag[navix]'``), imported only when one of its environments is
made.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frag.envs import id_options
from jaxrl_frag.envs.core import Box, Capabilities, Discrete, Env, PyTree, TimeStep
from jaxrl_frag.envs.family import package_module, unknown_id
from jaxrl_frag.errors import ConfigError, check

PREFIX = "navix:"
INSTALL = "pip install 'jaxrl-frag[navix]'"
FRAME_SECONDS = 0.2


def ids() -> list[str]:
    """Every id this family serves (Navix's registry)."""
    return [PREFIX + name for name in sorted(importlib.import_module("navix").registry())]


def make(env_id: str, num_envs: int | None, **options: Any) -> Env:
    """The family's factory (its entry point): one ``NavixEnv.make(env_id, **options)``, which
    ``envs.make`` batches (``num_envs``) and wraps."""
    del num_envs
    return NavixEnv.make(env_id, **options)


@dataclasses.dataclass(frozen=True)
class NavixEnv(Env):
    """One Navix environment (module docstring); ``step`` resets a finished episode itself and
    keeps the observation that ended it in ``final_obs``. Its state is Navix's ``Timestep``.
    Equal to another made from the same id and options."""

    name: str
    options: tuple[tuple[str, Any], ...]
    env: Any = dataclasses.field(compare=False)
    num_envs: None = None
    frame_seconds = FRAME_SECONDS

    @classmethod
    def make(cls, name: str, **options: Any) -> NavixEnv:
        """One environment from id ``name`` (``navix:<Navix name>``); ``options`` go to
        ``navix.make`` (``max_steps``, ``observation_fn``, ...).

        Raises:
            ConfigError: For an unknown id (with the closest ones), options that Navix
                refuses, a non-positive ``max_steps``, or navix not installed (with the
                command that installs it).
        """
        navix = package_module("navix", name, INSTALL)
        short = name.removeprefix(PREFIX)
        if short not in navix.registry():
            raise unknown_id(name, "Navix", ids())
        steps = options.get("max_steps", 100)
        check(isinstance(steps, int | np.integer) and steps > 0, "max_steps", steps, "must be a positive integer")
        try:
            env = navix.make(short, **options)
        except TypeError as error:
            raise ConfigError("env", name, f"Navix refuses the options {options}: {error}") from None
        return cls(id_options.named(name, options), tuple(sorted(options.items(), key=lambda item: item[0])), env)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(renders=True)

    @property
    def max_steps(self) -> int:
        """The time limit in steps."""
        return int(self.env.max_steps)

    @property
    def observation_space(self) -> Box:
        space = self.env.observation_space
        shape = tuple(space.shape)
        size = int(np.prod(shape))
        if np.dtype(space.dtype) == np.uint8:  # Navix's bound for symbolic grids is below its agent's code (10)
            low, high = 0.0, 255.0
        else:
            with jax.ensure_compile_time_eval():
                low, high = float(space.minimum), float(space.maximum)
        return Box((low,) * size, (high,) * size, shape)

    @property
    def action_space(self) -> Discrete:
        return Discrete(len(self.env.action_set))

    def reset(self, key: jax.Array) -> tuple[PyTree, jax.Array]:
        timestep = self.env.reset(key)
        return timestep, timestep.observation.astype(jnp.float32)

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        stepped = self.env._step(state, action)  # Navix's step without its reset on the step after an episode's end
        terminated, truncated = stepped.is_termination(), stepped.is_truncation()
        done = terminated | truncated
        fresh = self.env.reset(key)
        state = jax.tree.map(lambda new, old: jax.lax.select(done, new, old), fresh, stepped)
        final_obs = stepped.observation.astype(jnp.float32)
        obs = jnp.where(done, state.observation.astype(jnp.float32), final_obs)
        return state, TimeStep(obs, jnp.asarray(stepped.reward, jnp.float32), terminated, truncated, final_obs, {})

    def render(self, states: PyTree) -> np.ndarray:
        """The whole grid of each of ``states`` (one environment's, stacked ``[T, ...]``) with
        Navix's sprites: ``uint8 [T, H, W, 3]``."""
        rgb = importlib.import_module("navix").observations.rgb
        return np.asarray(jax.jit(jax.vmap(lambda timestep: rgb(timestep.state)))(states))
