"""Same seed and config: bitwise-identical parameters and metrics."""

from __future__ import annotations

from pathlib import Path

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


def test_rows_do_not_depend_on_where_calls_end(tmp_path: Path) -> None:
    """Calls of one iteration, calls of the whole run, and a stop inside a chunk resumed
    from its checkpoint: the same rows (the last one partial) and parameters."""
    from jaxrl_frag.checkpoints import Checkpoints

    algo = jf.recipes.PPO.create("CartPole-v1", total_steps=8192)  # 16 iterations: rows at 5, 10, 15, 16
    short = jf.compile(algo, chunk_iterations=5, seconds_per_call=1e-9)  # one iteration a call
    long = jf.compile(algo, chunk_iterations=5, seconds_per_call=1e9)
    whole = long.run(jax.random.PRNGKey(3))
    assert [row["iteration"] for row in whole.rows] == [5, 10, 15, 16]
    assert_same_run(short.run(jax.random.PRNGKey(3)), whole)

    calls = iter(range(100))
    checkpoints = Checkpoints(tmp_path, every=None)
    first = short.run(jax.random.PRNGKey(3), checkpoints=checkpoints, stop=lambda: next(calls) == 6)
    assert first.stopped and first.iteration == 7 and len(first.rows) == 1  # inside the second chunk
    restored = long.restore(checkpoints)
    assert restored.meta["chunk"]["count"] == 2 and len(restored.meta["rows"]) == 1
    rest = long.run(restored, checkpoints=checkpoints)
    saved = long.restore(checkpoints).meta["rows"]  # every row, for metrics.csv to be rebuilt from
    checkpoints.close()
    assert [{k: v for k, v in row.items() if k != "sps"} for row in saved] == [
        {k: v for k, v in row.items() if k != "sps"} for row in whole.rows]
    joined = jf.History(first.rows + rest.rows, rest.state, rest.iteration)
    assert_same_run(joined, whole)
