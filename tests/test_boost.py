"""Adaptive actor boosting: the curvature and noise probes against exact values, rung
switches that keep every environment's state, a forced rung equal to the fixed run,
the rungs' steps and minibatches (the batch kept, the minibatch size or the count) and
the ladders refused, the controller's rule, budgets that end the run, and the
controller in checkpoints."""

from __future__ import annotations

import csv
import itertools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import jaxrl_frag as jf
from jaxrl_frag.app.cli import main
from jaxrl_frag.checkpoints import Checkpoints
from jaxrl_frag.errors import ConfigError
from jaxrl_frag.recipes import IMPALA, PPO
from jaxrl_frag.transforms import boost, curvature

LADDER = (2, 4, 8)
SMALL = dict(num_steps=16, hidden=(16,), num_minibatches=2, num_epochs=2, lr=1e-3)


def small_ppo(**overrides: object) -> PPO:
    return PPO.create("CartPole-v1", **{**SMALL, "num_envs": LADDER[-1], "total_steps": 2048, **overrides})


def leaves_equal(a: object, b: object) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_lanczos_finds_the_extreme_eigenvalues_of_a_dense_hessian() -> None:
    """On a small tanh network's squared error (40 parameters, an indefinite Hessian),
    20 Lanczos steps give lambda_min and lambda_max to 1e-4 of the spectral radius, and
    the Hessian-vector product equals the dense Hessian's."""
    x = jax.random.normal(jax.random.PRNGKey(0), (32, 3))
    y = jnp.sin(x.sum(axis=1))
    params = {"w1": jax.random.normal(jax.random.PRNGKey(1), (3, 8)), "b1": jnp.zeros(8),
              "w2": jax.random.normal(jax.random.PRNGKey(2), (8,))}

    def loss(p: dict[str, jax.Array]) -> jax.Array:
        return jnp.mean((jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] - y) ** 2)

    flat, unravel = ravel_pytree(params)
    hessian = jax.hessian(lambda f: loss(unravel(f)))(flat)
    exact = np.linalg.eigvalsh(np.asarray(hessian, np.float64))
    assert exact[0] < -0.1 * exact[-1]  # indefinite: both extremes matter
    radius = np.abs(exact).max()
    low, high = jax.jit(curvature.extreme_eigenvalues, static_argnums=(0, 3))(loss, params, jax.random.PRNGKey(3), 20)
    assert abs(float(low) - exact[0]) <= 1e-4 * radius
    assert abs(float(high) - exact[-1]) <= 1e-4 * radius
    v = jax.random.normal(jax.random.PRNGKey(4), flat.shape)
    product = ravel_pytree(curvature.hessian_vector_product(loss, params, unravel(v)))[0]
    np.testing.assert_allclose(product, hessian @ v, rtol=1e-4, atol=1e-5)


def test_gradient_noise_terms_are_unbiased() -> None:
    """Minibatch gradients of per-sample gradients ``G + noise`` (covariance Sigma): over
    4000 draws the estimates average to ``|G|^2`` and ``tr Sigma`` within 4 standard errors."""
    true_grad = jnp.array([0.5, -1.0, 0.25, 0.0, 2.0])
    scale = jnp.array([1.0, 2.0, 0.5, 3.0, 1.5])  # Sigma = diag(scale**2)
    batch, count = 8, 4

    def draw(key: jax.Array) -> tuple[jax.Array, jax.Array]:
        samples = true_grad + scale * jax.random.normal(key, (count, batch, 5))
        return curvature.gradient_noise({"g": samples.mean(axis=1)}, batch)

    norms, traces = jax.vmap(draw)(jax.random.split(jax.random.PRNGKey(0), 4000))
    for estimates, expected in ((norms, float(true_grad @ true_grad)), (traces, float(scale @ scale))):
        error = abs(float(estimates.mean()) - expected)
        assert error <= 4 * float(estimates.std()) / np.sqrt(len(estimates)), (float(estimates.mean()), expected)


@pytest.mark.slow  # two programs each, fully optimised
@pytest.mark.users_compilation
@pytest.mark.parametrize(("minibatches", "steps", "count"), [("batch", 8, 2), ("size", 16, 4), ("count", 16, 2)])
def test_a_run_forced_to_one_rung_equals_the_fixed_run(minibatches: str, steps: int, count: int) -> None:
    """``fixed`` at 4 of (2, 4, 8) environments, against plain PPO with 4 environments, the
    rung's steps and minibatch count (``batch``: 8 steps, half the bottom rung's 16, in
    the given 2 minibatches, so that a round is the bottom rung's 32 samples; ``size``:
    16 steps in 4 minibatches, twice the bottom rung's 2, so that a minibatch is the
    bottom rung's 16 samples; ``count``: 16 steps in the given 2) and the same budget:
    the same rows, parameters, environments and observations, bitwise; the pool's other
    environments untouched since the start."""
    budget = 4 * 16 * 6
    plain = small_ppo(num_envs=4, num_steps=steps, num_minibatches=count, total_steps=budget, anneal_lr=False)
    boosted = boost.Boosted.create(small_ppo(anneal_lr=False), strategy="fixed", fixed_actors=4, ladder=LADDER,
                                   budget_steps=budget, minibatches=minibatches)
    rung = boosted.rung(1, plain.lr)
    assert (rung.num_steps, rung.num_minibatches) == (steps, count)
    key = jax.random.PRNGKey(5)
    fixed = jf.compile(plain, chunk_iterations=1).run(key)
    program = jf.compile(boosted)
    run = program.run(key)
    assert run.iteration == fixed.iteration == budget // (4 * steps) and run.final["env_steps"] == budget
    for name in fixed.rows[0]:
        if name != "sps":
            np.testing.assert_array_equal(run[name], fixed[name], err_msg=name)
    np.testing.assert_array_equal(run["actors"], 4)
    pool, start = run.state.pool, program.init(key).pool
    assert leaves_equal(pool.params, fixed.state.params)
    assert leaves_equal(pool.key, fixed.state.key)
    assert leaves_equal(jax.tree.map(lambda x: x[:4], (pool.env_state, pool.obs)),
                        (fixed.state.env_state, fixed.state.obs))
    assert leaves_equal(jax.tree.map(lambda x: x[4:], (pool.env_state, pool.obs)),
                        jax.tree.map(lambda x: x[4:], (start.env_state, start.obs)))


def test_rungs_keep_the_batch_the_minibatch_size_or_the_count() -> None:
    """On (4, 8, 16) environments from 16 steps in 2 minibatches: under ``batch`` rung
    ``n`` steps ``16 * 4 / n`` times, every round 64 samples in 2 minibatches of 32; under
    ``size`` rung ``n`` takes ``2 * n / 4`` minibatches, all of 32 samples (the probe's
    bottom rung keeps 2); under ``count`` every rung takes 2. Every way the configuration
    keeps the given steps and count, and rebuilt from it (as a resumed run is) gives the
    same rungs."""
    recipe = small_ppo(num_envs=16)
    for minibatches, steps, counts, sizes in (("batch", (16, 8, 4), (2, 2, 2), (32, 32, 32)),
                                              ("size", (16, 16, 16), (2, 4, 8), (32, 32, 32)),
                                              ("count", (16, 16, 16), (2, 2, 2), (32, 64, 128))):
        boosted = boost.Boosted.create(recipe, ladder=(4, 8, 16), minibatches=minibatches)
        rungs = [boosted.rung(i, recipe.lr) for i in range(3)]
        assert tuple(r.num_steps for r in rungs) == boosted.rung_steps == steps
        assert boosted.round_steps == tuple(n * length for n, length in zip((4, 8, 16), steps, strict=True))
        assert tuple(r.num_minibatches for r in rungs) == boosted.rung_minibatches == counts
        assert tuple(r.num_envs * r.num_steps // r.num_minibatches for r in rungs) == sizes
        config = boosted.config()
        assert boosted.recipe.num_minibatches == config["num_minibatches"] == 2
        assert boosted.recipe.num_steps == config["num_steps"] == 16
        assert config["minibatches"] == minibatches
        saved = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(json.dumps(config)).items()}
        rebuilt = boost.Boosted.create(PPO.create(config["env"], **{k: saved[k] for k in PPO.fields()}),
                                       **{k: saved[k] for k in boost.Boosted.defaults()})
        assert (rebuilt.rung_steps, rebuilt.rung_minibatches) == (steps, counts) and rebuilt.config() == config


def test_a_ladder_whose_rungs_do_not_fit_is_refused_before_tracing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    """Under ``batch`` (the default), a rung whose steps ``num_steps * ladder[0] / n`` are
    not whole; under ``size``, a rung whose count ``num_minibatches * n / ladder[0]`` is
    not whole; and a rung whose recipe refuses its count (IMPALA's must divide the rung's
    environments) are refused by name with the fix, before anything is traced; from the
    command line with exit status 2."""
    one = small_ppo(num_envs=6, num_minibatches=1)
    impala = IMPALA.create("CartPole-v1", num_envs=8, num_steps=16, num_minibatches=4, hidden=(16,))

    def traced(*args: object, **kwargs: object) -> None:
        raise AssertionError("traced before the configuration was validated")

    with monkeypatch.context() as patch:
        for name in ("eval_shape", "make_jaxpr", "jit"):
            patch.setattr(jax, name, traced)
        with pytest.raises(ConfigError, match=re.escape("steps each num_steps * ladder[0] / 6 = 16 * 4 / 6 times")) as error:
            boost.Boosted.create(one, ladder=(4, 6))
        assert error.value.field == "boost_ladder" and error.value.value == "4,6"
        assert "make every rung divide 64, or give --boost-minibatches size" in error.value.fix
        with pytest.raises(ConfigError, match=re.escape("takes num_minibatches * 6 / ladder[0] = 1 * 6 / 4")) as error:
            boost.Boosted.create(one, ladder=(4, 6), minibatches="size")
        assert error.value.field == "boost_ladder" and error.value.value == "4,6"
        assert "multiple of 4, or --num-minibatches a multiple of 2, or give --boost-minibatches count" in error.value.fix
        with pytest.raises(ConfigError, match="num_minibatches=4: must divide num_envs = 2") as error:
            boost.Boosted.create(impala, ladder=(2, 4, 8))
        assert error.value.field == "boost_ladder" and error.value.value == 2
        with pytest.raises(ConfigError, match=r"choose batch .*, size .* or count") as error:
            boost.Boosted.create(one, ladder=(4, 6), minibatches="sizes")
        assert error.value.field == "boost_minibatches"
    assert boost.Boosted.create(one, ladder=(4, 6), minibatches="count").rung_minibatches == (1, 1)
    status = main(["train", "ppo", "--env", "CartPole-v1", "--boost", "nitro", "--boost-ladder", "4,6",
                   "--num-minibatches", "1", "--num-steps", "16", "--run-dir", str(tmp_path / "run")])
    assert status == 2
    assert "boost_ladder='4,6': under --boost-minibatches batch" in capsys.readouterr().err


@pytest.mark.slow  # every rung's round compiled: make test runs it, make test-fast the controller's unit tests
def test_switching_rungs_keeps_every_environments_state() -> None:
    """Random rungs, round by round: the environments a round does not use keep their
    state exactly; those it uses continue as the rung's own recipe continues them."""
    boosted = boost.Boosted.create(small_ppo(anneal_lr=False), strategy="random", ladder=LADDER, budget_steps=10**6)
    step = jax.jit(boosted.step)
    state = boosted.init(jax.random.PRNGKey(0))
    # near the end of the budget the floor is down to the bottom rung: every rung is likely
    state = state.replace(controller=state.controller.replace(env_steps=jnp.int32(10**6 - 2000)))
    rounds = {count: jax.jit(boosted.rung(i, boosted.recipe.lr).round) for i, count in enumerate(LADDER)}
    seen = []
    for _ in range(10):
        after, metrics = step(state)
        count = int(metrics["actors"])
        seen.append(count)
        expected, _, _ = rounds[count](boosted.take(state.pool, count))
        envs = (after.pool.env_state, after.pool.obs)
        assert leaves_equal(jax.tree.map(lambda x, c=count: x[c:], envs),
                            jax.tree.map(lambda x, c=count: x[c:], (state.pool.env_state, state.pool.obs)))
        assert leaves_equal(jax.tree.map(lambda x, c=count: x[:c], envs), (expected.env_state, expected.obs))
        assert leaves_equal(after.pool.params, expected.params)
        state = after
    assert len(set(seen)) == len(LADDER) and any(a > b for a, b in itertools.pairwise(seen)), seen


def test_the_controller_follows_nitros_rule() -> None:
    """boost_t from the window's minimum and maximum, the floor at half the budget, the
    nearest rung, and the budget's last rounds at the largest rung that fits."""
    boosted = boost.Boosted.create(PPO.create("CartPole-v1", num_envs=64, num_steps=10), ladder=(8, 16, 32, 64),
                                   budget_steps=10_000, minibatches="size")
    ratios = jnp.array([1.0, 3.0, 2.0, 5.0, 4.0, 0.0])
    c = boosted.init(jax.random.PRNGKey(0)).controller.replace(ratios=ratios, seen=jnp.int32(6),
                                                                env_steps=jnp.int32(5_000))
    floor = 64 * (8 / 64) ** 0.5  # 22.6 at half the budget
    for newest, expected_boost, rung in ((4.5, 0.875, 64), (0.5, 0.0, 16), (3.0, 0.5, 32)):
        at = c.replace(ratios=ratios.at[-1].set(newest))
        b, f = boosted.boost(at, jax.random.PRNGKey(1))
        assert float(b) == pytest.approx(expected_boost) and float(f) == pytest.approx(floor, rel=1e-5)
        assert boosted.ladder[int(boosted.choose(at, b, f))] == rung
    first = boosted.init(jax.random.PRNGKey(0)).controller
    assert boosted.ladder[int(boosted.choose(first, *boosted.boost(first, jax.random.PRNGKey(1))))] == 64
    nearly_spent = c.replace(ratios=ratios.at[-1].set(4.5), env_steps=jnp.int32(10_000 - 250))
    assert boosted.ladder[int(boosted.choose(nearly_spent, jnp.float32(1.0), jnp.float32(8.0)))] == 16
    spent = c.replace(env_steps=jnp.int32(10_000 - 70))
    assert int(boosted.choose(spent, jnp.float32(1.0), jnp.float32(8.0))) == len(boosted.ladder)
    assert bool(boosted.finished(boost.BoostState(None, spent)))


@pytest.fixture(scope="module")
def nitro_program() -> jf.Program:
    """Nitro on (2, 4, 8) environments under a cost budget that binds before the steps'."""
    seconds = np.array([[1.0, 1.0, 0.5], [2.0, 2.0, 0.5], [4.0, 4.0, 0.5]])
    boosted = boost.Boosted.create(small_ppo(), strategy="nitro", ladder=LADDER, budget_steps=10**6,
                                   round_seconds=seconds, budget_cost=60.0, actor_price=1.0, learner_price=2.0)
    return jf.compile(boosted)


def test_a_cost_budget_ends_the_run(nitro_program: jf.Program) -> None:
    """Rounds cost ``actor_price * actor + learner_price * (learner + probe)`` seconds at
    their rung, each the bottom rung's 2 * 16 environment steps; the run stops when no
    rung fits, its rows one per round."""
    history = nitro_program.run(jax.random.PRNGKey(1))
    cost = {2: 4.0, 4: 7.0, 8: 13.0}
    actors = history["actors"].astype(int)
    assert set(actors) <= set(LADDER) and len(set(actors)) > 1
    spent = np.cumsum([cost[a] for a in actors])
    np.testing.assert_allclose(history["cost_total"], spent, rtol=1e-6)
    assert spent[-1] <= 60.0 < spent[-1] + cost[2]
    assert history.iteration == len(actors) < nitro_program.algorithm.num_iterations
    np.testing.assert_array_equal(history["env_steps"], np.arange(1, len(actors) + 1) * 32)
    assert np.isfinite(history["lambda_min"]).all() and (history["lambda_max"] > 0).all()


def test_the_controller_resumes_exactly_from_a_checkpoint(nitro_program: jf.Program, tmp_path: object) -> None:
    """Stopped at round 4 and restored from its orbax checkpoint, a nitro run continues
    bitwise as the uninterrupted one: rungs chosen, rows and the whole state."""
    key = jax.random.PRNGKey(2)
    whole = nitro_program.run(key, 8)
    checkpoints = Checkpoints(tmp_path, every=4, keep=2)
    try:
        nitro_program.run(key, 4, checkpoints=checkpoints)
    finally:
        checkpoints.close()
    restored = nitro_program.restore(tmp_path)
    assert restored.iteration == 4 and int(restored.state.controller.rounds) == 4
    rest = nitro_program.run(restored, 8)
    np.testing.assert_array_equal(rest["actors"], whole["actors"][4:])
    np.testing.assert_array_equal(rest["episode_return"], whole["episode_return"][4:])
    np.testing.assert_array_equal(rest["env_steps"], whole["env_steps"][4:])
    assert leaves_equal(rest.state, whole.state)


@pytest.mark.slow  # a long run for the inner loop: calibration times every rung's programs
def test_cli_boosted_run_writes_the_actor_counts(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    """A calibrated gns run: one row per round with its actor count, within the budget;
    resuming it keeps its calibration and finds it complete."""
    run_dir = tmp_path / "run"
    status = main(["train", "ppo", "--env", "CartPole-v1", "--boost", "gns", "--boost-ladder", "2,4,8",
                   "--budget-steps", "1200", "--num-steps", "16", "--hidden", "16", "--num-minibatches", "2",
                   "--boost-calibrate", "--run-dir", str(run_dir)])
    assert status == 0
    assert "ms probing" in capsys.readouterr().out
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    actors = [int(float(r["actors"])) for r in rows]
    assert set(actors) <= set(LADDER)
    assert [float(r["env_steps"]) for r in rows] == list(np.arange(1, len(rows) + 1) * 2 * 16.0)  # the bottom's batch
    assert 1200 - 2 * 16 < float(rows[-1]["env_steps"]) <= 1200
    config = json.loads((run_dir / "config.json").read_text())
    assert config["strategy"] == "gns" and config["ladder"] == list(LADDER) and config["chunk_iterations"] == 1
    assert config["minibatches"] == "batch" and config["num_minibatches"] == 2  # the bottom rung's, as given
    seconds = np.array(config["round_seconds"])
    assert seconds.shape == (3, 3) and (seconds > 0).all()
    np.testing.assert_allclose([float(rows[-1]["device_seconds_total"])],
                               [sum(seconds[LADDER.index(a)].sum() for a in actors)], rtol=1e-4)
    assert (run_dir / "learning_curve.png").stat().st_size > 0
    assert main(["resume", str(run_dir)]) == 0
    assert "complete: its budget is spent" in capsys.readouterr().out
