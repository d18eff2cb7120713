"""What PPO, A2C and IMPALA share: an actor-critic network, its settings, the ``actor``
fragment that rolls out the current policy in a batch of environments, and the loop
of minibatch updates.

A subclass adds its ``learn`` fragment (``learner`` role), its ``loss`` and its own
settings; ``step`` is the same for every subclass: roll out, then learn from the rollout.

With ``memory`` ``gru`` or ``lstm`` the network is recurrent (``RecurrentActorCritic``),
its memory kept and replayed as ``recipes.memory`` describes.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxrl_frag import envs, primitives
from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.envs.core import forget
from jaxrl_frag.errors import check
from jaxrl_frag.fragments import fragment
from jaxrl_frag.metrics import Metrics
from jaxrl_frag.recipes.advantages import gae
from jaxrl_frag.recipes.epochs import minibatch_epochs, updates_done
from jaxrl_frag.recipes.memory import Recurrence, check_memory, check_memory_env, recurrence
from jaxrl_frag.recipes.networks import (
    ACTIVATIONS,
    ActorCritic,
    Categorical,
    Gaussian,
    RecurrentActorCritic,
    TanhGaussian,
    check_torso,
    squash,
)
from jaxrl_frag.recipes.recipe import PolicyFn, Recipe, check_widths
from jaxrl_frag.recipes.rollout import collect_with_memory

PyTree = Any
TORSOS = ("auto", "atari", "cnn", "mlp")
ACTION_DISTS = ("gaussian", "tanh-gaussian")
ATARI_PIXELS = 36  # the smallest image side the atari torso's three convolutions take


class Transition(NamedTuple):
    """One environment step of the rollout, time-major once stacked ``[T, N, ...]``.
    ``log_prob`` and ``value`` are the acting policy's; ``final_value`` is its value of
    the observation that ended an episode at this step; ``memory`` the recurrent
    network's memory the step was acted with (``()`` for a feed-forward one)."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_value: jax.Array
    memory: PyTree = ()


def resolved_torso(torso: str, shape: tuple[int, ...]) -> str:
    """The networks' torso for setting ``torso`` on observations of ``shape``: ``torso``
    itself, or for ``auto`` ``atari`` on images of at least 36x36 pixels, ``cnn`` on
    smaller ones and ``mlp`` on vectors."""
    if torso != "auto":
        return torso
    if len(shape) != 3:
        return "mlp"
    return "atari" if min(shape[:2]) >= ATARI_PIXELS else "cnn"


class Lesson(NamedTuple):
    """What one iteration's learner learned from: the parameters it started from, the
    rollout and the observations that followed it (``samples`` makes its batch)."""

    params: PyTree
    traj: Transition
    last_obs: jax.Array


@struct.dataclass
class ActorCriticState:
    params: PyTree
    opt_state: PyTree
    env_state: PyTree
    obs: jax.Array
    memory: PyTree  # the recurrent network's, [N, ...]; () for a feed-forward one
    key: jax.Array


@struct.dataclass
class ActorCriticRecipe(Recipe):
    """Settings and the rollout shared by actor-critic recipes (which take action masks:
    ``ActorCritic`` gives the actions outside a ``MaskedObs``'s mask probability 0)."""

    takes_action_masks: ClassVar[bool] = True

    num_minibatches: int = static_field(4, help="minibatches per epoch")
    torso: str = static_field("auto", help="cnn (a 3x3 convolution with 16 channels under each MLP; for image "
                                           "observations (H, W, C)), atari (Mnih et al.'s convolutions and 512 units "
                                           "shared by linear heads; for images of at least 36x36), mlp (the MLPs "
                                           "alone) or auto (atari for images of at least 36x36, cnn for smaller ones)")
    activation: str = static_field("tanh", help="the MLPs' hidden activation: tanh, relu or swish (the atari torso is "
                                                "ReLU throughout)")
    value_hidden: tuple[int, ...] | None = static_field(None, help="the value MLP's hidden layer widths, where they "
                                                                  "differ from the policy's (hidden); as Brax's PPO, "
                                                                  "256,256,256,256,256 (not with the atari torso, "
                                                                  "whose value head is one linear layer)")
    action_dist: str = static_field("gaussian", help="continuous actions: gaussian (a learned scale per dimension, "
                                                     "samples clipped to the bounds) or tanh-gaussian (Brax's: a scale "
                                                     "output by the policy network, samples squashed by tanh onto the "
                                                     "bounds)")
    anneal_lr: bool = static_field(True, help="anneal the learning rate linearly to zero over the run")
    normalize_obs: bool = static_field(False, help="standardise observations with running statistics")
    scale_reward: bool = static_field(False, help="divide rewards by the running std of the discounted return")
    memory: str = static_field("none", help="the policy's memory: none (feed-forward), gru or lstm (a recurrent cell "
                                            "of hidden[0] units after the first layer, trained on whole sequences of "
                                            "each rollout; minibatches are then sets of environments)")
    ent_coef: float = hyperparameter(0.01, help="entropy bonus coefficient")
    vf_coef: float = hyperparameter(0.5, help="value loss coefficient")
    max_grad_norm: float = hyperparameter(0.5, help="global gradient norm clip")
    reward_scale: float = hyperparameter(1.0, help="factor on the rewards the learner sees, not on the episode returns "
                                                   "(Brax's reward_scaling)")

    counts: ClassVar[tuple[str, ...]] = (*Recipe.counts, "num_minibatches")
    reals: ClassVar[tuple[str, ...]] = (*Recipe.reals, "ent_coef", "vf_coef", "max_grad_norm", "reward_scale")
    positive: ClassVar[tuple[str, ...]] = (*Recipe.positive, "max_grad_norm", "reward_scale")

    @classmethod
    def make_env(cls, env_id: str, settings: dict[str, Any]) -> envs.Env:
        env = envs.make(env_id, num_envs=settings["num_envs"], normalize_obs=settings["normalize_obs"],
                        scale_reward=settings["scale_reward"], gamma=settings["gamma"], **cls.host_options(env_id, settings))
        shape, torso = env.observation_space.shape, settings["torso"]
        check_torso(env_id, shape, torso)
        check(torso != "atari" or min(shape[:2]) >= ATARI_PIXELS, "torso", torso,
              f"needs images of at least {ATARI_PIXELS}x{ATARI_PIXELS}; {env_id} observes {shape}: choose cnn or auto")
        check(settings["action_dist"] == "gaussian" or isinstance(env.action_space, envs.Box), "action_dist",
              settings["action_dist"], f"applies to continuous actions; {env_id}'s are discrete: leave it out")
        check(settings["value_hidden"] is None or resolved_torso(torso, shape) != "atari", "value_hidden",
              settings["value_hidden"], f"the atari torso (which {env_id} gets with --torso {torso}) values with one "
                                        "linear layer on its shared features: leave value_hidden out, or choose "
                                        "--torso cnn")
        check_memory_env(env_id, env, settings["memory"], torso)
        return env

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        check(s["torso"] in TORSOS, "torso", s["torso"],
              f"choose one of {', '.join(TORSOS)} (auto: atari or cnn for image observations, else mlp)")
        check(s["activation"] in ACTIVATIONS, "activation", s["activation"], f"choose one of {', '.join(ACTIVATIONS)}")
        check(s["action_dist"] in ACTION_DISTS, "action_dist", s["action_dist"], f"choose one of {', '.join(ACTION_DISTS)}")
        if s["value_hidden"] is not None:
            check_widths("value_hidden", s["value_hidden"])
        check_memory(s)
        for name in ("ent_coef", "vf_coef"):
            check(s[name] >= 0, name, s[name], "must be zero or positive")
        if s["anneal_lr"]:  # the schedule reads the optimizer's update count
            cls.check_updates(s, cls.updates_of(s))

    @classmethod
    def updates_of(cls, s: dict[str, Any]) -> int:
        """Optimizer updates in one iteration's ``learn`` under settings ``s``."""
        return s["num_minibatches"]

    @property
    def updates_per_iteration(self) -> int:
        """Optimizer updates in one iteration's ``learn``."""
        return self.updates_of(vars(self))

    @property
    def continuous(self) -> bool:
        return isinstance(self.env.action_space, envs.Box)

    @property
    def network_torso(self) -> str:
        """The networks' torso (``resolved_torso``)."""
        return resolved_torso(self.torso, self.env.observation_space.shape)

    @property
    def recurrent(self) -> bool:
        """Whether the network has a memory (``memory`` is not ``none``)."""
        return self.memory != "none"

    @property
    def squashed(self) -> bool:
        """Whether continuous actions are a ``TanhGaussian``'s (``action_dist`` ``tanh-gaussian``)."""
        return self.continuous and self.action_dist == "tanh-gaussian"

    @property
    def network(self) -> ActorCritic | RecurrentActorCritic:
        space = self.env.action_space
        action_dim = int(np.prod(space.shape)) if self.continuous else space.n
        if self.recurrent:  # the cell after the first layer, the heads' MLPs of the remaining widths after it
            heads = ActorCritic(action_dim, self.hidden[1:], self.continuous, "mlp", self.activation,
                                self.value_hidden, self.squashed)
            return RecurrentActorCritic(heads, self.memory, self.hidden[0])
        return ActorCritic(action_dim, self.hidden, self.continuous, self.network_torso, self.activation,
                           self.value_hidden, self.squashed)

    def act_step(self, params: PyTree, memory: PyTree, obs: jax.Array) -> tuple[
            PyTree, Categorical | Gaussian | TanhGaussian, jax.Array]:
        """The network on one step of ``N`` environments: ``(memory after, action
        distribution, value)`` of observations ``[N, ...]`` read with ``memory`` (``()``,
        kept, for a feed-forward network)."""
        if self.recurrent:
            return self.network.apply(params, memory, obs, method="step")
        return memory, *self.network.apply(params, obs)

    def value_of(self, params: PyTree, memory: PyTree, obs: jax.Array) -> jax.Array:
        """The value ``[N]`` of observations ``[N, ...]`` read with ``memory``."""
        if self.recurrent:
            return self.act_step(params, memory, obs)[2]
        return self.network.apply(params, obs, method="value")

    def value_after(self, params: PyTree, memory: PyTree, obs: jax.Array, done: jax.Array,
                    last_obs: jax.Array) -> jax.Array:
        """The value ``[N]`` of the observations ``last_obs`` that follow a rollout's last
        step, whose observations ``obs`` were acted on with ``memory`` and where ``done``
        says which episodes ended: read with the memory after that step, forgotten
        where they did."""
        if self.recurrent:
            memory = forget(self.act_step(params, memory, obs)[0], done)
        return self.value_of(params, memory, last_obs)

    def policy_value(self, params: PyTree, recurrence: Recurrence | tuple[()], obs: jax.Array) -> tuple[
            Categorical | Gaussian | TanhGaussian, jax.Array]:
        """The action distribution and value at a minibatch's samples: observations ``[B,
        ...]`` with ``recurrence`` ``()`` (feed-forward), or environment-major sequences ``[n,
        T, ...]`` unrolled from ``recurrence`` (recurrent; the outputs ``[n, T]``)."""
        if self.recurrent:
            return self.network.apply(params, recurrence.start, obs, recurrence.first)[1:]
        return self.network.apply(params, obs)

    def recurrence(self, traj: Transition) -> Recurrence | tuple[()]:
        """Where the environments' sequences of a time-major rollout start
        (``Recurrence``, environment-major), or ``()`` for a feed-forward network."""
        return recurrence(traj.memory, traj.terminated, traj.truncated) if self.recurrent else ()

    def returns_end(self, traj: Transition) -> tuple[jax.Array, jax.Array]:
        """Where the returns of a rollout's steps end: ``(terminated, truncated)``, not
        bootstrapped at the first, bootstrapped from ``final_value`` at the second; by
        default where the environment says its episodes ended."""
        return traj.terminated, traj.truncated

    def env_action(self, action: jax.Array) -> jax.Array:
        """The action sent to the environment: a continuous one clipped to its bounds, or
        squashed onto them (``squashed``)."""
        if not self.continuous:
            return action
        low, high = jnp.asarray(self.env.action_space.low), jnp.asarray(self.env.action_space.high)
        return squash(action, low, high) if self.squashed else jnp.clip(action, low, high)

    def policy_fn(self, state: ActorCriticState, greedy: bool) -> PolicyFn:
        """The policy network's action (``Recipe.policy_fn``): its most likely one (the
        Gaussian's mean) or a sample, clipped to the bounds, on observations standardised
        as in training. Feed-forward networks only: ``ConfigError`` for a recurrent one,
        which acts with its memory (``acting``)."""
        check(not self.recurrent, "memory", self.memory,
              "a recurrent policy acts with its memory: use acting (evaluation, load_policy and export_policy do)")
        act = self.acting(state, greedy).act
        return lambda obs, key: act(obs, (), key)[0]

    def acting(self, state: ActorCriticState, greedy: bool) -> envs.Acting:
        """``policy_fn``'s action, from the network's memory where it has one (``Recipe.acting``)."""
        observe = self.env.observation_fn(state.env_state)

        def act(obs: jax.Array, memory: PyTree, key: jax.Array) -> tuple[jax.Array, PyTree]:
            memory, dist, _ = self.act_step(state.params, memory, observe(obs))
            return self.env_action(dist.mode() if greedy else dist.sample(key)), memory

        return envs.Acting(self.network.blank if self.recurrent else lambda n: (), act)

    def learning_rate(self, update: jax.Array) -> jax.Array:
        """The learning rate of optimizer update number ``update``: annealed linearly to
        zero over the run's iterations, or constant."""
        if not self.anneal_lr:
            return jnp.asarray(self.lr)
        return self.lr * (1.0 - (update // self.updates_per_iteration) / self.num_iterations)

    def optimizer(self) -> optax.GradientTransformation:
        schedule = self.learning_rate if self.anneal_lr else self.lr
        return optax.chain(optax.clip_by_global_norm(self.max_grad_norm), optax.adam(schedule, eps=1e-5))

    # -- the algorithm -------------------------------------------------------------

    def init(self, key: jax.Array) -> ActorCriticState:
        key, k_net, k_env = jax.random.split(key, 3)
        env_state, obs = self.env.reset(k_env)
        if self.recurrent:
            memory = self.network.blank(self.num_envs)
            params = self.network.init(k_net, memory, obs, method="step")
        else:
            memory, params = (), self.network.init(k_net, obs)
        return ActorCriticState(params, self.optimizer().init(params), env_state, obs, memory, key)

    def step(self, state: ActorCriticState) -> tuple[ActorCriticState, Metrics]:
        state, metrics, _ = self.round(state)
        return state, metrics

    def round(self, state: ActorCriticState) -> tuple[ActorCriticState, Metrics, Lesson]:
        """``step``, also returning what its learner learned from."""
        key, k_act, k_learn = jax.random.split(state.key, 3)
        traj, env_state, obs, memory, episodes = self.rollout(state.params, state.env_state, state.obs, state.memory,
                                                              k_act)
        params, opt_state, losses = self.learn(state.params, state.opt_state, traj, obs, k_learn)
        lesson = Lesson(state.params, traj, obs)
        return ActorCriticState(params, opt_state, env_state, obs, memory, key), {**episodes, **losses}, lesson

    def learn(self, params: PyTree, opt_state: PyTree, traj: Transition, last_obs: jax.Array,
              key: jax.Array) -> tuple[PyTree, PyTree, Metrics]:
        """The learner fragment: new parameters and optimizer state from a rollout, by
        ``descend`` on its ``samples``. A subclass declares its own with
        ``@fragment("learner", ...)``.

        Args:
            params: The network parameters the rollout was acted with.
            opt_state: The optimizer state.
            traj: The rollout, time-major ``[T, N, ...]``.
            last_obs: ``[N, ...]``, the observations after the rollout's last step.
            key: PRNG key (minibatch shuffling).

        Returns:
            ``(params, opt_state, metrics)`` after the updates.
        """
        raise NotImplementedError

    def samples(self, params: PyTree, traj: Transition, last_obs: jax.Array) -> PyTree:
        """The batch that ``learn`` cuts into minibatches for ``loss``, from a rollout
        (leading axis: samples).

        Args:
            params: The network parameters (to compute values for advantages).
            traj: The rollout, time-major ``[T, N, ...]``.
            last_obs: ``[N, ...]``, the observations after the rollout's last step.

        Returns:
            A pytree whose leaves share a leading sample axis (the environments, for a
            recurrent network's whole sequences); ``loss`` receives a minibatch of it as
            positional arguments.
        """
        raise NotImplementedError

    def loss(self, params: PyTree, *minibatch: Any) -> tuple[jax.Array, Metrics]:
        """The loss ``descend`` minimises, and its metrics, on one minibatch.

        Args:
            params: The parameters being differentiated.
            *minibatch: One minibatch of ``samples``' leaves, in order.

        Returns:
            ``(loss, metrics)``: a scalar, and scalar metrics (averaged over the
            updates of an iteration).
        """
        raise NotImplementedError

    def gae_samples(self, params: PyTree, traj: Transition, last_obs: jax.Array,
                    gae_lambda: jax.Array, unroll: int = 0) -> tuple[Any, ...]:
        """The rollout as samples ``(recurrence, obs, action, log_prob, value, advantage,
        target)`` with GAE advantages and value targets (bootstrapped every ``unroll``
        steps, where it is not 0): one per step, each environment's contiguous, and
        ``recurrence`` ``()`` (feed-forward); or one whole sequence ``[N, T, ...]`` per
        environment from its ``Recurrence`` (recurrent)."""
        done = traj.terminated[-1] | traj.truncated[-1]
        last = jax.tree.map(lambda x: x[-1], (traj.memory, traj.obs))
        last_value = self.value_after(params, *last, done, last_obs)
        advantages, targets = gae(traj.reward, traj.value, *self.returns_end(traj), traj.final_value, last_value,
                                  self.gamma, gae_lambda, unroll)
        fields = (traj.obs, traj.action, traj.log_prob, traj.value, advantages, targets)
        if self.recurrent:
            return self.recurrence(traj), *jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), fields)
        return (), *primitives.flatten_batch(fields, 1)

    def descend(self, params: PyTree, opt_state: PyTree, batch: PyTree,
                keys: jax.Array) -> tuple[PyTree, PyTree, Metrics]:
        """One pass over ``batch`` per key in ``keys``, each in ``num_minibatches`` shuffled
        minibatches with one optimizer update of ``loss`` apiece; the mean metrics and
        the learning rate of the first update."""
        learning_rate = self.learning_rate(updates_done(opt_state))
        params, opt_state, metrics = minibatch_epochs(self.loss, self.optimizer(), params, opt_state, batch, keys,
                                                      self.num_minibatches)
        return params, opt_state, {**metrics, "learning_rate": learning_rate}

    @fragment("actor", batched={"env_state": 0, "obs": 0, "memory": 0, "traj": 1},
              outputs=("traj", "env_state", "obs", "memory", "episodes"))
    def rollout(
        self, params: PyTree, env_state: PyTree, obs: jax.Array, memory: PyTree, key: jax.Array
    ) -> tuple[Transition, PyTree, jax.Array, PyTree, Metrics]:
        """``num_steps`` steps of every environment with the current policy, its memory
        carried from step to step (and forgotten where an episode ended)."""

        def act(obs: jax.Array, memory: PyTree, key: jax.Array) -> tuple[Any, ...]:
            after, dist, value = self.act_step(params, memory, obs)
            action = dist.sample(key)
            return action, self.env_action(action), (dist.log_prob(action), value, memory, after), after

        steps, extras, env_state, obs, memory, episodes = collect_with_memory(self.env, act, env_state, obs, memory, key,
                                                                              self.num_steps)
        log_prob, value, acted_with, after = extras
        final_value = jax.vmap(lambda m, o: self.value_of(params, m, o))(after, steps.next_obs)
        traj = Transition(steps.obs, steps.action, log_prob, value, steps.reward * self.reward_scale, steps.terminated,
                          steps.truncated, final_value, acted_with)
        return traj, env_state, obs, memory, episodes
