"""Full-state checkpoints with orbax: the whole training state, saved asynchronously and
atomically every N iterations, the last k kept, restored onto any mesh.

A step is written to a temporary directory and renamed when complete (orbax), so a
kill during a write leaves the previous steps intact. Each step also records a
fingerprint of the state (a wrapping integer sum of its bits, computed on device and
independent of the sharding); on restore a step that fails to load or to match its
fingerprint is reported, removed, and the step before it used.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxrl_frag.errors import check

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A restored training state: the state after ``iteration`` iterations, and what was
    saved with it (``meta["config"]`` is the run's resolved configuration)."""

    state: PyTree
    iteration: int
    meta: dict[str, Any]


class Checkpoints:
    """The checkpoint steps of one run, in ``directory``, named by iteration.

    ``every`` is the interval in iterations at which ``Program.run`` saves (it also
    saves at the end and when stopped); ``keep`` is how many steps are kept.
    """

    def __init__(self, directory: str | Path, every: int | None = None, keep: int = 3):
        check(every is None or every > 0, "checkpoint_every", every, "must be a positive iteration count")
        check(keep > 0, "keep_checkpoints", keep, "must keep at least one checkpoint")
        self.directory = Path(directory).absolute()
        self.every = every
        self.keep = keep
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def steps(self) -> list[int]:
        """The complete steps on disk, oldest first."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def save(self, iteration: int, state: PyTree, meta: dict[str, Any]) -> None:
        """Start writing ``state`` as step ``iteration``; returns once the arrays are
        copied off the devices, so the caller may donate them."""
        meta = {**meta, "iteration": iteration, "fingerprint": fingerprint(state)}
        self._manager.save(iteration, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                               meta=ocp.args.JsonSave(meta)))

    def wait(self) -> None:
        """Block until every started save is on disk."""
        self._manager.wait_until_finished()

    def restore(self, like: PyTree) -> Checkpoint | None:
        """The newest usable step, placed like ``like`` (arrays or ``ShapeDtypeStruct``s
        with shardings: any mesh); ``None`` if there is no step at all.

        A step that cannot be read, or whose contents do not match the fingerprint
        saved with it, is removed with a warning, and the one before it tried.
        """
        self.wait()
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
        for step in reversed(self.steps()):
            try:
                restored = self._manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
                state, meta = restored["state"], restored["meta"]
                problem = None if fingerprint(state) == meta["fingerprint"] else "its contents do not match its fingerprint"
            except Exception as error:
                problem = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
            if problem is None:
                return Checkpoint(state, int(meta["iteration"]), meta)
            warnings.warn(f"checkpoint step {step} in {self.directory} is unusable ({problem}); "
                          "removed it, trying the step before", stacklevel=2)
            self._manager.delete(step)
        return None

    def delete_after(self, iteration: int) -> None:
        """Remove the steps past ``iteration`` (a resumed run writes them again)."""
        for step in self.steps():
            if step > iteration:
                self._manager.delete(step)

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


@jax.jit
def _fingerprint(state: PyTree) -> jax.Array:
    total = jnp.uint32(0)
    for i, leaf in enumerate(jax.tree.leaves(state)):
        bits = _as_uint32(leaf)
        total = total + jnp.uint32(2 * i + 1) * jnp.sum(bits, dtype=jnp.uint32)
    return total


def fingerprint(state: PyTree) -> int:
    """A wrapping sum of the state's bits, leaf by leaf: the same for any sharding."""
    return int(np.asarray(jax.device_get(_fingerprint(state))))


def _as_uint32(x: jax.Array) -> jax.Array:
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    if x.dtype.itemsize == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if x.dtype.itemsize == 8:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if x.dtype.itemsize == 2:
        return jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    return x.astype(jnp.uint32)  # one-byte types
