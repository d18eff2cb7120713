"""A recurrent network's memory over a rollout, as the recipes that take ``--memory``
share it: its settings, checked, and where the learner's sequences start.

The memory is part of the training state, batched along the environments (so every
distribution policy splits it with them) and forgotten (set to zeros) where an
episode ended, before the next step reads it. The rollout records the memory each step
was acted with; the learner trains on whole sequences, its minibatches sets of
environments, each unrolled from the memory its first step was acted with and
forgetting it where an episode began within (truncated backpropagation through the
rollout).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_frag import envs
from jaxrl_frag.bounds import divisors
from jaxrl_frag.errors import check
from jaxrl_frag.recipes.networks import CELLS

PyTree = Any
MEMORIES = ("none", *CELLS)


class Recurrence(NamedTuple):
    """Where the sequences of environment-major samples ``[n, T, ...]`` start: the memory
    each environment's first step was acted with (``[n, ...]``), and whether each step
    ``[n, T]`` (per agent: ``[n, T, agents]``) begins an episode (the memory forgotten
    before it)."""

    start: PyTree
    first: jax.Array


def recurrence(memory: PyTree, terminated: jax.Array, truncated: jax.Array) -> Recurrence:
    """The ``Recurrence`` of a time-major rollout: the memory each step was acted with
    (leaves ``[T, N, ...]``) and where episodes ended (``[T, N]``, or ``[T, N, agents]``)."""
    done = terminated | truncated
    first = jnp.concatenate([jnp.zeros_like(done[:1]), done[:-1]])
    return Recurrence(jax.tree.map(lambda m: m[0], memory), first.swapaxes(0, 1))


def check_memory(s: dict[str, Any]) -> None:
    """``memory`` is a cell or ``none``; with one, minibatches of whole environments."""
    check(s["memory"] in MEMORIES, "memory", s["memory"], f"choose one of {', '.join(MEMORIES)} (none: feed-forward)")
    if s["memory"] != "none":
        check(s["num_envs"] % s["num_minibatches"] == 0, "num_minibatches", s["num_minibatches"],
              lambda: f"with memory a minibatch holds whole environments' sequences, so it must divide num_envs = "
                      f"{s['num_envs']}; choose one of {divisors(s['num_envs'], 16)}")


def check_memory_env(env_id: str, env: envs.Env, memory: str, torso: str) -> None:
    """A memory reads vector observations (per agent, for a team) through MLPs, of
    environments traced into the program."""
    shape = env.observation_space.shape
    vector = len(shape) == 1 + (env.num_agents is not None)
    check(memory == "none" or (vector and torso in ("auto", "mlp")), "memory", memory,
          f"recurrent networks read vector observations through MLPs; {env_id} observes shape {shape} (torso "
          f"{torso}): choose --memory none")
    check(memory == "none" or not envs.is_host(env_id), "memory", memory,
          f"recurrent policies act on JAX environments; {env_id} runs on the host: choose --memory none")
