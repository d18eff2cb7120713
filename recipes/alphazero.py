"""AlphaZero (Silver et al. 2018) with Gumbel MuZero's search (Danihelka et al. 2022,
``mctx``), written once as fragments, on environments that are their own model.

The ``actor`` fragment plays every environment of the batch ``num_steps`` moves. Before
each move, ``mctx.gumbel_muzero_policy`` searches ``num_simulations`` simulations from the
environment's state, with the environment's own ``step`` as the model (it must declare
``Capabilities.deterministic``) and the network's policy and value at every node; the
move is the search's, and the search's improved policy (``action_weights``) is what the
network's policy learns. A move's value backs up to its parent as ``reward + discount *
value``: the discount is ``gamma``, or ``-gamma`` in a game whose players alternate
(``Capabilities.alternating``: the next state is the opponent's), and 0 after a move that
ends the episode in a termination. The ``learner`` fragment regresses the value on the returns (Monte
Carlo: ``gae`` at lambda 1, alternating in sign between the players' moves and
bootstrapped at the rollout's end) and the policy on the search's (cross-entropy), in
epochs of minibatches. Actions a ``MaskedObs`` does not allow are never searched nor chosen.

In a game of two players, every ``versus_random_every``-th iteration the ``evaluator``
fragment plays the batch's games with the network's greedy move against uniformly random
legal ones, the network first in half of them: the rows ``versus_random_outcome`` (its
mean result, 1 a win, -1 a loss), ``versus_random_won`` and ``versus_random_lost``.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import mctx
import optax
from flax import struct

from jaxrl_frag import envs, primitives
from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.envs.core import episodes_ended, unmasked
from jaxrl_frag.errors import check
from jaxrl_frag.fragments import fragment
from jaxrl_frag.metrics import Metrics, episode_metrics
from jaxrl_frag.recipes.advantages import gae
from jaxrl_frag.recipes.epochs import check_minibatches, minibatch_epochs, updates_done
from jaxrl_frag.recipes.networks import ActorCritic, Categorical, check_torso, uniform_allowed
from jaxrl_frag.recipes.recipe import PolicyFn, Recipe

PyTree = Any
TORSOS = ("mlp", "cnn")
VERSUS = ("versus_random_count", "versus_random_outcome_sum", "versus_random_won_sum", "versus_random_lost_sum")


class Searched(NamedTuple):
    """One move of the rollout, time-major once stacked ``[T, N, ...]``: what was observed,
    the move, the search's policy over the moves (its targets for the network's), the
    network's value where the move was made and of the observation that ended an episode
    there, and what followed."""

    obs: PyTree
    action: jax.Array
    search_policy: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_value: jax.Array


@struct.dataclass
class AlphaZeroState:
    params: PyTree
    opt_state: PyTree
    env_state: PyTree
    obs: PyTree
    key: jax.Array


@struct.dataclass
class AlphaZero(Recipe):
    """AlphaZero: Gumbel MuZero's search on the environment's own model, self-play in a
    game of two players (or one player's episodes), a policy and value network trained on
    the search's policy and the returns. The defaults learn tic-tac-toe to perfect play: at 4e5 moves the network's
    greedy moves alone lose no game, first or second, against any sequence of moves, for
    seeds 0 and 2 (seed 1 loses 2 of 551 second; ``tests/test_alphazero.py``). With the Gumbel noise at mctx's scale, 1, self-play
    soon repeats one drawn game, and the network, which then meets few positions, lost
    401 of the 863 games it played second (at 2e5 moves; at scale 3, 2 of 619)."""

    num_envs: int = static_field(64, help="games (or episodes) played at once")
    num_steps: int = static_field(16, help="moves per game per iteration")
    total_steps: int = static_field(400_000, help="moves of the whole run (all games)")
    hidden: tuple[int, ...] = static_field((128, 128), help="hidden layer widths of the policy and value networks")
    torso: str = static_field("mlp", help="mlp, or cnn (a 3x3 convolution with 16 channels under each MLP; for "
                                          "boards of feature planes (H, W, C))")
    num_simulations: int = static_field(32, help="simulations of each move's search")
    max_considered_actions: int = static_field(16, help="moves the search's sequential halving starts from (Gumbel "
                                                        "MuZero's max_num_considered_actions)")
    num_minibatches: int = static_field(4, help="minibatches per epoch; must divide num_envs * num_steps")
    num_epochs: int = static_field(1, help="passes over each iteration's moves")
    versus_random_every: int = static_field(1, help="a game of two players: iterations between the batch's games "
                                                    "against random moves (0: never)")
    lr: float = hyperparameter(1e-3, help="Adam learning rate")
    gamma: float = hyperparameter(1.0, help="discount factor")
    gumbel_scale: float = hyperparameter(3.0, help="scale of the Gumbel noise that draws the moves the search "
                                                   "considers and plays (mctx's default is 1; 0: none): self-play's "
                                                   "exploration, the search's policy, which the network learns, "
                                                   "has none")
    vf_coef: float = hyperparameter(1.0, help="value loss coefficient")
    max_grad_norm: float = hyperparameter(1.0, help="global gradient norm clip")

    action_spaces: ClassVar[tuple[type, ...]] = (envs.Discrete,)
    takes_action_masks: ClassVar[bool] = True  # a move the mask forbids is neither searched nor chosen
    takes_turns: ClassVar[bool] = True  # one network plays both sides, each value the mover's
    counts: ClassVar[tuple[str, ...]] = (*Recipe.counts, "num_simulations", "max_considered_actions",
                                         "num_minibatches", "num_epochs")
    reals: ClassVar[tuple[str, ...]] = (*Recipe.reals, "gumbel_scale", "vf_coef", "max_grad_norm")
    positive: ClassVar[tuple[str, ...]] = (*Recipe.positive, "max_grad_norm")

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        check_minibatches(s)
        check(s["torso"] in TORSOS, "torso", s["torso"], f"choose one of {', '.join(TORSOS)}")
        check(s["gumbel_scale"] >= 0, "gumbel_scale", s["gumbel_scale"], "must be 0 or more")
        check(s["vf_coef"] >= 0, "vf_coef", s["vf_coef"], "must be 0 or more")
        every = s["versus_random_every"]
        check(isinstance(every, int) and every >= 0, "versus_random_every", every,
              "give a whole number of iterations, or 0 for never")

    @classmethod
    def check_env(cls, env: envs.Env) -> None:
        """``Recipe.check_env``'s checks, and ``ConfigError`` unless ``env`` is its own model
        (``Capabilities.deterministic``) stepping inside the program."""
        super().check_env(env)
        capabilities = env.capabilities
        check(capabilities.deterministic and capabilities.traceable, "env", env.name,
              "is not a model AlphaZero can search with: its steps draw chance or run outside the compiled program; "
              "choose an environment that declares itself deterministic (pgx:tic_tac_toe, pgx:connect_four, "
              "jumanji:Knapsack-v1, ...)")

    @classmethod
    def make_env(cls, env_id: str, settings: dict[str, Any]) -> envs.Env:
        env = super().make_env(env_id, settings)
        check_torso(env_id, env.observation_space.shape, settings["torso"], "mlp")
        return env

    @property
    def network(self) -> ActorCritic:
        return ActorCritic(self.env.action_space.n, self.hidden, continuous=False, torso=self.torso,
                           activation="relu")

    @property
    def alternating(self) -> bool:
        """Whether the environment's players move in turn (a value backs up negated)."""
        return self.env.capabilities.alternating

    @property
    def discount(self) -> jax.Array | float:
        """What the next state's value is worth to the mover: ``gamma``, negated where the
        opponent moves next."""
        return -self.gamma if self.alternating else self.gamma

    @property
    def updates_per_iteration(self) -> int:
        return self.num_epochs * self.num_minibatches

    def optimizer(self) -> optax.GradientTransformation:
        return optax.chain(optax.clip_by_global_norm(self.max_grad_norm), optax.adam(self.lr))

    def policy_fn(self, state: AlphaZeroState, greedy: bool) -> PolicyFn:
        """The network's policy without search: its most likely legal move (greedy), or a
        draw from it (``Recipe.policy_fn``)."""

        def act(obs: PyTree, key: jax.Array) -> jax.Array:
            dist, _ = self.network.apply(state.params, obs)
            return dist.mode() if greedy else dist.sample(key)

        return act

    # -- the algorithm -------------------------------------------------------------

    def init(self, key: jax.Array) -> AlphaZeroState:
        key, k_net, k_env = jax.random.split(key, 3)
        env_state, obs = self.env.reset(k_env)
        params = self.network.init(k_net, obs)
        return AlphaZeroState(params, self.optimizer().init(params), env_state, obs, key)

    def step(self, state: AlphaZeroState) -> tuple[AlphaZeroState, Metrics]:
        key, k_act, k_learn, k_versus = jax.random.split(state.key, 4)
        traj, env_state, obs, episodes = self.rollout(state.params, state.env_state, state.obs, k_act)
        params, opt_state, losses = self.learn(state.params, state.opt_state, traj, obs, k_learn)
        metrics = {**episodes, **losses}
        if self.alternating and self.versus_random_every:
            iterations = updates_done(opt_state) // self.updates_per_iteration  # this one included
            due = iterations % self.versus_random_every == 0
            metrics |= self.versus_random(params, k_versus, due)
        return AlphaZeroState(params, opt_state, env_state, obs, key), metrics

    def search(self, params: PyTree, env_state: PyTree, obs: PyTree, key: jax.Array) -> tuple[
            mctx.PolicyOutput, jax.Array]:
        """Gumbel MuZero's search from the batch's states ``env_state`` (observed as
        ``obs``), the environment's ``step`` its model: the search's output and the
        network's values of ``obs``."""
        dist, value = self.network.apply(params, obs)
        root = mctx.RootFnOutput(prior_logits=dist.logits, value=value, embedding=env_state)

        def model(params: PyTree, key: jax.Array, action: jax.Array,
                  env_state: PyTree) -> tuple[mctx.RecurrentFnOutput, PyTree]:
            env_state, ts = self.env.step(key, env_state, action)
            dist, value = self.network.apply(params, ts.final_obs)  # where a time limit cut it, the cut state's
            discount = jnp.where(ts.terminated, 0.0, self.discount)
            return mctx.RecurrentFnOutput(reward=ts.reward, discount=discount, prior_logits=dist.logits,
                                          value=value), env_state

        _, mask = unmasked(obs)
        searched = mctx.gumbel_muzero_policy(
            params, key, root, model, self.num_simulations, invalid_actions=None if mask is None else ~mask,
            max_num_considered_actions=self.max_considered_actions, gumbel_scale=self.gumbel_scale)
        return searched, value

    @fragment("actor", batched={"env_state": 0, "obs": 0, "traj": 1}, outputs=("traj", "env_state", "obs", "episodes"))
    def rollout(self, params: PyTree, env_state: PyTree, obs: PyTree,
                key: jax.Array) -> tuple[Searched, PyTree, PyTree, Metrics]:
        """``num_steps`` moves of every environment, each the search's."""

        def move(carry: tuple[PyTree, PyTree], key: jax.Array) -> tuple[tuple[PyTree, PyTree], tuple[Any, ...]]:
            env_state, obs = carry
            k_search, k_env = jax.random.split(key)
            searched, value = self.search(params, env_state, obs, k_search)
            env_state, ts = self.env.step(k_env, env_state, searched.action)
            final_value = self.network.apply(params, ts.final_obs)[1]
            step = Searched(obs, searched.action, searched.action_weights, value, ts.reward, ts.terminated,
                            ts.truncated, final_value)
            return (env_state, ts.obs), (step, episodes_ended(ts))

        (env_state, obs), (traj, ended) = jax.lax.scan(move, (env_state, obs), jax.random.split(key, self.num_steps))
        return traj, env_state, obs, episode_metrics(*ended)

    @fragment("learner", batched={"traj": 1, "last_obs": 0}, outputs=("params", "opt_state", "losses"))
    def learn(self, params: PyTree, opt_state: PyTree, traj: Searched, last_obs: PyTree,
              key: jax.Array) -> tuple[PyTree, PyTree, Metrics]:
        """The returns of the rollout, then ``num_epochs`` epochs of ``num_minibatches``
        updates of the policy towards the search's and the value towards the returns."""
        last_value = self.network.apply(params, last_obs)[1]
        _, returns = gae(traj.reward, traj.value, traj.terminated, traj.truncated, traj.final_value, last_value,
                         self.discount, 1.0)
        batch = primitives.flatten_batch((traj.obs, traj.search_policy, returns), 1)
        return minibatch_epochs(self.loss, self.optimizer(), params, opt_state, batch,
                                jax.random.split(key, self.num_epochs), self.num_minibatches)

    def loss(self, params: PyTree, obs: PyTree, search_policy: jax.Array,
             target: jax.Array) -> tuple[jax.Array, Metrics]:
        """Cross-entropy of the network's policy to the search's, plus ``vf_coef`` times the
        squared error of its value, on one minibatch."""
        dist, value = self.network.apply(params, obs)
        policy_loss = optax.softmax_cross_entropy(dist.logits, search_policy).mean()
        value_loss = jnp.square(value - target).mean()
        total = policy_loss + self.vf_coef * value_loss
        return total, {"loss": total, "policy_loss": policy_loss, "value_loss": value_loss,
                       "entropy": dist.entropy().mean(), "search_entropy": Categorical(
                           jnp.log(jnp.maximum(search_policy, 1e-12))).entropy().mean()}

    @fragment("evaluator")
    def versus_random(self, params: PyTree, key: jax.Array, due: jax.Array) -> Metrics:
        """Where ``due``, the batch's games of the network's greedy moves against uniformly
        random legal ones (the network first in the even-numbered games), played to their
        ends: their count, and the sums of the network's results, wins and losses; zeros
        elsewhere. Under a ``Population`` ``due`` is batched, and the ``cond`` runs both
        branches: the games are played every iteration, their metrics unchanged."""

        def played(_: None) -> Metrics:
            k_reset, key_moves = jax.random.split(key)
            env_state, obs = self.env.reset(k_reset)
            first = jnp.arange(self.num_envs) % 2 == 0
            zeros = jnp.zeros(self.num_envs)
            carry = (env_state, obs, key_moves, jnp.int32(0), zeros, zeros.astype(bool))

            def ply(carry: tuple[Any, ...]) -> tuple[Any, ...]:
                env_state, obs, key, moves, outcome, over = carry
                key, k_random, k_env = jax.random.split(key, 3)
                _, mask = unmasked(obs)
                ours = self.network.apply(params, obs)[0].mode()
                random = uniform_allowed(k_random, jnp.where(mask, 0.0, -jnp.inf))
                our_move = (moves % 2 == 0) == first
                env_state, ts = self.env.step(k_env, env_state, jnp.where(our_move, ours, random))
                result = jnp.where(our_move, ts.reward, -ts.reward)
                outcome = jnp.where(ts.done & ~over, result, outcome)
                return env_state, ts.obs, key, moves + 1, outcome, over | ts.done

            outcome = jax.lax.while_loop(lambda carry: ~carry[-1].all(), ply, carry)[4]
            return dict(zip(VERSUS, (jnp.float32(self.num_envs), outcome.sum(), (outcome > 0).sum(dtype=jnp.float32),
                                     (outcome < 0).sum(dtype=jnp.float32)), strict=True))

        return jax.lax.cond(due, played, lambda _: {name: jnp.float32(0) for name in VERSUS}, None)
