"""Pgx's board games (``pgx:``) and AlphaZero on them: the games alternate their movers, each
step's reward the mover's; the search plans with the game as its model, a value backing up
negated to the player before; AlphaZero learns tic-tac-toe to perfect play. Its rows under the
distribution policies are ``test_matrix.py``'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_frag as jf
from jaxrl_frag import ConfigError, envs
from jaxrl_frag.recipes import AlphaZero
from jaxrl_frag.transforms.evaluated import Evaluated

GAME = "pgx:tic_tac_toe"
X_WINS = (0, 3, 1, 4, 2)  # X takes the top row, O the middle row's first two cells


def play(env: envs.Env, moves: tuple[int, ...]) -> tuple[object, envs.TimeStep | None, object]:
    """One game of ``env`` reset from key 0 and stepped through ``moves``: the state, the last step
    and the observation after it."""
    state, obs = env.reset(jax.random.PRNGKey(0))
    ts, step = None, jax.jit(env.step)
    for t, move in enumerate(moves):
        state, ts = step(jax.random.PRNGKey(t + 1), state, jnp.int32(move))
        obs = ts.obs
    return state, ts, obs


def test_a_game_alternates_its_movers_and_pays_the_mover() -> None:
    env = envs.make(GAME)
    capabilities = env.capabilities
    assert capabilities.alternating and capabilities.deterministic and capabilities.masks_actions
    assert env.action_space == envs.Discrete(9) and env.observation_space.shape == (3, 3, 2)
    # after X's first move O observes it: its own marks in plane 0, the opponent's in plane 1
    _, ts, obs = play(env, X_WINS[:1])
    np.testing.assert_array_equal(obs.obs[..., 1].ravel(), np.eye(9)[0])
    assert not obs.obs[..., 0].any() and not bool(obs.action_mask[0]) and int(obs.action_mask.sum()) == 8
    rewards = [float(play(env, X_WINS[:n])[1].reward) for n in range(1, 6)]
    assert rewards == [0.0, 0.0, 0.0, 0.0, 1.0]  # the mover who completes the row is paid, the others nothing
    _, ts, obs = play(env, X_WINS)
    assert bool(ts.terminated) and not bool(ts.truncated) and not obs.obs.any() and bool(obs.action_mask.all())
    assert ts.final_obs.obs.sum() == 5  # a new game's empty board, and the board that ended the last one, kept
    # O completing its row on move 6 is paid as the mover too: X's row was never finished
    _, ts, _ = play(env, (0, 3, 1, 4, 8, 5))
    assert float(ts.reward) == 1.0 and bool(ts.terminated)


def test_games_and_recipes_that_cannot_meet_are_refused_with_the_reason() -> None:
    for bad, why in (("pgx:2048", "draws a tile by chance after each move"),
                     ("pgx:kuhn_poker", "hides the cards"),
                     ("pgx:minatar-breakout", "is MinAtar's, which gymnax serves"),
                     ("pgx:tic_tac_to", "did you mean pgx:tic_tac_toe"),
                     ("pgx:tic_tac_toe@size=4", "take no options: drop @size")):
        with pytest.raises(ConfigError, match=why):
            envs.make(bad)
    with pytest.raises(ConfigError, match=r"move in turn.*PPO learns for one player.*choose a recipe that plays both "
                                          r"sides \(alphazero\)"):
        jf.recipes.PPO.create(GAME)
    for chance in ("CartPole-v1", "jumanji:Snake-v1"):  # a reset's draw; the fruit, drawn as Snake plays
        with pytest.raises(ConfigError, match="not a model AlphaZero can search with"):
            AlphaZero.create(chance)


def test_a_game_against_random_moves_is_a_task_for_one_player() -> None:
    """``@opponent=random``: each step the agent's move and a uniformly random reply, its reward
    the agent's, a coin deciding who opens. Random moves against random moves at tic-tac-toe: the
    player who opens wins 58.5% of the games, the other 28.8%, 12.7% are drawn; an agent that opens
    half of them wins and loses 43.7% each. Were the reply's reward counted as the agent's, it would
    win 87%; did it open every game, 58.5%."""
    env = envs.make(f"{GAME}@opponent=random", num_envs=1024)
    assert env.name == f"{GAME}@opponent=random" and envs.make(env.name).name == env.name
    capabilities = env.capabilities
    assert capabilities.masks_actions and not capabilities.alternating and not capabilities.deterministic
    jf.recipes.PPO.create(env.name)  # a task for a recipe that learns for one player
    with pytest.raises(ConfigError, match="not a model AlphaZero can search with"):
        AlphaZero.create(env.name)

    def games(key: jax.Array) -> tuple[jax.Array, ...]:
        state, obs = env.reset(key)

        def move(carry: tuple[object, envs.MaskedObs], key: jax.Array) -> tuple[tuple[object, envs.MaskedObs], tuple]:
            k_move, k_env = jax.random.split(key)
            state, ts = env.step(k_env, carry[0], envs.random_legal(k_move, carry[1].action_mask))
            return (state, ts.obs), (ts.done, ts.info["episode_return"], ts.info["episode_length"])

        return obs.obs.sum((1, 2, 3)), *jax.lax.scan(move, (state, obs), jax.random.split(key, 60))[1]

    marks, done, returns, lengths = jax.device_get(jax.jit(games)(jax.random.PRNGKey(0)))
    assert set(np.unique(marks)) == {0.0, 1.0} and abs(marks.mean() - 0.5) < 0.05  # the opponent opened half
    results = returns[done]
    assert results.size > 10_000 and set(np.unique(results)) == {-1.0, 0.0, 1.0}
    assert lengths[done].min() >= 2 and lengths[done].max() <= 5  # the agent's moves: two to five
    won, lost = (results > 0).mean(), (results < 0).mean()
    assert abs(won - 0.437) < 0.02 and abs(lost - 0.437) < 0.02 and abs(1 - won - lost - 0.127) < 0.02, (won, lost)
    from jaxrl_frag.transforms.evaluated import evaluation_env

    assert evaluation_env(envs.make(GAME)) == env.name and evaluation_env(envs.make("CartPole-v1")) == "CartPole-v1"


def test_a_games_returns_alternate_in_sign_between_the_movers() -> None:
    """AlphaZero's value targets are ``gae`` at lambda 1 with the discount negated: X's winning
    game (``X_WINS``), paid on its last move, is worth 1 to X at each of X's moves and -1 to O at
    each of O's; cut by the rollout after O's second move, each target bootstraps from the
    value of the board X then moves on, negated at every move back."""
    from jaxrl_frag.recipes.advantages import gae

    rewards, ended = jnp.array([[0.0], [0.0], [0.0], [0.0], [1.0]]), jnp.array([[0], [0], [0], [0], [1]], bool)
    _, targets = gae(rewards, jnp.zeros((5, 1)), ended, jnp.zeros((5, 1), bool), jnp.zeros((5, 1)), jnp.zeros(1), -1.0,
                     1.0)
    np.testing.assert_array_equal(targets[:, 0], [1, -1, 1, -1, 1])
    _, cut = gae(rewards[:4], jnp.zeros((4, 1)), ended[:4], ended[:4], jnp.zeros((4, 1)), jnp.full(1, 0.5), -1.0, 1.0)
    np.testing.assert_array_equal(cut[:, 0], [0.5, -0.5, 0.5, -0.5])


WIN, BLOCK = (0, 3, 1, 4), (0, 4, 8, 1)  # X to move: completes its row at 2; must block O's column at 7


def searched(mutate: Callable[[AlphaZero], AlphaZero] | None = None) -> np.ndarray:
    """The moves an untrained network's search chooses (no Gumbel noise, 1024 simulations: 256
    do not find the block) in 8 games, the first 4 after ``WIN``'s moves, the others after
    ``BLOCK``'s."""
    algo = AlphaZero.create(GAME, num_envs=8, num_steps=1, total_steps=8, hidden=(8,), num_simulations=1024,
                            gumbel_scale=0.0)
    algo = mutate(algo) if mutate else algo
    state, obs = algo.env.reset(jax.random.PRNGKey(0))
    for t, moves in enumerate(zip(WIN, BLOCK, strict=True)):
        state, ts = algo.env.step(jax.random.PRNGKey(t), state, jnp.repeat(jnp.array(moves), 4))
        obs = ts.obs
    params = algo.init(jax.random.PRNGKey(0)).params
    return np.asarray(jax.jit(algo.search)(params, state, obs, jax.random.PRNGKey(1))[0].action)


@pytest.mark.slow  # two searches of 1024 simulations, each compiled: half a minute on 2 cores
def test_the_search_plans_with_the_game_as_its_model() -> None:
    """An untrained network knows nothing, so what the search chooses comes from the game it
    steps: X completes its row at once, and where O threatens a column and X has no win, X,
    whose every other move lets O complete it, blocks it; the block is found only where the
    value of the state after a move backs up negated (the opponent moves next)."""
    np.testing.assert_array_equal(searched(), [2] * 4 + [7] * 4)
    same_sign = lambda algo: type("SameSign", (AlphaZero,), {"discount": 1.0})(  # noqa: E731
        **{f.name: getattr(algo, f.name) for f in dataclasses.fields(algo)})
    chosen = searched(same_sign)  # the opponent's win counted as the mover's
    assert (chosen[:4] == 2).all() and (chosen[4:] != 7).any(), chosen


def lines(policy: Callable[[envs.MaskedObs], int], first: bool) -> tuple[int, int]:
    """Every game of tic-tac-toe ``policy`` plays (the first move its, or the opponent's) against
    every sequence of the opponent's legal moves: how many games, and how many it lost."""
    env = envs.make(GAME)
    step, key = jax.jit(env.step), jax.random.PRNGKey(0)

    def count(state: object, obs: envs.MaskedObs, ours: bool) -> tuple[int, int]:
        moves = [policy(obs)] if ours else np.flatnonzero(np.asarray(obs.action_mask)).tolist()
        games = lost = 0
        for move in moves:
            after, ts = step(key, state, jnp.int32(move))
            if bool(ts.done):
                games, lost = games + 1, lost + int((float(ts.reward) if ours else -float(ts.reward)) < 0)
            else:
                more = count(after, ts.obs, not ours)
                games, lost = games + more[0], lost + more[1]
        return games, lost

    return count(*env.reset(key), first)


def greedy_lines(algo: AlphaZero, state: object) -> tuple[tuple[int, int], tuple[int, int]]:
    act = jax.jit(algo.policy_fn(state, greedy=True))
    policy = lambda obs: int(act(jax.tree.map(lambda x: x[None], obs), jax.random.PRNGKey(0))[0])  # noqa: E731
    return lines(policy, True), lines(policy, False)


@pytest.mark.learning
def test_alphazero_learns_to_beat_random_moves_at_tic_tac_toe() -> None:
    """The network's greedy moves alone, no search, against uniformly random ones, at 1e5 moves
    (a quarter of the defaults' budget): seeds 0-2 score 0.72, 0.66 and 0.81 in their last two
    rows (a result of 1 a win, -1 a loss; at 2e5 moves 0.88-0.89), and against every sequence of
    the opponent's moves, first and second, lose 12%, 9% and 6% of the games (at 2e5 moves 0.3%,
    3% and 0.4%). The same run at 2e5 moves with a learning rate of 1e-12 scores 0.03 and 0.15
    and loses 57% (591 of 1,036)."""
    algo = AlphaZero.create(GAME, total_steps=100_000)
    program = jf.compile(algo, chunk_iterations=algo.num_iterations // 10)
    history = program.run(jax.random.PRNGKey(0))
    outcome = np.asarray(history["versus_random_outcome"])
    assert outcome[-2:].mean() >= 0.5, outcome
    (games_first, lost_first), (games_second, lost_second) = greedy_lines(algo, program.algorithm_state(history.state))
    assert lost_first + lost_second <= 0.2 * (games_first + games_second), (games_first, lost_first, games_second,
                                                                             lost_second)


@pytest.mark.learning
@pytest.mark.long  # 4e5 moves: a minute on 2 cores
def test_alphazero_at_its_defaults_plays_tic_tac_toe_perfectly() -> None:
    """Tic-tac-toe is a draw with perfect play: at its defaults (4e5 moves) the network's greedy
    moves alone lose no game, first or second, against any sequence of the opponent's moves."""
    algo = AlphaZero.create(GAME)
    program = jf.compile(algo, chunk_iterations=algo.num_iterations // 10)
    history = program.run(jax.random.PRNGKey(0))
    (games_first, lost_first), (games_second, lost_second) = greedy_lines(algo, program.algorithm_state(history.state))
    assert lost_first == lost_second == 0 and games_first > 0 and games_second > 0, (games_first, lost_first,
                                                                                      games_second, lost_second)


@pytest.mark.learning
@pytest.mark.long  # PPO's programs on a board game: 25 s to compile, 10 s to train
def test_ppo_learns_to_beat_random_moves_at_tic_tac_toe() -> None:
    """``@opponent=random`` is a task for one player: PPO at its defaults over 2e5 steps (seed 0)
    ends with a mean result of 0.65 in its last rows (1 a win, -1 a loss; its greedy policy 0.74
    over 200 games), where random moves score 0.0 and the same run at a learning rate of 1e-12
    0.02."""
    algo = jf.recipes.PPO.create(f"{GAME}@opponent=random", total_steps=200_000)
    history = jf.compile(algo, chunk_iterations=algo.num_iterations // 20).run(jax.random.PRNGKey(0))
    returns = np.asarray(history["episode_return"])
    assert returns[-2:].mean() >= 0.5, returns


@pytest.mark.learning
@pytest.mark.long  # 1e5 steps of 32 simulations each: a minute and a half on 2 cores
def test_alphazero_learns_a_deterministic_task_for_one_player() -> None:
    """Jumanji's Knapsack draws its items at a reset and no chance as it steps, so it is its own
    model for one player (the discount gamma, not negated). At 1e5 steps the network's greedy
    choices alone, no search, return 14.7, 15.3 and 14.7 over 256 episodes (seeds 0-2), where
    random choices among the allowed items return 13.5 and the same run at a learning rate of
    1e-12 13.5 (its search, with the untrained network, 15.2 in training; the trained ones' 15.4-15.5)."""
    algo = AlphaZero.create("jumanji:Knapsack-v1", total_steps=100_000)
    assert not algo.alternating and algo.discount == algo.gamma
    evaluated = Evaluated.create(algo, every=algo.num_iterations, episodes=256)
    history = jf.compile(evaluated, chunk_iterations=algo.num_iterations).run(jax.random.PRNGKey(0))
    assert float(history.final["eval_return"]) >= 14.3, history["eval_return"]
