"""What DQN, SAC and TD3 share: acting into a replay buffer and learning from samples of it.

Each iteration, the ``actor`` fragment steps every environment ``num_steps``
times with the behaviour policy, the ``buffer`` fragment writes those steps to
the replay buffer, and the ``learner`` fragment takes ``num_updates`` gradient
steps, each on a fresh sample (once the buffer holds ``learning_starts``
windows). A subclass says how to act (``act``), what the learner keeps
(``init_learner``) and what one update does (``update``). ``ContinuousActorCritic``
holds what SAC and TD3 share: an actor in the action bounds and twin critics.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxrl_frag import envs
from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.bounds import INT32_MAX, is_whole
from jaxrl_frag.envs.core import Steps, unmasked
from jaxrl_frag.errors import check
from jaxrl_frag.fragments import fragment
from jaxrl_frag.metrics import Metrics
from jaxrl_frag.recipes import replay
from jaxrl_frag.recipes.advantages import n_step_return
from jaxrl_frag.recipes.networks import TwinCritic
from jaxrl_frag.recipes.recipe import PolicyFn, Recipe
from jaxrl_frag.recipes.rollout import collect

PyTree = Any


@struct.dataclass
class OffPolicyState:
    """``policy``: the parameters the actor acts with; ``learner``: everything else the
    learner keeps (critics, target networks, optimizer states); ``env_steps``: environment
    steps taken so far."""

    policy: PyTree
    learner: PyTree
    buffer: replay.Replay
    env_state: PyTree
    obs: jax.Array
    env_steps: jax.Array
    key: jax.Array


@struct.dataclass
class OffPolicyRecipe(Recipe):
    """Settings and the act / store / learn loop shared by replay-based recipes."""

    num_envs: int = static_field(8, help="parallel environments")
    num_steps: int = static_field(8, help="environment steps per environment per iteration")
    num_updates: int = static_field(4, help="gradient steps per iteration, each on a fresh sample")
    minibatch_size: int = static_field(128, help="windows sampled per gradient step")
    buffer_size: int = static_field(100_000, help="environment steps the replay buffer holds (all environments)")
    learning_starts: int = static_field(10_000, help="environment steps collected before the first gradient step")
    prioritized: bool = static_field(False, help="prioritized replay (proportional) instead of uniform")
    priority_alpha: float = hyperparameter(0.6, help="prioritized replay: priority exponent")
    priority_beta: float = hyperparameter(0.4, help="prioritized replay: importance-weight exponent at the start, "
                                                    "annealed to 1 over the run")
    tau: float = hyperparameter(1.0, help="target network update: new = tau * online + (1 - tau) * target")
    target_every: int = static_field(1, help="gradient steps between target network updates")
    max_grad_norm: float = hyperparameter(10.0, help="global gradient norm clip")

    counts: ClassVar[tuple[str, ...]] = (*Recipe.counts, "num_updates", "minibatch_size", "buffer_size",
                                         "target_every")
    reals: ClassVar[tuple[str, ...]] = (*Recipe.reals, "priority_alpha", "priority_beta", "tau", "max_grad_norm")
    positive: ClassVar[tuple[str, ...]] = (*Recipe.positive, "max_grad_norm")
    max_total_steps: ClassVar[tuple[int, str]] = (INT32_MAX, "the state counts environment steps in int32")

    window: ClassVar[int | str] = 1  # steps per sampled window, or the name of the setting that gives it

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        cls.check_updates(s, s["num_updates"])
        rows = s["buffer_size"] // s["num_envs"]
        window = s[cls.window] if isinstance(cls.window, str) else cls.window
        check(rows >= max(s["num_steps"], window + 1), "buffer_size", s["buffer_size"],
              f"must hold at least max(num_steps, window + 1) = {max(s['num_steps'], window + 1)} steps of each of "
              f"the {s['num_envs']} environments; raise it")
        check(is_whole(s["learning_starts"]) and 0 <= s["learning_starts"] <= s["total_steps"],
              "learning_starts", s["learning_starts"], "must be a whole number of steps between 0 and total_steps")
        check(0 < s["tau"] <= 1, "tau", s["tau"], "must lie in (0, 1]")
        check(s["priority_alpha"] >= 0, "priority_alpha", s["priority_alpha"], "must be zero or positive")
        check(0 <= s["priority_beta"] <= 1, "priority_beta", s["priority_beta"], "must lie in [0, 1]")

    @property
    def window_steps(self) -> int:
        return getattr(self, self.window) if isinstance(self.window, str) else self.window

    def optimizer(self) -> optax.GradientTransformation:
        return optax.chain(optax.clip_by_global_norm(self.max_grad_norm), optax.adam(self.lr))

    # -- what a subclass provides -------------------------------------------------

    def init_policy(self, key: jax.Array, obs: jax.Array) -> PyTree:
        """The parameters the actor acts with, for observations ``obs`` (without their
        action masks, where the environment gives them)."""
        raise NotImplementedError

    def init_learner(self, key: jax.Array, obs: jax.Array, policy: PyTree) -> PyTree:
        """What the learner keeps besides ``policy``."""
        raise NotImplementedError

    def act(self, policy: PyTree, obs: jax.Array, key: jax.Array, steps: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The behaviour policy's actions, to record and to send to the environment,
        ``steps`` environment steps into the run.

        Args:
            policy: The parameters the actor acts with.
            obs: ``[N, ...]`` observations.
            key: PRNG key (exploration).
            steps: Environment steps taken so far (for exploration schedules).

        Returns:
            ``(action, env_action)``: the action stored in the replay buffer, and the
            one sent to the environment (the same one in DQN and SAC).
        """
        raise NotImplementedError

    def greedy_action(self, policy: PyTree, obs: jax.Array) -> jax.Array:
        """The deterministic action of the behaviour policy on observations ``[N, ...]``
        (the greedy Q-value's, the squashed Gaussian's mean)."""
        raise NotImplementedError

    def policy_fn(self, state: OffPolicyState, greedy: bool) -> PolicyFn:
        """``greedy_action``, or the behaviour policy ``act`` as it acts at the end of the
        run (``Recipe.policy_fn``)."""
        end = jnp.int32(self.total_steps)

        def act(obs: jax.Array, key: jax.Array) -> jax.Array:
            return self.greedy_action(state.policy, obs) if greedy else self.act(state.policy, obs, key, end)[1]

        return act

    def update(self, policy: PyTree, learner: PyTree, drawn: replay.Sample,
               key: jax.Array) -> tuple[PyTree, PyTree, jax.Array, Metrics]:
        """One gradient step on the windows ``drawn`` (``Steps`` leaves ``[B, window, ...]``):
        new ``policy`` and ``learner``, each window's new priority, metrics.

        Args:
            policy: The parameters the actor acts with.
            learner: What the learner keeps besides them (critics, targets, optimizer states).
            drawn: The sampled windows, with their importance weights (``drawn.weight``).
            key: PRNG key.

        Returns:
            ``(policy, learner, priorities, metrics)``: ``priorities`` is ``[B]`` (used
            by a prioritized buffer, ignored by a uniform one).
        """
        raise NotImplementedError

    def n_step_targets(self, steps: Steps) -> tuple[jax.Array, jax.Array, jax.Array]:
        """For windows of ``steps`` (leaves ``[B, window, ...]``): the n-step return, the
        discount of the bootstrap value and the observation it bootstraps from."""
        returns, discount, last = n_step_return(steps.reward, steps.terminated, steps.truncated, self.gamma)
        bootstrap = jax.tree.map(lambda x: jnp.take_along_axis(x, last.reshape(-1, *[1] * (x.ndim - 1)), axis=1)[:, 0],
                                 steps.next_obs)
        return returns, discount, bootstrap

    # -- the loop -----------------------------------------------------------------

    def init(self, key: jax.Array) -> OffPolicyState:
        key, k_policy, k_learner, k_env = jax.random.split(key, 4)
        env_state, obs = self.env.reset(k_env)
        features, _ = unmasked(obs)
        policy = self.init_policy(k_policy, features)
        learner = self.init_learner(k_learner, features, policy)
        action = jax.eval_shape(self.act, policy, obs, k_policy, jnp.int32(0))[0]
        # a step's reward, termination and truncation: [N], or [N, agents] for a team
        agents = self.env.num_agents
        signal = (*jax.tree.leaves(obs)[0].shape[:1], *(() if agents is None else (agents,)))
        example = Steps(obs, jnp.zeros(action.shape, action.dtype),
                        *(jnp.zeros(signal, dtype) for dtype in (jnp.float32, bool, bool)), obs)
        buffer = replay.create(example, self.buffer_size // self.num_envs, self.window_steps, self.prioritized)
        return OffPolicyState(policy, learner, buffer, env_state, obs, jnp.int32(0), key)

    def step(self, state: OffPolicyState) -> tuple[OffPolicyState, Metrics]:
        key, k_act, k_learn = jax.random.split(state.key, 3)
        steps, env_state, obs, episodes = self.rollout(state.policy, state.env_state, state.obs, state.env_steps, k_act)
        buffer = self.store(state.buffer, steps)
        taken = state.env_steps + self.batch_size
        policy, learner, buffer, losses = self.learn(state.policy, state.learner, buffer, taken, k_learn)
        return OffPolicyState(policy, learner, buffer, env_state, obs, taken, key), {**episodes, **losses}

    @fragment("actor", batched={"env_state": 0, "obs": 0, "steps": 1}, outputs=("steps", "env_state", "obs", "episodes"))
    def rollout(self, policy: PyTree, env_state: PyTree, obs: jax.Array, taken: jax.Array,
                key: jax.Array) -> tuple[Steps, PyTree, jax.Array, Metrics]:
        """``num_steps`` steps of every environment with the behaviour policy."""

        def act(obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, None]:
            return (*self.act(policy, obs, key, taken), None)

        steps, _, env_state, obs, episodes = collect(self.env, act, env_state, obs, key, self.num_steps)
        return steps, env_state, obs, episodes

    def finite_part(self, field: str, value: PyTree) -> PyTree:
        """Of the replay buffer, what this iteration changed (``replay.latest``): its older
        rows were checked when they were written, and scanning them all would cost each
        iteration a pass over the whole buffer."""
        return replay.latest(value, self.num_steps) if field == "buffer" else value

    @fragment("buffer", batched={"buffer": 1, "steps": 1}, outputs=("buffer",))
    def store(self, buffer: replay.Replay, steps: Steps) -> replay.Replay:
        """The steps written to the replay buffer."""
        return replay.add(buffer, steps)

    @fragment("learner", batched={"buffer": 1}, outputs=("policy", "learner", "buffer", "losses"))
    def learn(self, policy: PyTree, learner: PyTree, buffer: replay.Replay, taken: jax.Array,
              key: jax.Array) -> tuple[PyTree, PyTree, replay.Replay, Metrics]:
        """``num_updates`` gradient steps, each on a fresh sample, once ``learning_starts``
        steps are in the buffer (before that, nothing changes and the losses read 0)."""
        beta = linear(self.priority_beta, 1.0, taken / self.total_steps)

        def one_update(carry: tuple[PyTree, PyTree, replay.Replay], key: jax.Array) -> tuple[Any, Metrics]:
            policy, learner, buffer = carry
            k_sample, k_update = jax.random.split(key)
            drawn = replay.sample(buffer, k_sample, self.minibatch_size, beta)
            policy, learner, priorities, metrics = self.update(policy, learner, drawn, k_update)
            if buffer.prioritized:
                buffer = replay.update_priorities(buffer, drawn, priorities + 1e-6, self.priority_alpha)
            return (policy, learner, buffer), metrics

        def train(carry: tuple[PyTree, PyTree, replay.Replay]) -> tuple[Any, Metrics]:
            carry, metrics = jax.lax.scan(one_update, carry, jax.random.split(key, self.num_updates))
            return carry, jax.tree.map(jnp.mean, metrics)

        def wait(carry: tuple[PyTree, PyTree, replay.Replay]) -> tuple[Any, Metrics]:
            shapes = jax.eval_shape(train, carry)[1]
            return carry, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        started = buffer.added * self.num_envs >= max(self.learning_starts, self.window_steps * self.num_envs)
        (policy, learner, buffer), metrics = jax.lax.cond(started, train, wait, (policy, learner, buffer))
        return policy, learner, buffer, metrics


class ContinuousActorCritic(OffPolicyRecipe):
    """An off-policy recipe for continuous actions: the actor is ``policy_class(action
    dimensions, hidden, low, high)``, a network whose actions lie in the action space's
    bounds, and the learner fits twin critics ``TwinCritic(hidden)`` of ``Q(s, a)``."""

    action_spaces: ClassVar[tuple[type, ...]] = (envs.Box,)
    policy_class: ClassVar[type[nn.Module]]

    @property
    def action_dim(self) -> int:
        return int(np.prod(self.env.action_space.shape))

    @property
    def policy_network(self) -> nn.Module:
        space = self.env.action_space
        return self.policy_class(self.action_dim, self.hidden, space.low, space.high)

    @property
    def critic_network(self) -> TwinCritic:
        return TwinCritic(self.hidden)

    def init_policy(self, key: jax.Array, obs: jax.Array) -> PyTree:
        return self.policy_network.init(key, obs)

    def init_critic(self, key: jax.Array, obs: jax.Array) -> PyTree:
        """The twin critics' parameters for observations ``obs`` ``[N, ...]``."""
        return self.critic_network.init(key, obs, jnp.zeros((obs.shape[0], self.action_dim)))


def polyak(online: PyTree, target: PyTree, tau: jax.Array, due: jax.Array) -> PyTree:
    """``target`` moved ``tau`` of the way to ``online`` where ``due``, else unchanged."""
    moved = optax.incremental_update(online, target, tau)
    return jax.tree.map(lambda m, t: jnp.where(due, m, t), moved, target)


def linear(start: jax.Array | float, end: jax.Array | float, progress: jax.Array) -> jax.Array:
    """``start`` to ``end`` as ``progress`` goes from 0 to 1, then ``end``."""
    return start + (end - start) * jnp.clip(progress, 0.0, 1.0)


EXPLORATION = ("epsilon_start", "epsilon_end", "exploration_fraction")  # an epsilon-greedy recipe's real settings


def check_exploration(s: dict[str, Any]) -> None:
    """Refuse epsilon-greedy settings ``s`` outside their ranges: rates in [0, 1], the
    share of the run they decay over in (0, 1]."""
    for name in ("epsilon_start", "epsilon_end"):
        check(0 <= s[name] <= 1, name, s[name], "must lie in [0, 1]")
    check(0 < s["exploration_fraction"] <= 1, "exploration_fraction", s["exploration_fraction"], "must lie in (0, 1]")
