"""Advantages and returns: GAE, V-trace and n-step returns, with time-limit truncation kept apart from termination."""

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
    unroll: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets for a time-major ``[T, N]`` rollout.

    ``values[t]`` is V(obs[t]); ``final_values[t]`` is V of the observation that
    ended an episode at step ``t``; ``last_value`` is V of the observation after
    the rollout. Within an episode the target bootstraps from the next value; on a
    time-limit truncation from ``final_values`` (the episode could have gone on);
    on a termination from nothing. The advantage recursion stops at either, and
    with ``unroll`` after every ``unroll`` steps: each unroll's advantages
    bootstrap from the value after it alone (Brax's ``unroll_length``).

    Args:
        rewards: ``[T, N]`` rewards.
        values: ``[T, N]``, V of the observation acted on at each step.
        terminated: ``[T, N]``, where an episode terminated.
        truncated: ``[T, N]``, where an episode was cut by a time limit.
        final_values: ``[T, N]``, V of the observation that ended the episode (read
            where ``truncated``).
        last_value: ``[N]``, V of the observation after the last step.
        gamma: Discount.
        lam: GAE lambda.
        unroll: Steps per unroll (a divisor of ``T``); 0: the whole rollout is one.

    Returns:
        ``(advantages, targets)``, each ``[T, N]``; ``targets = advantages + values``.
    """
    done = (terminated | truncated).astype(values.dtype)
    bootstrap = jnp.where(truncated & ~terminated, final_values, 0.0)
    steps = jnp.arange(1, rewards.shape[0] + 1)
    carried = jnp.ones_like(steps, values.dtype) if unroll == 0 else (steps % unroll != 0).astype(values.dtype)

    Carry = tuple[jax.Array, jax.Array]

    def backward(carry: Carry, x: tuple[jax.Array, ...]) -> tuple[Carry, jax.Array]:
        adv_next, value_next = carry
        reward, value, boot, d, carry_on = x
        delta = reward + gamma * ((1.0 - d) * value_next + boot) - value
        adv = delta + gamma * lam * (1.0 - d) * carry_on * adv_next
        return (adv, value), adv

    _, advantages = jax.lax.scan(
        backward, (jnp.zeros_like(last_value), last_value), (rewards, values, bootstrap, done, carried), reverse=True
    )
    return advantages, advantages + values


def vtrace(
    log_rhos: jax.Array,
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    discounts: jax.Array,
    continues: jax.Array,
    lam: jax.Array | float = 1.0,
    rho_bar: jax.Array | float = 1.0,
    c_bar: jax.Array | float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """V-trace value targets and policy-gradient advantages (Espeholt et al. 2018) for a
    time-major ``[T, N]`` rollout taken by a behaviour policy mu, for a target policy pi.

    ``log_rhos[t] = log pi(a_t|x_t) - log mu(a_t|x_t)``; ``values[t]`` is V(x_t) and
    ``next_values[t]`` is V of the observation after step ``t`` (the episode's final one
    where it ended); ``discounts[t]`` is gamma, or 0 where the episode terminated;
    ``continues[t]`` is 0 where an episode ended (terminated or truncated), which cuts
    the trace. With ``rho_t = min(rho_bar, pi/mu)`` and ``c_t = lam * min(c_bar, pi/mu)``:

        v_s = V(x_s) + delta_s + discounts_s c_s continues_s (v_{s+1} - V(x_{s+1})),
        delta_s = rho_s (r_s + discounts_s next_values_s - V(x_s)),
        advantage_s = rho_s (r_s + discounts_s v'_{s+1} - V(x_s)),

    where ``v'_{s+1}`` is ``v_{s+1}`` within the episode and ``next_values_s`` at its end
    or after the last step. On-policy (``log_rhos = 0``, ``lam = rho_bar = c_bar = 1``)
    ``v_s`` is the n-step bootstrapped return. Gradients do not flow through the results.

    Args:
        log_rhos: ``[T, N]``, log importance ratios ``log pi - log mu`` of the actions taken.
        rewards: ``[T, N]`` rewards.
        values: ``[T, N]``, V of the observation acted on.
        next_values: ``[T, N]``, V of the observation after each step.
        discounts: ``[T, N]``, gamma, or 0 where the episode terminated.
        continues: ``[T, N]``, 0 where an episode ended, 1 elsewhere.
        lam: Trace-cutting lambda.
        rho_bar: Clip of the importance ratios in the temporal differences.
        c_bar: Clip of the importance ratios in the trace.

    Returns:
        ``(vs, advantages)``, each ``[T, N]``: the value targets and the policy-gradient
        advantages, both with gradients stopped.
    """
    ratios = jnp.exp(log_rhos)
    rhos = jnp.minimum(rho_bar, ratios)
    cs = lam * jnp.minimum(c_bar, ratios)
    deltas = rhos * (rewards + discounts * next_values - values)
    carries = discounts * cs * continues

    def backward(acc: jax.Array, x: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta, carry = x
        acc = delta + carry * acc
        return acc, acc

    _, corrections = jax.lax.scan(backward, jnp.zeros_like(values[0]), (deltas, carries), reverse=True)
    vs = values + corrections
    # v_{s+1} = V(x_{s+1}) + correction_{s+1} = next_values_s + correction_{s+1} within an episode
    later = jnp.concatenate([corrections[1:], jnp.zeros_like(corrections[:1])])
    next_vs = next_values + continues * later
    advantages = rhos * (rewards + discounts * next_vs - values)
    return jax.lax.stop_gradient(vs), jax.lax.stop_gradient(advantages)


def n_step_return(
    rewards: jax.Array, terminated: jax.Array, truncated: jax.Array, gamma: jax.Array | float
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The n-step return of windows ``[B, n]`` of consecutive steps, cut at the first
    step that ends an episode: the discounted reward sum, the discount of the bootstrap
    value (``gamma ** m``, or 0 after a termination) and the index of the step whose
    next observation the value bootstraps from (``m - 1``, ``m`` the steps counted).

    Args:
        rewards: ``[B, n]`` rewards of each window.
        terminated: ``[B, n]``, where an episode terminated.
        truncated: ``[B, n]``, where an episode was cut by a time limit.
        gamma: Discount.

    Returns:
        ``(returns, discount, last)``, each ``[B]``.
    """
    n = rewards.shape[1]
    done = (terminated | truncated).astype(rewards.dtype)
    # counted[k]: no episode ended before step k of the window
    counted = jnp.cumprod(jnp.concatenate([jnp.ones_like(done[:, :1]), 1.0 - done[:, :-1]], axis=1), axis=1)
    powers = jnp.asarray(gamma, rewards.dtype) ** jnp.arange(n, dtype=rewards.dtype)
    returns = (rewards * counted * powers).sum(axis=1)
    last = counted.sum(axis=1).astype(jnp.int32) - 1
    ended_by_termination = jnp.take_along_axis(terminated, last[:, None], axis=1)[:, 0]
    discount = jnp.where(ended_by_termination, 0.0, jnp.asarray(gamma, rewards.dtype) ** (last + 1))
    return returns, discount, last


def q_lambda(
    rewards: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    next_values: jax.Array,
    gamma: jax.Array | float,
    lam: jax.Array | float,
) -> jax.Array:
    """Peng's Q(lambda) returns with greedy bootstraps (PQN's targets; no trace is cut at
    exploratory actions) of a time-major ``[T, N]`` rollout, computed backwards.

    ``next_values[t]`` is ``max_a Q(x', a)`` of the observation ``x'`` after step ``t``
    (the one that ended the episode where it ended). Within an episode,

        G_t = r_t + gamma ((1 - lam) next_values_t + lam G_{t+1});

    where the episode ended at ``t`` (and after the last step) the return bootstraps
    from ``next_values_t`` alone on a time-limit truncation, and from nothing on a
    termination: ``G_t = r_t + gamma next_values_t`` or ``G_t = r_t``.

    Args:
        rewards: ``[T, N]`` rewards.
        terminated: ``[T, N]``, where an episode terminated.
        truncated: ``[T, N]``, where an episode was cut by a time limit.
        next_values: ``[T, N]``, the greedy value of the observation after each step.
        gamma: Discount.
        lam: The mixing lambda (0: one-step Q-learning targets; 1: Monte Carlo returns
            within the rollout).

    Returns:
        ``[T, N]`` returns, with gradients stopped.
    """

    def backward(later: jax.Array, x: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        reward, term, trunc, next_value = x
        mixed = jnp.where(term | trunc, next_value, (1.0 - lam) * next_value + lam * later)
        value = reward + gamma * jnp.where(term, 0.0, mixed)
        return value, value

    _, returns = jax.lax.scan(backward, next_values[-1], (rewards, terminated, truncated, next_values), reverse=True)
    return jax.lax.stop_gradient(returns)
