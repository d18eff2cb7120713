"""Full-state checkpoints with orbax: the whole training state, saved asynchronously and
atomically every N iterations, the last k kept, restored onto any mesh.

Arrays with no elements (an action mask of no actions, say) hold nothing to write and
orbax refuses them: a step leaves them out, and a restore makes them again from the
target's shapes.

A step is written to a temporary directory and renamed when complete (orbax), so a
kill during a write leaves the previous steps intact. Each step also records a
fingerprint of the state (a wrapping integer sum of its bits, computed on device and
independent of the sharding); on restore a step that fails to load or to match its
fingerprint is reported, moved aside to ``<directory>.damaged/``, and the step before
it used.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import logging
import os
import shutil
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from jaxrl_frag.errors import check
from jaxrl_frag.writes import WriteError

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

    Args:
        directory: Where the steps are written (created if missing); unusable steps
            are moved to ``<directory>.damaged/``.
        every: Save every this many iterations (a multiple of the program's
            ``chunk_iterations``); ``None``: only at the end and when stopped.
        keep: How many of the newest steps to keep.

    Raises:
        ConfigError: If ``every`` is not positive or ``keep`` is below one.
    """

    def __init__(self, directory: str | Path, every: int | None = None, keep: int = 3):
        check_settings(every, keep)
        self.directory = Path(directory).absolute()
        self.every = every
        self.keep = keep
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))
        _quiet_stragglers()

    def steps(self) -> list[int]:
        """The complete steps on disk, oldest first."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def save(self, iteration: int, state: PyTree, meta: dict[str, Any]) -> None:
        """Start writing ``state`` as step ``iteration``; returns once the arrays are
        copied off the devices, so the caller may donate them.

        Args:
            iteration: The iteration the state is at; names the step.
            state: The training state (any pytree of arrays, sharded or not).
            meta: JSON-ready data saved with it (``Program.run`` saves the
                configuration, the rows of metrics and a chunk in progress).
        """
        meta = {**meta, "iteration": iteration, "fingerprint": fingerprint(state)}
        if jax.process_index() == 0:
            self._check_writable()
        self._manager.save(iteration, args=ocp.args.Composite(state=ocp.args.StandardSave(_without_empty(state)),
                                                               meta=ocp.args.JsonSave(meta)))

    def _check_writable(self) -> None:
        """Raise ``WriteError`` naming the directory unless a step can be made in it: orbax
        makes the step's folder in a thread of its own, and where that fails, its other
        threads wait for the folder forever (the process cannot end)."""
        if os.path.lexists(self.directory) and not self.directory.is_dir():
            raise WriteError(errno.ENOTDIR, "a file is there, not a folder of checkpoints", str(self.directory))
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise WriteError(error.errno, error.strerror or str(error), str(self.directory)) from error
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise WriteError(errno.EACCES, os.strerror(errno.EACCES), str(self.directory))

    def wait(self) -> None:
        """Block until every started save is on disk."""
        self._manager.wait_until_finished()

    def restore(self, like: PyTree, read_only: bool = False) -> Checkpoint | None:
        """The newest usable step, placed like ``like`` (arrays or ``ShapeDtypeStruct``s
        with shardings: any mesh); ``None`` if there is no step at all.

        A step that cannot be read, or whose contents do not match the fingerprint
        saved with it, is moved aside (``damaged``) with a warning, and the one before
        it tried.

        Args:
            like: The state's structure, shapes, dtypes and target shardings.
            read_only: Leave the steps as they are: an unusable one is skipped with the
                warning, not moved aside (to read a run that another process may be writing).

        Returns:
            The restored ``Checkpoint``, or ``None`` where no step is usable.
        """
        self.wait()
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
        for step in reversed(self.steps()):
            try:
                restored = self._manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(_without_empty(abstract)), meta=ocp.args.JsonRestore()))
                state, meta = _with_empty(abstract, restored["state"]), restored["meta"]
                problem = None if fingerprint(state) == meta["fingerprint"] else "its contents do not match its fingerprint"
            except Exception as error:
                problem = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
            if problem is None:
                return Checkpoint(state, int(meta["iteration"]), meta)
            where = "left it in place" if read_only else f"moved it to {self._set_aside(step)}"
            warnings.warn(f"checkpoint step {step} in {self.directory} is unusable ({problem}); "
                          f"{where}, trying the step before", stacklevel=2)
        return None

    def saved_tree(self) -> PyTree:
        """The newest step's state as it was saved: orbax's metadata of each array (its
        shape and dtype), in nested dicts and lists (orbax's containers, not the state's)."""
        step = self.steps()[-1]
        return ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "state").tree

    @property
    def damaged(self) -> Path:
        """Where unusable steps are moved (kept for inspection, out of orbax's way)."""
        return damaged_directory(self.directory)

    def damaged_steps(self) -> list[int]:
        """The steps moved aside as unusable (by this run or an earlier one), oldest first."""
        names = (p.name.partition("-")[0] for p in self.damaged.iterdir()) if self.damaged.is_dir() else ()
        return sorted(int(name) for name in names if name.isdigit())

    def _set_aside(self, step: int) -> Path:
        target = self.damaged / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
        if jax.process_index() == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(self.directory / str(step), target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"jaxrl_frag: set aside checkpoint step {step}")
        self._manager.reload()
        return target

    def delete_after(self, iteration: int) -> None:
        """Remove the steps past ``iteration`` (a resumed run writes them again)."""
        for step in self.steps():
            if step > iteration:
                self._manager.delete(step)

    def close(self) -> None:
        """Wait for the saves started, then stop orbax's threads; raises what a save failed with."""
        try:
            self._manager.wait_until_finished()
        finally:
            self._manager.close()


def _quiet_stragglers() -> None:
    """From now on, drop the reports of orbax's reads and writes that outlive a failed
    restore or save: tensorstore's unraisable ``RuntimeError("Event loop is closed")`` for
    each (dozens per damaged step or failed save), and asyncio's "Task (or _GatheringFuture)
    exception was never retrieved". The failure itself reaches the caller; any other report goes on as before."""
    logging.getLogger("asyncio").addFilter(_not_an_orbax_task)
    previous = sys.unraisablehook
    if getattr(previous, "__name__", None) == "_drop_closed_loop_reports":
        return

    def _drop_closed_loop_reports(unraisable: Any) -> None:
        error = unraisable.exc_value
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
            previous(unraisable)

    sys.unraisablehook = _drop_closed_loop_reports


def _not_an_orbax_task(record: logging.LogRecord) -> bool:
    """Whether ``record`` is other than asyncio's report of an orbax task (or a gathering
    of them) whose exception nobody retrieved: the message or its traceback names orbax."""
    message = record.getMessage()
    if not message.startswith(("Task exception was never retrieved", "_GatheringFuture exception was never retrieved")):
        return True
    trace = "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else ""
    return "orbax" not in message + trace


def _without_empty(tree: PyTree) -> PyTree:
    """``tree`` with its arrays of no elements as ``None`` (orbax writes no such array)."""
    return jax.tree.map(lambda x: None if 0 in x.shape else x, tree)


def _with_empty(like: PyTree, tree: PyTree) -> PyTree:
    """``tree`` read from a step, with the arrays of no elements it left out made again like ``like``'s."""
    return jax.tree.map(lambda x, y: jax.device_put(np.zeros(x.shape, x.dtype), x.sharding) if y is None else y,
                        like, tree)


def damaged_directory(directory: Path) -> Path:
    """Where the unusable steps of the checkpoints in ``directory`` are moved."""
    return directory.with_name(directory.name + ".damaged")


def check_settings(every: int | None, keep: int, chunk_iterations: int | None = None) -> None:
    """Raise ``ConfigError`` for a checkpoint interval that is not a positive multiple of
    ``chunk_iterations`` (saves happen between chunks), or ``keep`` below one.

    Args:
        every: The checkpoint interval in iterations, or ``None`` for none.
        keep: How many steps to keep.
        chunk_iterations: The program's iterations per chunk, if known.

    Raises:
        ConfigError: Naming the setting, its value and the fix.
    """
    check(every is None or every > 0, "checkpoint_every", every, "must be a positive iteration count")
    if every is not None and chunk_iterations:
        check(every % chunk_iterations == 0, "checkpoint_every", every,
              f"must be a multiple of chunk_iterations ({chunk_iterations}), e.g. "
              f"{max(1, every // chunk_iterations) * chunk_iterations}")
    check(keep > 0, "keep_checkpoints", keep, "must keep at least one checkpoint")


def changed_settings(saved: dict[str, Any], now: dict[str, Any], ignore: Sequence[str] = (),
                     defaults: dict[str, Any] | None = None) -> dict[str, str]:
    """The settings that differ between a saved configuration and ``now`` (compared as
    JSON, so tuples equal lists), other than ``ignore``: name -> ``"name: old -> new"``.
    A setting that ``saved`` does not name (one added since it was saved) counts as its
    entry in ``defaults`` (``algorithms.setting_defaults``), so a run saved before a setting
    existed continues where the setting is at its default.

    Args:
        saved: The configuration a checkpoint was saved with (``meta["config"]``).
        now: The current one (``Algorithm.config()``).
        ignore: Settings allowed to change.
        defaults: The settings' defaults.

    Returns:
        One ``"name: old -> new"`` line per differing setting, by name; empty if none.
    """
    now, defaults = json.loads(json.dumps([now, defaults or {}], default=str))
    saved = {**{k: v for k, v in defaults.items() if k in now}, **saved}
    names = sorted(k for k in (saved.keys() | now.keys()) - set(ignore) if saved.get(k) != now.get(k))
    return {k: f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in names}


@functools.partial(jax.jit, static_argnums=0)
def _fingerprint(indices: tuple[int, ...], leaves: list[jax.Array]) -> jax.Array:
    total = jnp.uint32(0)
    for i, leaf in zip(indices, leaves, strict=True):
        bits = _as_uint32(leaf)
        total = total + jnp.uint32(2 * i + 1) * jnp.sum(bits, dtype=jnp.uint32)
    return total


def fingerprint(state: PyTree) -> int:
    """A wrapping sum of the state's bits, leaf by leaf: the same for any sharding. Leaves
    on different sets of devices (``ActorLearner``'s groups) are summed apart."""
    groups: dict[frozenset[Any], list[int]] = {}
    leaves = jax.tree.leaves(state)
    for i, leaf in enumerate(leaves):
        groups.setdefault(frozenset((getattr(leaf, "sharding", None) and leaf.sharding.device_set) or ()), []).append(i)
    parts = [_fingerprint(tuple(ix), [leaves[i] for i in ix]) for ix in groups.values()]
    return sum(int(np.asarray(p)) for p in jax.device_get(parts)) % 2**32


def _as_uint32(x: jax.Array) -> jax.Array:
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    if x.dtype.itemsize in (4, 8):  # an 8-byte value becomes two words on a new last axis
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if x.dtype.itemsize == 2:
        return jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    return x.astype(jnp.uint32)  # one-byte types
