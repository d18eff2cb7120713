"""Replay buffers: uniform sampling is uniform, prioritized sampling follows the
priorities, importance weights are right, writes wrap around, and a buffer split
over devices behaves as one buffer."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from scipy import stats

from jaxrl_frag import primitives
from jaxrl_frag.collectives import audit
from jaxrl_frag.recipes import replay
from jaxrl_frag.sharding import DataParallel

ENVS = 4


def filled(steps: int, rows: int, window: int = 1, prioritized: bool = False) -> replay.Replay:
    """A buffer of ``rows`` rows after ``steps`` steps of ``ENVS`` environments; item
    ``(t, e)`` is tagged ``t * ENVS + e``."""
    tags = jnp.arange(steps * ENVS).reshape(steps, ENVS)
    buffer = replay.create({"tag": tags[0]}, rows, window, prioritized)
    for start in range(0, steps, rows):
        buffer = replay.add(buffer, {"tag": tags[start: start + rows]})
    return buffer


def draw(buffer: replay.Replay, count: int, beta: float = 0.0, policy: DataParallel | None = None,
         seed: int = 0) -> replay.Sample:
    rule = policy.lowering() if policy else primitives.Lowering()

    @functools.partial(jax.jit, static_argnums=2)
    def run(buffer: replay.Replay, key: jax.Array, count: int) -> replay.Sample:
        with primitives.lowering(rule):
            return replay.sample(buffer, key, count, beta)

    if policy:  # split the buffer over the devices along its environment axis, as a policy does
        buffer = jax.device_put(buffer, jax.tree.map(
            lambda x: NamedSharding(policy.mesh, PartitionSpec(*[None, "data"][: x.ndim])), buffer))
    return run(buffer, jax.random.PRNGKey(seed), count)


def test_writes_wrap_around_overwriting_the_oldest() -> None:
    buffer = filled(3, 5)
    buffer = replay.add(buffer, {"tag": jnp.arange(3 * ENVS, 7 * ENVS).reshape(4, ENVS)})
    np.testing.assert_array_equal(buffer.items["tag"][:, 0], [20, 24, 8, 12, 16])
    assert int(buffer.added) == 7 and int(buffer.size) == 5
    with pytest.raises(ValueError, match="5 rows"):
        replay.add(buffer, {"tag": jnp.zeros((6, ENVS), jnp.int32)})


def test_the_latest_rows_are_those_the_last_add_wrote_wrapped_around() -> None:
    buffer = replay.add(filled(3, 5), {"tag": jnp.arange(3 * ENVS, 7 * ENVS).reshape(4, ENVS)})  # rows 3, 4, 0, 1
    items, totals, largest = replay.latest(buffer, 4)
    np.testing.assert_array_equal(items["tag"], jnp.arange(3 * ENVS, 7 * ENVS).reshape(4, ENVS))
    assert totals == () and largest is None  # uniform: no priorities
    prioritized = filled(6, 8, prioritized=True)
    _, totals, largest = replay.latest(prioritized, 2)
    np.testing.assert_array_equal(totals[0], prioritized.tree[-1])
    assert float(largest) == float(prioritized.max_priority) == 1.0


def test_uniform_sampling_is_uniform_over_the_written_windows() -> None:
    # 9 steps in 6 rows: steps 3..8 held; windows of 2 start at steps 3..7
    buffer = filled(9, 6, window=2)
    drawn = draw(buffer, 40_000)
    tags = np.asarray(drawn.items["tag"])
    np.testing.assert_array_equal(tags[:, 1], tags[:, 0] + ENVS)  # the next step of the same environment
    counts = np.bincount(tags[:, 0], minlength=9 * ENVS)
    assert counts[: 3 * ENVS].sum() == 0 and counts[8 * ENVS:].sum() == 0
    assert stats.chisquare(counts[3 * ENVS: 8 * ENVS]).pvalue > 1e-3, counts
    np.testing.assert_array_equal(drawn.weight, 1.0)


def set_priorities(buffer: replay.Replay, priorities: np.ndarray, alpha: float) -> replay.Replay:
    """Priorities ``[steps, ENVS]`` for the items of the first ``steps`` rows."""
    steps = priorities.shape[0]
    rows, envs = np.meshgrid(np.arange(steps), np.arange(ENVS), indexing="ij")
    at = replay.Sample(None, jnp.asarray(rows.ravel()), jnp.asarray(envs.ravel()), None)
    return replay.update_priorities(buffer, at, jnp.asarray(priorities.ravel()), alpha)


PRIORITIES = np.array([[1.0, 2.0, 3.0, 0.5], [4.0, 10.0, 0.2, 1.0], [2.0, 2.0, 6.0, 3.0]])


@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_prioritized_sampling_follows_the_priorities(alpha: float) -> None:
    buffer = set_priorities(filled(3, 3, prioritized=True), PRIORITIES, alpha)  # 3 rows in a tree of 4
    drawn = draw(buffer, 60_000, beta=0.4)
    tags = np.asarray(drawn.items["tag"][:, 0])
    np.testing.assert_array_equal(tags, drawn.row * ENVS + drawn.env)
    scaled = PRIORITIES.ravel() ** alpha
    expected = scaled / scaled.sum()
    assert stats.chisquare(np.bincount(tags, minlength=12), expected * len(tags)).pvalue > 1e-3
    # w_i = (N P(i))^-beta / max_k (N P(k))^-beta
    want = (expected / expected.min()) ** -0.4
    np.testing.assert_allclose(drawn.weight, want[tags], rtol=1e-5)


def test_new_windows_enter_with_the_largest_priority_and_unfinished_ones_are_never_drawn() -> None:
    buffer = set_priorities(filled(3, 8, window=2, prioritized=True), PRIORITIES[:2], 1.0)
    assert float(buffer.max_priority) == 10.0
    leaves = np.asarray(buffer.tree[0])
    np.testing.assert_array_equal(leaves[2], 0.0)  # step 2's window (steps 2, 3) is not complete
    buffer = replay.add(buffer, {"tag": jnp.arange(3 * ENVS, 4 * ENVS)[None]})
    leaves = np.asarray(buffer.tree[0])
    np.testing.assert_array_equal(leaves[2], 10.0)
    np.testing.assert_array_equal(leaves[3], 0.0)
    np.testing.assert_allclose(buffer.tree[-1][0], leaves.sum(0))
    tags = np.asarray(draw(buffer, 4000).items["tag"])
    assert tags[:, 0].max() < 3 * ENVS  # no window starts at the newest step


def test_a_split_buffer_samples_uniformly_with_no_traffic() -> None:
    policy = DataParallel(4)
    buffer = filled(9, 6)
    drawn = draw(buffer, 40_000, policy=policy)
    counts = np.bincount(np.asarray(drawn.items["tag"][:, 0]), minlength=9 * ENVS)
    assert counts[: 3 * ENVS].sum() == 0
    assert stats.chisquare(counts[3 * ENVS:]).pvalue > 1e-3, counts
    # the same draw compiled: no collective moves items between devices
    with primitives.lowering(policy.lowering()):
        hlo = jax.jit(replay.sample, static_argnums=2).lower(buffer, jax.random.PRNGKey(0), 4000).compile().as_text()
    assert audit(hlo) == []


def test_a_split_buffer_samples_exactly_as_one_buffer_under_exact_sampling() -> None:
    buffer = set_priorities(filled(3, 3, prioritized=True), PRIORITIES, 0.6)
    one = draw(buffer, 64, beta=0.4)
    split = draw(buffer, 64, beta=0.4, policy=DataParallel(4, shuffle="exact"))
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(split), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_a_split_prioritized_buffer_weights_by_the_probabilities_it_samples_with() -> None:
    buffer = set_priorities(filled(3, 3, prioritized=True), PRIORITIES, 1.0)
    drawn = draw(buffer, 60_000, beta=1.0, policy=DataParallel(4))
    tags = np.asarray(drawn.items["tag"][:, 0])
    # each device holds one environment's column and draws a quarter of the batch from it
    probability = PRIORITIES / PRIORITIES.sum(axis=0) / ENVS
    assert stats.chisquare(np.bincount(tags, minlength=12), probability.ravel() * len(tags)).pvalue > 1e-3
    np.testing.assert_allclose(drawn.weight, (probability.ravel() / probability.min())[tags] ** -1.0, rtol=1e-5)
    # with beta = 1 the weights undo the sampling bias: a weighted mean is the mean over all items
    f = np.arange(12.0) ** 2
    weight = np.asarray(drawn.weight)
    assert (weight * f[tags]).sum() / weight.sum() == pytest.approx(f.mean(), rel=0.03)
