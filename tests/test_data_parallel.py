"""DataParallel: equal to SingleDevice where it claims to be, learns where it does not,
and inserts only the communication it should."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxrl_frag as jf
from jaxrl_frag import ConfigError
from jaxrl_frag.collectives import totals
from jaxrl_frag.sharding import DataParallel, SingleDevice

SMALL = dict(num_envs=8, num_steps=32, total_steps=8 * 32 * 4)  # 4 iterations


def final_params(algo: jf.recipes.PPO, policy: jf.sharding.Policy) -> list[np.ndarray]:
    history = jf.compile(algo, policy, chunk_iterations=2).run(jax.random.PRNGKey(3))
    return [np.asarray(x) for x in jax.tree.leaves(history.state.params)]


def assert_close(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def single_reference() -> dict[int, list[np.ndarray]]:
    """SingleDevice parameters after 4 iterations, by minibatch count."""
    return {m: final_params(jf.recipes.PPO.create("CartPole-v1", num_minibatches=m, **SMALL), SingleDevice())
            for m in (1, 4)}


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_exact_shuffling_equals_single_device(devices: int, single_reference) -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", num_minibatches=4, **SMALL)
    assert_close(final_params(algo, DataParallel(devices, shuffle="exact")), single_reference[4])


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_local_shuffling_with_one_minibatch_equals_single_device(devices: int, single_reference) -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", num_minibatches=1, **SMALL)
    assert_close(final_params(algo, DataParallel(devices, shuffle="local")), single_reference[1])


def test_local_shuffling_with_several_minibatches_differs_from_single_device(single_reference) -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", num_minibatches=4, **SMALL)
    local = final_params(algo, DataParallel(4, shuffle="local"))
    assert max(float(np.abs(x - y).max()) for x, y in zip(local, single_reference[4], strict=True)) > 1e-4


@pytest.mark.learning
def test_local_shuffling_learns_cartpole() -> None:
    # the yardstick's settings over 4 devices, one environment each; same threshold as SingleDevice
    algo = jf.recipes.PPO.create("CartPole-v1", total_steps=500_000)
    history = jf.compile(algo, DataParallel(4), chunk_iterations=16).run(jax.random.PRNGKey(0))
    assert history.final["episode_return"] >= 475, history["episode_return"][-10:]


def test_state_is_split_along_data_and_parameters_replicated() -> None:
    algo = jf.recipes.PPO.create("Pendulum-v1", **SMALL)  # with observation normalisation
    state = jf.compile(algo, DataParallel(4), chunk_iterations=2).init(jax.random.PRNGKey(0))
    assert state.obs.sharding.spec == jax.sharding.PartitionSpec("data", None)
    assert state.obs.addressable_shards[0].data.shape == (2, 3)
    assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(state.params))
    moments = state.env_state.inner.moments  # running statistics of the whole batch
    assert moments.mean.sharding.is_fully_replicated


def gradient_bytes(algo: jf.recipes.PPO) -> int:
    params = jax.eval_shape(algo.init, jax.random.PRNGKey(0)).params
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))


def test_local_mode_all_reduces_gradients_once_per_update_and_moves_no_trajectory() -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", **SMALL)
    collectives = jf.compile(algo, DataParallel(4), chunk_iterations=2).explain().collectives
    assert set(totals(collectives)) == {"all-reduce"}
    updates = algo.num_epochs * algo.num_minibatches
    per_update = sum(c.nbytes for c in collectives if c.times == updates)
    ratio = per_update / gradient_bytes(algo)
    assert 1.0 <= ratio <= 1.0 + 4096 / gradient_bytes(algo), ratio
    # everything else is scalar statistics
    assert all(c.nbytes <= 64 for c in collectives if c.times != updates)


def test_exact_mode_moves_trajectory_samples_each_epoch() -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", **SMALL)
    collectives = jf.compile(algo, DataParallel(4, shuffle="exact"), chunk_iterations=2).explain().collectives
    per_epoch = sum(c.nbytes for c in collectives if c.times == algo.num_epochs)
    sample_bytes = algo.batch_size * (4 * 4 + 4 + 4 + 4 + 4 + 4)  # obs, action, log_prob, value, advantage, target
    assert per_epoch >= sample_bytes


def test_more_devices_than_exist_is_a_clear_error() -> None:
    with pytest.raises(ConfigError) as err:
        DataParallel(16)
    assert err.value.field == "devices" and "only 8" in str(err.value)


def test_environment_batch_must_divide_across_devices() -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", num_envs=6, num_steps=8, total_steps=48)
    with pytest.raises(ConfigError) as err:
        jf.compile(algo, DataParallel(4))
    assert err.value.field == "devices" and "6" in str(err.value) and "divide" in str(err.value)


def test_impala_all_reduces_gradients_once_per_update_and_moves_no_trajectory() -> None:
    algo = jf.recipes.IMPALA.create("CartPole-v1", num_minibatches=2, **SMALL)
    collectives = jf.compile(algo, DataParallel(4), chunk_iterations=2).explain().collectives
    assert set(totals(collectives)) == {"all-reduce"}
    gradients = [c for c in collectives if c.times == algo.num_minibatches]
    # the gradients, with the minibatch's scalar losses fused into the same all-reduce
    assert gradient_bytes(algo) <= sum(c.nbytes for c in gradients) <= gradient_bytes(algo) + 64
    assert all(c.nbytes <= 64 for c in collectives if c not in gradients)  # episode statistics
