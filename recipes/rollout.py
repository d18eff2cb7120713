"""``collect``: a batch of environments stepped for a number of steps by an acting
function, what happened at each step recorded time-major."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from jaxrl_frag import envs
from jaxrl_frag.metrics import Metrics, episode_metrics

PyTree = Any


class Steps(NamedTuple):
    """Environment steps, time-major ``[T, N, ...]``: the observation acted on, the
    action, and what followed. ``next_obs`` is the observation the action led to,
    before any reset (the one that ended the episode where it ended)."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array


Act = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array, PyTree]]


def collect(env: envs.Env, act: Act, env_state: PyTree, obs: jax.Array, key: jax.Array,
            num_steps: int) -> tuple[Steps, PyTree, PyTree, jax.Array, Metrics]:
    """``num_steps`` steps of ``env`` from ``(env_state, obs)``.

    ``act(obs, key) -> (action, env_action, extra)`` chooses the action to record, the
    one to send to the environment (clipped to its bounds, say) and anything else to
    keep per step. Returns the ``Steps``, the ``extra``s stacked, the environment
    state and observation after the last step, and the episodes that ended."""

    def one_step(carry: tuple[PyTree, jax.Array, jax.Array], _: None) -> tuple[Any, Any]:
        env_state, obs, key = carry
        key, k_act, k_env = jax.random.split(key, 3)
        action, env_action, extra = act(obs, k_act)
        env_state, ts = env.step(k_env, env_state, env_action)
        step = Steps(obs, action, ts.reward, ts.terminated, ts.truncated, ts.final_obs)
        ended = (ts.done, ts.info["episode_return"], ts.info["episode_length"])
        return (env_state, ts.obs, key), (step, extra, ended)

    (env_state, obs, _), (steps, extras, ended) = jax.lax.scan(one_step, (env_state, obs, key), None, num_steps)
    return steps, extras, env_state, obs, episode_metrics(*ended)
