"""PPO's value clipping: with ``clip_value`` the value may move at most ``clip_eps`` from
the rollout's per iteration (a value already that far gets no gradient toward its target);
without it the value loss is the plain squared error, whatever the distance."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_frag as jf


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
