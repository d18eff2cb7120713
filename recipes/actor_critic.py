"""What PPO and IMPALA share: an actor-critic network, its settings, and the ``actor``
fragment that rolls out the current policy in a batch of environments.

A subclass adds its ``learn`` fragment (``learner`` role) and its own settings;
``step`` is the same for every subclass: roll out, then learn from the rollout.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxrl_frag import envs
from jaxrl_frag.algorithms import Algorithm, hyperparameter, static_field
from jaxrl_frag.errors import ConfigError, check
from jaxrl_frag.fragments import fragment
from jaxrl_frag.metrics import Metrics, episode_metrics
from jaxrl_frag.recipes.networks import ActorCritic

PyTree = Any
TORSOS = ("auto", "cnn", "mlp")


class Transition(NamedTuple):
    """One environment step of the rollout, time-major once stacked ``[T, N, ...]``.
    ``log_prob`` and ``value`` are the acting policy's; ``final_value`` is its value of
    the observation that ended an episode at this step."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_value: jax.Array


@struct.dataclass
class ActorCriticState:
    params: PyTree
    opt_state: PyTree
    env_state: PyTree
    obs: jax.Array
    key: jax.Array


@struct.dataclass
class ActorCriticRecipe(Algorithm):
    """Settings and the rollout shared by actor-critic recipes."""

    env: envs.Env = static_field(help="the batched environment (from --env)")
    num_envs: int = static_field(4, help="parallel environments")
    num_steps: int = static_field(128, help="environment steps per environment per iteration")
    total_steps: int = static_field(500_000, help="environment steps of the whole run")
    num_minibatches: int = static_field(4, help="minibatches per epoch")
    hidden: tuple[int, ...] = static_field((64, 64), help="hidden layer widths of the policy and value MLPs")
    torso: str = static_field("auto", help="cnn (a 3x3 convolution with 16 channels under each MLP; for image "
                                           "observations (H, W, C)), mlp (the MLPs alone) or auto (cnn for images)")
    anneal_lr: bool = static_field(True, help="anneal the learning rate linearly to zero over the run")
    normalize_obs: bool = static_field(False, help="standardise observations with running statistics")
    scale_reward: bool = static_field(False, help="divide rewards by the running std of the discounted return")
    lr: float = hyperparameter(2.5e-4, help="Adam learning rate")
    gamma: float = hyperparameter(0.99, help="discount factor")
    ent_coef: float = hyperparameter(0.01, help="entropy bonus coefficient")
    vf_coef: float = hyperparameter(0.5, help="value loss coefficient")
    max_grad_norm: float = hyperparameter(0.5, help="global gradient norm clip")

    # the settings that must be positive integers, and those that must be finite numbers
    counts: ClassVar[tuple[str, ...]] = ("num_envs", "num_steps", "total_steps", "num_minibatches")
    reals: ClassVar[tuple[str, ...]] = ("lr", "gamma", "ent_coef", "vf_coef", "max_grad_norm")

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        """Settings that work for ``env_id``'s family, over the dataclass defaults."""
        return {}

    @classmethod
    def create(cls, env: str, **overrides: Any) -> ActorCriticRecipe:
        """The recipe on environment id ``env``: family defaults, then ``overrides``; validated."""
        fields = cls.fields()
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ConfigError(unknown[0], overrides[unknown[0]],
                              f"not a {cls.__name__} setting; the settings are {', '.join(fields)}")
        settings = {**fields, **cls.defaults(env), **overrides}
        cls.validate(settings)
        batched = envs.make(env, num_envs=settings["num_envs"], normalize_obs=settings["normalize_obs"],
                            scale_reward=settings["scale_reward"], gamma=settings["gamma"])
        cls.check_env(batched)
        shape = batched.observation_space.shape
        check(settings["torso"] != "cnn" or len(shape) == 3, "torso", "cnn",
              f"needs image observations (H, W, C); {env} observes shape {shape}: choose mlp or auto")
        return cls(env=batched, **settings)

    @classmethod
    def fields(cls) -> dict[str, Any]:
        """Every setting but the environment, with its default."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name != "env"}

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        """Raise ``ConfigError`` for the first setting in ``s`` that cannot work."""
        for name in cls.counts:
            check(int(s[name]) == s[name] and s[name] > 0, name, s[name], "must be a positive integer")
        batch = s["num_envs"] * s["num_steps"]
        check(s["total_steps"] >= batch, "total_steps", s["total_steps"],
              f"must cover at least one iteration of num_envs * num_steps = {batch} steps; raise it")
        check(len(s["hidden"]) > 0 and all(w > 0 for w in s["hidden"]), "hidden", s["hidden"],
              "give one or more positive layer widths, e.g. 64,64")
        check(s["torso"] in TORSOS, "torso", s["torso"],
              f"choose one of {', '.join(TORSOS)} (auto: cnn for image observations, else mlp)")
        for name in cls.reals:
            check(math.isfinite(s[name]), name, s[name], "must be a finite number")
        for name in ("lr", "max_grad_norm"):
            check(s[name] > 0, name, s[name], "must be positive")
        for name in ("ent_coef", "vf_coef"):
            check(s[name] >= 0, name, s[name], "must be zero or positive")
        check(0 < s["gamma"] <= 1, "gamma", s["gamma"], "must lie in (0, 1]")

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
    def updates_per_iteration(self) -> int:
        """Optimizer updates in one iteration's ``learn``."""
        return self.num_minibatches

    @property
    def continuous(self) -> bool:
        return isinstance(self.env.action_space, envs.Box)

    @property
    def conv(self) -> bool:
        """Whether the networks have a convolutional torso: asked for, or ``auto`` on image observations."""
        return self.torso == "cnn" or (self.torso == "auto" and len(self.env.observation_space.shape) == 3)

    @property
    def network(self) -> ActorCritic:
        space = self.env.action_space
        action_dim = int(np.prod(space.shape)) if self.continuous else space.n
        return ActorCritic(action_dim, self.hidden, self.continuous, self.conv)

    def learning_rate(self, update: jax.Array) -> jax.Array:
        """The learning rate of optimizer update number ``update``: annealed linearly to
        zero over the run's iterations, or constant."""
        if not self.anneal_lr:
            return jnp.asarray(self.lr)
        return self.lr * (1.0 - (update // self.updates_per_iteration) / self.num_iterations)

    def optimizer(self) -> optax.GradientTransformation:
        schedule = self.learning_rate if self.anneal_lr else self.lr
        return optax.chain(optax.clip_by_global_norm(self.max_grad_norm), optax.adam(schedule, eps=1e-5))

    def updates_done(self, opt_state: PyTree) -> jax.Array:
        """How many optimizer updates ``opt_state`` has seen."""
        (_, count), *_ = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
        return count

    # -- the algorithm -------------------------------------------------------------

    def init(self, key: jax.Array) -> ActorCriticState:
        key, k_net, k_env = jax.random.split(key, 3)
        env_state, obs = self.env.reset(k_env)
        params = self.network.init(k_net, obs)
        return ActorCriticState(params, self.optimizer().init(params), env_state, obs, key)

    def step(self, state: ActorCriticState) -> tuple[ActorCriticState, Metrics]:
        key, k_act, k_learn = jax.random.split(state.key, 3)
        traj, env_state, obs, episodes = self.rollout(state.params, state.env_state, state.obs, k_act)
        params, opt_state, losses = self.learn(state.params, state.opt_state, traj, obs, k_learn)
        return ActorCriticState(params, opt_state, env_state, obs, key), {**episodes, **losses}

    def learn(self, params: PyTree, opt_state: PyTree, traj: Transition, last_obs: jax.Array,
              key: jax.Array) -> tuple[PyTree, PyTree, Metrics]:
        """The learner fragment: new parameters and optimizer state from a rollout."""
        raise NotImplementedError

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


def divisors(n: int, limit: int) -> list[int]:
    """The first ``limit`` divisors of ``n``, for messages that suggest a valid count."""
    return [d for d in range(1, n + 1) if n % d == 0][:limit]
