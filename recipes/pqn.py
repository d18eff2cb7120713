"""PQN (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning"): Q-learning
with no replay buffer and no target network, written once as fragments.

The ``actor`` fragment steps the environment batch epsilon-greedily with a LayerNorm
Q-network (epsilon decaying linearly over a share of the run) and keeps, for every
step, the greedy value of the observation that followed it. The ``learner`` fragment
computes Q(lambda) returns backwards over the rollout from those values
(``advantages.q_lambda``: cut where an episode ends, bootstrapping at a time-limit
truncation and not at a termination), then runs epochs of minibatch updates of
``0.5 (Q(s, a) - G)^2``. LayerNorm in every hidden layer is what keeps the bootstrapped
regression stable without a target network (the paper's analysis). With ``memory``
the Q-network is recurrent (``RecurrentQ``), its memory kept and replayed as
``recipes.memory`` describes; the targets are those of the rollout, as without one.
Like every recipe, no distribution code: minibatches come from ``primitives.minibatches``.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrl_frag import envs, primitives
from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.envs.core import unmasked
from jaxrl_frag.errors import check
from jaxrl_frag.fragments import fragment
from jaxrl_frag.metrics import Metrics
from jaxrl_frag.recipes.advantages import q_lambda
from jaxrl_frag.recipes.epochs import check_minibatches, minibatch_epochs, updates_done
from jaxrl_frag.recipes.memory import Recurrence, check_memory, check_memory_env, recurrence
from jaxrl_frag.recipes.networks import LayerNormQ, RecurrentQ, allowed_values, check_torso, uniform_allowed
from jaxrl_frag.recipes.off_policy import EXPLORATION, check_exploration, linear
from jaxrl_frag.recipes.recipe import PolicyFn, Recipe
from jaxrl_frag.recipes.rollout import collect_with_memory

PyTree = Any
TORSOS = ("auto", "cnn", "mlp")


class QTransition(NamedTuple):
    """One environment step of the rollout, time-major once stacked ``[T, N, ...]``;
    ``next_value`` is the acting network's greedy value of the observation after it
    (read with the memory after the step); ``memory`` the memory the step was acted
    with (``()`` for a feed-forward network)."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_value: jax.Array
    memory: PyTree = ()


@struct.dataclass
class PQNState:
    params: PyTree
    opt_state: PyTree
    env_state: PyTree
    obs: jax.Array
    memory: PyTree  # the recurrent Q-network's, [N, ...]; () for a feed-forward one
    key: jax.Array


@struct.dataclass
class PQN(Recipe):
    """PQN: epsilon-greedy rollouts, Q(lambda) targets, epochs of minibatch updates of a
    LayerNorm Q-network; RAdam with a linearly decaying learning rate, as the authors'
    purejaxql. The defaults are purejaxql's CartPole settings but for the exploration
    left at the end, 0.01 (0.05 there): on CartPole-v1 at 5e5 steps seeds 0-2 end at 500,
    500, 500 with 0.01, and 246, 500, 500 with 0.05 (benchmarks/HISTORY.md)."""

    num_envs: int = static_field(32, help="parallel environments")
    num_steps: int = static_field(64, help="environment steps per environment per iteration")
    hidden: tuple[int, ...] = static_field((256, 256), help="hidden layer widths of the Q network (each Dense, "
                                                            "LayerNorm, ReLU)")
    num_minibatches: int = static_field(16, help="minibatches per epoch; must divide num_envs * num_steps")
    num_epochs: int = static_field(4, help="passes over each iteration's batch")
    torso: str = static_field("auto", help="cnn (a 3x3 convolution with 16 channels, LayerNorm and ReLU under the "
                                           "MLP; for image observations (H, W, C)), mlp, or auto (cnn for images)")
    anneal_lr: bool = static_field(True, help="decay the learning rate linearly to zero over the run")
    memory: str = static_field("none", help="the Q-network's memory: none (feed-forward), gru or lstm (a recurrent "
                                            "cell of hidden[0] units after the first layer, trained on whole sequences "
                                            "of each rollout; minibatches are then sets of environments)")
    lr: float = hyperparameter(1e-4, help="RAdam learning rate")
    q_lambda: float = hyperparameter(0.95, help="lambda of the Q(lambda) returns (0: one-step targets)")
    epsilon_start: float = hyperparameter(1.0, help="exploration rate at the start")
    epsilon_end: float = hyperparameter(0.01, help="exploration rate after the decay")
    exploration_fraction: float = hyperparameter(0.2, help="share of the run over which epsilon decays")
    reward_scale: float = hyperparameter(0.1, help="factor on the rewards the learner sees (not the episode returns)")
    max_grad_norm: float = hyperparameter(10.0, help="global gradient norm clip")

    action_spaces: ClassVar[tuple[type, ...]] = (envs.Discrete,)
    takes_action_masks: ClassVar[bool] = True  # a masked action's value is -inf: never chosen, never bootstrapped from
    counts: ClassVar[tuple[str, ...]] = (*Recipe.counts, "num_minibatches", "num_epochs")
    reals: ClassVar[tuple[str, ...]] = (*Recipe.reals, *EXPLORATION, "q_lambda", "reward_scale", "max_grad_norm")
    positive: ClassVar[tuple[str, ...]] = (*Recipe.positive, "max_grad_norm", "reward_scale")

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        if env_id.endswith("-MinAtar"):
            # purejaxql's config/alg/pqn_minatar.yaml
            return dict(num_envs=128, num_steps=32, num_minibatches=32, num_epochs=2, hidden=(128,), lr=5e-4,
                        q_lambda=0.65, epsilon_end=0.05, exploration_fraction=0.1, reward_scale=1.0,
                        total_steps=10_000_000)
        return {}

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        check_minibatches(s)
        check(s["torso"] in TORSOS, "torso", s["torso"], f"choose one of {', '.join(TORSOS)} (auto: cnn for images)")
        check(0 <= s["q_lambda"] <= 1, "q_lambda", s["q_lambda"], "must lie in [0, 1]")
        check_exploration(s)
        check_memory(s)
        if s["anneal_lr"]:  # the schedule reads the optimizer's update count
            cls.check_updates(s, s["num_epochs"] * s["num_minibatches"])

    @classmethod
    def make_env(cls, env_id: str, settings: dict[str, Any]) -> envs.Env:
        env = super().make_env(env_id, settings)
        check_torso(env_id, env.observation_space.shape, settings["torso"])
        check_memory_env(env_id, env, settings["memory"], settings["torso"])
        return env

    @property
    def recurrent(self) -> bool:
        """Whether the Q-network has a memory (``memory`` is not ``none``)."""
        return self.memory != "none"

    @property
    def network(self) -> LayerNormQ | RecurrentQ:
        if self.recurrent:
            return RecurrentQ(self.env.action_space.n, self.hidden, self.memory)
        shape = self.env.observation_space.shape
        conv = self.torso == "cnn" or (self.torso == "auto" and len(shape) == 3)
        return LayerNormQ(self.env.action_space.n, self.hidden, conv)

    @property
    def updates_per_iteration(self) -> int:
        return self.num_epochs * self.num_minibatches

    def learning_rate(self, update: jax.Array) -> jax.Array:
        """The learning rate of optimizer update number ``update``: decayed linearly to zero
        over the run's iterations, or constant."""
        if not self.anneal_lr:
            return jnp.asarray(self.lr)
        return self.lr * (1.0 - (update // self.updates_per_iteration) / self.num_iterations)

    def optimizer(self) -> optax.GradientTransformation:
        return optax.chain(optax.clip_by_global_norm(self.max_grad_norm),
                           optax.radam(self.learning_rate if self.anneal_lr else self.lr))

    def epsilon(self, iteration: jax.Array) -> jax.Array:
        """The exploration rate of iteration ``iteration``: linear from ``epsilon_start`` to
        ``epsilon_end`` over ``exploration_fraction`` of the iterations, then constant."""
        return linear(self.epsilon_start, self.epsilon_end, iteration / (self.exploration_fraction * self.num_iterations))

    # -- how the Q-values of one agent, or of a team, are read --------------------------

    def q_values(self, params: PyTree, recurrence: Recurrence | tuple[()], obs: jax.Array) -> jax.Array:
        """``[..., actions]``: the Q-values of every action (a network that masks actions
        it may not take puts ``-inf`` there), at observations ``[B, ...]`` with
        ``recurrence`` ``()`` (feed-forward), or at environment-major sequences ``[n, T,
        ...]`` unrolled from ``recurrence`` (recurrent)."""
        x, mask = unmasked(obs)
        if self.recurrent:
            return allowed_values(self.network.apply(params, recurrence.start, x, recurrence.first)[1], mask)
        return allowed_values(self.network.apply(params, x), mask)

    def q_step(self, params: PyTree, memory: PyTree, obs: jax.Array) -> tuple[PyTree, jax.Array]:
        """The Q-network on one step of ``N`` environments: ``(memory after, Q-values)`` of
        observations ``[N, ...]`` read with ``memory`` (``()``, kept, for a feed-forward one)."""
        if self.recurrent:
            x, mask = unmasked(obs)
            memory, q = self.network.apply(params, memory, x, method="step")
            return memory, allowed_values(q, mask)
        return memory, self.q_values(params, (), obs)

    def chosen(self, q: jax.Array, action: jax.Array) -> jax.Array:
        """The value of the ``action`` taken, from its ``q_values``."""
        return jnp.take_along_axis(q, action[..., None].astype(jnp.int32), axis=-1)[..., 0]

    def greedy_value(self, q: jax.Array) -> jax.Array:
        """The value of the greedy action, from ``q_values``."""
        return q.max(-1)

    def learning_signal(self, traj: QTransition) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The rewards, terminations and truncations the returns are computed from."""
        return traj.reward * self.reward_scale, traj.terminated, traj.truncated

    def explore(self, q: jax.Array, key: jax.Array, epsilon: jax.Array | float) -> jax.Array:
        """Epsilon-greedy actions from Q-values ``q``: with probability ``epsilon`` one
        uniform over the available actions (those with a finite value), else the greedy one."""
        k_explore, k_random = jax.random.split(key)
        random = uniform_allowed(k_random, q)
        return jnp.where(jax.random.uniform(k_explore, random.shape) < epsilon, random, q.argmax(-1))

    def policy_fn(self, state: PQNState, greedy: bool) -> PolicyFn:
        """``explore`` with epsilon 0 (greedy) or ``epsilon_end``, as the run ends
        (``Recipe.policy_fn``). Feed-forward networks only: ``ConfigError`` for a recurrent
        one, which acts with its memory (``acting``)."""
        check(not self.recurrent, "memory", self.memory,
              "a recurrent Q-network acts with its memory: use acting (evaluation, load_policy and export_policy do)")
        act = self.acting(state, greedy).act
        return lambda obs, key: act(obs, (), key)[0]

    def acting(self, state: PQNState, greedy: bool) -> envs.Acting:
        """``policy_fn``'s action, from the network's memory where it has one (``Recipe.acting``)."""
        epsilon = 0.0 if greedy else self.epsilon_end

        def act(obs: jax.Array, memory: PyTree, key: jax.Array) -> tuple[jax.Array, PyTree]:
            memory, q = self.q_step(state.params, memory, obs)
            return self.explore(q, key, epsilon), memory

        return envs.Acting(self.network.blank if self.recurrent else lambda n: (), act)

    # -- the algorithm -------------------------------------------------------------

    def init(self, key: jax.Array) -> PQNState:
        key, k_net, k_env = jax.random.split(key, 3)
        env_state, obs = self.env.reset(k_env)
        x, _ = unmasked(obs)
        if self.recurrent:
            memory = self.network.blank(self.num_envs)
            params = self.network.init(k_net, memory, x, method="step")
        else:
            memory, params = (), self.network.init(k_net, x)
        return PQNState(params, self.optimizer().init(params), env_state, obs, memory, key)

    def step(self, state: PQNState) -> tuple[PQNState, Metrics]:
        key, k_act, k_learn = jax.random.split(state.key, 3)
        iteration = updates_done(state.opt_state) // self.updates_per_iteration
        traj, env_state, obs, memory, episodes = self.rollout(state.params, state.env_state, state.obs, state.memory,
                                                              k_act, self.epsilon(iteration))
        params, opt_state, losses = self.learn(state.params, state.opt_state, traj, k_learn)
        return PQNState(params, opt_state, env_state, obs, memory, key), {**episodes, **losses}

    @fragment("actor", batched={"env_state": 0, "obs": 0, "memory": 0, "traj": 1},
              outputs=("traj", "env_state", "obs", "memory", "episodes"))
    def rollout(self, params: PyTree, env_state: PyTree, obs: jax.Array, memory: PyTree, key: jax.Array,
                epsilon: jax.Array) -> tuple[QTransition, PyTree, jax.Array, PyTree, Metrics]:
        """``num_steps`` epsilon-greedy steps of every environment with the current
        Q-network, its memory carried from step to step (and forgotten where an episode ended)."""

        def act(obs: jax.Array, memory: PyTree, key: jax.Array) -> tuple[Any, ...]:
            after, q = self.q_step(params, memory, obs)
            action = self.explore(q, key, epsilon)
            return action, action, (memory, after), after

        steps, (acted_with, after), env_state, obs, memory, episodes = collect_with_memory(
            self.env, act, env_state, obs, memory, key, self.num_steps)
        next_value = jax.vmap(lambda m, o: self.greedy_value(self.q_step(params, m, o)[1]))(after, steps.next_obs)
        traj = QTransition(steps.obs, steps.action, steps.reward, steps.terminated, steps.truncated, next_value,
                           acted_with)
        return traj, env_state, obs, memory, {**episodes, "epsilon": epsilon}

    @fragment("learner", batched={"traj": 1}, outputs=("params", "opt_state", "losses"))
    def learn(self, params: PyTree, opt_state: PyTree, traj: QTransition,
              key: jax.Array) -> tuple[PyTree, PyTree, Metrics]:
        """Q(lambda) returns, then ``num_epochs`` epochs of ``num_minibatches`` updates."""
        reward, terminated, truncated = self.learning_signal(traj)
        returns = q_lambda(reward, terminated, truncated, traj.next_value, self.gamma, self.q_lambda)
        fields = (traj.obs, traj.action, returns)
        if self.recurrent:  # one whole sequence per environment
            batch = (recurrence(traj.memory, traj.terminated, traj.truncated),
                     *jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), fields))
        else:
            batch = ((), *primitives.flatten_batch(fields, 1))
        learning_rate = self.learning_rate(updates_done(opt_state))
        params, opt_state, metrics = minibatch_epochs(self.loss, self.optimizer(), params, opt_state, batch,
                                                      jax.random.split(key, self.num_epochs), self.num_minibatches)
        return params, opt_state, {**metrics, "learning_rate": learning_rate}

    def loss(self, params: PyTree, recurrence: Recurrence | tuple[()], obs: jax.Array, action: jax.Array,
             target: jax.Array) -> tuple[jax.Array, Metrics]:
        """``0.5 (Q(s, a) - G)^2`` on one minibatch."""
        value = self.chosen(self.q_values(params, recurrence, obs), action)
        loss = 0.5 * jnp.square(value - target).mean()
        return loss, {"loss": loss, "q": value.mean()}

