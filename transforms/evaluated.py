"""Greedy episodes of a policy on fresh environments, counted without bias
(``play``, ``first``), and ``Evaluated``: an algorithm that plays them every ``every``
iterations inside its compiled training program.

``play`` is the one episode loop: ``jaxrl_frag.app.evaluation.evaluate`` runs it on a
restored policy after training, ``Evaluated`` on the current policy during it, both on
``evaluation_env``: a game of two players against random moves.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_frag import envs
from jaxrl_frag.algorithms import Algorithm, Wrapper, static_field
from jaxrl_frag.bounds import INT32_MAX, check_count
from jaxrl_frag.errors import check
from jaxrl_frag.fragments import fragment
from jaxrl_frag.metrics import Metrics

PyTree = Any
EPISODES_MAX = 1_000_000  # episodes of one evaluation
ENVS_MAX = 256  # environments stepped at once; more episodes run as several in a row in each
STEPS_MAX = 1_000_000  # steps of each environment before an evaluation gives up on episodes that do not end
EVALUATION = "evaluation"  # the state field that ``Evaluated`` adds to its algorithm's
_EVAL_KEY = 0xE7A1  # folded into the run's key for the evaluations' keys


class Played(NamedTuple):
    """What ``play`` gives: how many episodes each environment ended (``[envs]``), and
    the returns and lengths of its first ``each`` (``[envs, each]``, 0 where not ended)."""

    ended: jax.Array
    returns: jax.Array
    lengths: jax.Array


def evaluation_env(env: envs.Env) -> str:
    """The id of the environment that an evaluation of a policy trained on ``env`` plays:
    ``env``'s own, and for a game of two players who move in turn
    (``Capabilities.alternating``, where the policy plays both sides) the game against
    uniformly random legal moves (``envs.VersusRandom``), so that a return is the policy's
    result (1 a win, -1 a loss)."""
    return env.name + envs.VERSUS_RANDOM if env.capabilities.alternating else env.name


def layout(episodes: int, envs_max: int = ENVS_MAX) -> tuple[int, int]:
    """The environments stepped at once for ``episodes`` episodes (at most ``envs_max``),
    and the fewest episodes each must play to make them."""
    num_envs = min(episodes, envs_max)
    return num_envs, math.ceil(episodes / num_envs)


def play(env: envs.Env, acting: envs.Acting, key: jax.Array, each: int, max_steps: int = STEPS_MAX) -> Played:
    """Every environment of the batched ``env``, reset from ``key``, playing ``acting``
    (its memory carried, forgotten where an episode ends) until it has ended ``each``
    episodes (or taken ``max_steps`` steps), in one ``while_loop``.

    Args:
        env: A batched environment with episode statistics (``envs.make``'s).
        acting: The policy (``Recipe.acting``).
        key: The key of the resets, the steps and the policy's draws.
        each: Episodes kept per environment.
        max_steps: Steps per environment after which episodes that have not ended are
            left uncounted.
    """
    num_envs = env.num_envs
    rows = jnp.arange(num_envs)
    key, k_reset = jax.random.split(key)
    env_state, obs = env.reset(k_reset)
    zeros = jnp.zeros((num_envs, each), jnp.float32)
    carry = (env_state, obs, acting.blank(num_envs), key, jnp.zeros(num_envs, jnp.int32), zeros,
             zeros.astype(jnp.int32), jnp.int32(0))

    def unfinished(carry: tuple[Any, ...]) -> jax.Array:
        ended, steps = carry[4], carry[7]
        return (ended < each).any() & (steps < max_steps)

    def one_step(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        env_state, obs, memory, key, ended, returns, lengths, steps = carry
        key, k_act, k_env = jax.random.split(key, 3)
        action, memory = acting.act(obs, memory, k_act)
        env_state, ts = env.step(k_env, env_state, action)
        counted = ts.info.get("episode_done", ts.done) & (ended < each)
        at = jnp.minimum(ended, each - 1)
        returns = returns.at[rows, at].set(jnp.where(counted, ts.info["episode_return"], returns[rows, at]))
        lengths = lengths.at[rows, at].set(jnp.where(counted, ts.info["episode_length"], lengths[rows, at]))
        return (env_state, ts.obs, envs.forget(memory, ts.done), key, ended + counted, returns, lengths, steps + 1)

    ended, returns, lengths = jax.lax.while_loop(unfinished, one_step, carry)[4:7]
    return Played(ended, returns, lengths)


def first(played: Played, episodes: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The returns and lengths of ``played``'s first ``episodes`` episodes by index alone
    (every environment's first, then every one's second, ...), never by when they ended,
    so short episodes are not favoured; and whether each ended. ``[episodes]`` each."""
    complete = jnp.arange(played.returns.shape[1]) < played.ended[:, None]

    def by_index(x: jax.Array) -> jax.Array:
        return x.T.reshape(-1)[:episodes]

    return by_index(played.returns), by_index(played.lengths), by_index(complete)


@struct.dataclass
class Schedule:
    """When ``Evaluated`` evaluates: the iterations run, and the key its evaluations'
    keys are folded from (one per iteration)."""

    iteration: jax.Array
    key: jax.Array


@struct.dataclass
class Evaluated(Wrapper):
    """``algorithm`` that also plays ``episodes`` greedy episodes of its current policy
    (``acting(state, True)``) after every ``every``-th iteration, on fresh copies of
    its environment (``layout``, ``play``), inside its compiled training program. The
    copies are ``envs.make``'s of ``evaluation_env``, with its default options, as
    ``jaxrl_frag.app.evaluation.evaluate`` plays on.

    The state is the algorithm's, its top-level fields as they were (so a policy places
    them as before), with one more, ``evaluation`` (a ``Schedule``); the algorithm's
    parameters, environments, keys and metrics are bitwise those of a run without
    evaluation. Each iteration adds the metrics ``eval_count`` (episodes evaluated, 0
    between evaluations), ``eval_return_sum`` and ``eval_length_sum``; a chunk sums
    them, and ``metrics.finalize`` makes them the means ``eval_return`` and
    ``eval_length`` of the chunk's evaluations (NaN for a chunk without one). An episode
    that does not end within ``STEPS_MAX`` steps is left uncounted.

    Cost: the evaluation is a ``lax.cond``, so other iterations pay for the predicate
    alone. Under a ``Population`` the predicate is batched over the members, and
    ``vmap`` turns the ``cond`` into a ``select`` that runs both branches: every
    iteration then plays the episodes (the metrics are unchanged). Under
    ``DataParallel`` the evaluation reads only replicated values and runs replicated:
    every device plays every episode, and no collective is added.
    """

    algorithm: Any  # a Recipe, or any algorithm with ``env`` and ``acting``
    env: envs.Env = static_field()  # the evaluation's environments, ``layout(episodes)[0]`` of them
    state_type: type = static_field()  # the algorithm's state class, rebuilt from its fields
    every: int = static_field()  # iterations between evaluations
    episodes: int = static_field()  # greedy episodes per evaluation

    @classmethod
    def create(cls, algorithm: Any, every: int, episodes: int) -> Evaluated:
        """``algorithm`` evaluated every ``every`` iterations over ``episodes`` episodes;
        ``ConfigError`` (naming ``eval_every`` or ``eval_episodes``) where it cannot be."""
        check_count("eval_every", every, INT32_MAX, "iterations are counted in int32")
        check_count("eval_episodes", episodes, EPISODES_MAX, "evaluate more often instead")
        env = getattr(algorithm, "env", None)
        check(env is not None and hasattr(algorithm, "acting"), "eval_every", every,
              f"{type(algorithm).__name__} has no policy to act with (boosted runs have none yet): drop --eval-every")
        check(env.capabilities.traceable, "eval_every", every,
              f"{env.name} runs outside the compiled program (a host environment), and evaluation during training "
              "runs inside it: drop --eval-every, and evaluate the run afterwards with jaxrl-frag evaluate")
        state = jax.eval_shape(algorithm.init, jax.ShapeDtypeStruct((2,), jnp.uint32))
        algorithm.acting(state, True)  # its own ConfigError, before anything is traced, where it cannot act
        check((dataclasses.is_dataclass(state) or isinstance(state, Mapping)) and EVALUATION not in _fields(state),
              "eval_every", every, f"{type(algorithm).__name__}'s state must be a dataclass or a dict without a field "
              f"{EVALUATION!r} to be evaluated during training")
        return cls(algorithm, envs.make(evaluation_env(env), num_envs=layout(episodes)[0]), type(state), every,
                   episodes)

    @property
    def inner(self) -> Algorithm:
        return self.algorithm

    def unwrap(self, state: Mapping[str, PyTree], member: int | None = None) -> tuple[Algorithm, PyTree]:
        return self.algorithm, self.split(state)[0]

    def init(self, key: jax.Array) -> dict[str, PyTree]:
        """The algorithm's initial state from ``key``, and a schedule keyed from it."""
        schedule = Schedule(jnp.int32(0), jax.random.fold_in(key, _EVAL_KEY))
        return {**_fields(self.algorithm.init(key)), EVALUATION: schedule}

    def step(self, state: dict[str, PyTree]) -> tuple[dict[str, PyTree], Metrics]:
        """The algorithm's step, then, every ``every``-th, the evaluation of its new state."""
        inner, schedule = self.split(state)
        inner, metrics = self.algorithm.step(inner)
        due = (schedule.iteration + 1) % self.every == 0
        evaluation = self.evaluate(inner, jax.random.fold_in(schedule.key, schedule.iteration), due)
        schedule = schedule.replace(iteration=schedule.iteration + 1)
        return {**_fields(inner), EVALUATION: schedule}, {**metrics, **evaluation}

    @fragment("evaluator")
    def evaluate(self, state: PyTree, key: jax.Array, due: jax.Array) -> Metrics:
        """Where ``due``, the evaluation metrics of ``state``'s greedy policy; else zeros."""

        def played(_: None) -> Metrics:
            returns, lengths, complete = first(
                play(self.env, self.algorithm.acting(state, True), key, layout(self.episodes)[1]), self.episodes)
            counted = complete.astype(jnp.float32)
            return {"eval_count": counted.sum(), "eval_return_sum": (returns * counted).sum(),
                    "eval_length_sum": (lengths * counted).sum()}

        zeros = {name: jnp.float32(0) for name in ("eval_count", "eval_return_sum", "eval_length_sum")}
        return jax.lax.cond(due, played, lambda _: zeros, None)

    def split(self, state: Mapping[str, PyTree]) -> tuple[PyTree, Schedule]:
        """The algorithm's state and the schedule in ``state``."""
        fields = dict(state)
        schedule = fields.pop(EVALUATION)
        return self.state_type(**fields), schedule

    def resumed(self, state: dict[str, PyTree]) -> dict[str, PyTree]:
        inner, schedule = self.split(state)
        return {**_fields(self.algorithm.resumed(inner)), EVALUATION: schedule}

    def finished(self, state: dict[str, PyTree]) -> jax.Array:
        return self.algorithm.finished(self.split(state)[0])

    def config(self) -> dict[str, Any]:
        """The algorithm's configuration, with ``eval_every`` and ``eval_episodes``."""
        return {**self.algorithm.config(), "eval_every": self.every, "eval_episodes": self.episodes}


def _fields(state: PyTree) -> dict[str, PyTree]:
    """The top-level fields of a dataclass or dict state, by name."""
    if dataclasses.is_dataclass(state):
        return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    return dict(state)
