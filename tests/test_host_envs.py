"""Host environments (Gymnasium, Atari) under the unchanged recipes: the environment
ring computes what strict alternation computes, every policy runs them, a resumed run
starts them afresh and nothing else, a killed worker stops the run cleanly, and PPO
learns on them."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium
import jax
import numpy as np
import pytest
from processes import wait_for, workers_of

import jaxrl_frag as jf
from jaxrl_frag.checkpoints import Checkpoints
from jaxrl_frag.sharding import ActorLearner, DataParallel

CARTPOLE = "gymnasium:CartPole-v1"
SMALL = dict(num_envs=8, num_steps=16, total_steps=8 * 16 * 4, num_minibatches=4)  # 4 iterations


def leaves(tree: object) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def without_sps(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "sps"} for row in rows]


def run(algo: jf.Algorithm, policy: jf.sharding.Policy | None = None) -> tuple[jf.Program, jf.History]:
    program = jf.compile(algo, policy, chunk_iterations=2)
    return program, program.run(jax.random.PRNGKey(3))


@pytest.fixture(scope="module")
def single() -> tuple[jf.Program, jf.History]:
    """PPO on 8 CartPole environments in 2 workers, 2 ring groups, on one device."""
    return run(jf.recipes.PPO.create(CARTPOLE, **SMALL))


def test_the_ring_computes_what_strict_alternation_does(single: tuple[jf.Program, jf.History]) -> None:
    """Same seeds, same numbers: the ring only reorders host calls and inference, and
    stepping in this process instead of worker processes changes nothing either. A
    second ring run is bitwise the same too (the schedule is fixed, not first come,
    first served)."""
    program, ring = single
    assert program.algorithm.env.ring and program.algorithm.env.groups == 2
    assert program.algorithm.env.backend == "processes"
    _, alternating = run(jf.recipes.PPO.create(CARTPOLE, env_ring=False, **SMALL))
    _, in_process = run(jf.recipes.PPO.create(CARTPOLE, env_backend="in-process", **SMALL))
    again = program.run(jax.random.PRNGKey(3))
    for other in (alternating, in_process, again):
        assert without_sps(other.rows) == without_sps(ring.rows)
        for x, y in zip(leaves(other.state), leaves(ring.state), strict=True):
            np.testing.assert_array_equal(x, y)
    assert ring.final["episode_count"] > 0 and np.isfinite(ring.final["episode_return"])


def test_data_parallel_and_actor_learner_equal_single_device(single: tuple[jf.Program, jf.History]) -> None:
    """Each device infers for its share of every group (the observations are split over
    the data axis); with exact shuffling the runs equal the single-device run."""
    _, reference = single
    algo = jf.recipes.PPO.create(CARTPOLE, **SMALL)
    _, parallel = run(algo, DataParallel(2, shuffle="exact"))
    assert parallel.state.obs.sharding.spec[0] == "data"
    pipeline, split = run(jf.recipes.PPO.create(CARTPOLE, **SMALL), ActorLearner(2, 2, staleness=0, shuffle="exact"))
    for state in (parallel.state, pipeline.algorithm_state(split.state)):
        for x, y in zip(leaves(state.params), leaves(reference.state.params), strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    for history in (parallel, split):
        np.testing.assert_allclose(history["episode_return"], reference["episode_return"], rtol=1e-5)


def test_a_resumed_run_starts_its_environments_afresh_and_the_rest_exactly(tmp_path: Path) -> None:
    """From a checkpoint at iteration 2: parameters, optimizer state and key as saved; the
    observations are fresh resets, seeded from the key; two resumptions are the same run."""
    algo = jf.recipes.PPO.create(CARTPOLE, **SMALL)
    program = jf.compile(algo, chunk_iterations=2)
    checkpoints = Checkpoints(tmp_path, every=2)
    first = program.run(jax.random.PRNGKey(3), 2, checkpoints=checkpoints)
    checkpoints.close()
    checkpoint = program.restore(tmp_path)
    resumed = algo.resumed(checkpoint.state)
    for field in ("params", "opt_state", "key"):
        for x, y in zip(leaves(getattr(resumed, field)), leaves(getattr(first.state, field)), strict=True):
            np.testing.assert_array_equal(x, y)
    seeds = np.asarray(jax.random.randint(jax.random.fold_in(checkpoint.state.key, 0x7E5), (8,), 0, 2**31 - 1))
    fresh = np.stack([gymnasium.make("CartPole-v1").reset(seed=int(s))[0] for s in seeds])
    np.testing.assert_array_equal(np.asarray(resumed.obs), fresh)
    assert not np.array_equal(np.asarray(first.state.obs), fresh)
    continued = [program.run(program.restore(tmp_path), 4) for _ in range(2)]
    assert without_sps(continued[0].rows) == without_sps(continued[1].rows)
    assert [row["iteration"] for row in continued[0].rows] == [4.0]


def test_a_prefix_of_the_batch_steps_alone_and_the_rest_wait() -> None:
    """A pool of 8 environments in 4 workers and 2 groups, stepped 5 times on its first 4
    (each group's first worker of 2) beside a pool stepped whole with the same actions: the
    prefix's steps are the whole pool's first rows, and the 4 that waited then step as
    if from their reset (a third pool's first step). A prefix of part of a worker is
    refused, naming the multiple that whole workers make."""
    from jaxrl_frag.envs.host_pool import HostEnvPool
    from jaxrl_frag.errors import ConfigError

    actions = np.random.default_rng(0).integers(0, 2, (6, 8))
    with (HostEnvPool(CARTPOLE, 8, 4, 2) as whole, HostEnvPool(CARTPOLE, 8, 4, 2) as part,
          HostEnvPool(CARTPOLE, 8, 4, 2) as fresh):
        np.testing.assert_array_equal(whole.reset(7), part.reset(7))
        fresh.reset(7)
        for a in actions[:5]:
            expected = whole.step(a)
            for g in range(2):
                part.send(g, a[:4][g::2])
            steps = [part.receive(g) for g in range(2)]
            for column, g in ((c, g) for c in range(len(expected)) for g in range(2)):
                np.testing.assert_array_equal(steps[g][column], expected[column][:4][g::2])
        after, waited = whole.step(actions[5]), part.step(actions[5])
        np.testing.assert_array_equal(waited.obs[:4], after.obs[:4])
        np.testing.assert_array_equal(waited.obs[4:], fresh.step(actions[5]).obs[4:])
        assert not np.array_equal(waited.obs[4:], after.obs[4:])
        np.testing.assert_array_equal(part.reset(np.arange(4)), fresh.reset(np.arange(8))[:4])
        with pytest.raises(ConfigError, match="whole workers of every group: give a multiple of 4"):
            part.reset(np.arange(2))
        with pytest.raises(ConfigError, match=r"actions=\(1,\): give one action per environment of the group's first "
                                              r"workers \(2 each, 4 in all\)"):
            part.send(0, np.zeros(1, np.int64))


def test_boosting_steps_a_prefix_of_the_workers_each_round() -> None:
    """PPO boosted at random on a ladder of 4 and 8 host environments in 8 worker
    processes: each round steps its rung's first workers (``env_workers``, the rung's
    share) and counts the steps it took, the pool made once for the top rung. Fixed at
    the bottom rung, the program's last observations of the other 4 are still their
    first ones, and those 4 environments, stepped whole afterwards, go on from their
    resets: no round stepped them."""
    from jaxrl_frag.transforms.boost import Boosted

    recipe = jf.recipes.PPO.create(CARTPOLE, num_envs=8, env_workers=8, num_steps=16, num_minibatches=2,
                                   total_steps=8 * 16 * 8)
    boosted = Boosted.create(recipe, strategy="random", ladder=(4, 8), minibatches="size")
    assert [env.num_envs for env in boosted.rung_envs] == [4, 8] and boosted.rung_envs[1] is recipe.env
    assert [env.workers for env in boosted.rung_envs] == [4, 8]
    history = jf.compile(boosted, chunk_iterations=1).run(jax.random.PRNGKey(3))  # a row a round
    actors, workers = history["actors"], history["env_workers"]
    assert set(actors) == {4, 8} and (workers == actors).all()  # one environment a worker
    np.testing.assert_array_equal(np.diff(history["env_steps"], prepend=0), actors * 16)
    assert history.final["episode_count"] > 0

    bottom = Boosted.create(recipe, strategy="fixed", fixed_actors=4, ladder=(4, 8), minibatches="size")
    first = np.asarray(jax.jit(bottom.init)(jax.random.PRNGKey(3)).pool.obs)  # the run's init resets alike
    last = np.asarray(jf.compile(bottom, chunk_iterations=2).run(jax.random.PRNGKey(3)).state.pool.obs)
    np.testing.assert_array_equal(last[4:], first[4:])
    assert not np.array_equal(last[:4], first[:4])
    stepped = recipe.env.pool().step(np.zeros(8, np.int64)).obs
    cartpole = gymnasium.make("CartPole-v1").unwrapped  # its state is its observation
    cartpole.reset()
    for i in range(4, 8):
        cartpole.state = first[i].astype(np.float64)
        np.testing.assert_allclose(stepped[i], cartpole.step(0)[0], rtol=1e-6)
    recipe.env.close()


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_naming_its_environments(tmp_path: Path) -> None:
    """SIGKILL one of four workers mid-run: the CLI exits with status 4 within seconds,
    naming the worker's environments, without a traceback; the other workers are gone,
    and the checkpoints written before are kept."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "jaxrl_frag", "train", "ppo", "--env", CARTPOLE, "--num-envs", "8",
                             "--env-workers", "4", "--num-steps", "16", "--total-steps", "1e7", "--chunk-iterations",
                             "4", "--checkpoint-every", "4", "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(run_dir / "checkpoints" / "8", proc, 240)
        workers = workers_of(proc.pid)
        assert len(workers) == 4
        os.kill(workers[1], signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - killed < 20
    finally:
        proc.kill()
    assert proc.returncode == 4, err
    assert "environment worker 1 (environments 4, 6 of gymnasium:CartPole-v1) died (exit code -9)" in err, err
    assert "Traceback" not in err and "resume with jaxrl-frag resume" in err
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists()
    assert (run_dir / "checkpoints" / "8").exists()


def test_a_host_environment_run_is_evaluated_on_fresh_environments(tmp_path: Path) -> None:
    """``jaxrl-frag evaluate`` of a run on Gymnasium's CartPole plays complete episodes of
    the run's policy on fresh host environments, inside one compiled program: each
    episode's return is its length (a reward of 1 a step), at most the time limit of
    500, and the same seed plays the same episodes."""
    from jaxrl_frag.app import evaluation
    from jaxrl_frag.app.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", "ppo", "--env", CARTPOLE, "--num-envs", "8", "--num-steps", "16", "--total-steps", "512",
                 "--chunk-iterations", "2", "--run-dir", str(run_dir)]) == 0
    assert main(["evaluate", str(run_dir), "--episodes", "6"]) == 0
    with open(run_dir / "eval.csv") as f:
        rows = list(csv.DictReader(f))
    returns = np.array([float(r["return"]) for r in rows])
    np.testing.assert_array_equal(returns, [int(r["length"]) for r in rows])
    assert len(rows) == 6 and (returns >= 8).all() and (returns <= 500).all()
    again = evaluation.evaluate(evaluation.restore(run_dir), 6)
    np.testing.assert_array_equal(again.returns, returns)


@pytest.mark.learning
@pytest.mark.long
def test_ppo_learns_gymnasium_cartpole() -> None:
    """The recipe's CartPole settings but for 8 environments of 64 steps (the batch and
    update count of its 4 of 128), in 2 workers and 2 ring groups."""
    algo = jf.recipes.PPO.create(CARTPOLE, num_envs=8, num_steps=64, total_steps=500_000)
    history = jf.compile(algo).run(jax.random.PRNGKey(0))
    assert history.last("episode_return") >= 475


@pytest.mark.learning
@pytest.mark.long
def test_ppo_improves_on_an_atari_game() -> None:
    """KungFuMaster with the standard preprocessing and Mnih et al.'s network: a uniformly
    random policy scores 401 +- 33 (100 games, ``benchmarks/HISTORY.md``); after 40,960
    steps PPO's games of the last quarter score at least 1000 on average. Two epochs per
    iteration, half of CleanRL's four, halve the learner's time; seeds 0 and 1 measured
    1786 and 1460 with them."""
    algo = jf.recipes.PPO.create("ale:KungFuMaster", num_envs=8, num_steps=128, total_steps=40_960, clip_eps=0.1,
                                 num_epochs=2)
    assert algo.network_torso == "atari"
    history = jf.compile(algo, chunk_iterations=2).run(jax.random.PRNGKey(0))
    last = history.rows[-len(history.rows) // 4:]
    games = sum(row["episode_count"] for row in last)
    score = sum(row["episode_return"] * row["episode_count"] for row in last if row["episode_count"]) / games
    assert games >= 5 and score >= 1000, (games, score)
