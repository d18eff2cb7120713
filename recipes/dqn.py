"""Deep Q-learning (Mnih et al. 2015) with double Q-learning (van Hasselt et al. 2016),
n-step returns and optional prioritized replay, written once as fragments.

The actor acts epsilon-greedily with the online network, epsilon decaying
linearly (on an environment that masks actions, ``envs.MaskedObs``, among the allowed
ones, and the bootstrap action too is an allowed one); the learner regresses Q(s, a) on ``G + gamma^m Q_target(s_m, a*)``, where
``G`` is the n-step return cut at an episode's end, ``a*`` the online network's
greedy action (double) or the target network's, and no bootstrap follows a
termination; a time-limit truncation bootstraps from the observation it cut off.
The target network follows the online one every ``target_every`` steps (a hard
copy with ``tau = 1``, Polyak averaging below).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrl_frag import envs
from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.envs.core import unmasked
from jaxrl_frag.errors import check
from jaxrl_frag.metrics import Metrics
from jaxrl_frag.recipes import replay
from jaxrl_frag.recipes.networks import QValues, allowed_values, uniform_allowed
from jaxrl_frag.recipes.off_policy import EXPLORATION, OffPolicyRecipe, check_exploration, linear, polyak

PyTree = Any

TD_LOSSES = {"mse": optax.l2_loss, "huber": optax.huber_loss}


@struct.dataclass
class DQNLearner:
    target: PyTree
    opt_state: PyTree
    updates: jax.Array


@struct.dataclass
class DQN(OffPolicyRecipe):
    """DQN: double Q-learning, n-step returns, a target network (hard or Polyak
    updates), a linear epsilon-greedy schedule and uniform or prioritized replay."""

    num_updates: int = static_field(8, help="gradient steps per iteration, each on a fresh sample")
    total_steps: int = static_field(200_000, help="environment steps of the whole run")
    buffer_size: int = static_field(20_000, help="environment steps the replay buffer holds (all environments)")
    hidden: tuple[int, ...] = static_field((120, 84), help="hidden layer widths of the Q network")
    lr: float = hyperparameter(5e-4, help="Adam learning rate")
    double: bool = static_field(True, help="double Q-learning: the online network picks the bootstrap action")
    n_step: int = static_field(1, help="steps of reward before bootstrapping")
    target_every: int = static_field(25, help="gradient steps between target network updates")
    epsilon_start: float = hyperparameter(1.0, help="exploration rate at the start")
    epsilon_end: float = hyperparameter(0.05, help="exploration rate after the decay")
    exploration_fraction: float = hyperparameter(0.2, help="share of the run over which epsilon decays")
    td_loss: str = static_field("mse", help="loss of the TD error: mse, or huber (quadratic within 1, then linear)")

    action_spaces: ClassVar[tuple[type, ...]] = (envs.Discrete,)
    takes_action_masks: ClassVar[bool] = True  # a masked action is never chosen, nor bootstrapped from
    counts: ClassVar[tuple[str, ...]] = (*OffPolicyRecipe.counts, "n_step")
    reals: ClassVar[tuple[str, ...]] = (*OffPolicyRecipe.reals, *EXPLORATION)
    window: ClassVar[int | str] = "n_step"

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        check_exploration(s)
        check(s["td_loss"] in TD_LOSSES, "td_loss", s["td_loss"], f"choose one of {', '.join(TD_LOSSES)}")

    @property
    def network(self) -> QValues:
        return QValues(self.env.action_space.n, self.hidden)

    def epsilon(self, steps: jax.Array) -> jax.Array:
        return linear(self.epsilon_start, self.epsilon_end, steps / (self.exploration_fraction * self.total_steps))

    def init_policy(self, key: jax.Array, obs: jax.Array) -> PyTree:
        return self.network.init(key, obs)

    def init_learner(self, key: jax.Array, obs: jax.Array, policy: PyTree) -> DQNLearner:
        return DQNLearner(policy, self.optimizer().init(policy), jnp.int32(0))

    def values(self, params: PyTree, obs: jax.Array, key: jax.Array | None = None) -> jax.Array:
        """The network's output on observations ``[B, ...]``: ``[B, actions, ...]`` (here
        Q-values ``[B, actions]``); ``key`` draws the noise of a noisy network, and
        without one it acts on its mean weights (this network has none)."""
        return self.network.apply(params, obs)

    def q_values(self, values: jax.Array) -> jax.Array:
        """The Q-values ``[B, actions]`` of ``values``' outputs (here themselves)."""
        return values

    def sample_loss(self, chosen: jax.Array, target: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Each sample's loss and new priority, from the outputs of the actions taken
        (``values`` of them, ``[B, ...]``) and their targets: here the TD loss and the
        absolute TD error."""
        td = chosen - target
        return TD_LOSSES[self.td_loss](td), jnp.abs(td)

    def of_actions(self, params: PyTree, values: jax.Array, action: jax.Array, obs: PyTree) -> jax.Array:
        """The outputs ``[B, ...]`` of the actions ``action`` ``[B]`` among ``values`` ``[B,
        actions, ...]`` (here ``taken``); a team's recipe mixes its agents' outputs here, with
        the network ``params`` and the observations ``obs`` (without masks) they were read at."""
        return taken(values, action)

    def allowed_q(self, params: PyTree, obs: jax.Array | envs.MaskedObs, key: jax.Array | None = None) -> jax.Array:
        """The Q-values ``[B, actions]`` of ``values`` on observations ``obs``, those of the
        actions outside a ``MaskedObs``'s mask at ``-inf`` (``networks.allowed_values``)."""
        x, mask = unmasked(obs)
        return allowed_values(self.q_values(self.values(params, x, key)), mask)

    def greedy_action(self, policy: PyTree, obs: jax.Array) -> jax.Array:
        return self.allowed_q(policy, obs).argmax(-1)

    def act(self, policy: PyTree, obs: jax.Array, key: jax.Array, steps: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Epsilon-greedy: with probability ``epsilon`` an action uniform over the allowed
        ones (every action, where the environment masks none), else the greedy one."""
        k_explore, k_random = jax.random.split(key)
        q = self.allowed_q(policy, obs, jax.random.fold_in(key, 1))
        greedy = q.argmax(-1)
        if not isinstance(obs, (envs.MaskedObs, envs.AgentObs)):  # no action masks to draw within
            random = jax.random.randint(k_random, greedy.shape, 0, self.env.action_space.n)
        else:
            random = uniform_allowed(k_random, q)
        action = jnp.where(jax.random.uniform(k_explore, greedy.shape) < self.epsilon(steps), random, greedy)
        return action, action

    def update(self, policy: PyTree, learner: DQNLearner, drawn: replay.Sample,
               key: jax.Array) -> tuple[PyTree, DQNLearner, jax.Array, Metrics]:
        k_online, k_next, k_target = jax.random.split(key, 3)  # the noise of a noisy network's three passes
        steps = drawn.items
        returns, discount, bootstrap_obs = self.n_step_targets(steps)
        bootstrap, mask = unmasked(bootstrap_obs)
        next_target = self.values(learner.target, bootstrap, k_target)
        chooser = self.values(policy, bootstrap, k_next) if self.double else next_target
        next_value = self.of_actions(learner.target, next_target, allowed_values(self.q_values(chooser), mask).argmax(-1),
                                     bootstrap)
        at = (-1, *[1] * (next_value.ndim - 1))
        target = jax.lax.stop_gradient(returns.reshape(at) + discount.reshape(at) * next_value)

        def loss(params: PyTree) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
            obs, _ = unmasked(jax.tree.map(lambda x: x[:, 0], steps.obs))
            chosen = self.of_actions(params, self.values(params, obs, k_online), steps.action[:, 0], obs)
            per_sample, priority = self.sample_loss(chosen, target)
            return (drawn.weight * per_sample).mean(), (priority, chosen)

        (value, (priority, chosen)), grads = jax.value_and_grad(loss, has_aux=True)(policy)
        updates, opt_state = self.optimizer().update(grads, learner.opt_state, policy)
        policy = optax.apply_updates(policy, updates)
        done = learner.updates + 1
        target_params = polyak(policy, learner.target, self.tau, done % self.target_every == 0)
        mean = lambda x: x.reshape(x.shape[0], -1).mean(-1)  # noqa: E731  the expected value of a distribution's atoms
        metrics = {"loss": value, "q": chosen.mean(), "td_abs": jnp.abs(mean(chosen) - mean(target)).mean()}
        return policy, DQNLearner(target_params, opt_state, done), priority, metrics


def taken(values: jax.Array, action: jax.Array) -> jax.Array:
    """The outputs ``[B, ...]`` of the actions ``action`` ``[B]`` among ``values`` ``[B, actions, ...]``."""
    index = action.astype(jnp.int32).reshape(-1, *[1] * (values.ndim - 1))
    return jnp.take_along_axis(values, index, axis=1)[:, 0]
