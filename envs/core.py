"""The environment protocol: pure, batched-by-wrapper, auto-resetting.

An environment object holds no state. ``reset`` and ``step`` are pure functions
of a key and a state pytree, so they trace into XLA programs and compose with
``vmap``. ``step`` resets a finished episode itself and reports the observation
that ended it in ``TimeStep.final_obs``: on a time-limit truncation a value
target bootstraps from V(final_obs); on a termination it does not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
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


class Steps(NamedTuple):
    """Environment steps, time-major ``[T, N, ...]``: the observation acted on, the
    action, and what followed. ``next_obs`` is the observation the action led to,
    before any reset (the one that ended the episode where it ended)."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array


class Ended(NamedTuple):
    """Per step ``[T, N]``: whether an episode ended, and its return and length (read where
    it did); ``stats``, more statistics of the episode by name (a team's win, say), read
    alike."""

    done: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    stats: dict[str, jax.Array] = {}


class AgentObs(NamedTuple):
    """What the agents of a multi-agent environment observe, agents as an array axis.

    ``obs``: ``[..., agents, D]``, each agent's observation (zero-padded to the longest);
    ``state``: ``[..., S]``, the global state a centralised critic reads;
    ``action_mask``: ``[..., agents, actions]``, the actions each agent may take now
    (true where it may; ``[..., agents, 0]`` for continuous actions).
    """

    obs: jax.Array
    state: jax.Array
    action_mask: jax.Array


class MaskedObs(NamedTuple):
    """What one agent observes, with the actions it may take now (an environment that
    declares ``Capabilities.masks_actions``).

    ``obs``: ``[..., *observation_space.shape]``; ``action_mask``: ``[..., actions]``, true
    where the action is allowed.
    """

    obs: jax.Array
    action_mask: jax.Array


def unmasked(obs: PyTree) -> tuple[jax.Array, jax.Array | None]:
    """``obs`` apart from its action mask: ``(obs.obs, obs.action_mask)`` for a
    ``MaskedObs``, ``(obs, None)`` for an observation without one."""
    return (obs.obs, obs.action_mask) if isinstance(obs, MaskedObs) else (obs, None)


EPISODE_KEYS = ("episode_done", "episode_return", "episode_length")  # info entries that Ended reads by name
AGENT_AXIS = "agents"  # the name of the agents axis in Algorithm.named_axes and a policy's mesh


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an environment family can do, declared for the features that depend on it.

    ``traceable``: its steps trace into XLA and its state is arrays of the training
    state, so a transform may ``vmap`` copies of it (populations) or step a slice of its
    environments (boosting). ``restorable``: a checkpoint of the training state restores
    it exactly; where not (environments stepped outside the program), a resumed run
    starts them afresh. ``renders``: ``Env.render`` draws its states, so ``evaluate
    --video`` can draw an episode of it. ``masks_actions``: its observations are
    ``MaskedObs``, the actions allowed now beside what it observes; a recipe acts on it
    only where it takes action masks (``Recipe.takes_action_masks``). ``elastic``: a prefix
    of its batch steps alone (``Env.prefix``), the other environments waiting as they are,
    so that a transform may step fewer of them where it cannot slice their state
    (boosting, on environments stepped outside the program). ``deterministic``: a step
    follows from the state and the action alone (its key seeds only the reset of an
    episode that ended), so ``step`` is an exact model a planner may search with
    (``alphazero``). ``alternating``: two players move in turn, one step each, in a
    zero-sum game; the observation is the player to move's and a step's reward the
    mover's, so the state after a step is worth to the mover the negative of what it is
    worth to the opponent, who moves next; a recipe trains on it only where it takes
    turns (``Recipe.takes_turns``: one network playing both sides).
    """

    traceable: bool = True
    restorable: bool = True
    renders: bool = False
    masks_actions: bool = False
    elastic: bool = False
    deterministic: bool = False
    alternating: bool = False


# act(obs, key) -> (action to record, action to send to the environment, anything else to keep per step)
Act = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array, PyTree]]
# act(obs, memory, key) -> (action, env_action, extra, memory after the step): an acting function with a memory
RecurrentAct = Callable[[jax.Array, PyTree, jax.Array], tuple[jax.Array, jax.Array, PyTree, PyTree]]


class Acting(NamedTuple):
    """A trained policy, with or without a memory: ``blank(N)`` is the memory of ``N``
    environments before their first step (``()`` without one), and ``act(obs [N, ...],
    memory, key) -> (actions [N, ...], memory after)``; the memory of an environment whose
    episode ended is forgotten (``forget``) before its next step."""

    blank: Callable[[int], PyTree]
    act: Callable[[jax.Array, PyTree, jax.Array], tuple[jax.Array, PyTree]]

    @classmethod
    def without_memory(cls, act: Callable[[jax.Array, jax.Array], jax.Array]) -> Acting:
        """``act(obs, key) -> actions``, carrying no memory."""
        return cls(lambda n: (), lambda obs, memory, key: (act(obs, key), memory))


def random_legal(key: jax.Array, legal: jax.Array) -> jax.Array:
    """An action ``[...]`` drawn uniformly from those that ``legal`` ``[..., actions]`` allows."""
    return jnp.argmax(jnp.where(legal, jax.random.uniform(key, legal.shape), -jnp.inf), -1)


def episodes_ended(ts: TimeStep) -> Ended:
    """The episodes that ended at the step of ``ts``, read from ``EpisodeStatistics``'s
    info: an environment's own ``info["episode_done"]`` where it has one, and its other
    ``episode_*`` entries as ``Ended.stats``."""
    info = ts.info
    stats = {k: v for k, v in info.items() if k.startswith("episode_") and k not in EPISODE_KEYS}
    return Ended(info.get("episode_done", ts.done), info["episode_return"], info["episode_length"], stats)


def forget(memory: PyTree, done: jax.Array) -> PyTree:
    """``memory`` (leaves ``[N, ...]``) set to zeros where ``done`` (``[N]``) holds."""
    return jax.tree.map(lambda m: jnp.where(done.reshape(done.shape + (1,) * (m.ndim - done.ndim)), 0, m), memory)


class Env:
    """Base of every environment and wrapper.

    Subclasses are frozen dataclasses, so an environment is hashable and can sit
    in a static field of an algorithm.
    """

    name: str  # the id it was made from
    num_envs: int | None  # batch size; None for one unbatched environment

    @property
    def num_agents(self) -> int | None:
        """Agents acting at once, for a multi-agent environment: its observations are
        ``AgentObs``, its actions, rewards, ``terminated`` and ``truncated`` carry an
        agents axis after the batch, and ``info["episode_done"]`` says where a whole
        episode ended. None for a single-agent environment (the default)."""
        return None

    @property
    def capabilities(self) -> Capabilities:
        """What this environment can do (by default: everything a pure JAX one can)."""
        return Capabilities()

    def failure(self) -> Exception | None:
        """What failed outside the compiled program in its last call, where something did
        (a worker process stepping it, say); taken once. None for a pure environment."""
        return None

    def counters(self) -> dict[str, float]:
        """Counts kept outside the compiled program, by name, for a run's rows (workers
        that a host environment's pool restarted, say). None for a pure environment."""
        return {}

    @property
    def host_workers(self) -> int:
        """The processes or actors outside the program that step this batch (a cost model
        prices them); 0 for environments stepped in the program."""
        return 0

    def prefix(self, count: int) -> Env:
        """The batch's first ``count`` environments as a batch of their own, stepping the
        same environments (the others wait as they are): for an ``elastic`` environment."""
        raise NotImplementedError(f"{self.name} is not elastic: its batch steps whole")

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

    def render(self, states: PyTree) -> np.ndarray:
        """Frames of one (unbatched) environment's ``states``, stacked on a leading axis:
        ``uint8 [T, H, W, 3]``, for ``evaluate --video``; a family that draws declares
        ``Capabilities.renders`` and may give ``frame_seconds`` (the seconds a step lasts)
        and ``max_steps`` (its time limit, the longest episode a video draws)."""
        raise NotImplementedError(f"{self.name} does not render")

    frame_seconds: ClassVar[float] = 0.1

    def observation_fn(self, state: PyTree) -> Callable[[jax.Array], jax.Array]:
        """What this environment makes of the bare environment's observations, with the
        statistics it keeps in ``state`` held fixed (to act after training on
        observations from elsewhere); the identity unless a wrapper transforms them."""
        del state
        return lambda obs: obs

    def rollout(self, act: Act, state: PyTree, obs: jax.Array, key: jax.Array,
                num_steps: int) -> tuple[Steps, PyTree, PyTree, jax.Array, Ended]:
        """``num_steps`` steps of this batch from ``(state, obs)``, each action chosen by
        ``act``: the ``Steps``, ``act``'s extras stacked, the state and observation after
        the last step, and the episodes that ended (``episodes_ended``).
        ``recurrent_rollout`` without a memory; an environment outside XLA schedules
        its steps its own way (``HostEnv``)."""

        def stateless(obs: jax.Array, memory: PyTree, key: jax.Array) -> tuple[Any, ...]:
            return (*act(obs, key), memory)

        steps, extras, state, obs, _, ended = self.recurrent_rollout(stateless, state, obs, (), key, num_steps)
        return steps, extras, state, obs, ended

    def recurrent_rollout(self, act: RecurrentAct, state: PyTree, obs: jax.Array, memory: PyTree, key: jax.Array,
                          num_steps: int) -> tuple[Steps, PyTree, PyTree, jax.Array, PyTree, Ended]:
        """``rollout`` with an acting function that carries a ``memory`` (leaves ``[N, ...]``)
        from step to step, set to zeros (``forget``) where an episode ended, before the
        next step reads it: a ``lax.scan`` of ``act`` then ``step``. Returns what
        ``rollout`` does, with the memory after the last step before the episodes."""

        def one_step(carry: tuple[PyTree, jax.Array, PyTree, jax.Array], _: None) -> tuple[Any, Any]:
            state, obs, memory, key = carry
            key, k_act, k_env = jax.random.split(key, 3)
            action, env_action, extra, memory = act(obs, memory, k_act)
            state, ts = self.step(k_env, state, env_action)
            step = Steps(obs, action, ts.reward, ts.terminated, ts.truncated, ts.final_obs)
            return (state, ts.obs, forget(memory, ts.done), key), (step, extra, episodes_ended(ts))

        (state, obs, memory, _), (steps, extras, ended) = jax.lax.scan(one_step, (state, obs, memory, key), None,
                                                                      num_steps)
        return steps, extras, state, obs, memory, ended


@dataclasses.dataclass(frozen=True)
class Wrapper(Env):
    """An environment around ``inner``; by default everything passes through."""

    inner: Env

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not yet set during unpickling/copy
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def capabilities(self) -> Capabilities:
        """The inner environment's, but for rendering: a wrapper's state is not the inner one's."""
        return dataclasses.replace(self.inner.capabilities, renders=False)

    @property
    def num_agents(self) -> int | None:
        return self.inner.num_agents

    def failure(self) -> Exception | None:
        """The inner environment's."""
        return self.inner.failure()

    def counters(self) -> dict[str, float]:
        """The inner environment's."""
        return self.inner.counters()

    @property
    def host_workers(self) -> int:
        return self.inner.host_workers

    def prefix(self, count: int) -> Env:
        """This wrapper around the inner environment's prefix."""
        return dataclasses.replace(self, inner=self.inner.prefix(count))

    @property
    def observation_space(self) -> Box:
        return self.inner.observation_space

    @property
    def action_space(self) -> Space:
        return self.inner.action_space

    def reset(self, key: jax.Array) -> tuple[PyTree, jax.Array]:
        """The inner environment's reset."""
        return self.inner.reset(key)

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        """The inner environment's step."""
        return self.inner.step(key, state, action)

    def observation_fn(self, state: PyTree) -> Callable[[jax.Array], jax.Array]:
        """The inner environment's (a wrapper that keeps a state of its own passes its inner part)."""
        return self.inner.observation_fn(state)
