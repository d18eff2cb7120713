"""Proximal Policy Optimization (Schulman et al. 2017), written once as fragments.

An ``actor`` fragment steps the environment batch with the current policy; a
``learner`` fragment computes GAE advantages and runs epochs of clipped-surrogate
minibatch updates. Discrete actions use a categorical policy, continuous ones a
Gaussian whose samples are clipped to the action bounds for the environment
(the log-probability is of the unclipped sample). No distribution code here:
batch-wide operations go through ``jaxrl_frag.primitives``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxrl_frag import envs, primitives
from jaxrl_frag.algorithms import Algorithm, hyperparameter, static_field
from jaxrl_frag.errors import ConfigError, check
from jaxrl_frag.fragments import fragment
from jaxrl_frag.metrics import Metrics, episode_metrics
from jaxrl_frag.recipes.advantages import gae
from jaxrl_frag.recipes.networks import ActorCritic

PyTree = Any


class Transition(NamedTuple):
    """One environment step of the rollout, time-major once stacked ``[T, N, ...]``."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_value: jax.Array


@struct.dataclass
class PPOState:
    params: PyTree
    opt_state: PyTree
    env_state: PyTree
    obs: jax.Array
    key: jax.Array


@struct.dataclass
class PPO(Algorithm):
    """PPO with GAE, clipped surrogate and value losses, entropy bonus, minibatch
    epochs, linear learning-rate annealing and global-norm gradient clipping."""

    env: envs.Env = static_field(help="the batched environment (from --env)")
    num_envs: int = static_field(4, help="parallel environments")
    num_steps: int = static_field(128, help="environment steps per environment per iteration")
    total_steps: int = static_field(500_000, help="environment steps of the whole run")
    num_epochs: int = static_field(4, help="passes over each iteration's batch")
    num_minibatches: int = static_field(4, help="minibatches per epoch; must divide num_envs * num_steps")
    hidden: tuple[int, ...] = static_field((64, 64), help="hidden layer widths of the policy and value MLPs")
    anneal_lr: bool = static_field(True, help="anneal the learning rate linearly to zero over the run")
    normalize_obs: bool = static_field(False, help="standardise observations with running statistics")
    scale_reward: bool = static_field(False, help="divide rewards by the running std of the discounted return")
    lr: float = hyperparameter(2.5e-4, help="Adam learning rate")
    gamma: float = hyperparameter(0.99, help="discount factor")
    gae_lambda: float = hyperparameter(0.95, help="GAE lambda")
    clip_eps: float = hyperparameter(0.2, help="surrogate and value clipping range")
    ent_coef: float = hyperparameter(0.01, help="entropy bonus coefficient")
    vf_coef: float = hyperparameter(0.5, help="value loss coefficient")
    max_grad_norm: float = hyperparameter(0.5, help="global gradient norm clip")

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        """Settings that work for ``env_id``'s family, over the dataclass defaults."""
        if env_id.endswith("-MinAtar"):
            return dict(num_envs=64, total_steps=10_000_000, lr=5e-4, hidden=(256, 256))
        if env_id in ("Pendulum-v1", "MountainCarContinuous-v0"):
            return dict(num_envs=16, num_steps=256, total_steps=1_000_000, num_epochs=10, num_minibatches=32,
                        lr=1e-3, gamma=0.95, ent_coef=0.0, normalize_obs=True, scale_reward=True,
                        max_grad_norm=0.5)
        return {}

    @classmethod
    def create(cls, env: str, **overrides: Any) -> PPO:
        """PPO on environment id ``env``: family defaults, then ``overrides``; validated."""
        fields = cls.fields()
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ConfigError(unknown[0], overrides[unknown[0]], f"not a PPO setting; the settings are {', '.join(fields)}")
        settings = {**fields, **cls.defaults(env), **overrides}
        cls._validate(settings)
        batched = envs.make(env, num_envs=settings["num_envs"], normalize_obs=settings["normalize_obs"],
                            scale_reward=settings["scale_reward"], gamma=settings["gamma"])
        cls.check_env(batched)
        return cls(env=batched, **settings)

    @classmethod
    def fields(cls) -> dict[str, Any]:
        """Every setting but the environment, with its default."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name != "env"}

    @staticmethod
    def _validate(s: dict[str, Any]) -> None:
        for name in ("num_envs", "num_steps", "total_steps", "num_epochs", "num_minibatches"):
            check(int(s[name]) == s[name] and s[name] > 0, name, s[name], "must be a positive integer")
        batch = s["num_envs"] * s["num_steps"]
        check(s["total_steps"] >= batch, "total_steps", s["total_steps"],
              f"must cover at least one iteration of num_envs * num_steps = {batch} steps; raise it")
        check(batch % s["num_minibatches"] == 0, "num_minibatches", s["num_minibatches"],
              f"must divide the batch num_envs * num_steps = {s['num_envs']} * {s['num_steps']} = {batch}; "
              f"choose one of {_divisors(batch, 16)}")
        check(len(s["hidden"]) > 0 and all(w > 0 for w in s["hidden"]), "hidden", s["hidden"],
              "give one or more positive layer widths, e.g. 64,64")
        for name in ("lr", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef", "max_grad_norm"):
            check(math.isfinite(s[name]), name, s[name], "must be a finite number")
        for name in ("lr", "clip_eps", "max_grad_norm"):
            check(s[name] > 0, name, s[name], "must be positive")
        for name in ("ent_coef", "vf_coef"):
            check(s[name] >= 0, name, s[name], "must be zero or positive")
        check(0 < s["gamma"] <= 1, "gamma", s["gamma"], "must lie in (0, 1]")
        check(0 <= s["gae_lambda"] <= 1, "gae_lambda", s["gae_lambda"], "must lie in [0, 1]")

    # -- sizes -----------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def steps_per_iteration(self) -> int:
        return self.batch_size

    @property
    def num_iterations(self) -> int:
        return self.total_steps // self.batch_size

    @property
    def continuous(self) -> bool:
        return isinstance(self.env.action_space, envs.Box)

    @property
    def network(self) -> ActorCritic:
        space = self.env.action_space
        action_dim = int(np.prod(space.shape)) if self.continuous else space.n
        return ActorCritic(action_dim, self.hidden, self.continuous)

    def learning_rate(self, update: jax.Array) -> jax.Array:
        """The learning rate of optimizer update number ``update``: annealed linearly to
        zero over the run's iterations, or constant."""
        if not self.anneal_lr:
            return jnp.asarray(self.lr)
        return self.lr * (1.0 - (update // (self.num_epochs * self.num_minibatches)) / self.num_iterations)

    def optimizer(self) -> optax.GradientTransformation:
        schedule = self.learning_rate if self.anneal_lr else self.lr
        return optax.chain(optax.clip_by_global_norm(self.max_grad_norm), optax.adam(schedule, eps=1e-5))

    # -- the algorithm -------------------------------------------------------------

    def init(self, key: jax.Array) -> PPOState:
        key, k_net, k_env = jax.random.split(key, 3)
        env_state, obs = self.env.reset(k_env)
        params = self.network.init(k_net, obs)
        return PPOState(params, self.optimizer().init(params), env_state, obs, key)

    def step(self, state: PPOState) -> tuple[PPOState, Metrics]:
        key, k_act, k_learn = jax.random.split(state.key, 3)
        traj, env_state, obs, episodes = self.rollout(state.params, state.env_state, state.obs, k_act)
        params, opt_state, losses = self.learn(state.params, state.opt_state, traj, obs, k_learn)
        return PPOState(params, opt_state, env_state, obs, key), {**episodes, **losses}

    @fragment("actor", batched={"env_state": 0, "obs": 0, "traj": 1}, outputs=("traj", "env_state", "obs", "episodes"))
    def rollout(
        self, params: PyTree, env_state: PyTree, obs: jax.Array, key: jax.Array
    ) -> tuple[Transition, PyTree, jax.Array, Metrics]:
        """``num_steps`` steps of every environment with the current policy."""
        net = self.network
        space = self.env.action_space

        def one_step(carry: tuple[PyTree, jax.Array, jax.Array], _: None) -> tuple[Any, Any]:
            env_state, obs, key = carry
            key, k_act, k_env = jax.random.split(key, 3)
            dist, value = net.apply(params, obs)
            action = dist.sample(k_act)
            env_action = jnp.clip(action, jnp.asarray(space.low), jnp.asarray(space.high)) if self.continuous else action
            env_state, ts = self.env.step(k_env, env_state, env_action)
            final_value = net.apply(params, ts.final_obs, method=ActorCritic.value)
            transition = Transition(obs, action, dist.log_prob(action), value, ts.reward,
                                    ts.terminated, ts.truncated, final_value)
            ended = (ts.done, ts.info["episode_return"], ts.info["episode_length"])
            return (env_state, ts.obs, key), (transition, ended)

        (env_state, obs, _), (traj, ended) = jax.lax.scan(one_step, (env_state, obs, key), None, self.num_steps)
        return traj, env_state, obs, episode_metrics(*ended)

    @fragment("learner", batched={"traj": 1, "last_obs": 0}, outputs=("params", "opt_state", "losses"))
    def learn(
        self, params: PyTree, opt_state: PyTree, traj: Transition, last_obs: jax.Array, key: jax.Array
    ) -> tuple[PyTree, PyTree, Metrics]:
        """GAE, then ``num_epochs`` epochs of ``num_minibatches`` clipped-surrogate updates."""
        net, tx = self.network, self.optimizer()
        last_value = net.apply(params, last_obs, method=ActorCritic.value)
        advantages, targets = gae(traj.reward, traj.value, traj.terminated, traj.truncated, traj.final_value,
                                  last_value, self.gamma, self.gae_lambda)
        batch = primitives.flatten_batch((traj.obs, traj.action, traj.log_prob, traj.value, advantages, targets), 1)

        def update(carry: tuple[PyTree, PyTree], minibatch: tuple[jax.Array, ...]) -> tuple[Any, Metrics]:
            params, opt_state = carry
            grads, metrics = jax.grad(self.loss, has_aux=True)(params, *minibatch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), metrics

        def epoch(carry: tuple[PyTree, PyTree], key: jax.Array) -> tuple[Any, Metrics]:
            return jax.lax.scan(update, carry, primitives.minibatches(key, batch, self.num_minibatches))

        (_, updates_done), *_ = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
        (params, opt_state), metrics = jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, self.num_epochs))
        return params, opt_state, {**jax.tree.map(jnp.mean, metrics), "learning_rate": self.learning_rate(updates_done)}

    def loss(self, params: PyTree, obs: jax.Array, action: jax.Array, old_log_prob: jax.Array,
             old_value: jax.Array, advantage: jax.Array, target: jax.Array) -> tuple[jax.Array, Metrics]:
        """Clipped surrogate + clipped value loss - entropy bonus, on one minibatch."""
        dist, value = self.network.apply(params, obs)
        log_ratio = dist.log_prob(action) - old_log_prob
        ratio = jnp.exp(log_ratio)
        advantage = primitives.standardize(advantage)
        clipped_ratio = jnp.clip(ratio, 1.0 - self.clip_eps, 1.0 + self.clip_eps)
        policy_loss = -jnp.minimum(ratio * advantage, clipped_ratio * advantage).mean()
        value_clipped = old_value + jnp.clip(value - old_value, -self.clip_eps, self.clip_eps)
        value_loss = 0.5 * jnp.maximum((value - target) ** 2, (value_clipped - target) ** 2).mean()
        entropy = dist.entropy().mean()
        total = policy_loss + self.vf_coef * value_loss - self.ent_coef * entropy
        return total, {
            "loss": total, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
            "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
            "clip_fraction": (jnp.abs(ratio - 1.0) > self.clip_eps).mean(),
        }


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0][:limit]
