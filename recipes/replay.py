"""Replay buffers in the training state: uniform or prioritized, fixed capacity,
circular, pure JAX, split along the environment batch.

A buffer (``Replay``) is a pytree that lives in the training state; ``add``,
``sample`` and ``update_priorities`` are pure functions of it, so an off-policy
training loop stays one compiled program. Items are stored as rows of
environment steps: every leaf is ``[rows, envs, ...]``, row ``t % rows`` holding
step ``t`` of every environment. The environment axis (axis 1) is the batch
axis a distribution policy splits, so each device keeps the transitions of its
own environments.

``sample`` draws windows of ``window`` consecutive steps of one environment
(``window = n`` for n-step returns), starting at any step whose window has been
written. How it spreads over a split buffer is the policy's ``shuffle``: with
``exact`` sampling (and on one device) all draws come from the buffer as a
whole; with ``local`` sampling each device draws an equal share of the batch
from its own environments, and nothing crosses devices. Uniform sampling is the
same distribution either way (every shard holds as many items). Prioritized
sampling (Schaul et al. 2016, proportional) draws item ``i`` with probability
``P(i) = p_i / sum_k p_k`` (``p = |priority| ** alpha``) by stratified descent of a
sum tree kept per environment; with ``local`` sampling each shard is drawn in
proportion within itself, ``P(i) = p_i / (shards * sum_{k in shard} p_k)``. Either
way the importance weights ``w_i = (P(i) / min_k P(k)) ** -beta`` use the
probabilities actually sampled with, so the corrected estimate stays unbiased.
New items enter with the largest priority seen so far.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_frag import primitives
from jaxrl_frag.errors import ConfigError

PyTree = Any


@struct.dataclass
class Replay:
    """The buffer: ``items`` (leaves ``[rows, envs, ...]``), the count of rows ever
    added, and for a prioritized buffer the sum tree over each environment's rows
    (levels ``[width, envs]`` from the leaves, padded to a power of two, to the
    per-environment totals) and the largest priority seen."""

    items: PyTree
    added: jax.Array
    tree: tuple[jax.Array, ...] = ()
    max_priority: jax.Array | None = None
    window: int = struct.field(pytree_node=False, default=1)

    @property
    def rows(self) -> int:
        """Capacity in rows."""
        return jax.tree.leaves(self.items)[0].shape[0]

    @property
    def envs(self) -> int:
        """Environments per row."""
        return jax.tree.leaves(self.items)[0].shape[1]

    @property
    def prioritized(self) -> bool:
        """Whether it keeps priorities (a sum tree)."""
        return bool(self.tree)

    @property
    def size(self) -> jax.Array:
        """Rows held."""
        return jnp.minimum(self.added, self.rows)

    @property
    def ready(self) -> jax.Array:
        """Items (windows) that can be sampled."""
        return jnp.maximum(self.size - self.window + 1, 0) * self.envs


class Sample(NamedTuple):
    """Sampled windows (leaves ``[count, window, ...]``), where they start (row and
    environment, for ``update_priorities``) and their importance weights (ones when
    uniform)."""

    items: PyTree
    row: jax.Array
    env: jax.Array
    weight: jax.Array


def create(example: PyTree, rows: int, window: int = 1, prioritized: bool = False) -> Replay:
    """An empty buffer of ``rows`` rows shaped like ``example`` (one step of every
    environment: leaves ``[envs, ...]``), sampled in windows of ``window`` steps.

    Args:
        example: One step of every environment (leaves ``[envs, ...]``); only its
            shapes and dtypes are used.
        rows: Capacity in rows (steps of every environment).
        window: Consecutive steps of one environment per sampled item (``n`` for
            n-step returns); at most ``rows``.
        prioritized: Keep a sum tree of priorities for proportional sampling.

    Returns:
        The empty buffer, leaves ``[rows, envs, ...]``.

    Raises:
        ValueError: If ``window`` is not between 1 and ``rows``.
    """
    if not 1 <= window <= rows:
        raise ValueError(f"a replay buffer of {rows} rows cannot hold windows of {window} steps")
    items = jax.tree.map(lambda x: jnp.zeros((rows, *jnp.shape(x)), jnp.result_type(x)), example)
    buffer = Replay(items, jnp.int32(0), window=window)
    if not prioritized:
        return buffer
    width = 1 << int(np.ceil(np.log2(rows)))
    return buffer.replace(tree=_levels(jnp.zeros((width, buffer.envs), jnp.float32)), max_priority=jnp.float32(1.0))


def add(buffer: Replay, batch: PyTree) -> Replay:
    """``buffer`` with ``batch`` (leaves ``[steps, envs, ...]``) written as its next
    rows, overwriting the oldest once full. Prioritized: the windows completed by
    these rows get the largest priority seen, those not yet complete none.

    Args:
        buffer: The buffer to write to.
        batch: Time-major steps, leaves ``[steps, envs, ...]`` with ``steps`` at most
            the buffer's rows.

    Returns:
        The new buffer (the old one is unchanged: pure function).

    Raises:
        ValueError: If ``batch`` has more steps than the buffer has rows.
    """
    steps = jax.tree.leaves(batch)[0].shape[0]
    if steps > buffer.rows:
        raise ValueError(f"cannot add {steps} rows at once to a buffer of {buffer.rows} rows")
    rows = (buffer.added + jnp.arange(steps)) % buffer.rows
    items = jax.tree.map(lambda store, new: store.at[rows].set(new), buffer.items, batch)
    added = buffer.added + steps
    if not buffer.prioritized:
        return buffer.replace(items=items, added=added)
    leaves = buffer.tree[0].at[rows].set(0.0)
    starts = buffer.added - buffer.window + 1 + jnp.arange(steps)  # windows that end at a new row
    held = starts >= jnp.maximum(added - buffer.rows, 0)
    leaves = leaves.at[jnp.where(held, starts % buffer.rows, leaves.shape[0])].set(buffer.max_priority, mode="drop")
    return buffer.replace(items=items, added=added, tree=_levels(leaves))


def latest(buffer: Replay, steps: int) -> PyTree:
    """What adding the last ``steps`` rows changed: those rows' items, and for a
    prioritized buffer the sum tree's per-environment totals (every priority adds into
    them) and the largest priority. A check of these each time rows are added checks
    every value the buffer holds."""
    rows = (buffer.added - steps + jnp.arange(steps)) % buffer.rows
    return jax.tree.map(lambda store: store[rows], buffer.items), buffer.tree[-1:], buffer.max_priority


def sample(buffer: Replay, key: jax.Array, count: int, beta: jax.Array | float = 0.0) -> Sample:
    """``count`` windows drawn with replacement: uniformly, or, from a prioritized
    buffer, in proportion to priority with importance weights of exponent ``beta``.
    Draws are spread as the policy's ``shuffle`` says (module docstring).

    Args:
        buffer: The buffer to draw from; only windows already written are drawn.
        key: PRNG key.
        count: Windows to draw; with ``local`` sampling, a multiple of the devices the
            environments are split over.
        beta: Importance-weight exponent (prioritized buffers only).

    Returns:
        A ``Sample``: the windows (leaves ``[count, window, ...]``), their start rows
        and environments, and their importance weights.

    Raises:
        ConfigError: If the environments or ``count`` do not divide across the devices.
    """
    rule = primitives.current()
    shards = rule.local_shards
    for what, size in (("number of environments", buffer.envs), ("sample batch", count)):
        if size % shards:
            raise ConfigError("devices", shards, f"the {what} ({size}) does not divide across {shards} devices; "
                              "use a device count that divides it")
    per_shard, local_envs = count // shards, buffer.envs // shards
    keys = jax.random.split(key, shards)
    if buffer.prioritized:
        levels = [level.reshape(level.shape[0], shards, local_envs) for level in buffer.tree]
        row, env, prob = jax.vmap(_descend, (0, 1, None))(keys, levels, per_shard)
        leaves = levels[0]
        smallest = jnp.min(jnp.where(leaves > 0, leaves, jnp.inf), axis=(0, 2)) / leaves.sum(axis=(0, 2))
        weight = (prob / smallest.min()) ** -beta  # both within-shard probabilities: the 1/shards cancels
    else:
        row, env = jax.vmap(_uniform, (0, None, None, None))(keys, buffer, per_shard, local_envs)
        weight = jnp.ones((shards, per_shard), jnp.float32)
    offsets = jnp.arange(buffer.window)

    def gather(store: jax.Array) -> jax.Array:
        blocks = store.reshape(store.shape[0], shards, local_envs, *store.shape[2:])
        taken = jax.vmap(lambda b, r, e: b[(r[:, None] + offsets) % buffer.rows, e[:, None]], (1, 0, 0))(blocks, row, env)
        return rule.constrain(taken.reshape(count, buffer.window, *store.shape[2:]), 0)

    global_env = env + local_envs * jnp.arange(shards)[:, None]
    return Sample(jax.tree.map(gather, buffer.items), row.reshape(count), global_env.reshape(count),
                  weight.reshape(count))


def update_priorities(buffer: Replay, drawn: Sample, priorities: jax.Array, alpha: jax.Array | float) -> Replay:
    """``buffer`` with the windows of ``drawn`` given priorities ``priorities ** alpha``.

    Args:
        buffer: A prioritized buffer.
        drawn: What ``sample`` drew from it.
        priorities: One new priority per drawn window, ``[count]`` (typically the
            absolute TD error, plus a small constant so none is zero).
        alpha: Prioritization exponent (0: uniform).

    Returns:
        The buffer with the new priorities, and its largest priority seen updated.
    """
    scaled = jnp.asarray(priorities, jnp.float32) ** alpha
    shards = primitives.current().local_shards
    leaves = buffer.tree[0]
    local_envs = buffer.envs // shards
    blocks = leaves.reshape(leaves.shape[0], shards, local_envs)
    row, env, p = (x.reshape(shards, -1) for x in (drawn.row, drawn.env % local_envs, scaled))
    blocks = jax.vmap(lambda b, r, e, v: b.at[r, e].set(v), (1, 0, 0, 0), 1)(blocks, row, env, p)
    return buffer.replace(tree=_levels(blocks.reshape(leaves.shape)),
                          max_priority=jnp.maximum(buffer.max_priority, scaled.max()))


def _uniform(key: jax.Array, buffer: Replay, count: int, envs: int) -> tuple[jax.Array, jax.Array]:
    """Rows and environments of ``count`` uniformly drawn windows among ``envs`` environments."""
    k_row, k_env = jax.random.split(key)
    starts = jnp.maximum(buffer.size - buffer.window + 1, 1)
    oldest = buffer.added - buffer.size
    row = (oldest + jax.random.randint(k_row, (count,), 0, starts)) % buffer.rows
    return row, jax.random.randint(k_env, (count,), 0, envs)


def _descend(key: jax.Array, levels: list[jax.Array], count: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Stratified proportional draws from one shard's sum trees (levels ``[width, envs]``):
    rows, environments and each draw's probability within the shard."""
    totals = levels[-1][0]
    cumulative = jnp.cumsum(totals)
    targets = (jnp.arange(count) + jax.random.uniform(key, (count,))) * (cumulative[-1] / count)
    env = jnp.minimum(jnp.searchsorted(cumulative, targets, side="right"), totals.shape[0] - 1)
    targets = targets - (cumulative[env] - totals[env])
    row = jnp.zeros(count, jnp.int32)
    for level in reversed(levels[:-1]):  # from the root's children down to the leaves
        left, right = level[2 * row, env], level[2 * row + 1, env]
        go_right = (targets >= left) & (right > 0)  # never into an empty subtree on round-off
        targets = jnp.where(go_right, targets - left, targets)
        row = 2 * row + go_right
    return row, env, levels[0][row, env] / cumulative[-1]


def _levels(leaves: jax.Array) -> tuple[jax.Array, ...]:
    """The sum tree over the rows (axis 0, a power of two of them) of ``leaves``:
    leaves first, per-environment totals last."""
    levels = [leaves]
    while levels[-1].shape[0] > 1:
        level = levels[-1]
        levels.append(level.reshape(level.shape[0] // 2, 2, *level.shape[1:]).sum(axis=1))
    return tuple(levels)
