"""PPO's value clipping: with ``clip_value`` the value may move at most ``clip_eps`` from
the rollout's per iteration (a value already that far gets no gradient toward its target);
without it the value loss is the plain squared error, whatever the distance. QR-DQN's
quantile Huber loss, term by term, and its network's noisy layers. Brax's PPO layout:
the tanh-squashed Gaussian with a state-dependent scale, a value network of its own widths
and scaled rewards."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_frag as jf
from jaxrl_frag.recipes.networks import MIN_STD, TanhGaussian, tanh_log_det


@pytest.mark.parametrize("clip_value", [True, False])
def test_value_clipping_bounds_the_values_move(clip_value: bool) -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", num_envs=4, num_steps=4, total_steps=16, clip_value=clip_value)
    params = jax.jit(algo.init)(jax.random.PRNGKey(0)).params
    obs = jax.random.normal(jax.random.PRNGKey(1), (8, 4))
    dist, value = jax.jit(algo.policy_value)(params, (), obs)
    action = dist.sample(jax.random.PRNGKey(2))
    # the value has moved 1.0 from the rollout's already, and its target lies 5.0 further on
    old_value, target = value - 1.0, value + 5.0

    def loss(params: dict) -> tuple[jax.Array, dict]:
        return algo.loss(params, (), obs, action, dist.log_prob(action), old_value, jnp.ones(8), target)

    grads, metrics = jax.jit(jax.grad(loss, has_aux=True))(params)
    value_grads = jnp.concatenate([g.ravel() for g in jax.tree.leaves(grads["params"]["v"])])
    clipped = old_value + algo.clip_eps
    expected = np.mean((clipped - target) ** 2) / 2 if clip_value else 12.5
    np.testing.assert_allclose(metrics["value_loss"], expected, rtol=1e-5)
    assert bool(jnp.any(value_grads != 0)) != clip_value


def test_the_quantile_huber_loss_is_the_papers_sum_over_pairs() -> None:
    """Dabney et al. (2018), eq. 10 with kappa: for predicted quantiles theta_i at the
    midpoints tau_i and targets T_j, sum_i mean_j |tau_i - 1{u < 0}| L_kappa(u) / kappa,
    u = T_j - theta_i; checked against a loop over the pairs."""
    algo = jf.recipes.QRDQN.create("CartPole-v1", quantiles=4, kappa=0.5)
    rng = np.random.default_rng(0)
    chosen, target = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(3, 4)).astype(np.float32)
    loss, priority = algo.sample_loss(jnp.asarray(chosen), jnp.asarray(target))
    tau = (np.arange(4) + 0.5) / 4
    for b in range(3):
        total = 0.0
        for i in range(4):
            for j in range(4):
                u = target[b, j] - chosen[b, i]
                huber = 0.5 * u**2 if abs(u) <= 0.5 else 0.5 * (abs(u) - 0.25)
                total += abs(tau[i] - (u < 0)) * huber / 0.5 / 4
        np.testing.assert_allclose(loss[b], total, rtol=1e-5)
    np.testing.assert_allclose(priority, loss)


def test_noisy_layers_act_on_their_means_without_noise_and_on_one_draw_per_key() -> None:
    algo = jf.recipes.QRDQN.create("CartPole-v1", quantiles=5, noisy=True, hidden=(16, 16))
    obs = jax.random.normal(jax.random.PRNGKey(1), (6, 4))
    params = algo.init_policy(jax.random.PRNGKey(0), obs)
    mean = algo.values(params, obs)
    assert mean.shape == (6, 2, 5)
    np.testing.assert_array_equal(mean, algo.values(params, obs))  # no key: the mean weights, every time
    one, other = (algo.values(params, obs, jax.random.PRNGKey(k)) for k in (2, 3))
    assert not np.allclose(one, mean) and not np.allclose(one, other)
    np.testing.assert_array_equal(one, algo.values(params, obs, jax.random.PRNGKey(2)))


def test_brax_layout_squashes_a_state_dependent_gaussian_onto_the_bounds_and_scales_the_learners_rewards() -> None:
    settings = dict(num_envs=4, num_steps=8, total_steps=32, hidden=(32,) * 4, value_hidden=(256,) * 5,
                    action_dist="tanh-gaussian")
    algo = jf.recipes.PPO.create("Pendulum-v1", **settings)
    state = jax.jit(algo.init)(jax.random.PRNGKey(0))
    shapes = jax.tree.map(jnp.shape, state.params["params"])
    assert [shapes["pi"][f"Dense_{i}"]["kernel"] for i in range(5)] == [(3, 32), (32, 32), (32, 32), (32, 32), (32, 2)]
    assert [shapes["v"][f"Dense_{i}"]["kernel"][1] for i in range(6)] == [256] * 5 + [1]
    assert "log_std" not in shapes
    obs = 3 * jax.random.normal(jax.random.PRNGKey(1), (64, 3))
    dist, _ = jax.jit(algo.policy_value)(state.params, (), obs)
    assert isinstance(dist, TanhGaussian) and float(dist.std.min()) >= MIN_STD and float(jnp.ptp(dist.std)) > 0
    # the log-probability is the density of tanh(u) on (-1, 1): it integrates to 1
    one = TanhGaussian(dist.mean[:1], dist.std[:1] + 0.5)
    y = jnp.linspace(-1, 1, 200_001)[1:-1]
    density = jnp.exp(jax.vmap(lambda y: one.log_prob(jnp.arctanh(y)[None, None])[0])(y))
    assert float(jnp.trapezoid(density, y)) == pytest.approx(1.0, abs=2e-3)
    np.testing.assert_allclose(tanh_log_det(jnp.array([0.5, -3.0])), jnp.log(1 - jnp.tanh(jnp.array([0.5, -3.0])) ** 2),
                               rtol=1e-5)
    assert bool(jnp.isfinite(tanh_log_det(jnp.array(40.0))))
    # samples far out are squashed onto Pendulum's [-2, 2], not clipped to its edge
    action = algo.env_action(jnp.array([[-30.0], [0.0], [0.5], [30.0]]))
    np.testing.assert_allclose(action[:, 0], [-2.0, 0.0, 2 * np.tanh(0.5), 2.0], rtol=1e-6)
    # the learner's rewards are the environment's times reward_scale; the episodes' returns stay the environment's
    rollouts = [jax.jit(jf.recipes.PPO.create("Pendulum-v1", **settings, reward_scale=scale).rollout)(
        state.params, state.env_state, state.obs, state.memory, jax.random.PRNGKey(2)) for scale in (1.0, 10.0)]
    np.testing.assert_allclose(rollouts[1][0].reward, 10 * rollouts[0][0].reward, rtol=1e-5)
    np.testing.assert_array_equal(rollouts[1][0].action, rollouts[0][0].action)
