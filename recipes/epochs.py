"""``minibatch_epochs``: the learner loop of the on-policy recipes, passes over a batch
in shuffled minibatches with one optimizer update apiece; ``check_minibatches``: the
refusal of minibatches that do not divide an iteration's batch; ``updates_done``: how
many updates an optimizer state has seen (what learning-rate schedules read)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxrl_frag import primitives
from jaxrl_frag.bounds import divisors
from jaxrl_frag.errors import check
from jaxrl_frag.metrics import Metrics

PyTree = Any
Loss = Callable[..., tuple[jax.Array, Metrics]]  # loss(params, *minibatch) -> (scalar, metrics)


def minibatch_epochs(loss: Loss, optimizer: optax.GradientTransformation, params: PyTree, opt_state: PyTree,
                     batch: PyTree, keys: jax.Array, num_minibatches: int) -> tuple[PyTree, PyTree, Metrics]:
    """One pass over ``batch`` per key of ``keys``, each in ``num_minibatches`` minibatches
    shuffled by ``primitives.minibatches`` (so the policy decides where), with one update
    of ``optimizer`` on the gradient of ``loss`` per minibatch.

    Args:
        loss: ``loss(params, *minibatch) -> (scalar, metrics)``, its minibatch the
            leaves of ``batch`` cut along their leading (sample) axis, in order.
        optimizer: The optimizer ``opt_state`` belongs to.
        params: The parameters to update.
        opt_state: The optimizer's state.
        batch: A tuple of arrays sharing a leading sample axis.
        keys: ``[epochs, 2]``, one shuffling key per pass.
        num_minibatches: Minibatches per pass.

    Returns:
        ``(params, opt_state, metrics)``: after every update, and ``loss``'s metrics
        averaged over them.
    """

    def update(carry: tuple[PyTree, PyTree], minibatch: tuple[Any, ...]) -> tuple[Any, Metrics]:
        params, opt_state = carry
        grads, metrics = jax.grad(loss, has_aux=True)(params, *minibatch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), metrics

    def epoch(carry: tuple[PyTree, PyTree], key: jax.Array) -> tuple[Any, Metrics]:
        return jax.lax.scan(update, carry, primitives.minibatches(key, batch, num_minibatches))

    (params, opt_state), metrics = jax.lax.scan(epoch, (params, opt_state), keys)
    return params, opt_state, jax.tree.map(jnp.mean, metrics)


def check_minibatches(s: dict[str, Any]) -> None:
    """Refuse settings ``s`` whose ``num_minibatches`` does not divide the batch of
    ``num_envs * num_steps`` steps, naming the divisors that do."""
    batch = s["num_envs"] * s["num_steps"]
    check(batch % s["num_minibatches"] == 0, "num_minibatches", s["num_minibatches"],
          lambda: f"must divide the batch num_envs * num_steps = {s['num_envs']} * {s['num_steps']} = {batch}; "
                  f"choose one of {divisors(batch, 16)}")


def updates_done(opt_state: PyTree) -> jax.Array:
    """How many updates the optimizer whose state is ``opt_state`` has made (its first
    ``count``, which Adam, RAdam and the schedules keep)."""
    (_, count), *_ = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    return count
