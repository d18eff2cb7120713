"""Advantage actor-critic, synchronous (A2C; Mnih et al. 2016), written once as fragments.

The ``actor`` fragment is the shared rollout (``ActorCriticRecipe.rollout``); the
``learner`` fragment computes n-step advantages (GAE with ``gae_lambda = 1`` by
default, i.e. bootstrapped n-step returns) and takes one gradient step per
minibatch of the rollout, in a single pass.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
from flax import struct

from jaxrl_frag import primitives
from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.errors import check
from jaxrl_frag.fragments import fragment
from jaxrl_frag.metrics import Metrics
from jaxrl_frag.recipes.actor_critic import ActorCriticRecipe, Transition
from jaxrl_frag.recipes.epochs import check_minibatches
from jaxrl_frag.recipes.memory import Recurrence

PyTree = Any


@struct.dataclass
class A2C(ActorCriticRecipe):
    """A2C: policy gradient with n-step (or GAE) advantages, a value baseline and an
    entropy bonus, one update per minibatch of each rollout."""

    num_envs: int = static_field(16, help="parallel environments")
    num_steps: int = static_field(8, help="environment steps per environment per iteration (the n of n-step)")
    num_minibatches: int = static_field(1, help="gradient steps per iteration; must divide num_envs * num_steps")
    lr: float = hyperparameter(1e-3, help="Adam learning rate")
    gae_lambda: float = hyperparameter(1.0, help="GAE lambda (1: bootstrapped n-step returns)")
    normalize_advantage: bool = static_field(False, help="standardise advantages over each minibatch")

    reals: ClassVar[tuple[str, ...]] = (*ActorCriticRecipe.reals, "gae_lambda")

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        check_minibatches(s)
        check(0 <= s["gae_lambda"] <= 1, "gae_lambda", s["gae_lambda"], "must lie in [0, 1]")

    @fragment("learner", batched={"traj": 1, "last_obs": 0}, outputs=("params", "opt_state", "losses"))
    def learn(
        self, params: PyTree, opt_state: PyTree, traj: Transition, last_obs: jax.Array, key: jax.Array
    ) -> tuple[PyTree, PyTree, Metrics]:
        """Advantages, then one pass of ``num_minibatches`` updates."""
        return self.descend(params, opt_state, self.samples(params, traj, last_obs), key[None])

    def samples(self, params: PyTree, traj: Transition, last_obs: jax.Array) -> tuple[Any, ...]:
        return self.gae_samples(params, traj, last_obs, self.gae_lambda)

    def loss(self, params: PyTree, recurrence: Recurrence | tuple[()], obs: jax.Array, action: jax.Array,
             old_log_prob: jax.Array, old_value: jax.Array, advantage: jax.Array,
             target: jax.Array) -> tuple[jax.Array, Metrics]:
        """Policy gradient + value regression - entropy bonus, on one minibatch."""
        dist, value = self.policy_value(params, recurrence, obs)
        if self.normalize_advantage:
            advantage = primitives.standardize(advantage)
        policy_loss = -(advantage * dist.log_prob(action)).mean()
        value_loss = 0.5 * ((value - target) ** 2).mean()
        entropy = dist.entropy().mean()
        total = policy_loss + self.vf_coef * value_loss - self.ent_coef * entropy
        return total, {"loss": total, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy}
