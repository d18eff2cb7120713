"""XLand-MiniGrid's MiniGrid tasks (Nikulin et al., NeurIPS 2024) behind the ``Env`` protocol, as ids
``xminigrid:<name>``.

``xminigrid:MiniGrid-Empty-8x8``, ``xminigrid:MiniGrid-DoorKey-5x5``,
``xminigrid:MiniGrid-FourRooms``, ... take the ``MiniGrid-*`` names of XLand-MiniGrid's
registry (its ``XLand-MiniGrid-*`` tasks need a benchmark of rulesets downloaded from the
network, and are not served). The observation is XLand-MiniGrid's: the agent's field of
view (``[view, view, 2]``: each cell's tile and colour; 7x7 by default), as float32; six
actions (forward, turn right, turn left, pick up, put down, toggle). The reward is
XLand-MiniGrid's, MiniGrid's ``1 - 0.9 * steps / max_steps`` where the goal is reached,
which terminates; ``max_steps`` (the task's default, ``4 * height * width`` for most)
truncates. Options replace fields of its ``EnvParams`` (``max_steps``, ``view_size``).
``render`` draws the grid with XLand-MiniGrid's renderer, for ``evaluate --video``.

The family reaches ``envs.make`` through this package's entry point (group
``jaxrl_frag.envs``, name ``xminigrid:``); the ``xminigrid`` package is an optional extra
(``pip install 'jaxrl-frag[xminigrid]'``), imported only when one of its environments is
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
from jaxrl_frag.envs.family import check_parameters, package_module, unknown_id
from jaxrl_frag.errors import check

PREFIX = "xminigrid:"
INSTALL = "pip install 'jaxrl-frag[xminigrid]'"
FRAME_SECONDS = 0.2


def ids() -> list[str]:
    """Every id this family serves (the ``MiniGrid-*`` names of XLand-MiniGrid's registry)."""
    names = importlib.import_module("xminigrid").registered_environments()
    return [PREFIX + name for name in names if name.startswith("MiniGrid-")]


def make(env_id: str, num_envs: int | None, **options: Any) -> Env:
    """The family's factory (its entry point): one ``XMiniGridEnv.make(env_id, **options)``, which
    ``envs.make`` batches (``num_envs``) and wraps."""
    del num_envs
    return XMiniGridEnv.make(env_id, **options)


@dataclasses.dataclass(frozen=True)
class XMiniGridEnv(Env):
    """One XLand-MiniGrid task (module docstring); ``step`` resets a finished episode itself and
    keeps the observation that ended it in ``final_obs``. Its state is XLand-MiniGrid's
    ``TimeStep``. Equal to another made from the same id and options."""

    name: str
    options: tuple[tuple[str, Any], ...]
    env: Any = dataclasses.field(compare=False)
    params: Any = dataclasses.field(compare=False)
    num_envs: None = None
    frame_seconds = FRAME_SECONDS

    @classmethod
    def make(cls, name: str, **options: Any) -> XMiniGridEnv:
        """One environment from id ``name`` (``xminigrid:MiniGrid-<task>``); ``options`` replace
        fields of XLand-MiniGrid's ``EnvParams`` (``max_steps``, ``view_size``).

        Raises:
            ConfigError: For an unknown id (with the closest ones), an option its
                parameters do not have, a non-positive ``max_steps``, or xminigrid not
                installed (with the command that installs it).
        """
        xminigrid = package_module("xminigrid", name, INSTALL)
        short = name.removeprefix(PREFIX)
        if PREFIX + short not in ids():
            raise unknown_id(name, "XLand-MiniGrid", ids())
        env, params = xminigrid.make(short)
        check_parameters(name, "XLand-MiniGrid", options, [f.name for f in dataclasses.fields(params)
                                                           if f.name != "render_mode"])
        steps = options.get("max_steps", params.max_steps)
        check(isinstance(steps, int | np.integer) and steps > 0, "max_steps", steps, "must be a positive integer")
        return cls(id_options.named(name, options), tuple(sorted(options.items())), env, params.replace(**options))

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(renders=True)

    @property
    def max_steps(self) -> int:
        """The time limit in steps."""
        return int(self.params.max_steps)

    @property
    def observation_space(self) -> Box:
        shape = tuple(self.env.observation_shape(self.params))
        size = int(np.prod(shape))
        return Box((0.0,) * size, (255.0,) * size, shape)

    @property
    def action_space(self) -> Discrete:
        return Discrete(int(self.env.num_actions(self.params)))

    def reset(self, key: jax.Array) -> tuple[PyTree, jax.Array]:
        timestep = self.env.reset(self.params, key)
        return timestep, timestep.observation.astype(jnp.float32)

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        stepped = self.env.step(self.params, state, action)
        terminated = stepped.discount == 0  # the goal reached; the time limit keeps the discount at 1
        done = stepped.last()
        truncated = done & ~terminated
        fresh = self.env.reset(self.params, key)
        state = jax.tree.map(lambda new, old: jax.lax.select(done, new, old), fresh, stepped)
        final_obs = stepped.observation.astype(jnp.float32)
        obs = jnp.where(done, state.observation.astype(jnp.float32), final_obs)
        return state, TimeStep(obs, jnp.asarray(stepped.reward, jnp.float32), terminated, truncated, final_obs, {})

    def render(self, states: PyTree) -> np.ndarray:
        """The whole grid of each of ``states`` (one environment's, stacked ``[T, ...]``) with
        XLand-MiniGrid's renderer, the agent's field of view shaded: ``uint8 [T, H, W, 3]``."""
        states = jax.device_get(states)
        count = len(states.step_type)
        return np.stack([np.asarray(self.env.render(self.params, jax.tree.map(lambda x, t=t: x[t], states)), np.uint8)
                         for t in range(count)])
