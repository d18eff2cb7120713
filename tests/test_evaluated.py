"""Evaluation during training (``transforms.evaluated.Evaluated``, ``--eval-every``):
the training stream bitwise unchanged, each evaluation's numbers those of its policy,
rows without one NaN, under the single, data-parallel and population policies; the
command line's columns, curve and exact resume."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from saved_state import read_state

import jaxrl_frag as jf
from jaxrl_frag import sharding
from jaxrl_frag.app.cli import main
from jaxrl_frag.transforms import Population
from jaxrl_frag.transforms.evaluated import Evaluated, first, layout, play

EVERY, EPISODES, CHUNK = 3, 3, 2  # 6 iterations: rows at 2, 4, 6; evaluations after 3 and 6
EVAL = ("eval_count", "eval_return", "eval_length")


@pytest.fixture(scope="module")
def recipe() -> jf.recipes.PPO:
    return jf.recipes.PPO.create("CartPole-v1", num_envs=4, num_steps=16, total_steps=6 * 64, hidden=(16,))


@pytest.fixture(scope="module")
def plain(recipe: jf.recipes.PPO) -> jf.History:
    return jf.compile(recipe, chunk_iterations=CHUNK).run(jax.random.PRNGKey(0))


def _expected(evaluated: Evaluated, state: dict[str, Any]) -> tuple[float, float]:
    """The mean return and length of the last evaluation of a run ending in ``state``, played anew."""
    inner, schedule = evaluated.split(jax.device_get(state))
    key = jax.random.fold_in(schedule.key, schedule.iteration - 1)
    acting = evaluated.algorithm.acting(inner, True)
    returns, lengths, complete = jax.jit(
        lambda k: first(play(evaluated.env, acting, k, layout(EPISODES)[1]), EPISODES))(key)
    assert bool(complete.all())
    return float(returns.mean()), float(lengths.mean())


def _check_rows(history: jf.History, evaluated: Evaluated) -> None:
    """Rows 2 and 4 hold one evaluation each, row 1 none; the last is the final policy's."""
    np.testing.assert_array_equal(history["eval_count"], [0, EPISODES, EPISODES])
    assert np.isnan(history["eval_return"][0]) and np.isnan(history["eval_length"][0])
    assert (history["eval_return"][1:] >= 8).all()  # a complete CartPole episode
    np.testing.assert_allclose([history["eval_return"][-1], history["eval_length"][-1]],
                               _expected(evaluated, history.state))


@pytest.mark.slow  # two programs, fully optimised
@pytest.mark.users_compilation
def test_training_is_bitwise_unchanged_and_each_row_reports_its_evaluations(recipe: jf.recipes.PPO) -> None:
    # both programs compiled here, as a user's run is (the module's ``plain`` may have been compiled for another test)
    plain = jf.compile(recipe, chunk_iterations=CHUNK).run(jax.random.PRNGKey(0))
    evaluated = Evaluated.create(recipe, EVERY, EPISODES)
    history = jf.compile(evaluated, chunk_iterations=CHUNK).run(jax.random.PRNGKey(0))
    inner, schedule = evaluated.split(history.state)
    assert int(schedule.iteration) == 6
    assert jax.tree.all(jax.tree.map(lambda a, b: np.array_equal(a, b), inner, plain.state))
    for row, reference in zip(history.rows, plain.rows, strict=True):
        assert {k: v for k, v in row.items() if k not in (*EVAL, "sps")} == {
            k: v for k, v in reference.items() if k != "sps"}
    _check_rows(history, evaluated)


def test_data_parallel_evaluates_replicated(recipe: jf.recipes.PPO, plain: jf.History) -> None:
    """Over 4 devices (exact shuffling: the single-device run to float tolerance)."""
    evaluated = Evaluated.create(recipe, EVERY, EPISODES)
    policy = sharding.DataParallel(devices=4, shuffle="exact")
    history = jf.compile(evaluated, policy, chunk_iterations=CHUNK).run(jax.random.PRNGKey(0))
    np.testing.assert_allclose(history["loss"], plain["loss"], rtol=1e-4)
    _check_rows(history, evaluated)


def test_population_members_each_evaluate_their_own_policy(recipe: jf.recipes.PPO, plain: jf.History) -> None:
    """The cond is a select under vmap: both branches run, and the rows are still right."""
    members = [Evaluated.create(recipe, EVERY, EPISODES), Evaluated.create(recipe.replace(lr=1e-3), EVERY, EPISODES)]
    population = Population.of(members, [0, 1])
    history = jf.compile(population, chunk_iterations=CHUNK).run(jax.random.PRNGKey(0))
    np.testing.assert_allclose(history["loss"][:, 0], plain["loss"], rtol=1e-4)
    for i, member in enumerate(members):
        one = jf.History(rows=[{k: v[i] for k, v in row.items() if k in EVAL} for row in history.rows],
                         state=jax.tree.map(lambda x, i=i: x[i], history.state), iteration=6, stopped=False)
        _check_rows(one, member)


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k != "sps"} for row in csv.DictReader(f)]


def test_the_command_line_writes_eval_columns_and_resumes_exactly(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["train", "ppo", "--env", "CartPole-v1", "--num-envs", "4", "--num-steps", "16", "--total-steps",
                 "384", "--hidden", "16", "--chunk-iterations", "2", "--checkpoint-every", "2",
                 "--eval-every", "3", "--eval-episodes", "3", "--run-dir", str(run)]) == 0
    rows = _metrics(run)
    assert [row["eval_count"] for row in rows] == ["0.0", "3.0", "3.0"]
    assert rows[0]["eval_return"] == "nan" and float(rows[1]["eval_return"]) >= 8
    assert (run / "learning_curve.png").stat().st_size > 0
    assert jf.load_policy(run)(np.zeros(4, np.float32), jax.random.PRNGKey(0)).shape == ()
    # the run cut back to its checkpoint at iteration 2 and resumed is the same run
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    for step in ("4", "6"):
        shutil.rmtree(resumed / "checkpoints" / step)
    assert main(["resume", str(resumed)]) == 0
    assert _metrics(resumed) == rows
    final, reference = read_state(resumed / "checkpoints" / "6"), read_state(run / "checkpoints" / "6")
    assert jax.tree.all(jax.tree.map(lambda a, b: np.array_equal(a, b), final, reference))
    assert final["evaluation"]["iteration"] == 6
