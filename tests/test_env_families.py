"""The environment families that come in through the environment seam, each one file in
``envs/`` and one entry point: Craftax (``craftax:``), Navix (``navix:``), XLand-MiniGrid
(``xminigrid:``), Jumanji (``jumanji:``, its action masks beside the observations) and Pgx
(``pgx:``, listed and imported lazily here; its games are ``test_alphazero.py``'s). Each
is listed, refuses bad ids before anything is traced, steps under jit and vmap, keeps
terminations and truncations apart, learns past random play, and draws a video where it
renders. Their rows under the distribution policies are ``test_matrix.py``'s."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

import jaxrl_frag as jf
from jaxrl_frag import ConfigError, envs
from jaxrl_frag.app.cli import main

CLASSIC, FULL = "craftax:Craftax-Classic-Symbolic-v1", "craftax:Craftax-Symbolic-v1"
EMPTY = "navix:Navix-Empty-5x5-v0"
XEMPTY = "xminigrid:MiniGrid-Empty-5x5"
KNAPSACK = "jumanji:Knapsack-v1"
GAME = "pgx:tic_tac_toe"  # the games themselves are test_alphazero.py's


@pytest.mark.slow  # a process of its own: nothing imported yet
def test_families_are_listed_lazily_and_bad_ids_exit_2_naming_the_ids(capsys: pytest.CaptureFixture[str]) -> None:
    # importing jaxrl_frag and listing the ids imports neither package; one that is missing is named with its install
    code = ("import sys; from jaxrl_frag import ConfigError, envs; envs.available()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('craftax', 'navix', 'xminigrid', 'jumanji', 'pgx')))\n"
            "sys.modules['craftax'] = sys.modules['navix'] = sys.modules['xminigrid'] = sys.modules['jumanji'] = None\n"
            "sys.modules['pgx'] = None\n"
            f"for name in ({CLASSIC!r}, {EMPTY!r}, {XEMPTY!r}, {KNAPSACK!r}, {GAME!r}):\n"
            "    try:\n"
            "        envs.make(name)\n"
            "    except ConfigError as error:\n"
            "        print(error)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["[]",
                   f"env='{CLASSIC}': needs the craftax package, which is not installed: pip install 'jaxrl-frag[craftax]'",
                   f"env='{EMPTY}': needs the navix package, which is not installed: pip install 'jaxrl-frag[navix]'",
                   f"env='{XEMPTY}': needs the xminigrid package, which is not installed: "
                   "pip install 'jaxrl-frag[xminigrid]'",
                   f"env='{KNAPSACK}': needs the jumanji package, which is not installed: pip install 'jaxrl-frag[jumanji]'",
                   f"env='{GAME}': needs the pgx package, which is not installed: pip install 'jaxrl-frag[pgx]'"]
    assert main(["envs"]) == 0
    listed = capsys.readouterr().out
    assert all(f"{family}:<id>" in listed for family in ("craftax", "navix", "xminigrid", "jumanji", "pgx")), listed
    for bad, names in (("craftax:Craftax-Classic-v1", CLASSIC), ("navix:Navix-Empty-5x5", EMPTY),
                       ("xminigrid:MiniGrid-Empty-5x6", XEMPTY), ("jumanji:Knapsack-v2", KNAPSACK)):
        assert main(["train", "ppo", "--env", bad]) == 2
        err = capsys.readouterr().err
        assert bad in err and "did you mean" in err and names in err and "Traceback" not in err, err


def test_craftax_declares_its_spaces_capabilities_and_options() -> None:
    for name, size, actions in ((CLASSIC, 1345, 17), (FULL, 8268, 43)):
        env = envs.make(name)
        assert env.observation_space.shape == (size,) and env.action_space == envs.Discrete(actions)
        assert env.capabilities == envs.Capabilities(traceable=True, restorable=True, renders=True)
        assert env.max_steps == (10_000 if name == CLASSIC else 100_000)
        assert envs.make(name) == env and envs.make(name, max_timesteps=50) != env
    with pytest.raises(ConfigError, match="Craftax's parameters have no lava; they are max_timesteps, day_length"):
        envs.make(CLASSIC, lava=True)
    with pytest.raises(ConfigError, match="did you mean craftax:Craftax-Symbolic-v1"):
        envs.make("craftax:Craftax-Symbolic-v2")


@pytest.mark.long  # each game compiles for one to five minutes on 2 cores (and Classic's textures load once for ~1 min)
@pytest.mark.parametrize("name, num_envs, limit, achievements", [(CLASSIC, 8, 20, 22), (FULL, 4, 5, 65)])
def test_craftax_steps_under_jit_and_vmap_and_truncates_at_its_limit(name: str, num_envs: int, limit: int,
                                                                      achievements: int) -> None:
    env = envs.make(name, num_envs=num_envs, max_timesteps=limit)
    n = env.action_space.n

    def act(obs, key):
        action = jax.random.randint(key, obs.shape[:1], 0, n)
        return action, action, ()

    length = 2 * limit + 2
    state, obs = env.reset(jax.random.PRNGKey(0))
    steps, _, _, _, ended = jax.jit(lambda s, o, k: env.rollout(act, s, o, k, length))(state, obs, jax.random.PRNGKey(1))
    done = np.asarray(ended.done)
    # random play lives past the limit: every episode is cut by it, a truncation, twice in the rollout
    assert np.asarray(steps.truncated)[[limit - 1, 2 * limit - 1]].all() and done.sum() == 2 * num_envs
    assert not np.asarray(steps.terminated).any() and (np.asarray(ended.episode_length)[done] == limit).all()
    achieved = np.asarray(ended.stats["episode_achievements"])[done]
    assert np.isfinite(achieved).all() and (achieved >= 0).all() and achieved.max() <= achievements
    assert np.isfinite(np.asarray(steps.reward)).all() and np.asarray(steps.next_obs).max() <= 1.0
    assert np.asarray(steps.obs).shape == (length, num_envs, *env.observation_space.shape)


@pytest.mark.long  # Classic's textures load once for ~1 min on 2 cores
def test_craftax_classic_renders_whole_frames() -> None:
    one = envs.make(CLASSIC)
    first, _ = one.reset(jax.random.PRNGKey(0))
    frames = one.render(jax.tree.map(lambda x: jnp.stack([x, x]), first))
    assert frames.dtype == np.uint8 and frames.shape[0] == 2 and frames.shape[-1] == 3 and frames.std() > 10


@pytest.mark.learning
@pytest.mark.long  # Craftax's game: 8 minutes, compiling included, on 2 cores at load 6 to 8 (20 at load 15)
def test_ppo_learns_craftax_classic_past_random_play() -> None:
    """Random play returns 1.25 a finished episode (2.1 achievements, 132 steps; 64 environments
    x 500 steps); PPO's first 1.2e4 steps return 1.36 (2.3 achievements), its last 2.98 (3.9
    achievements) by 1e5 steps (64 environments x 64 steps; the run in benchmarks/HISTORY.md)."""
    algo = jf.recipes.PPO.create(CLASSIC, num_envs=64, num_steps=64, total_steps=100_000, hidden=(128, 128))
    history = jf.compile(algo, chunk_iterations=3).run(jax.random.PRNGKey(0))
    assert history.final["episode_return"] >= 2.3 and history.final["episode_achievements"] >= 3.2, (
        history["episode_return"], history["episode_achievements"])


# per family: its spaces, the actions forward, forward, right, forward, forward from the start of the empty
# 5x5 grid (the goal in the far corner, XLand-MiniGrid paying 1 - 0.9 * 5 / 100 for it), turning left, a frame's
# shape, a misspelt id with the one it suggests, and a refused option with its refusal
GRIDS = {
    EMPTY: ((5, 5, 3), 7, (2, 2, 1, 2, 2), 1.0, 0, (40, 40, 3), ("navix:Navix-Empty-5x5", EMPTY),
            (dict(max_steps=0), "max_steps=0: must be a positive integer")),
    XEMPTY: ((7, 7, 2), 6, (0, 0, 1, 0, 0), 0.955, 2, (160, 160, 3), ("xminigrid:MiniGrid-Empty-5x6",
                                                                      "xminigrid:MiniGrid-Empty-6x6"),
             (dict(lava=1), "XLand-MiniGrid's parameters have no lava; they are height, width")),
}


@pytest.mark.parametrize("name", GRIDS)
def test_grid_worlds_declare_their_spaces_terminate_at_the_goal_and_truncate_at_their_limit(name: str) -> None:
    shape, actions, to_goal, paid, left, frame, (misspelt, suggested), (bad, refusal) = GRIDS[name]
    env = envs.make(name)
    assert env.observation_space.shape == shape and env.action_space == envs.Discrete(actions)
    assert env.capabilities.renders and env.max_steps == 100
    state, obs = env.reset(jax.random.PRNGKey(0))
    step = jax.jit(env.step)
    for t, action in enumerate(to_goal):
        state, ts = step(jax.random.PRNGKey(1), state, jnp.int32(action))
        last = t == len(to_goal) - 1
        assert (float(ts.reward), bool(ts.terminated), bool(ts.truncated)) == pytest.approx((paid * last, last, False))
    assert not np.array_equal(ts.final_obs, ts.obs) and np.array_equal(ts.obs, obs)  # reset to the start
    short = envs.make(name, max_steps=3)
    state, _ = short.reset(jax.random.PRNGKey(0))
    for t in range(3):
        state, ts = short.step(jax.random.PRNGKey(t), state, jnp.int32(left))  # turning left: never the goal
    assert bool(ts.truncated) and not bool(ts.terminated)
    frames = env.render(jax.tree.map(lambda x: jnp.stack([x] * 3), state))
    assert frames.shape == (3, *frame) and frames.dtype == np.uint8 and frames.std() > 10
    with pytest.raises(ConfigError, match=f"did you mean {suggested}"):
        envs.make(misspelt)
    with pytest.raises(ConfigError, match=refusal):
        envs.make(name, **bad)


@pytest.mark.learning
def test_ppo_learns_navix_empty_5x5_past_random_play() -> None:
    """Random play reaches the goal in 44% of episodes (return 0.44, mean length 80 of the 100
    allowed; 64 environments x 400 steps); PPO reaches it every time within 6e4 steps (return
    0.99, length 15.5 at 6e4 steps; 1.00 and 6.5 by 1e5; 16 environments x 128 steps)."""
    algo = jf.recipes.PPO.create(EMPTY, num_envs=16, num_steps=128, total_steps=61_440, hidden=(128, 128))
    history = jf.compile(algo, chunk_iterations=6).run(jax.random.PRNGKey(0))
    assert history.final["episode_return"] >= 0.95 and history.final["episode_length"] <= 25, (
        history["episode_return"], history["episode_length"])


@pytest.mark.slow  # the command line's train and evaluate, each compiling its programs
def test_navix_trains_evaluates_and_draws_a_video_from_the_command_line(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "navix"
    tiny = ["--num-envs", "4", "--num-steps", "16", "--total-steps", "512", "--chunk-iterations", "4"]
    assert main(["train", "ppo", "--env", EMPTY, *tiny, "--run-dir", str(run)]) == 0
    gif = tmp_path / "episode.gif"
    assert main(["evaluate", str(run), "--episodes", "3", "--video", str(gif)]) == 0
    out = capsys.readouterr().out
    assert f"on {EMPTY}: mean return" in out and "over 3 episodes" in out, out
    with Image.open(gif) as image:
        frames, size = image.n_frames, image.size
        image.seek(frames - 1)
        assert len(set(image.convert("RGB").getdata())) > 4  # the grid drawn, not a blank frame
    assert size == (400, 240) and 1 <= frames <= 100 and f"one episode, {frames} steps" in out, out


@pytest.mark.learning
def test_ppo_learns_xminigrid_empty_5x5_past_random_play() -> None:
    """Random play returns 0.27 (mean length 76 of the 100 allowed; 64 environments x 400
    steps); PPO returns 0.91 (length 9.7) by 2.5e4 steps and 0.95, the most there is (the goal
    in 5 steps), by 3.7e4 (16 environments x 128 steps)."""
    algo = jf.recipes.PPO.create(XEMPTY, num_envs=16, num_steps=128, total_steps=36_864, hidden=(128, 128))
    history = jf.compile(algo, chunk_iterations=6).run(jax.random.PRNGKey(0))
    assert history.final["episode_return"] >= 0.9 and history.final["episode_length"] <= 15, (
        history["episode_return"], history["episode_length"])


def test_jumanji_observes_its_action_mask_and_keeps_terminations_apart() -> None:
    env = envs.make(KNAPSACK)
    assert env.capabilities.masks_actions and env.action_space == envs.Discrete(50)
    assert env.observation_space.shape == (150,)  # weights, values, packed: 50 items each
    state, obs = env.reset(jax.random.PRNGKey(0))
    assert isinstance(obs, envs.MaskedObs) and obs.obs.shape == (150,) and bool(obs.action_mask.all())
    step = jax.jit(env.step)
    state, ts = step(jax.random.PRNGKey(1), state, jnp.int32(0))  # item 0 packed: its value paid, no longer allowed
    assert float(ts.reward) == pytest.approx(float(obs.obs[50])) and not bool(ts.obs.action_mask[0])
    assert int(ts.obs.action_mask.sum()) == 49 and not bool(ts.terminated | ts.truncated)
    # Maze ends an episode at its time limit as a termination (discount 0), as Jumanji's own step says
    maze = envs.make("jumanji:Maze-v0@time_limit=3")  # an option in the id, the environment named with it
    assert maze.name == "jumanji:Maze-v0@time_limit=3" and envs.make(maze.name) == maze
    state, obs = maze.reset(jax.random.PRNGKey(0))
    for t in range(3):
        action = jnp.argmax(obs.action_mask)  # an allowed move
        state, ts = maze.step(jax.random.PRNGKey(t), state, action)
        obs = ts.obs
    assert bool(ts.terminated) and not bool(ts.truncated)
    assert not np.array_equal(ts.final_obs.obs, ts.obs.obs)  # reset, the last observation kept
    with pytest.raises(ConfigError, match="did you mean jumanji:Knapsack-v1"):
        envs.make("jumanji:Knapsack-v2")
    with pytest.raises(ConfigError, match=r"acts with MultiDiscreteArray \(2,\) \(several choices at once\)"):
        envs.make("jumanji:Minesweeper-v0")
    with pytest.raises(ConfigError, match="normalize_obs=True: standardises observations of one array"):
        envs.make(KNAPSACK, num_envs=2, normalize_obs=True)


def test_q_learning_acts_and_bootstraps_within_the_masks() -> None:
    """DQN, QR-DQN and PQN on Knapsack's masks: a masked action's value is -inf, so neither the
    greedy action, nor an exploring one, nor the action a target bootstraps from is ever a masked
    one (a mask that allows nothing allows everything, so that a greedy value stays finite)."""
    from jaxrl_frag.recipes.networks import allowed_values

    q = jnp.array([[1.0, 5.0, 2.0], [1.0, 5.0, 2.0]])
    mask = jnp.array([[True, False, True], [False, False, False]])
    np.testing.assert_array_equal(allowed_values(q, mask), [[1.0, -np.inf, 2.0], [1.0, 5.0, 2.0]])
    small = dict(num_envs=8, num_steps=4, total_steps=8 * 4 * 3)
    off_policy = dict(small, num_updates=2, minibatch_size=16, buffer_size=128, learning_starts=32, hidden=(32,))
    for recipe, settings in ((jf.recipes.DQN, off_policy), (jf.recipes.QRDQN, {**off_policy, "quantiles": 4}),
                             (jf.recipes.PQN, {**small, "num_minibatches": 2, "hidden": (32,)})):
        algo = recipe.create(KNAPSACK, **settings)
        program = jf.compile(algo, chunk_iterations=3)
        history = program.run(jax.random.PRNGKey(0))
        state = program.algorithm_state(history.state)
        assert np.isfinite(history["loss"]).all(), (recipe.__name__, history["loss"])
        # one allowed item per environment, chosen at random: the greedy and every exploring action take it
        only = jax.random.randint(jax.random.PRNGKey(1), (algo.num_envs,), 0, 50)
        obs = envs.MaskedObs(state.obs.obs, jax.nn.one_hot(only, 50, dtype=bool))
        params = state.policy if recipe is not jf.recipes.PQN else state.params
        if recipe is jf.recipes.PQN:
            q = algo.q_values(params, (), obs)
            greedy, exploring = q.argmax(-1), algo.explore(q, jax.random.PRNGKey(2), 1.0)
        else:
            greedy, exploring = algo.greedy_action(params, obs), algo.act(params, obs, jax.random.PRNGKey(2), 0)[0]
        np.testing.assert_array_equal(greedy, only, err_msg=recipe.__name__)
        np.testing.assert_array_equal(exploring, only, err_msg=recipe.__name__)
        if recipe is not jf.recipes.PQN:  # every action the buffer holds was allowed where it was taken
            items = state.buffer.items
            written = np.asarray(items.obs.action_mask).reshape(-1, 50).any(-1)
            taken = np.take_along_axis(np.asarray(items.obs.action_mask).reshape(-1, 50),
                                       np.asarray(items.action).reshape(-1, 1).astype(int), 1)[:, 0]
            assert written.sum() >= algo.total_steps and taken[written].all(), recipe.__name__


@pytest.mark.learning
def test_dqn_learns_jumanji_knapsack_within_its_masks() -> None:
    """DQN (16 environments x 8 steps, 128x128) on Knapsack returns 16.1, 16.2 and 14.6 at 2e5 steps
    (seeds 0 to 2; 16.1, 16.2 and 16.1 a chunk before): past random play among the allowed items (13.5),
    which a policy blind to the masks cannot reach (an item taken twice or past the capacity ends the
    episode). The mean over the last quarter of the run, seed 0: 16.1, and 13.8 with the masks ignored."""
    algo = jf.recipes.DQN.create(KNAPSACK, num_envs=16, num_steps=8, total_steps=200_000, hidden=(128, 128))
    history = jf.compile(algo, chunk_iterations=algo.num_iterations // 20).run(jax.random.PRNGKey(0))
    returns = np.asarray(history["episode_return"])
    assert returns[-len(returns) // 4:].mean() >= 15.0, returns


@pytest.mark.learning
def test_ppo_learns_jumanji_knapsack_within_its_masks() -> None:
    """Random play among the allowed items returns 13.5 (682 episodes of 64 environments x 300
    steps); PPO returns 14.5 by 2.6e5 steps and 15.1 by 4e5 (64 environments x 64 steps). An
    item taken twice or past the capacity ends Jumanji's episode, so a policy blind to the
    masks returns less than random play among the allowed items."""
    algo = jf.recipes.PPO.create(KNAPSACK, num_envs=64, num_steps=64, total_steps=400_000, hidden=(128, 128),
                                 lr=1e-3, ent_coef=0.0)
    history = jf.compile(algo, chunk_iterations=8).run(jax.random.PRNGKey(0))
    assert history.final["episode_return"] >= 14.6, history["episode_return"]
