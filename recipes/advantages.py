"""Generalised advantage estimation with time-limit truncation kept apart from termination."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(
    rewards: jax.Array,
    values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    final_values: jax.Array,
    last_value: jax.Array,
    gamma: jax.Array | float,
    lam: jax.Array | float,
) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets for a time-major ``[T, N]`` rollout.

    ``values[t]`` is V(obs[t]); ``final_values[t]`` is V of the observation that
    ended an episode at step ``t``; ``last_value`` is V of the observation after
    the rollout. Within an episode the target bootstraps from the next value; on a
    time-limit truncation from ``final_values`` (the episode could have gone on);
    on a termination from nothing. The advantage recursion stops at either.
    """
    done = (terminated | truncated).astype(values.dtype)
    bootstrap = jnp.where(truncated & ~terminated, final_values, 0.0)

    Carry = tuple[jax.Array, jax.Array]

    def backward(carry: Carry, x: tuple[jax.Array, ...]) -> tuple[Carry, jax.Array]:
        adv_next, value_next = carry
        reward, value, boot, d = x
        delta = reward + gamma * ((1.0 - d) * value_next + boot) - value
        adv = delta + gamma * lam * (1.0 - d) * adv_next
        return (adv, value), adv

    _, advantages = jax.lax.scan(
        backward, (jnp.zeros_like(last_value), last_value), (rewards, values, bootstrap, done), reverse=True
    )
    return advantages, advantages + values
