"""Jumanji's tasks with discrete actions (Bonnet et al., 2024) behind the ``Env``
protocol, as ids ``jumanji:<name>``, their action masks beside the observations.

``jumanji:Snake-v1``, ``jumanji:Game2048-v1``, ``jumanji:Maze-v0``,
``jumanji:Knapsack-v1``, ``jumanji:TSP-v1``, ``jumanji:GraphColoring-v1``, ... take
the names of Jumanji's registry (``jumanji.registered_environments()``) whose action is
one choice among ``n`` (a ``DiscreteArray``); a task whose action is several choices at
once (a ``MultiDiscreteArray``: Minesweeper, BinPack, the multi-agent tasks) is refused.
Options go to ``jumanji.make`` (``time_limit``, a ``generator``, ...).

Jumanji's observation is a structure of arrays, one of them ``action_mask`` (the actions
allowed now; Snake cannot turn back on itself, Knapsack cannot take an item twice).
Here the observation is a ``MaskedObs``: ``obs``, the structure's other arrays
flattened and concatenated in its order as one float32 vector, and ``action_mask`` (all
true for a task without one). A recipe that takes action masks acts only on allowed
actions; the others refuse these tasks (``Capabilities.masks_actions``). A step's
reward is Jumanji's; an episode ends in a termination where Jumanji's last step has
discount 0, and in a truncation where it has discount 1 (a time limit). The tasks whose
step draws no chance (``DETERMINISTIC``: Knapsack, TSP, CVRP, GraphColoring, Maze,
SlidingTilePuzzle; their key only draws an episode's instance at its reset) declare
``Capabilities.deterministic``, so a planner searches with their step (``alphazero``);
Snake's fruit, 2048's tiles and Tetris's pieces are drawn as they play.

The family reaches ``envs.make`` through this package's entry point (group
``jaxrl_frag.envs``, name ``jumanji:``); the ``jumanji`` package is an optional extra
(``pip install 'jaxrl-frag[jumanji]'``), imported only when one of its environments is
made. A few tasks (Sokoban's levels) download data when made, so they need the internet.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frag.envs import id_options
from jaxrl_frag.envs.core import Box, Capabilities, Discrete, Env, MaskedObs, PyTree, TimeStep
from jaxrl_frag.envs.family import package_module, unknown_id
from jaxrl_frag.errors import ConfigError

PREFIX = "jumanji:"
INSTALL = "pip install 'jaxrl-frag[jumanji]'"
DETERMINISTIC = ("Knapsack-v1", "TSP-v1", "CVRP-v1", "GraphColoring-v1", "Maze-v0", "SlidingTilePuzzle-v0")


def ids() -> list[str]:
    """Every id of Jumanji's registry (those with several choices at once are refused when made)."""
    return [PREFIX + name for name in importlib.import_module("jumanji").registered_environments()]


def make(env_id: str, num_envs: int | None, **options: Any) -> Env:
    """The family's factory (its entry point): one ``JumanjiEnv.make(env_id, **options)``, which
    ``envs.make`` batches (``num_envs``) and wraps."""
    del num_envs
    return JumanjiEnv.make(env_id, **options)


def _flat(observation: Any) -> jax.Array:
    """Jumanji's observation but its action mask: its arrays flattened and concatenated, in order, as float32."""
    fields = observation._asdict() if hasattr(observation, "_asdict") else vars(observation)
    leaves = jax.tree.leaves({k: v for k, v in fields.items() if k != "action_mask"})
    return jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in leaves])


@dataclasses.dataclass(frozen=True)
class JumanjiEnv(Env):
    """One Jumanji task (module docstring); ``step`` resets a finished episode itself and keeps
    the observation that ended it in ``final_obs``. Its state is Jumanji's ``(state,
    timestep)``. Equal to another made from the same id and options."""

    name: str
    options: tuple[tuple[str, Any], ...]
    env: Any = dataclasses.field(compare=False)
    num_envs: None = None

    @classmethod
    def make(cls, name: str, **options: Any) -> JumanjiEnv:
        """One environment from id ``name`` (``jumanji:<Jumanji name>``); ``options`` go to
        ``jumanji.make``.

        Raises:
            ConfigError: For an unknown id (with the closest ones), a task whose action is
                several choices at once, options that Jumanji refuses, or jumanji not
                installed (with the command that installs it).
        """
        jumanji = package_module("jumanji", name, INSTALL)
        short = name.removeprefix(PREFIX)
        if short not in jumanji.registered_environments():
            raise unknown_id(name, "Jumanji", ids())
        try:
            env = jumanji.make(short, **options)
        except TypeError as error:
            raise ConfigError("env", name, f"Jumanji refuses the options {options}: {error}") from None
        spec = env.action_spec
        if type(spec).__name__ != "DiscreteArray":
            raise ConfigError("env", name, f"acts with {type(spec).__name__} {tuple(spec.shape)} (several choices at "
                                           "once); the jumanji: family takes tasks whose action is one choice among "
                                           "n (a DiscreteArray): Snake-v1, Game2048-v1, Maze-v0, Knapsack-v1, TSP-v1, "
                                           "GraphColoring-v1, ...")
        return cls(id_options.named(name, options), tuple(sorted(options.items())), env)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(masks_actions=True, deterministic=id_options.split(self.name)[0].removeprefix(PREFIX)
                                                              in DETERMINISTIC)

    @functools.cached_property
    def observation_space(self) -> Box:
        """The vector ``obs`` of a ``MaskedObs``, unbounded (Jumanji's arrays have bounds of their own)."""
        with jax.ensure_compile_time_eval():
            (size,) = jax.eval_shape(lambda key: self.reset(key)[1].obs, jax.random.PRNGKey(0)).shape
        return Box((-np.inf,) * size, (np.inf,) * size, (size,))

    @property
    def action_space(self) -> Discrete:
        return Discrete(int(self.env.action_spec.num_values))

    def _observe(self, timestep: Any) -> MaskedObs:
        mask = getattr(timestep.observation, "action_mask", None)
        if mask is None:
            mask = jnp.ones(self.action_space.n, bool)
        return MaskedObs(_flat(timestep.observation), mask.astype(bool))

    def reset(self, key: jax.Array) -> tuple[PyTree, MaskedObs]:
        state, timestep = self.env.reset(key)
        return state, self._observe(timestep)

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        stepped, timestep = self.env.step(state, action)
        last = timestep.last()
        terminated, truncated = last & (timestep.discount == 0), last & (timestep.discount != 0)
        fresh, first = self.env.reset(key)
        state = jax.tree.map(lambda new, old: jax.lax.select(last, new, old), fresh, stepped)
        final_obs = self._observe(timestep)
        obs = jax.tree.map(lambda new, old: jnp.where(last, new, old), self._observe(first), final_obs)
        return state, TimeStep(obs, jnp.asarray(timestep.reward, jnp.float32), terminated, truncated, final_obs, {})
