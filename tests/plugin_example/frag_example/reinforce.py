"""REINFORCE (Williams 1992) with an optional baseline, written once as two fragments,
as a user of jaxrl-frag would write an algorithm of their own.

The ``actor`` fragment steps the environment batch with the current policy; the
``learner`` fragment computes each step's discounted return to the end of the rollout
(an episode cut by the rollout's end is not bootstrapped) and takes one policy-gradient
step. No distribution code: the batch-wide statistics go through
``jaxrl_frag.primitives``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrl_frag import envs, fragment, primitives
from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.errors import check
from jaxrl_frag.metrics import Metrics, episode_metrics
from jaxrl_frag.recipes.recipe import Recipe

PyTree = Any


class PolicyNet(nn.Module):
    """An MLP from observations to action logits, clipped to ``logit_range``."""

    actions: int
    hidden: tuple[int, ...]
    logit_range: tuple[float, float]

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.reshape(obs.shape[0], -1)
        for width in self.hidden:
            x = nn.tanh(nn.Dense(width)(x))
        return jnp.clip(nn.Dense(self.actions)(x), *self.logit_range)


@struct.dataclass
class ReinforceState:
    params: PyTree
    opt_state: PyTree
    env_state: PyTree
    obs: jax.Array
    key: jax.Array


@struct.dataclass
class Reinforce(Recipe):
    """REINFORCE: the policy gradient of discounted returns, with a baseline."""

    num_envs: int = static_field(8, help="parallel environments")
    num_steps: int = static_field(32, help="environment steps per environment per iteration")
    total_steps: int = static_field(32_768, help="environment steps of the whole run")
    hidden: tuple[int, ...] = static_field((32,), help="hidden layer widths of the policy")
    lr: float = hyperparameter(1e-2, help="Adam learning rate")
    baseline: Literal["none", "mean", "standardize"] = static_field(
        "mean", help="what the returns are compared with: nothing, their batch mean, or standardized over the batch")
    max_grad_norm: float | None = static_field(None, help="global gradient norm clip (none: no clipping)")
    logit_range: tuple[float, float] = static_field((-10.0, 10.0), help="bounds of the policy's logits")

    action_spaces: ClassVar[tuple[type, ...]] = (envs.Discrete,)

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        low, high = s["logit_range"]
        check(low < high, "logit_range", s["logit_range"], "give LOW,HIGH with LOW < HIGH, e.g. -10,10")
        check(s["max_grad_norm"] is None or s["max_grad_norm"] > 0, "max_grad_norm", s["max_grad_norm"],
              "must be positive, or none for no clipping")

    @property
    def network(self) -> PolicyNet:
        return PolicyNet(self.env.action_space.n, self.hidden, self.logit_range)

    def optimizer(self) -> optax.GradientTransformation:
        adam = optax.adam(self.lr)
        return adam if self.max_grad_norm is None else optax.chain(optax.clip_by_global_norm(self.max_grad_norm), adam)

    def init(self, key: jax.Array) -> ReinforceState:
        key, k_net, k_env = jax.random.split(key, 3)
        env_state, obs = self.env.reset(k_env)
        params = self.network.init(k_net, obs)
        return ReinforceState(params, self.optimizer().init(params), env_state, obs, key)

    def step(self, state: ReinforceState) -> tuple[ReinforceState, Metrics]:
        key, k_act = jax.random.split(state.key)
        steps, env_state, obs, episodes = self.rollout(state.params, state.env_state, state.obs, k_act)
        params, opt_state, losses = self.learn(state.params, state.opt_state, steps)
        return ReinforceState(params, opt_state, env_state, obs, key), {**episodes, **losses}

    @fragment("actor", batched={"env_state": 0, "obs": 0, "steps": 1}, outputs=("steps", "env_state", "obs", "episodes"))
    def rollout(self, params: PyTree, env_state: PyTree, obs: jax.Array,
                key: jax.Array) -> tuple[envs.Steps, PyTree, jax.Array, Metrics]:
        """``num_steps`` steps of every environment with the current policy."""

        def act(obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, tuple[()]]:
            action = jax.random.categorical(key, self.network.apply(params, obs))
            return action, action, ()

        steps, _, env_state, obs, ended = self.env.rollout(act, env_state, obs, key, self.num_steps)
        return steps, env_state, obs, episode_metrics(*ended)

    @fragment("learner", batched={"steps": 1}, outputs=("params", "opt_state", "losses"))
    def learn(self, params: PyTree, opt_state: PyTree, steps: envs.Steps) -> tuple[PyTree, PyTree, Metrics]:
        """Discounted returns, then one policy-gradient step."""
        done = (steps.terminated | steps.truncated).astype(jnp.float32)

        def back(carry: jax.Array, x: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            reward, end = x
            carry = reward + self.gamma * carry * (1.0 - end)
            return carry, carry

        _, returns = jax.lax.scan(back, jnp.zeros_like(steps.reward[0]), (steps.reward, done), reverse=True)
        obs, action, returns = primitives.flatten_batch((steps.obs, steps.action, returns), 1)
        if self.baseline == "mean":
            returns = returns - primitives.batch_moments(returns)[0]
        elif self.baseline == "standardize":
            returns = primitives.standardize(returns)

        def loss(params: PyTree) -> tuple[jax.Array, Metrics]:
            log_probs = jax.nn.log_softmax(self.network.apply(params, obs))
            chosen = jnp.take_along_axis(log_probs, action[:, None], axis=1)[:, 0]
            entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
            value = -(chosen * returns).mean()
            return value, {"loss": value, "entropy": entropy}

        grads, metrics = jax.grad(loss, has_aux=True)(params)
        updates, opt_state = self.optimizer().update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, metrics
