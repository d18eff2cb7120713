"""Proximal Policy Optimization (Schulman et al. 2017), written once as fragments.

The ``actor`` fragment (``ActorCriticRecipe.rollout``) steps the environment batch
with the current policy; the ``learner`` fragment computes GAE advantages and runs
epochs of clipped-surrogate minibatch updates. Discrete actions use a categorical
policy, continuous ones a Gaussian whose samples are clipped to the action bounds
for the environment (the log-probability is of the unclipped sample). No
distribution code here: batch-wide operations go through ``jaxrl_frag.primitives``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_frag import primitives
from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.bounds import divisors, is_whole
from jaxrl_frag.errors import check
from jaxrl_frag.fragments import fragment
from jaxrl_frag.metrics import Metrics
from jaxrl_frag.recipes.actor_critic import ActorCriticRecipe, Transition
from jaxrl_frag.recipes.epochs import check_minibatches
from jaxrl_frag.recipes.memory import Recurrence

PyTree = Any


@struct.dataclass
class PPO(ActorCriticRecipe):
    """PPO with GAE, clipped surrogate and (optionally clipped) value losses, entropy
    bonus, minibatch epochs, linear learning-rate annealing and global-norm gradient
    clipping."""

    num_minibatches: int = static_field(4, help="minibatches per epoch; must divide num_envs * num_steps")
    num_epochs: int = static_field(4, help="passes over each iteration's batch")
    gae_lambda: float = hyperparameter(0.95, help="GAE lambda")
    clip_eps: float = hyperparameter(0.2, help="surrogate and value clipping range")
    clip_value: bool = static_field(True, help="clip each update's change of the value to clip_eps (PPO2's value "
                                               "clipping, as CleanRL and PureJaxRL); off: the plain squared error, "
                                               "as Brax's PPO, whose returns are not normalised")
    unroll_length: int = static_field(0, help="bootstrap the advantages every this many steps of an environment's "
                                              "rollout (Brax's unroll_length); 0: once, after num_steps")

    counts: ClassVar[tuple[str, ...]] = (*ActorCriticRecipe.counts, "num_epochs")
    reals: ClassVar[tuple[str, ...]] = (*ActorCriticRecipe.reals, "gae_lambda", "clip_eps")

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        if env_id.endswith("-MinAtar"):
            # ReLU: Breakout-MinAtar at gymnax-blines' settings reached 24.6 at 1e7 steps against 14.3 with tanh
            # (benchmarks/HISTORY.md, parity row ppo-breakout-minatar)
            return dict(num_envs=64, total_steps=10_000_000, lr=5e-4, hidden=(256, 256), activation="relu")
        if env_id in ("Pendulum-v1", "MountainCarContinuous-v0"):
            return dict(num_envs=16, num_steps=256, total_steps=1_000_000, num_epochs=10, num_minibatches=32,
                        lr=1e-3, gamma=0.95, ent_coef=0.0, normalize_obs=True, scale_reward=True,
                        max_grad_norm=0.5)
        if env_id.startswith("brax:"):
            # tuned on brax:inverted_pendulum, which these settings solve (return 1000) within 1.5e5 steps
            return dict(num_envs=64, num_steps=32, total_steps=1_000_000, num_minibatches=4, lr=1e-3, gamma=0.97,
                        ent_coef=0.0, normalize_obs=True)
        return {}

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        check_minibatches(s)
        check(s["clip_eps"] > 0, "clip_eps", s["clip_eps"], "must be positive")
        check(0 <= s["gae_lambda"] <= 1, "gae_lambda", s["gae_lambda"], "must lie in [0, 1]")
        check(is_whole(s["unroll_length"]) and s["unroll_length"] >= 0
              and (s["unroll_length"] == 0 or s["num_steps"] % s["unroll_length"] == 0), "unroll_length",
              s["unroll_length"], lambda: f"must divide num_steps = {s['num_steps']} (one of "
                                          f"{divisors(s['num_steps'], 16)}), or be 0")

    @classmethod
    def updates_of(cls, s: dict[str, Any]) -> int:
        return s["num_epochs"] * s["num_minibatches"]

    @fragment("learner", batched={"traj": 1, "last_obs": 0}, outputs=("params", "opt_state", "losses"))
    def learn(
        self, params: PyTree, opt_state: PyTree, traj: Transition, last_obs: jax.Array, key: jax.Array
    ) -> tuple[PyTree, PyTree, Metrics]:
        """GAE, then ``num_epochs`` epochs of ``num_minibatches`` clipped-surrogate updates."""
        return self.descend(params, opt_state, self.samples(params, traj, last_obs), jax.random.split(key, self.num_epochs))

    def samples(self, params: PyTree, traj: Transition, last_obs: jax.Array) -> tuple[Any, ...]:
        return self.gae_samples(params, traj, last_obs, self.gae_lambda, self.unroll_length)

    def loss(self, params: PyTree, recurrence: Recurrence | tuple[()], obs: jax.Array, action: jax.Array,
             old_log_prob: jax.Array, old_value: jax.Array, advantage: jax.Array,
             target: jax.Array) -> tuple[jax.Array, Metrics]:
        """Clipped surrogate + value loss (clipped with ``clip_value``) - entropy bonus, on one minibatch."""
        dist, value = self.policy_value(params, recurrence, obs)
        log_ratio = dist.log_prob(action) - old_log_prob
        ratio = jnp.exp(log_ratio)
        advantage = primitives.standardize(advantage)
        clipped_ratio = jnp.clip(ratio, 1.0 - self.clip_eps, 1.0 + self.clip_eps)
        policy_loss = -jnp.minimum(ratio * advantage, clipped_ratio * advantage).mean()
        value_loss = (value - target) ** 2
        if self.clip_value:  # the value moves at most clip_eps from the rollout's per iteration
            value_clipped = old_value + jnp.clip(value - old_value, -self.clip_eps, self.clip_eps)
            value_loss = jnp.maximum(value_loss, (value_clipped - target) ** 2)
        value_loss = 0.5 * value_loss.mean()
        entropy = dist.entropy().mean()
        total = policy_loss + self.vf_coef * value_loss - self.ent_coef * entropy
        return total, {
            "loss": total, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
            "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
            "clip_fraction": (jnp.abs(ratio - 1.0) > self.clip_eps).mean(),
        }
