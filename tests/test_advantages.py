"""GAE bootstraps from V(final observation) on truncation and from nothing on termination;
V-trace equals its defining sums, and n-step returns on-policy; n-step returns of
replayed windows stop at an episode's end; Q(lambda) returns equal their definition as
a lambda-weighted mix of n-step returns cut at an episode's end."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frag.recipes.advantages import gae, n_step_return, q_lambda, vtrace

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


def vtrace_by_definition(log_rhos, rewards, values, next_values, discounts, continues, lam, rho_bar, c_bar):
    """V-trace from its definition (Espeholt et al. 2018, eq. 1), one environment at a time:
    v_s = V(x_s) + sum_t (prod_{i<t} discount_i c_i continue_i) delta_t, and the advantage
    rho_s (r_s + discount_s v'_{s+1} - V(x_s)), v' the next target in the episode or the
    next value at its end."""
    steps, envs = rewards.shape
    ratios = np.exp(log_rhos)
    rho, c = np.minimum(rho_bar, ratios), lam * np.minimum(c_bar, ratios)
    vs, adv = np.zeros_like(values), np.zeros_like(values)
    for n in range(envs):
        for s in range(steps):
            total, weight = values[s, n], 1.0
            for t in range(s, steps):
                total += weight * rho[t, n] * (rewards[t, n] + discounts[t, n] * next_values[t, n] - values[t, n])
                weight *= discounts[t, n] * c[t, n] * continues[t, n]
            vs[s, n] = total
        for s in range(steps):
            following = vs[s + 1, n] if s + 1 < steps and continues[s, n] else next_values[s, n]
            adv[s, n] = rho[s, n] * (rewards[s, n] + discounts[s, n] * following - values[s, n])
    return vs, adv


def random_rollout(seed: int, steps: int = 7, envs: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    terminated = rng.random((steps, envs)) < 0.15
    truncated = ~terminated & (rng.random((steps, envs)) < 0.15)
    values = rng.normal(size=(steps, envs)).astype(np.float32)
    last = rng.normal(size=(1, envs)).astype(np.float32)
    final = rng.normal(size=(steps, envs)).astype(np.float32)  # V of the final observation where an episode ended
    done = terminated | truncated
    return dict(
        log_rhos=rng.normal(scale=0.5, size=(steps, envs)).astype(np.float32),
        rewards=rng.normal(size=(steps, envs)).astype(np.float32),
        values=values,
        next_values=np.where(done, final, np.concatenate([values[1:], last])),
        discounts=(0.95 * ~terminated).astype(np.float32),
        continues=(~done).astype(np.float32),
    )


@pytest.mark.parametrize("lam, rho_bar, c_bar", [(1.0, 1.0, 1.0), (0.9, 1.5, 0.8), (0.5, 0.7, 2.0)])
def test_vtrace_equals_its_definition_off_policy(lam: float, rho_bar: float, c_bar: float) -> None:
    for seed in range(3):
        data = random_rollout(seed)
        vs, adv = vtrace(*(jnp.asarray(data[k]) for k in data), lam=lam, rho_bar=rho_bar, c_bar=c_bar)
        want_vs, want_adv = vtrace_by_definition(*data.values(), lam, rho_bar, c_bar)
        np.testing.assert_allclose(vs, want_vs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)


def test_vtrace_on_policy_is_the_n_step_return() -> None:
    data = random_rollout(0)
    steps, envs = data["rewards"].shape
    data.update(log_rhos=np.zeros((steps, envs), np.float32), discounts=np.full((steps, envs), 0.95, np.float32),
                continues=np.ones((steps, envs), np.float32))
    data["next_values"] = np.concatenate([data["values"][1:], data["next_values"][-1:]])  # no episode ends
    vs, adv = vtrace(*(jnp.asarray(data[k]) for k in data))
    bootstrap = data["next_values"][-1]
    for s in range(steps):
        horizon = steps - s
        n_step = sum(0.95**k * data["rewards"][s + k] for k in range(horizon)) + 0.95**horizon * bootstrap
        np.testing.assert_allclose(vs[s], n_step, rtol=1e-5, atol=1e-5)
        following = vs[s + 1] if s < steps - 1 else bootstrap
        np.testing.assert_allclose(adv[s], data["rewards"][s] + 0.95 * following - data["values"][s],
                                   rtol=1e-5, atol=1e-5)


def test_n_step_return_stops_at_the_first_end_of_an_episode() -> None:
    rewards = jnp.array([[1.0, 2.0, 4.0]] * 4)
    f, t = False, True
    terminated = jnp.array([[f, f, f], [f, t, f], [f, f, f], [t, t, f]])
    truncated = jnp.array([[f, f, f], [f, f, f], [f, t, t], [f, f, f]])
    returns, discount, last = n_step_return(rewards, terminated, truncated, GAMMA)
    np.testing.assert_allclose(returns, [1 + 2 * GAMMA + 4 * GAMMA**2, 1 + 2 * GAMMA, 1 + 2 * GAMMA, 1], rtol=1e-6)
    # bootstrap from the next observation of the last step counted, unless that step terminated
    np.testing.assert_allclose(discount, [GAMMA**3, 0.0, GAMMA**2, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(last, [2, 1, 1, 0])


def q_lambda_by_definition(rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                           next_values: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """(1 - lam) sum_k lam^(k-1) G^(k) + lam^(H-1) G^(H): the k-step returns G^(k) from step s,
    each bootstrapping from the greedy value after its last step (nothing after a
    termination), over the H steps up to the episode's end or the rollout's."""
    steps, envs = rewards.shape
    out = np.zeros_like(rewards)
    for n in range(envs):
        for s in range(steps):
            ends = [t for t in range(s, steps) if terminated[t, n] or truncated[t, n]]
            horizon = (ends[0] if ends else steps - 1) - s + 1

            def k_step(k: int, s: int = s, n: int = n) -> float:
                last = s + k - 1
                bootstrap = 0.0 if terminated[last, n] else next_values[last, n]
                return sum(gamma**i * rewards[s + i, n] for i in range(k)) + gamma**k * bootstrap

            out[s, n] = (1 - lam) * sum(lam ** (k - 1) * k_step(k) for k in range(1, horizon)) \
                + lam ** (horizon - 1) * k_step(horizon)
    return out


@pytest.mark.parametrize("lam", [0.0, 0.65, 1.0])
def test_q_lambda_equals_its_definition(lam: float) -> None:
    for seed in range(3):
        data = random_rollout(seed)
        rng = np.random.default_rng(seed + 10)
        terminated = rng.random(data["rewards"].shape) < 0.15
        truncated = ~terminated & (rng.random(data["rewards"].shape) < 0.15)
        args = (data["rewards"], terminated, truncated, data["next_values"])
        got = q_lambda(*(jnp.asarray(a) for a in args), 0.95, lam)
        np.testing.assert_allclose(got, q_lambda_by_definition(*args, 0.95, lam), rtol=1e-5, atol=1e-5)


def test_q_lambda_bootstraps_at_a_truncation_and_not_at_a_termination() -> None:
    rewards, next_values = jnp.array([[1.0], [2.0]]), jnp.array([[5.0], [7.0]])
    ended, never = jnp.array([[True], [False]]), jnp.zeros((2, 1), bool)
    truncated = q_lambda(rewards, never, ended, next_values, GAMMA, LAM)
    terminated = q_lambda(rewards, ended, never, next_values, GAMMA, LAM)
    np.testing.assert_allclose(truncated[0], 1.0 + GAMMA * 5.0)
    np.testing.assert_allclose(terminated[0], 1.0)
    np.testing.assert_allclose(truncated[1], 2.0 + GAMMA * 7.0)  # the last step bootstraps from what follows


def test_gae_in_unrolls_equals_gae_on_each_unroll_bootstrapped_from_the_value_after_it() -> None:
    # Brax's unroll_length: a rollout of 6 steps in unrolls of 3 is two rollouts of 3 steps, the first bootstrapped
    # from the value of the observation that starts the second; episodes end inside and at the edge of an unroll
    rng = np.random.default_rng(0)
    rewards, values, final_values = (jnp.asarray(rng.normal(size=(6, 4)), jnp.float32) for _ in range(3))
    last_value = jnp.asarray(rng.normal(size=4), jnp.float32)
    terminated = jnp.zeros((6, 4), bool).at[1, 0].set(True).at[2, 1].set(True)
    truncated = jnp.zeros((6, 4), bool).at[4, 2].set(True).at[2, 3].set(True)
    adv, target = gae(rewards, values, terminated, truncated, final_values, last_value, GAMMA, LAM, unroll=3)
    first = gae(rewards[:3], values[:3], terminated[:3], truncated[:3], final_values[:3], values[3], GAMMA, LAM)
    second = gae(rewards[3:], values[3:], terminated[3:], truncated[3:], final_values[3:], last_value, GAMMA, LAM)
    np.testing.assert_allclose(adv, jnp.concatenate([first[0], second[0]]), rtol=1e-6)
    np.testing.assert_allclose(target, jnp.concatenate([first[1], second[1]]), rtol=1e-6)
    whole, _ = gae(rewards, values, terminated, truncated, final_values, last_value, GAMMA, LAM)
    assert not np.allclose(adv[:3], whole[:3])  # the cut changes the first unroll's advantages
    np.testing.assert_array_equal(gae(rewards, values, terminated, truncated, final_values, last_value, GAMMA, LAM,
                                      unroll=6)[0], whole)
