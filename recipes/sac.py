"""Soft actor-critic (Haarnoja et al. 2018) for continuous actions, written once as fragments.

The actor samples from a tanh-squashed Gaussian policy; the learner fits twin
critics to ``r + gamma (min_i Q_target_i(s', a') - alpha log pi(a'|s'))`` with
``a' ~ pi(s')``, then improves the policy on ``alpha log pi(a|s) - min_i Q_i(s, a)``
and tunes the temperature ``alpha`` so that the policy's entropy tracks
``-target_entropy_scale * action dimensions``. Target critics follow by Polyak
averaging. No bootstrap follows a termination; a time-limit truncation
bootstraps from the observation it cut off.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.errors import check
from jaxrl_frag.metrics import Metrics
from jaxrl_frag.recipes import replay
from jaxrl_frag.recipes.networks import SquashedGaussianPolicy
from jaxrl_frag.recipes.off_policy import ContinuousActorCritic, OffPolicyRecipe, polyak

PyTree = Any


@struct.dataclass
class SACLearner:
    critic: PyTree
    target: PyTree
    log_alpha: jax.Array
    policy_opt: PyTree
    critic_opt: PyTree
    alpha_opt: PyTree
    updates: jax.Array


@struct.dataclass
class SAC(ContinuousActorCritic):
    """SAC: twin critics with Polyak-averaged targets, a squashed Gaussian policy and
    automatic entropy temperature; uniform or prioritized replay."""

    num_envs: int = static_field(4, help="parallel environments")
    num_steps: int = static_field(8, help="environment steps per environment per iteration")
    num_updates: int = static_field(32, help="gradient steps per iteration, each on a fresh sample")
    minibatch_size: int = static_field(256, help="transitions sampled per gradient step")
    total_steps: int = static_field(100_000, help="environment steps of the whole run")
    learning_starts: int = static_field(1_000, help="environment steps collected before the first gradient step")
    hidden: tuple[int, ...] = static_field((256, 256), help="hidden layer widths of the policy and critics")
    lr: float = hyperparameter(1e-3, help="Adam learning rate of the policy, the critics and the temperature")
    tau: float = hyperparameter(0.005, help="target critic update: new = tau * online + (1 - tau) * target")
    init_temperature: float = hyperparameter(1.0, help="entropy temperature alpha at the start")
    target_entropy_scale: float = hyperparameter(1.0, help="target entropy = -scale * action dimensions")

    policy_class: ClassVar[type[nn.Module]] = SquashedGaussianPolicy
    reals: ClassVar[tuple[str, ...]] = (*OffPolicyRecipe.reals, "init_temperature", "target_entropy_scale")

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        if env_id == "Pendulum-v1":
            return dict(total_steps=20_000, hidden=(64, 64), minibatch_size=128)
        return {}

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        check(s["init_temperature"] > 0, "init_temperature", s["init_temperature"], "must be positive")

    def init_learner(self, key: jax.Array, obs: jax.Array, policy: PyTree) -> SACLearner:
        critic = self.init_critic(key, obs)
        log_alpha = jnp.log(jnp.asarray(self.init_temperature, jnp.float32))
        tx = self.optimizer()
        return SACLearner(critic, critic, log_alpha, tx.init(policy), tx.init(critic), tx.init(log_alpha),
                          jnp.int32(0))

    def greedy_action(self, policy: PyTree, obs: jax.Array) -> jax.Array:
        return self.policy_network.apply(policy, obs).mode()

    def act(self, policy: PyTree, obs: jax.Array, key: jax.Array, steps: jax.Array) -> tuple[jax.Array, jax.Array]:
        action, _ = self.policy_network.apply(policy, obs).sample_and_log_prob(key)
        return action, action

    def update(self, policy: PyTree, learner: SACLearner, drawn: replay.Sample,
               key: jax.Array) -> tuple[PyTree, SACLearner, jax.Array, Metrics]:
        k_next, k_new = jax.random.split(key)
        steps = drawn.items
        obs, action = steps.obs[:, 0], steps.action[:, 0]
        returns, discount, next_obs = self.n_step_targets(steps)
        alpha = jnp.exp(learner.log_alpha)
        next_action, next_log_prob = self.policy_network.apply(policy, next_obs).sample_and_log_prob(k_next)
        next_q = self.critic_network.apply(learner.target, next_obs, next_action).min(0)
        target = jax.lax.stop_gradient(returns + discount * (next_q - alpha * next_log_prob))
        tx = self.optimizer()

        def critic_loss(critic: PyTree) -> tuple[jax.Array, jax.Array]:
            q = self.critic_network.apply(critic, obs, action)
            return (drawn.weight * 0.5 * ((q - target) ** 2).sum(0)).mean(), q

        (q_loss, q), grads = jax.value_and_grad(critic_loss, has_aux=True)(learner.critic)
        updates, critic_opt = tx.update(grads, learner.critic_opt, learner.critic)
        critic = optax.apply_updates(learner.critic, updates)

        def policy_loss(params: PyTree) -> tuple[jax.Array, jax.Array]:
            new_action, log_prob = self.policy_network.apply(params, obs).sample_and_log_prob(k_new)
            new_q = self.critic_network.apply(critic, obs, new_action).min(0)
            return (drawn.weight * (alpha * log_prob - new_q)).mean(), log_prob

        (pi_loss, log_prob), grads = jax.value_and_grad(policy_loss, has_aux=True)(policy)
        updates, policy_opt = tx.update(grads, learner.policy_opt, policy)
        policy = optax.apply_updates(policy, updates)

        target_entropy = -self.target_entropy_scale * self.action_dim
        entropy = -jax.lax.stop_gradient(log_prob).mean()

        def alpha_loss(log_alpha: jax.Array) -> jax.Array:
            return log_alpha * (entropy - target_entropy)

        grads = jax.grad(alpha_loss)(learner.log_alpha)
        updates, alpha_opt = tx.update(grads, learner.alpha_opt, learner.log_alpha)
        log_alpha = optax.apply_updates(learner.log_alpha, updates)

        done = learner.updates + 1
        target_critic = polyak(critic, learner.target, self.tau, done % self.target_every == 0)
        learner = SACLearner(critic, target_critic, log_alpha, policy_opt, critic_opt, alpha_opt, done)
        metrics = {"critic_loss": q_loss, "policy_loss": pi_loss, "alpha": alpha, "entropy": entropy, "q": q.mean()}
        return policy, learner, jnp.abs(q[0] - target), metrics
