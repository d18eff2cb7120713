"""Tabular Q-learning as a plain ``jaxrl_frag.Algorithm`` (no ``Recipe`` base): a
dataclass with a ``create`` classmethod, its settings the fields with a ``help``, as a
user would write an algorithm outside the recipes' conventions.

Observations are one-hot states (``Chain``'s); each iteration steps every environment
``num_steps`` times epsilon-greedily and moves each visited state-action value towards
its one-step target by ``lr`` (the batch's mean update).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_frag import Algorithm, ConfigError, envs
from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.metrics import Metrics, episode_metrics


@struct.dataclass
class TabularQState:
    q: jax.Array  # [states, actions]
    env_state: Any
    obs: jax.Array
    key: jax.Array


@struct.dataclass
class TabularQ(Algorithm):
    """Tabular Q-learning over one-hot observations, epsilon-greedy."""

    env: envs.Env = static_field()
    num_envs: int = static_field(8, help="parallel environments")
    num_steps: int = static_field(16, help="environment steps per environment per iteration")
    total_steps: int = static_field(16_384, help="environment steps of the whole run")
    lr: float = hyperparameter(0.5, help="step size towards the one-step target")
    gamma: float = hyperparameter(0.95, help="discount")
    epsilon: float = hyperparameter(0.1, help="probability of a random action")

    @classmethod
    def create(cls, env: str, **settings: Any) -> TabularQ:
        """Q-learning on environment id ``env``, one-hot observations and discrete actions."""
        num_envs = settings.get("num_envs", 8)
        batched = envs.make(env, num_envs=num_envs)
        if not (isinstance(batched.action_space, envs.Discrete) and len(batched.observation_space.shape) == 1):
            raise ConfigError("env", env, "tabular-q needs one-hot observations and discrete actions, as chain:N has")
        return cls(env=batched, **settings)

    @property
    def steps_per_iteration(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        return self.total_steps // self.steps_per_iteration

    def init(self, key: jax.Array) -> TabularQState:
        key, k_env = jax.random.split(key)
        env_state, obs = self.env.reset(k_env)
        q = jnp.zeros((self.env.observation_space.shape[0], self.env.action_space.n))
        return TabularQState(q, env_state, obs, key)

    def step(self, state: TabularQState) -> tuple[TabularQState, Metrics]:
        key, k_roll = jax.random.split(state.key)

        def act(obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, tuple[()]]:
            explore, pick = jax.random.split(key)
            greedy = jnp.argmax(obs @ state.q, axis=-1)
            random = jax.random.randint(pick, greedy.shape, 0, self.env.action_space.n)
            action = jnp.where(jax.random.uniform(explore, greedy.shape) < self.epsilon, random, greedy)
            return action, action, ()

        steps, _, env_state, obs, ended = self.env.rollout(act, state.env_state, state.obs, k_roll, self.num_steps)
        target = steps.reward + self.gamma * (1.0 - steps.terminated) * (steps.next_obs @ state.q).max(-1)
        chosen = jax.nn.one_hot(steps.action, self.env.action_space.n)  # [T, N, actions]
        error = (target - ((steps.obs @ state.q) * chosen).sum(-1))[..., None, None]
        visits = steps.obs[..., :, None] * chosen[..., None, :]  # [T, N, states, actions]
        count = visits.sum((0, 1))
        q = state.q + self.lr * (error * visits).sum((0, 1)) / jnp.maximum(count, 1.0)
        metrics = episode_metrics(*ended)
        return TabularQState(q, env_state, obs, key), {**metrics, "td_error": jnp.abs(error).mean()}
