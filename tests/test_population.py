"""Population: member i of one compiled population equals its solo run."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxrl_frag as jf
from jaxrl_frag import ConfigError, sharding
from jaxrl_frag.transforms import Population

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
    from jaxrl_frag import sweeps

    grid = sweeps.settings(["lr=1e-4,3e-4,1e-3", "ent_coef=0,0.01"])
    assert len(grid) == 6 and {"lr": 1e-3, "ent_coef": 0.01} in grid
    drawn = sweeps.settings(["lr=loguniform:1e-5:1e-2", "gamma=0.9,0.99"], samples=32, seed=1)
    assert len(drawn) == 32 and drawn == sweeps.settings(["lr=loguniform:1e-5:1e-2", "gamma=0.9,0.99"], 32, 1)
    lrs = np.array([s["lr"] for s in drawn])
    assert lrs.min() >= 1e-5 and lrs.max() <= 1e-2 and lrs.min() < 1e-4 < lrs.max()  # spread over decades
    assert {s["gamma"] for s in drawn} == {0.9, 0.99}


def test_interval_statistics() -> None:
    from jaxrl_frag.summary import bootstrap_ci, iqm

    assert iqm(np.array([0.0, 1, 2, 3, 4, 5, 6, 100])) == 3.5  # the middle half: 2, 3, 4, 5
    values = np.random.default_rng(0).normal(10.0, 1.0, size=400)
    low, high = bootstrap_ci(values)
    assert low < 10.0 < high and high - low < 0.3
