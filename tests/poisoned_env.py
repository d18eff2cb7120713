"""A CartPole that turns its rewards NaN, for the tests of the non-finite checks."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_frag import envs


@dataclasses.dataclass(frozen=True)
class PoisonedRewards(envs.Wrapper):
    """``inner`` whose rewards turn NaN after ``after`` steps of each environment whose reset
    key draws below ``rate`` (every environment by default)."""

    after: int = 0
    rate: float = 1.0

    def reset(self, key: jax.Array) -> tuple[tuple[object, jax.Array, jax.Array], jax.Array]:
        state, obs = self.inner.reset(key)
        return (state, jnp.int32(0), jax.random.uniform(jax.random.fold_in(key, 1)) < self.rate), obs

    def step(self, key: jax.Array, state: tuple[object, jax.Array, jax.Array],
             action: jax.Array) -> tuple[object, envs.TimeStep]:
        inner, t, poisoned = state
        inner, ts = self.inner.step(key, inner, action)
        return (inner, t + 1, poisoned), ts._replace(reward=jnp.where(poisoned & (t >= self.after), jnp.nan, ts.reward))
