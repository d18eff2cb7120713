"""JaxMARL's multi-agent environments behind the ``Env`` protocol, agents as an array axis.

``jaxmarl:<name>`` takes JaxMARL's registered names (``jaxmarl:MPE_simple_spread_v3``,
``jaxmarl:overcooked``, ...), and ``jaxmarl:SMAX_<scenario>`` a SMAX unit-list scenario
(``SMAX_3m``, ``SMAX_2s3z``, any name of ``jaxmarl.environments.smax.map_name_to_scenario``)
against JaxMARL's heuristic enemy, with the settings of JaxMARL's SMAX baselines
(``SMAX_SETTINGS``). The family reaches ``envs.make`` through this package's own entry
point (group ``jaxrl_frag.envs``, name ``jaxmarl:``), as any plugin's would; jaxmarl is
imported only when one of its environments is made.

Each agent's observation is flattened and zero-padded to the longest
(``AgentObs.obs``; ``observation_mask`` says which entries are an agent's own); the
global state is the environment's own world state where it has one (SMAX), else every
agent's padded observation side by side (JaxMARL's ``MPEWorldStateWrapper``); the
action mask is the environment's available actions, padded to the most actions of any
agent. An episode ends when JaxMARL's ``dones["__all__"]`` says so: for every agent a
truncation where the time limit ended it (SMAX: the battle undecided, both sides
standing; the others: at the environment's ``max_steps``, or MABrax's ``episode_length``),
and a termination otherwise; besides, an agent whose own ``dones`` entry is set (a SMAX
unit that dies) terminates on its own while the others go on. MABrax environments are
made without JaxMARL's auto-reset, which this adapter does itself.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_frag.envs import id_options
from jaxrl_frag.envs.core import AgentObs, Box, Discrete, Env, PyTree, Space, TimeStep
from jaxrl_frag.envs.wrappers import VecEnv
from jaxrl_frag.errors import ConfigError, check, did_you_mean

PREFIX = "jaxmarl:"
SMAX = "SMAX_"
# JaxMARL's SMAX baselines (baselines/IPPO/config/ippo_rnn_smax.yaml, baselines/MAPPO/config/mappo_homogenous_rnn_smax.yaml)
SMAX_SETTINGS = dict(see_enemy_actions=True, walls_cause_death=True, attack_mode="closest")
_NOT_SERVED = ("SMAX", "HeuristicEnemySMAX", "LearnedPolicyEnemySMAX")  # served as SMAX_<scenario>


@functools.cache
def _jaxmarl() -> Any:
    """The ``jaxmarl`` module, imported once without the lines it prints (after its
    ``mabrax`` module has set ``sys.stdout`` to ``sys.__stdout__``) and with the streams
    it replaces put back (so a caller's captured ``sys.stderr`` stays captured)."""
    streams = sys.stdout, sys.stderr, sys.__stdout__
    try:
        sys.stdout = sys.__stdout__ = io.StringIO()
        import jaxmarl
    finally:
        sys.stdout, sys.stderr, sys.__stdout__ = streams
    return jaxmarl


def _smax_scenarios() -> dict[str, Any]:
    _jaxmarl()
    from jaxmarl.environments.smax.smax_env import MAP_NAME_TO_SCENARIO

    return MAP_NAME_TO_SCENARIO


def _families() -> list[str]:
    return [name for name in _jaxmarl().registered_envs if name not in _NOT_SERVED]


def _mabrax_names() -> list[str]:
    _jaxmarl()
    from jaxmarl.environments.mabrax.mappings import _agent_action_mapping

    return list(_agent_action_mapping)


def is_mabrax(env_id: str) -> bool:
    """Whether ``env_id`` is one of JaxMARL's MABrax environments (``jaxmarl:ant_4x2``, ...)."""
    return env_id.startswith(PREFIX) and env_id.removeprefix(PREFIX) in _mabrax_names()


def ids() -> list[str]:
    """Every id this family serves."""
    return [PREFIX + name for name in (*_families(), *(SMAX + s for s in _smax_scenarios()))]


def make(env_id: str, num_envs: int | None, **options: Any) -> Env:
    """The family's factory (its entry point): ``num_envs`` copies of ``JaxMarlEnv.make(env_id,
    **options)`` stepped with ``vmap``, or one without ``num_envs``."""
    env = JaxMarlEnv.make(env_id, **options)
    return env if num_envs is None else VecEnv(env, num_envs)


def _space(space: Any) -> Space:
    from jaxmarl.environments import spaces

    if isinstance(space, spaces.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, spaces.Box):
        shape = tuple(space.shape)
        low = np.broadcast_to(np.asarray(space.low, np.float64), shape).ravel().tolist()
        high = np.broadcast_to(np.asarray(space.high, np.float64), shape).ravel().tolist()
        return Box(tuple(low), tuple(high), shape)
    raise TypeError(f"JaxMARL space {space!r} is not supported (Discrete and Box are)")


@struct.dataclass
class JaxMarlState:
    inner: PyTree
    agent_returns: jax.Array  # [agents], of the episode so far
    length: jax.Array


@dataclasses.dataclass(frozen=True)
class JaxMarlEnv(Env):
    """One JaxMARL environment: observations ``AgentObs``, actions, rewards,
    ``terminated`` and ``truncated`` ``[agents, ...]``; ``step`` resets a finished
    episode itself and keeps its last observation in ``final_obs``.

    ``info``: ``episode_done``, and where it is true the episode's ``episode_return``
    (the mean of the agents' returns: the team's return per agent, the shared
    return where the reward is shared), ``episode_length``, each agent's
    ``episode_return_agent<i>`` and, for SMAX, ``episode_won`` (1 where the battle is won:
    every enemy unit down, one of ours standing). Equal to another made from the same id
    and options.
    """

    name: str
    options: tuple[tuple[str, Any], ...]
    env: Any = dataclasses.field(compare=False)
    smax: bool = False
    num_envs: None = None

    @classmethod
    def make(cls, name: str, **options: Any) -> JaxMarlEnv:
        """One environment from id ``name`` (``jaxmarl:<JaxMARL name>`` or ``jaxmarl:SMAX_<scenario>``);
        ``options`` go to JaxMARL's constructor.

        Raises:
            ConfigError: For an unknown id (with the closest ones), or agents whose
                actions cannot be stacked on one axis (discrete beside continuous, or
                continuous of different shapes).
        """
        jaxmarl = _jaxmarl()
        named = id_options.named(name, options)
        short = name.removeprefix(PREFIX)
        smax = short.startswith(SMAX) and short.removeprefix(SMAX) in _smax_scenarios()
        try:
            if smax:
                from jaxmarl.environments.smax import map_name_to_scenario

                scenario = map_name_to_scenario(short.removeprefix(SMAX))
                inner = jaxmarl.make("HeuristicEnemySMAX", scenario=scenario, **{**SMAX_SETTINGS, **options})
            elif short in _families():
                if short in _mabrax_names():  # the reset is this adapter's, so that final_obs is the episode's last
                    options = {**options, "auto_reset": False}
                inner = jaxmarl.make(short, **options)
            else:
                raise ConfigError("env", name, f"unknown JaxMARL environment; {did_you_mean(name, ids())}JaxMARL's names "
                                               f"are {', '.join(PREFIX + n for n in _families())}, and SMAX scenarios "
                                               f"{PREFIX}{SMAX}<scenario> for {', '.join(_smax_scenarios())}")
        except TypeError as error:  # an option its constructor does not take
            raise ConfigError("env", named, f"JaxMARL refuses the options: {error}") from None
        env = cls(named, tuple(sorted(options.items())), inner, smax)
        env._check_stackable()
        return env

    def _check_stackable(self) -> None:
        with jax.ensure_compile_time_eval():
            spaces = {a: _space(self.env.action_space(a)) for a in self.agents}
        kinds = {type(s) for s in spaces.values()}
        check(len(kinds) == 1, "env", self.name, f"mixes discrete and continuous actions across agents ({spaces}): "
                                                 "its agents cannot be stacked on one axis")
        shapes = {a: s.shape for a, s in spaces.items()}
        check(kinds == {Discrete} or len(set(shapes.values())) == 1, "env", self.name,
              f"has continuous actions of different shapes per agent ({shapes}): its agents cannot be stacked on "
              "one axis")

    @property
    def agents(self) -> list[str]:
        """JaxMARL's names of the agents, in the order of the agents axis."""
        return list(self.env.agents)

    @property
    def num_agents(self) -> int:
        return len(self.env.agents)

    @property
    def _obs_sizes(self) -> list[int]:
        with jax.ensure_compile_time_eval():
            return [int(np.prod(self.env.observation_space(a).shape)) for a in self.agents]

    @property
    def max_steps(self) -> int | None:
        """The time limit in steps, where the environment has one (JaxMARL's ``max_steps``,
        or MABrax's ``episode_length``)."""
        return getattr(self.env, "max_steps", None) or getattr(self.env, "episode_length", None)

    @property
    def observation_mask(self) -> np.ndarray:
        """``[agents, D]``: true where an entry of ``AgentObs.obs`` is the agent's own,
        false where it pads a shorter observation to the longest."""
        sizes = self._obs_sizes
        return np.arange(max(sizes))[None, :] < np.asarray(sizes)[:, None]

    @property
    def observation_space(self) -> Box:
        """Of ``AgentObs.obs``: ``[agents, D]``, D the longest observation."""
        shape = (self.num_agents, max(self._obs_sizes))
        size = int(np.prod(shape))
        return Box((-np.inf,) * size, (np.inf,) * size, shape)

    @property
    def state_space(self) -> Box:
        """Of the global state, ``AgentObs.state``."""
        with jax.ensure_compile_time_eval():
            size = int(jax.eval_shape(self.reset, jax.random.PRNGKey(0))[1].state.shape[-1])
        return Box((-np.inf,) * size, (np.inf,) * size, (size,))

    @property
    def action_space(self) -> Space:
        """One agent's: discrete with the most actions of any agent, or the agents' common box."""
        with jax.ensure_compile_time_eval():
            spaces = [_space(self.env.action_space(a)) for a in self.agents]
        if isinstance(spaces[0], Discrete):
            return Discrete(max(s.n for s in spaces))
        return spaces[0]

    def _observe(self, inner: PyTree, raw: dict[str, jax.Array]) -> AgentObs:
        width = max(self._obs_sizes)
        obs = jnp.stack([jnp.pad(raw[a].reshape(-1), (0, width - raw[a].size)) for a in self.agents]).astype(jnp.float32)
        state = raw["world_state"].reshape(-1) if "world_state" in raw else obs.reshape(-1)
        return AgentObs(obs, state.astype(jnp.float32), self._action_mask(inner))

    def _action_mask(self, inner: PyTree) -> jax.Array:
        """Each agent's own actions (the padding up to the most actions of any agent masked
        out), of them those the environment makes available now where it says."""
        space = self.action_space
        if not isinstance(space, Discrete):
            return jnp.ones((self.num_agents, 0), bool)
        with jax.ensure_compile_time_eval():
            counts = np.array([self.env.action_space(a).n for a in self.agents])
        own = jnp.asarray(np.arange(space.n)[None, :] < counts[:, None])
        try:
            avail = self.env.get_avail_actions(inner)
        except NotImplementedError:  # every action of its own, always
            return own
        return own & jnp.stack([jnp.pad(avail[a].astype(bool), (0, space.n - avail[a].shape[0])) for a in self.agents])

    def reset(self, key: jax.Array) -> tuple[JaxMarlState, AgentObs]:
        raw, inner = self.env.reset(key)
        zeros = jnp.zeros((self.num_agents,), jnp.float32)
        return JaxMarlState(inner, zeros, jnp.int32(0)), self._observe(inner, raw)

    def step(self, key: jax.Array, state: JaxMarlState, action: jax.Array) -> tuple[JaxMarlState, TimeStep]:
        key, k_reset = jax.random.split(key)
        actions = {a: action[i] for i, a in enumerate(self.agents)}
        raw, stepped, rewards, dones, _ = self.env.step_env(key, state.inner, actions)
        final_obs = self._observe(stepped, raw)
        raw_reset, inner_reset = self.env.reset(k_reset)
        done = dones["__all__"]
        inner = jax.tree.map(lambda r, s: jax.lax.select(done, r, s), inner_reset, stepped)
        obs = jax.tree.map(lambda r, s: jnp.where(done, r, s), self._observe(inner_reset, raw_reset), final_obs)
        reward = jnp.stack([rewards[a] for a in self.agents]).astype(jnp.float32)
        length = state.length + 1
        info: dict[str, jax.Array] = {}
        if self.smax:  # decided: one side has no unit left; won: the enemy's side (a unit of ours standing)
            alive = stepped.state.unit_alive
            allies, enemies = alive[:self.env.num_allies].any(), alive[self.env.num_allies:].any()
            truncated = done & allies & enemies
            info["episode_won"] = (allies & ~enemies).astype(jnp.float32)
        else:
            truncated = done & (length >= self.max_steps) if self.max_steps else jnp.zeros_like(done)
        # an agent terminates where it is done (a unit that dies) and where the episode ends but by the time limit
        terminated = (jnp.stack([dones[a] for a in self.agents]) | done) & ~truncated
        returns = state.agent_returns + reward
        info.update({"episode_done": done, "episode_return": returns.mean(), "episode_length": length,
                     **{f"episode_return_agent{i}": returns[i] for i in range(self.num_agents)}})
        keep = ~done
        state = JaxMarlState(inner, returns * keep, length * keep)
        return state, TimeStep(obs, reward, terminated, jnp.broadcast_to(truncated, terminated.shape), final_obs, info)
