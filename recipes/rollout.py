"""``collect``: a batch of environments stepped for a number of steps by an acting
function, what happened at each step recorded time-major, and the episodes that ended;
``collect_with_memory``: the same by an acting function that carries a memory."""

from __future__ import annotations

from typing import Any

import jax

from jaxrl_frag import envs
from jaxrl_frag.envs.core import Act, RecurrentAct, Steps
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


def collect_with_memory(env: envs.Env, act: RecurrentAct, env_state: PyTree, obs: jax.Array, memory: PyTree,
                        key: jax.Array, num_steps: int) -> tuple[Steps, PyTree, PyTree, jax.Array, PyTree, Metrics]:
    """``collect`` with ``act(obs, memory, key) -> (action, env_action, extra, memory)``, its
    memory (leaves ``[N, ...]``) carried from step to step and forgotten where an episode
    ended (``Env.recurrent_rollout``). Without a memory (no leaves) it goes through
    ``collect``, so that an environment outside XLA schedules its steps its own way.

    Returns:
        ``(steps, extras, env_state, obs, memory, episodes)``: ``collect``'s, with the
        memory after the last step.
    """
    if not jax.tree.leaves(memory):
        def stateless(obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, PyTree]:
            action, env_action, extra, _ = act(obs, memory, key)
            return action, env_action, extra

        steps, extras, env_state, obs, episodes = collect(env, stateless, env_state, obs, key, num_steps)
        return steps, extras, env_state, obs, memory, episodes
    steps, extras, env_state, obs, memory, ended = env.recurrent_rollout(act, env_state, obs, memory, key, num_steps)
    return steps, extras, env_state, obs, memory, episode_metrics(*ended)
