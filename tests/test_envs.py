"""Environments: terminated and truncated kept apart, auto-reset, statistics wrappers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frag import ConfigError, envs


def run(env: envs.Env, steps: int, action: int = 0):
    state, _ = env.reset(jax.random.PRNGKey(0))

    def body(state, key):
        state, ts = env.step(key, state, jnp.full((env.num_envs,), action))
        return state, ts

    return jax.lax.scan(body, state, jax.random.split(jax.random.PRNGKey(1), steps))


def test_time_limit_is_a_truncation_not_a_termination() -> None:
    # MountainCar never reaches the goal by pushing left: every episode ends by the 200-step time limit
    env = envs.make("MountainCar-v0", num_envs=2)
    _, ts = jax.jit(lambda: run(env, 450))()
    done_at = np.nonzero(np.asarray(ts.done[:, 0]))[0]
    np.testing.assert_array_equal(done_at, [199, 399])
    assert not np.asarray(ts.terminated).any()
    np.testing.assert_array_equal(np.asarray(ts.info["episode_length"])[done_at, 0], [200, 200])
    # the observation after a done is a fresh reset; the final one is where the car was
    assert not np.allclose(np.asarray(ts.obs[199]), np.asarray(ts.final_obs[199]))
    np.testing.assert_array_equal(np.asarray(ts.obs[198]), np.asarray(ts.final_obs[198]))


def test_cartpole_falling_over_is_a_termination() -> None:
    env = envs.make("CartPole-v1", num_envs=3)
    _, ts = jax.jit(lambda: run(env, 60))()
    assert np.asarray(ts.terminated).any()
    assert not np.asarray(ts.truncated).any()
    ended = np.asarray(ts.done)
    returns = np.asarray(ts.info["episode_return"])[ended]
    lengths = np.asarray(ts.info["episode_length"])[ended]
    np.testing.assert_array_equal(returns, lengths)  # reward 1 per step


def test_normalize_observation_standardizes() -> None:
    env = envs.make("Pendulum-v1", num_envs=64, normalize_obs=True)
    _, ts = jax.jit(lambda: run(env, 300))()
    obs = np.asarray(ts.obs[100:]).reshape(-1, 3)
    np.testing.assert_allclose(obs.mean(0), 0.0, atol=0.25)
    np.testing.assert_allclose(obs.std(0), 1.0, atol=0.25)


def test_scale_reward_divides_by_return_std_and_keeps_episode_returns_raw() -> None:
    raw = envs.make("Pendulum-v1", num_envs=16)
    scaled = envs.make("Pendulum-v1", num_envs=16, scale_reward=True)
    _, ts_raw = jax.jit(lambda: run(raw, 210))()
    _, ts = jax.jit(lambda: run(scaled, 210))()
    assert np.abs(np.asarray(ts.reward)).mean() < 0.2 * np.abs(np.asarray(ts_raw.reward)).mean()
    np.testing.assert_allclose(np.asarray(ts.info["episode_return"]), np.asarray(ts_raw.info["episode_return"]))


def test_running_moments_merge_equals_whole_batch() -> None:
    x = jax.random.normal(jax.random.PRNGKey(3), (1000, 2)) * 3 + 1
    m = envs.RunningMoments.zeros((2,))
    for chunk in np.split(np.asarray(x), 10):
        m = m.update(jnp.asarray(chunk))
    np.testing.assert_allclose(m.mean, x.mean(0), rtol=1e-3)
    np.testing.assert_allclose(m.var, x.var(0), rtol=1e-3)


def test_unknown_environment_lists_the_available_ones() -> None:
    with pytest.raises(ConfigError) as err:
        envs.make("CartPole-v2")
    assert err.value.field == "env" and "CartPole-v1" in str(err.value) and "available" in str(err.value)


def test_minatar_observations_are_images() -> None:
    env = envs.make("Breakout-MinAtar", num_envs=2)
    assert env.observation_space.shape == (10, 10, 4)
    assert isinstance(env.action_space, envs.Discrete)
    _, ts = jax.jit(lambda: run(env, 5))()
    assert ts.obs.shape == (5, 2, 10, 10, 4)
