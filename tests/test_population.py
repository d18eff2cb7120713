"""Population: member i of one compiled population equals its solo run; a member that goes
non-finite is frozen and reported while the others train on."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
import pytest
from poisoned_env import PoisonedRewards

import jaxrl_frag as jf
from jaxrl_frag import ConfigError, envs, sharding
from jaxrl_frag.errors import NonFiniteError
from jaxrl_frag.transforms import Population, boost

SMALL = dict(num_envs=8, num_steps=32, total_steps=8 * 32 * 4)  # 4 iterations
LRS, SEEDS, ENT = (1e-4, 3e-4, 1e-3, 2.5e-4), (0, 1, 2, 3), (0.0, 0.01, 0.02, 0.0)


def member(i: int) -> jf.recipes.PPO:
    return jf.recipes.PPO.create("CartPole-v1", lr=LRS[i], ent_coef=ENT[i], **SMALL)


@pytest.fixture(scope="module")
def solo_params() -> list[list[np.ndarray]]:
    runs = [jf.compile(member(i), chunk_iterations=2).run(jax.random.PRNGKey(SEEDS[i])) for i in range(4)]
    return [[np.asarray(x) for x in jax.tree.leaves(run.state.params)] for run in runs]


@pytest.mark.parametrize("policy", [sharding.PopulationParallel(pop=4),
                                    sharding.PopulationParallel(pop=2, data=2, shuffle="exact")], ids=["pop4", "pop2xdata2"])
def test_member_equals_its_solo_run(policy: sharding.PopulationParallel, solo_params) -> None:
    population = Population.of([member(i) for i in range(4)], SEEDS)
    history = jf.compile(population, policy, chunk_iterations=2).run(jax.random.PRNGKey(0))
    leaves = [np.asarray(x) for x in jax.tree.leaves(history.state.params)]
    assert jax.tree.leaves(history.state.obs)[0].sharding.spec[0] == "pop"
    for i in range(4):
        for pop_leaf, solo_leaf in zip(leaves, solo_params[i], strict=True):
            np.testing.assert_allclose(pop_leaf[i], solo_leaf, rtol=1e-5, atol=1e-6)
    assert history["episode_return"].shape == (2, 4)  # rows x members


def test_sweeping_a_static_field_is_refused() -> None:
    a = jf.recipes.PPO.create("CartPole-v1", num_envs=4)
    b = jf.recipes.PPO.create("CartPole-v1", num_envs=8)
    with pytest.raises(ConfigError) as err:
        Population.of([a, b], [0, 1])
    assert err.value.field == "num_envs" and "static field" in str(err.value) and "separate runs" in str(err.value)


def test_grid_and_random_search_settings() -> None:
    from jaxrl_frag.app import sweeps

    grid = sweeps.settings(["lr=1e-4,3e-4,1e-3", "ent_coef=0,0.01"])
    assert len(grid) == 6 and {"lr": 1e-3, "ent_coef": 0.01} in grid
    drawn = sweeps.settings(["lr=loguniform:1e-5:1e-2", "gamma=0.9,0.99"], samples=32, seed=1)
    assert len(drawn) == 32 and drawn == sweeps.settings(["lr=loguniform:1e-5:1e-2", "gamma=0.9,0.99"], 32, 1)
    lrs = np.array([s["lr"] for s in drawn])
    assert lrs.min() >= 1e-5 and lrs.max() <= 1e-2 and lrs.min() < 1e-4 < lrs.max()  # spread over decades
    assert {s["gamma"] for s in drawn} == {0.9, 0.99}


def test_interval_statistics() -> None:
    from jaxrl_frag.app.summary import bootstrap_ci, iqm

    assert iqm(np.array([0.0, 1, 2, 3, 4, 5, 6, 100])) == 3.5  # the middle half: 2, 3, 4, 5
    values = np.random.default_rng(0).normal(10.0, 1.0, size=400)
    low, high = bootstrap_ci(values)
    assert low < 10.0 < high and high - low < 0.3


POISONED = dict(num_envs=4, num_steps=8, total_steps=4 * 8 * 6)  # 6 iterations
# of seeds 0..7 only seed 2 draws below the rate in one of its 4 environments: its rewards turn NaN at step 16,
# in its 3rd iteration
envs.register("PoisonedSeedCartPole-v1",
              lambda: PoisonedRewards(envs.GymnaxEnv.make("CartPole-v1"), after=16, rate=0.02))
BAD = 2


class Poisoned(NamedTuple):
    solo: jf.Program
    population: Population
    program: jf.Program
    history: jf.History


@pytest.fixture(scope="module")
def poisoned() -> Poisoned:
    """Seeds 0..7 of PPO on PoisonedSeedCartPole-v1, solo and as one population, and the population's run."""
    algo = jf.recipes.PPO.create("PoisonedSeedCartPole-v1", **POISONED)
    population = Population.of([algo] * 8, range(8))
    program = jf.compile(population, chunk_iterations=2)
    return Poisoned(jf.compile(algo, chunk_iterations=2), population, program, program.run(jax.random.PRNGKey(0)))


def _assert_close(a: Any, b: Any) -> None:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f":
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(a, b)


def test_a_failed_member_is_frozen_and_the_others_equal_their_solo_runs(poisoned: Poisoned) -> None:
    [failure] = poisoned.population.failures(poisoned.history.rows)
    assert (failure.member, failure.seed, failure.setting, failure.iteration) == (BAD, BAD, {}, 3)
    assert str(failure) == "member 2 (seed 2) went non-finite at iteration 3"
    with pytest.raises(NonFiniteError) as error:
        poisoned.solo.run(jax.random.PRNGKey(BAD))
    assert error.value.iteration == 3
    assert poisoned.history.iteration == 6
    for i in range(8):  # the failed member holds the state its solo run had before it failed
        solo = poisoned.solo.run(jax.random.PRNGKey(i), iterations=2 if i == BAD else None)
        for pop_leaf, solo_leaf in zip(jax.tree.leaves(poisoned.history.state), jax.tree.leaves(solo.state), strict=True):
            _assert_close(np.asarray(pop_leaf)[i], solo_leaf)
    loss = poisoned.history["loss"]
    assert np.isnan(loss[1:, BAD]).all() and np.isfinite(np.delete(loss, BAD, axis=1)).all()
    assert poisoned.history["failed_count"][:, BAD].tolist() == [0, 2, 2]  # iterations 3 and 4, 5 and 6


def test_the_freeze_leaves_the_other_members_bitwise_as_if_it_were_healthy(poisoned: Poisoned) -> None:
    start = poisoned.program.init(jax.random.PRNGKey(0))
    [flag] = [x for x in jax.tree.leaves(start.env_state) if x.dtype == bool]  # which environments are poisoned
    assert np.asarray(flag).any(axis=1).nonzero()[0].tolist() == [BAD]
    healed = poisoned.program.run(jax.tree.map(lambda x: x & False if x.dtype == bool else x, start))
    assert poisoned.population.failures(healed.rows) == []
    for a, b in zip(jax.tree.leaves(poisoned.history.state), jax.tree.leaves(healed.state), strict=True):
        np.testing.assert_array_equal(np.delete(np.asarray(a), BAD, axis=0), np.delete(np.asarray(b), BAD, axis=0))


def test_the_run_stops_once_every_member_has_failed(poisoned: Poisoned) -> None:
    start = poisoned.program.init(jax.random.PRNGKey(0))
    every_one_bad = jax.tree.map(lambda x: x[np.full(8, BAD)], start)
    with pytest.raises(NonFiniteError) as error:
        poisoned.program.run(every_one_bad)
    assert error.value.iteration == 3 and error.value.fragment == "actor.rollout"


def test_cli_reports_the_failed_member_and_trains_the_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jaxrl_frag.app.cli import main

    run_dir = tmp_path / "run"
    status = main(["train", "ppo", "--env", "PoisonedSeedCartPole-v1", "--seeds", "8", "--num-envs", "4",
                   "--num-steps", "8", "--total-steps", str(POISONED["total_steps"]), "--chunk-iterations", "2",
                   "--run-dir", str(run_dir)])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "jaxrl-frag: warning: member 2 (seed 2) went non-finite at iteration 3; its state stays that of " \
           "iteration 2 and the other members train on" in err
    note = "- member 2 (seed 2) went non-finite at iteration 3: left out of the statistics above"
    assert note in out and note in (run_dir / "summary.md").read_text()
    with open(run_dir / "summary.csv", newline="") as f:
        [summary] = list(csv.DictReader(f))
    assert (summary["seeds"], summary["failed"]) == ("7", "1")
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row["member"] == str(BAD)]
    assert [(row["iteration"], float(row["failed_count"])) for row in rows] == [("2.0", 0), ("4.0", 2), ("6.0", 2)]
    assert [row["loss"] for row in rows[1:]] == ["nan", "nan"]


@dataclasses.dataclass(frozen=True)
class Forgetful(envs.Wrapper):
    """CartPole under an id of its own, whose state a checkpoint does not restore (as a host
    environment's): a resumed run starts its environments afresh."""

    name: str = "ForgetfulCartPole-v1"

    @property
    def capabilities(self) -> envs.Capabilities:
        return dataclasses.replace(super().capabilities, restorable=False)


envs.register(Forgetful.name, lambda: Forgetful(envs.GymnaxEnv.make("CartPole-v1")))


def test_a_transform_resumes_its_recipes_state_as_the_recipe_resumes_it() -> None:
    """A population resumes every member, and a boosted run its pool, as the recipe alone
    does: here, environments a checkpoint does not restore start afresh."""
    recipe = jf.recipes.PPO.create(Forgetful.name, **{**SMALL, "anneal_lr": False})
    assert not recipe.env.capabilities.restorable
    for algorithm in (Population.of([recipe, recipe.replace(lr=1e-3)], [0, 1]),
                      boost.Boosted.create(recipe, ladder=(4, 8), strategy="fixed", fixed_actors=4)):
        state = jax.jit(algorithm.init)(jax.random.PRNGKey(0))
        resumed = jax.jit(algorithm.resumed)(state)
        for member in range(getattr(algorithm, "size", 1)):
            (inner, before), (_, after) = algorithm.unwrap(state, member), algorithm.unwrap(resumed, member)
            expected = inner.resumed(before)
            assert not np.array_equal(expected.obs, before.obs)  # the environments started afresh
            for got, want in zip(jax.tree.leaves(after), jax.tree.leaves(expected), strict=True):
                np.testing.assert_array_equal(got, want, err_msg=type(algorithm).__name__)
