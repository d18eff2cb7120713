"""Twin delayed deep deterministic policy gradient (TD3; Fujimoto et al. 2018) for
continuous actions, written once as fragments.

The actor is a deterministic policy ``mu(s)`` in the action bounds; it acts with
Gaussian exploration noise (``exploration_noise`` of the half action range), and
uniformly at random until ``learning_starts`` steps are in the buffer. The learner
fits twin critics to ``r + gamma min_i Q_target_i(s', a')``, where ``a'`` is the
target actor's action smoothed by clipped Gaussian noise (``policy_noise``, clipped
at ``noise_clip``, both of the half range); every ``policy_delay`` critic updates
it moves the actor up ``Q_1(s, mu(s))`` and the target actor and critics towards
theirs by Polyak averaging (``tau``). No bootstrap follows a termination; a
time-limit truncation bootstraps from the observation it cut off.
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
from jaxrl_frag.recipes.networks import DeterministicPolicy
from jaxrl_frag.recipes.off_policy import ContinuousActorCritic, OffPolicyRecipe, polyak

PyTree = Any


@struct.dataclass
class TD3Learner:
    critic: PyTree
    target_critic: PyTree
    target_policy: PyTree
    policy_opt: PyTree
    critic_opt: PyTree
    updates: jax.Array


@struct.dataclass
class TD3(ContinuousActorCritic):
    """TD3: twin critics, target policy smoothing, delayed actor and target updates,
    Gaussian exploration noise; uniform or prioritized replay. Defaults: Fujimoto's
    ``TD3.py`` and ``main.py`` (on Pendulum-v1, rl-baselines3-zoo's ``td3.yml``)."""

    num_envs: int = static_field(4, help="parallel environments")
    num_steps: int = static_field(8, help="environment steps per environment per iteration")
    num_updates: int = static_field(32, help="critic updates per iteration, each on a fresh sample")
    minibatch_size: int = static_field(256, help="transitions sampled per gradient step")
    total_steps: int = static_field(1_000_000, help="environment steps of the whole run")
    buffer_size: int = static_field(1_000_000, help="environment steps the replay buffer holds (all environments)")
    learning_starts: int = static_field(25_000, help="environment steps of uniformly random actions collected "
                                                     "before the first gradient step")
    hidden: tuple[int, ...] = static_field((256, 256), help="hidden layer widths of the actor and critics")
    lr: float = hyperparameter(3e-4, help="Adam learning rate of the actor and the critics")
    tau: float = hyperparameter(0.005, help="target update: new = tau * online + (1 - tau) * target")
    max_grad_norm: float = hyperparameter(1e9, help="global gradient norm clip (TD3 clips none: the default "
                                                    "clips nothing)")
    target_every: int = static_field(1, help="actor updates between target network updates")
    policy_delay: int = static_field(2, help="critic updates per actor update (and target update)")
    exploration_noise: float = hyperparameter(0.1, help="std of the Gaussian noise on the acting actions, as a "
                                                        "share of the half action range")
    policy_noise: float = hyperparameter(0.2, help="std of the target policy smoothing noise, as a share of the "
                                                   "half action range")
    noise_clip: float = hyperparameter(0.5, help="the smoothing noise clipped to +- this share of the half range")

    policy_class: ClassVar[type[nn.Module]] = DeterministicPolicy
    counts: ClassVar[tuple[str, ...]] = (*OffPolicyRecipe.counts, "policy_delay")
    reals: ClassVar[tuple[str, ...]] = (*OffPolicyRecipe.reals, "exploration_noise", "policy_noise", "noise_clip")

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        if env_id == "Pendulum-v1":  # rl-baselines3-zoo's td3.yml (its 400x300 networks: 64x64 here, as SAC's)
            return dict(total_steps=20_000, buffer_size=200_000, learning_starts=10_000, gamma=0.98, lr=1e-3,
                        hidden=(64, 64))
        return {}

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        for name in ("exploration_noise", "policy_noise", "noise_clip"):
            check(s[name] >= 0, name, s[name], "must be zero or positive")

    def init_learner(self, key: jax.Array, obs: jax.Array, policy: PyTree) -> TD3Learner:
        critic = self.init_critic(key, obs)
        tx = self.optimizer()
        return TD3Learner(critic, critic, policy, tx.init(policy), tx.init(critic), jnp.int32(0))

    def noisy(self, action: jax.Array, key: jax.Array, std: jax.Array, clip: jax.Array | None = None) -> jax.Array:
        """``action`` plus Gaussian noise of ``std`` half ranges (clipped at ``clip`` of
        them), kept within the action bounds."""
        space = self.env.action_space
        low, high = jnp.asarray(space.low), jnp.asarray(space.high)
        noise = std * jax.random.normal(key, action.shape)
        if clip is not None:
            noise = jnp.clip(noise, -clip, clip)
        return jnp.clip(action + noise * (high - low) / 2.0, low, high)

    def greedy_action(self, policy: PyTree, obs: jax.Array) -> jax.Array:
        return self.policy_network.apply(policy, obs)

    def act(self, policy: PyTree, obs: jax.Array, key: jax.Array, steps: jax.Array) -> tuple[jax.Array, jax.Array]:
        k_noise, k_random = jax.random.split(key)
        action = self.noisy(self.greedy_action(policy, obs), k_noise, self.exploration_noise)
        space = self.env.action_space
        shape = (obs.shape[0], *space.shape)
        random = jax.random.uniform(k_random, shape, minval=jnp.asarray(space.low), maxval=jnp.asarray(space.high))
        action = jnp.where(steps < self.learning_starts, random, action)
        return action, action

    def update(self, policy: PyTree, learner: TD3Learner, drawn: replay.Sample,
               key: jax.Array) -> tuple[PyTree, TD3Learner, jax.Array, Metrics]:
        steps = drawn.items
        obs, action = steps.obs[:, 0], steps.action[:, 0]
        returns, discount, next_obs = self.n_step_targets(steps)
        next_action = self.noisy(self.policy_network.apply(learner.target_policy, next_obs), key, self.policy_noise,
                                 self.noise_clip)
        next_q = self.critic_network.apply(learner.target_critic, next_obs, next_action).min(0)
        target = jax.lax.stop_gradient(returns + discount * next_q)
        tx = self.optimizer()

        def critic_loss(critic: PyTree) -> tuple[jax.Array, jax.Array]:
            q = self.critic_network.apply(critic, obs, action)
            return (drawn.weight * ((q - target) ** 2).sum(0)).mean(), q

        (q_loss, q), grads = jax.value_and_grad(critic_loss, has_aux=True)(learner.critic)
        updates, critic_opt = tx.update(grads, learner.critic_opt, learner.critic)
        critic = optax.apply_updates(learner.critic, updates)

        def policy_loss(params: PyTree) -> jax.Array:
            q1 = self.critic_network.apply(critic, obs, self.policy_network.apply(params, obs))[0]
            return (drawn.weight * -q1).mean()

        def improve(policy: PyTree, policy_opt: PyTree) -> tuple[PyTree, PyTree, jax.Array]:
            value, grads = jax.value_and_grad(policy_loss)(policy)
            updates, policy_opt = tx.update(grads, policy_opt, policy)
            return optax.apply_updates(policy, updates), policy_opt, value

        def hold(policy: PyTree, policy_opt: PyTree) -> tuple[PyTree, PyTree, jax.Array]:
            return policy, policy_opt, policy_loss(policy)

        done = learner.updates + 1
        delayed = done % self.policy_delay == 0
        policy, policy_opt, pi_loss = jax.lax.cond(delayed, improve, hold, policy, learner.policy_opt)
        # the targets follow on the actor's updates, every target_every-th of them (each one by default)
        due = delayed & ((done // self.policy_delay) % self.target_every == 0)
        target_critic = polyak(critic, learner.target_critic, self.tau, due)
        target_policy = polyak(policy, learner.target_policy, self.tau, due)
        learner = TD3Learner(critic, target_critic, target_policy, policy_opt, critic_opt, done)
        metrics = {"critic_loss": q_loss, "policy_loss": pi_loss, "q": q.mean()}
        return policy, learner, jnp.abs(q[0] - target), metrics
