"""Wrappers: batching, episode statistics, observation and reward normalisation,
observations cut down to some of their entries (partial observability), and a game of
two players against random moves.

The statistics wrappers sit outside ``VecEnv`` and reduce over the whole
environment batch with ``jaxrl_frag.primitives.batch_moments``, whose meaning a
distribution policy keeps global.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_frag import primitives
from jaxrl_frag.envs.core import Box, Capabilities, PyTree, TimeStep, Wrapper, random_legal, unmasked
from jaxrl_frag.primitives import Shared


@dataclasses.dataclass(frozen=True)
class VecEnv(Wrapper):
    """``num_envs`` independent copies of ``inner``, stepped with ``vmap``: every leaf of
    the state, the observations and the ``TimeStep`` gain a leading ``[num_envs]`` axis,
    and ``reset`` and ``step`` split their key into one per environment."""

    num_envs: int = 1

    def reset(self, key: jax.Array) -> tuple[PyTree, jax.Array]:
        return jax.vmap(self.inner.reset)(jax.random.split(key, self.num_envs))

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        return jax.vmap(self.inner.step)(jax.random.split(key, self.num_envs), state, action)


OBS_MASK = "@obs="  # an id's suffix naming the observation entries an ObservationMask keeps: CartPole-v1@obs=0,2


@dataclasses.dataclass(frozen=True)
class ObservationMask(Wrapper):
    """Only the entries ``keep`` of each vector observation, in that order: a partially
    observed task (CartPole without its velocities keeps 0 and 2). Named
    ``<inner name>@obs=<keep>``, so that ``make`` makes it again from its name."""

    keep: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.inner.name}{OBS_MASK}{','.join(map(str, self.keep))}"

    @property
    def observation_space(self) -> Box:
        space, keep = self.inner.observation_space, list(self.keep)
        return Box(tuple(np.asarray(space.low)[keep].tolist()), tuple(np.asarray(space.high)[keep].tolist()),
                   (len(keep),), space.dtype)

    def _mask(self, obs: jax.Array) -> jax.Array:
        return obs[..., np.asarray(self.keep)]

    def reset(self, key: jax.Array) -> tuple[PyTree, jax.Array]:
        state, obs = self.inner.reset(key)
        return state, self._mask(obs)

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        state, ts = self.inner.step(key, state, action)
        return state, ts._replace(obs=self._mask(ts.obs), final_obs=self._mask(ts.final_obs))


VERSUS_RANDOM = "@opponent=random"  # an id's suffix: an alternating game against random moves (VersusRandom)


def _where(pred: jax.Array, new: PyTree, old: PyTree) -> PyTree:
    return jax.tree.map(lambda n, o: jax.lax.select(pred, n, o), new, old)


@dataclasses.dataclass(frozen=True)
class VersusRandom(Wrapper):
    """A game of two players who move in turn (``Capabilities.alternating``), played
    against uniformly random legal moves: a step is the agent's move and, unless that
    ended the game, the opponent's reply; its reward is the agent's (its move's reward
    less the reply's). A coin at each game's start says who moves first, the opponent's
    opening played at once, so the agent opens half of the games. The observations are the
    agent's (the player to move's). A single-agent task, neither alternating nor an exact
    model. One unbatched game, named ``<inner name>@opponent=random``."""

    @property
    def name(self) -> str:
        return f"{self.inner.name}{VERSUS_RANDOM}"

    @property
    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities, alternating=False, deterministic=False)

    def _random_move(self, key: jax.Array, obs: PyTree) -> jax.Array:
        """A uniformly random move among those legal in ``obs`` (any move without a mask)."""
        legal = unmasked(obs)[1]
        return random_legal(key, jnp.ones(self.action_space.n, bool) if legal is None else legal)

    def _open(self, key: jax.Array, state: PyTree, obs: PyTree) -> tuple[PyTree, PyTree]:
        """A game's start: where a coin says so, the opponent's opening move played."""
        k_coin, k_move, k_env = jax.random.split(key, 3)
        opened, ts = self.inner.step(k_env, state, self._random_move(k_move, obs))
        return _where(jax.random.bernoulli(k_coin), (opened, ts.obs), (state, obs))

    def reset(self, key: jax.Array) -> tuple[PyTree, PyTree]:
        k_reset, k_open = jax.random.split(key)
        return self._open(k_open, *self.inner.reset(k_reset))

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        k_ours, k_move, k_reply, k_open = jax.random.split(key, 4)
        ours_state, ours = self.inner.step(k_ours, state, action)
        reply_state, reply = self.inner.step(k_reply, ours_state, self._random_move(k_move, ours.obs))
        replied = ~ours.done  # where the agent's move ended the game, the inner game has started again
        state, ts = _where(replied, (reply_state, reply), (ours_state, ours))
        ts = ts._replace(reward=ours.reward - jnp.where(replied, reply.reward, 0.0))
        state, obs = _where(ts.done, self._open(k_open, state, ts.obs), (state, ts.obs))
        return state, ts._replace(obs=obs)


@struct.dataclass
class EpisodeState:
    inner: PyTree
    episode_return: jax.Array
    episode_length: jax.Array


@dataclasses.dataclass(frozen=True)
class EpisodeStatistics(Wrapper):
    """Adds ``info["episode_return"]`` and ``info["episode_length"]``: the undiscounted
    return and length of the episode that ended at this step (read where ``done``)."""

    def reset(self, key: jax.Array) -> tuple[EpisodeState, jax.Array]:
        state, obs = self.inner.reset(key)
        zeros = jnp.zeros(jax.tree.leaves(obs)[0].shape[:1], jnp.float32)  # an observation may be a pytree
        return EpisodeState(state, zeros, zeros.astype(jnp.int32)), obs

    def step(self, key: jax.Array, state: EpisodeState, action: jax.Array) -> tuple[EpisodeState, TimeStep]:
        inner, ts = self.inner.step(key, state.inner, action)
        ret = state.episode_return + ts.reward
        length = state.episode_length + 1
        info = {**ts.info, "episode_return": ret, "episode_length": length}
        keep = ~ts.done
        state = EpisodeState(inner, ret * keep, length * keep)
        return state, ts._replace(info=info)

    def observation_fn(self, state: EpisodeState) -> Callable[[jax.Array], jax.Array]:
        return self.inner.observation_fn(state.inner)


@struct.dataclass
class RunningMoments(Shared):
    """Mean and variance of everything seen so far (Chan et al.'s parallel merge).

    A ``Shared`` value: the statistics of the whole environment batch, the same on
    every device under any distribution policy.

    Attributes:
        mean: Running mean per feature.
        var: Running variance per feature.
        count: Samples seen (starts at a tiny positive count, so the first update
            divides by no zero).
    """

    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def zeros(cls, shape: tuple[int, ...]) -> RunningMoments:
        """No data yet: mean 0 and variance 1 per feature of ``shape``."""
        return cls(jnp.zeros(shape), jnp.ones(shape), jnp.asarray(1e-4))

    def update(self, batch: jax.Array) -> RunningMoments:
        """The moments with ``batch`` (leading axis: samples, over the whole environment
        batch through ``primitives.batch_moments``) merged in."""
        mean, var, count = primitives.batch_moments(batch)
        total = self.count + count
        delta = mean - self.mean
        new_mean = self.mean + delta * count / total
        m2 = self.var * self.count + var * count + delta**2 * self.count * count / total
        return RunningMoments(new_mean, m2 / total, total)


@struct.dataclass
class NormalizeState:
    inner: PyTree
    moments: RunningMoments


@dataclasses.dataclass(frozen=True)
class NormalizeObservation(Wrapper):
    """Observations standardised by running statistics over all environments, clipped
    to ``[-clip, clip]``. ``final_obs`` is standardised with the same statistics, so a
    bootstrapped value sees what the policy sees. The statistics live in the
    environment state (and so in a checkpoint)."""

    clip: float = 10.0

    def _normalize(self, moments: RunningMoments, obs: jax.Array) -> jax.Array:
        z = (obs - moments.mean) / jnp.sqrt(moments.var + 1e-8)
        return jnp.clip(z, -self.clip, self.clip)

    def reset(self, key: jax.Array) -> tuple[NormalizeState, jax.Array]:
        state, obs = self.inner.reset(key)
        moments = RunningMoments.zeros(obs.shape[1:]).update(obs)
        return NormalizeState(state, moments), self._normalize(moments, obs)

    def step(self, key: jax.Array, state: NormalizeState, action: jax.Array) -> tuple[NormalizeState, TimeStep]:
        inner, ts = self.inner.step(key, state.inner, action)
        moments = state.moments.update(ts.obs)
        ts = ts._replace(obs=self._normalize(moments, ts.obs), final_obs=self._normalize(moments, ts.final_obs))
        return NormalizeState(inner, moments), ts

    def observation_fn(self, state: NormalizeState) -> Callable[[jax.Array], jax.Array]:
        """Standardised by the statistics in ``state``, as they stand."""
        inner = self.inner.observation_fn(state.inner)
        return lambda obs: self._normalize(state.moments, inner(obs))


@struct.dataclass
class ScaleState:
    inner: PyTree
    discounted_return: jax.Array
    moments: RunningMoments


@dataclasses.dataclass(frozen=True)
class ScaleReward(Wrapper):
    """Rewards divided by the running standard deviation of the discounted return
    (discount ``gamma``), clipped to ``[-clip, clip]``; the statistics live in the
    environment state."""

    gamma: float = 0.99
    clip: float = 10.0

    def reset(self, key: jax.Array) -> tuple[ScaleState, jax.Array]:
        state, obs = self.inner.reset(key)
        zeros = jnp.zeros(jax.tree.leaves(obs)[0].shape[:1], jnp.float32)  # an observation may be a pytree
        return ScaleState(state, zeros, RunningMoments.zeros(())), obs

    def step(self, key: jax.Array, state: ScaleState, action: jax.Array) -> tuple[ScaleState, TimeStep]:
        inner, ts = self.inner.step(key, state.inner, action)
        ret = state.discounted_return * self.gamma + ts.reward
        moments = state.moments.update(ret)
        reward = jnp.clip(ts.reward / jnp.sqrt(moments.var + 1e-8), -self.clip, self.clip)
        return ScaleState(inner, ret * ~ts.done, moments), ts._replace(reward=reward)

    def observation_fn(self, state: ScaleState) -> Callable[[jax.Array], jax.Array]:
        return self.inner.observation_fn(state.inner)
