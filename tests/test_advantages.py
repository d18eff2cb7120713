"""GAE bootstraps from V(final observation) on truncation and from nothing on termination."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frag.recipes.advantages import gae

GAMMA, LAM = 0.9, 0.8


def one_env(terminated: bool, truncated: bool) -> tuple[np.ndarray, np.ndarray]:
    # three steps of one environment; the episode ends after step 1 (index 1),
    # a new one starts at step 2
    rewards = jnp.array([[1.0], [2.0], [3.0]])
    values = jnp.array([[0.5], [0.25], [4.0]])
    term = jnp.array([[False], [terminated], [False]])
    trunc = jnp.array([[False], [truncated], [False]])
    final_values = jnp.array([[0.0], [10.0], [0.0]])  # V(final obs) where the episode ended
    last_value = jnp.array([6.0])
    adv, target = gae(rewards, values, term, trunc, final_values, last_value, GAMMA, LAM)
    return np.asarray(adv)[:, 0], np.asarray(target)[:, 0]


def expected(bootstrap_at_end: float) -> np.ndarray:
    d2 = 3.0 + GAMMA * 6.0 - 4.0
    d1 = 2.0 + GAMMA * bootstrap_at_end - 0.25
    d0 = 1.0 + GAMMA * 0.25 - 0.5
    return np.array([d0 + GAMMA * LAM * d1, d1, d2])


def test_truncation_bootstraps_from_final_observation_value() -> None:
    adv, target = one_env(terminated=False, truncated=True)
    np.testing.assert_allclose(adv, expected(bootstrap_at_end=10.0), rtol=1e-6)
    np.testing.assert_allclose(target, adv + np.array([0.5, 0.25, 4.0]), rtol=1e-6)


def test_termination_does_not_bootstrap() -> None:
    adv, _ = one_env(terminated=True, truncated=False)
    np.testing.assert_allclose(adv, expected(bootstrap_at_end=0.0), rtol=1e-6)


def test_termination_wins_when_both_are_set() -> None:
    adv, _ = one_env(terminated=True, truncated=True)
    np.testing.assert_allclose(adv, expected(bootstrap_at_end=0.0), rtol=1e-6)


def test_the_two_cases_differ_by_the_discounted_final_value() -> None:
    truncated, _ = one_env(terminated=False, truncated=True)
    terminated, _ = one_env(terminated=True, truncated=False)
    assert truncated[1] - terminated[1] == pytest.approx(GAMMA * 10.0)
