"""IMPALA (Espeholt et al. 2018): an actor-critic whose learner corrects for the lag
between the acting policy and the learned one with V-trace, written once as fragments.

The ``actor`` fragment is the shared rollout (``ActorCriticRecipe.rollout``); it
records the acting policy's log-probabilities. The ``learner`` fragment splits the
environments into ``num_minibatches`` groups of whole trajectories and, for each,
recomputes the policy and values with the current parameters, forms V-trace targets
and clipped-importance advantages, and takes one gradient step on the policy-gradient
loss, the value regression and an entropy bonus. Under ``ActorLearner`` with
staleness ``k`` the acting policy is ``k`` updates old, which V-trace corrects;
without lag it is on-policy, and V-trace reduces to n-step returns.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.bounds import divisors
from jaxrl_frag.errors import check
from jaxrl_frag.fragments import fragment
from jaxrl_frag.metrics import Metrics
from jaxrl_frag.recipes.actor_critic import ActorCriticRecipe, Transition
from jaxrl_frag.recipes.advantages import vtrace

PyTree = Any


@struct.dataclass
class IMPALA(ActorCriticRecipe):
    """Actor-critic with V-trace off-policy correction (clipped importance weights
    rho_bar for the targets and the policy gradient, c_bar for the trace)."""

    num_envs: int = static_field(16, help="parallel environments")
    # 64 steps and 4 minibatches: 16 of 16 seeds reach 475 on CartPole-v1 within 1e6 steps, where 32 steps and one
    # minibatch left 1 of 8 stalled near 150 (benchmarks/HISTORY.md, "IMPALA on every seed")
    num_steps: int = static_field(64, help="environment steps per environment per iteration (trajectory length)")
    num_minibatches: int = static_field(4, help="gradient steps per iteration, each on a share of the environments; "
                                               "must divide num_envs")
    total_steps: int = static_field(1_000_000, help="environment steps of the whole run")
    lr: float = hyperparameter(1e-3, help="Adam learning rate")
    ent_coef: float = hyperparameter(0.001, help="entropy bonus coefficient")
    vf_coef: float = hyperparameter(0.25, help="value loss coefficient")
    vtrace_lambda: float = hyperparameter(1.0, help="V-trace lambda (trace decay)")
    rho_bar: float = hyperparameter(1.0, help="importance weight clip for targets and policy gradient")
    c_bar: float = hyperparameter(1.0, help="importance weight clip for the trace")

    reals: ClassVar[tuple[str, ...]] = (*ActorCriticRecipe.reals, "vtrace_lambda", "rho_bar", "c_bar")

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        check(s["num_envs"] % s["num_minibatches"] == 0, "num_minibatches", s["num_minibatches"],
              lambda: f"must divide num_envs = {s['num_envs']} (each minibatch is whole trajectories); "
                      f"choose one of {divisors(s['num_envs'], 16)}")
        check(0 <= s["vtrace_lambda"] <= 1, "vtrace_lambda", s["vtrace_lambda"], "must lie in [0, 1]")
        for name in ("rho_bar", "c_bar"):
            check(s[name] > 0, name, s[name], "must be positive")

    @fragment("learner", batched={"traj": 1, "last_obs": 0}, outputs=("params", "opt_state", "losses"))
    def learn(
        self, params: PyTree, opt_state: PyTree, traj: Transition, last_obs: jax.Array, key: jax.Array
    ) -> tuple[PyTree, PyTree, Metrics]:
        """One V-trace actor-critic update per minibatch of environments."""
        return self.descend(params, opt_state, self.samples(params, traj, last_obs), key[None])

    def samples(self, params: PyTree, traj: Transition, last_obs: jax.Array) -> tuple[Transition, jax.Array]:
        """Environment-major trajectories and their following observations, so that a
        minibatch holds whole trajectories."""
        return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), traj), last_obs

    def loss(self, params: PyTree, traj: Transition, last_obs: jax.Array) -> tuple[jax.Array, Metrics]:
        """Policy-gradient loss with V-trace advantages + value regression to V-trace
        targets - entropy bonus, on environment-major trajectories ``[n, T, ...]`` and the
        observations ``[n, ...]`` that follow them."""
        n, steps = traj.reward.shape
        time_major = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), traj)
        # a recurrent network unrolls each environment's sequence [n, T]; a feed-forward one sees [n * T] samples,
        # environments outermost, so samples stay with their environments
        obs, action = (traj.obs, traj.action) if self.recurrent else (
            x.reshape(n * steps, *x.shape[2:]) for x in (traj.obs, traj.action))
        dist, values = self.policy_value(params, self.recurrence(time_major), obs)
        log_prob = dist.log_prob(action).reshape(n, steps).T
        values = values.reshape(n, steps).T  # time-major [T, n] from here on
        traj = time_major
        done = traj.terminated | traj.truncated
        last_value = self.value_after(params, jax.tree.map(lambda m: m[-1], traj.memory), traj.obs[-1], done[-1],
                                      last_obs)
        following = jnp.concatenate([values[1:], last_value[None]])
        # at an episode's end the next value is the final observation's, as the actor valued it
        next_values = jax.lax.stop_gradient(jnp.where(done, traj.final_value, following))
        discounts = self.gamma * (1.0 - traj.terminated.astype(values.dtype))
        log_rhos = jax.lax.stop_gradient(log_prob) - traj.log_prob
        targets, advantages = vtrace(log_rhos, traj.reward, jax.lax.stop_gradient(values), next_values, discounts,
                                     1.0 - done.astype(values.dtype), self.vtrace_lambda, self.rho_bar, self.c_bar)
        policy_loss = -(advantages * log_prob).mean()
        value_loss = 0.5 * ((targets - values) ** 2).mean()
        entropy = dist.entropy().mean()
        total = policy_loss + self.vf_coef * value_loss - self.ent_coef * entropy
        return total, {
            "loss": total, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
            "importance_weight": jnp.exp(log_rhos).mean(),
        }
