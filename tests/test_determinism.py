"""Same seed and config: bitwise-identical parameters and metrics."""

from __future__ import annotations

import jax
import numpy as np

import jaxrl_frag as jf


def assert_same_run(a: jf.History, b: jf.History) -> None:
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert len(a.rows) == len(b.rows)
    for name in a.rows[0]:
        if name != "sps":  # wall-clock
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_same_seed_same_parameters_and_metrics(cartpole_program: jf.Program, cartpole_run: jf.History) -> None:
    assert_same_run(cartpole_run, cartpole_program.run(jax.random.PRNGKey(0)))


def test_separate_compilations_agree() -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", total_steps=8192)
    runs = [jf.compile(algo, chunk_iterations=4).run(jax.random.PRNGKey(7)) for _ in range(2)]
    assert_same_run(*runs)


def test_different_seeds_differ(cartpole_program: jf.Program) -> None:
    a = cartpole_program.init(jax.random.PRNGKey(0))
    b = cartpole_program.init(jax.random.PRNGKey(1))
    assert not np.array_equal(np.asarray(a.obs), np.asarray(b.obs))
