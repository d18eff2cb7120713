"""``collect``: a batch of environments stepped for a number of steps by an acting
function, what happened at each step recorded time-major, and the episodes that ended."""

from __future__ import annotations

from typing import Any

import jax

from jaxrl_frag import envs
from jaxrl_frag.envs.core import Act, Steps
from jaxrl_frag.metrics import Metrics, episode_metrics

PyTree = Any


def collect(env: envs.Env, act: Act, env_state: PyTree, obs: jax.Array, key: jax.Array,
            num_steps: int) -> tuple[Steps, PyTree, PyTree, jax.Array, Metrics]:
    """``num_steps`` steps of ``env`` from ``(env_state, obs)`` (``Env.rollout``).

    ``act(obs, key) -> (action, env_action, extra)`` chooses the action to record, the
    one to send to the environment (clipped to its bounds, say) and anything else to
    keep per step. Returns the ``Steps``, the ``extra``s stacked, the environment
    state and observation after the last step, and the episodes that ended.

    Args:
        env: A batched environment of ``N`` environments.
        act: The acting function.
        env_state: The environments' state.
        obs: ``[N, ...]`` observations to act on first.
        key: PRNG key.
        num_steps: ``T``, steps per environment.

    Returns:
        ``(steps, extras, env_state, obs, episodes)``: ``Steps`` ``[T, N, ...]``, the
        extras ``[T, N, ...]``, the state and observations after the last step, and
        ``metrics.episode_metrics`` of the episodes that ended.
    """
    steps, extras, env_state, obs, ended = env.rollout(act, env_state, obs, key, num_steps)
    return steps, extras, env_state, obs, episode_metrics(*ended)
