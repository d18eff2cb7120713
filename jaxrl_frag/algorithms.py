"""``Algorithm``: an RL algorithm as a pytree dataclass.

Static fields (shapes, counts, the environment) are declared with
``static_field`` and live in the pytree structure; every other field is a
traced hyperparameter, so a population can ``vmap`` over it and changing it
does not recompile. An algorithm is written for one device and the global
batch: no axis names, device counts or collectives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

PyTree = Any
Metrics = dict[str, jax.Array]
Flags = dict[str, jax.Array]


def static_field(default: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """A field that is part of the pytree structure, not a traced leaf."""
    return struct.field(pytree_node=False, default=default, metadata=metadata)


def hyperparameter(default: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """A traced field: a leaf of the algorithm pytree."""
    return struct.field(pytree_node=True, default=default, metadata=metadata)


class Algorithm:
    """Base of every algorithm; subclasses are ``flax.struct.dataclass`` pytrees."""

    def init(self, key: jax.Array) -> PyTree:
        """The training state at iteration 0."""
        raise NotImplementedError

    def step(self, state: PyTree) -> tuple[PyTree, Metrics]:
        """One training iteration: ``(state, metrics)`` with scalar metrics."""
        raise NotImplementedError

    def checked_step(self, state: PyTree) -> tuple[PyTree, Metrics, Flags]:
        """The iteration a run takes: ``step`` (from which the fragment graph is read), with
        the flags that a run checking finiteness stops at (the first iteration with one
        unset). By default ``step`` itself and ``finite_flags`` of its new state and
        metrics; a transform may also contain what went non-finite here."""
        state, metrics = self.step(state)
        return state, metrics, finite_flags(state, metrics, self.finite_part)

    def finite_part(self, field: str, value: PyTree) -> PyTree:
        """What a run checks for non-finite values in state field ``field`` (``value``, as
        an iteration left it): all of it by default. An algorithm whose field keeps what
        earlier iterations checked already (a replay buffer's older rows) gives what one
        iteration can have changed, so that the check costs that rather than the field."""
        del field
        return value

    def resumed(self, state: PyTree) -> PyTree:
        """The state a run restored from a checkpoint continues from: ``state`` itself,
        unless part of the training lives outside it (host environments, which start
        afresh). Called outside any transformation, on the restored state."""
        return state

    def failure(self) -> Exception | None:
        """What failed outside the compiled program, where something did (a host
        environment's worker, say): XLA reports such a failure as a runtime error of the
        program, and ``Program.run`` raises this instead. Taken once; none by default."""
        return None

    def counters(self) -> dict[str, float]:
        """Counts kept outside the compiled program (a host environment's restarted
        workers, say), added to each row by ``Program.run`` as they stand after its call;
        none by default."""
        return {}

    def finished(self, state: PyTree) -> jax.Array:
        """Whether the run is over before ``num_iterations`` (its budget spent): no
        iteration runs from a finished state. Never, by default."""
        return jnp.bool_(False)

    @property
    def named_axes(self) -> Mapping[str, Mapping[str, int]]:
        """Axes of the state besides the environment batch that a policy may split over a
        mesh axis of the same name: ``{name: {state field: axis}}``, say ``{"agents":
        {"params": 0}}`` for parameters stacked per agent. Within a field, the leaves with
        more dimensions than ``axis`` carry it (a counter stays whole). Empty by default."""
        return {}

    @property
    def steps_per_iteration(self) -> int:
        """Environment steps taken by one ``step`` (an algorithm whose iterations vary
        in size reports its running count as the metric ``env_steps_total``)."""
        raise NotImplementedError

    @property
    def num_iterations(self) -> int | None:
        """Iterations of a complete run, if the algorithm fixes it (e.g. for annealing)."""
        return None

    @property
    def iterations_vary(self) -> bool:
        """Whether iterations differ in size (then ``steps_per_iteration`` is the smallest,
        ``num_iterations`` the most, and a row of metrics is one iteration by default)."""
        return False

    def config(self) -> dict[str, Any]:
        """The resolved configuration, JSON-ready: every field but callables and environments."""
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if hasattr(value, "name") and not isinstance(value, str | int | float | bool):
                value = value.name
            elif callable(value):
                continue
            out[f.name] = plain(value)
        return out


class Wrapper(Algorithm):
    """Base of a transform: an algorithm around another (``inner``). The hooks that read
    no state are the inner algorithm's unless the transform overrides them; ``unwrap``
    takes a state apart (``innermost`` all the way)."""

    @property
    def inner(self) -> Algorithm:
        """The algorithm this one wraps."""
        raise NotImplementedError

    def unwrap(self, state: PyTree, member: int | None = None) -> tuple[Algorithm, PyTree]:
        """The inner algorithm and its part of ``state``; of a population (the algorithms
        and states stacked), member ``member``'s, which other transforms ignore."""
        raise NotImplementedError

    @property
    def steps_per_iteration(self) -> int:
        return self.inner.steps_per_iteration

    @property
    def num_iterations(self) -> int | None:
        return self.inner.num_iterations

    @property
    def iterations_vary(self) -> bool:
        return self.inner.iterations_vary

    @property
    def named_axes(self) -> Mapping[str, Mapping[str, int]]:
        return self.inner.named_axes

    def failure(self) -> Exception | None:
        return self.inner.failure()

    def finite_part(self, field: str, value: PyTree) -> PyTree:
        return self.inner.finite_part(field, value)

    def counters(self) -> dict[str, float]:
        return self.inner.counters()

    def config(self) -> dict[str, Any]:
        """The inner algorithm's configuration and this transform's settings (its fields with
        a ``help``), named ``NAME_SETTING`` by its ``name`` where it has one."""
        prefix = getattr(self, "name", "").replace("-", "_")
        own = {f"{prefix}_{f.name}" if prefix else f.name: plain(getattr(self, f.name))
               for f in dataclasses.fields(self) if "help" in f.metadata}  # type: ignore[arg-type]
        return {**self.inner.config(), **own}


def innermost(algorithm: Algorithm, state: PyTree, member: int | None = None) -> tuple[Algorithm, PyTree]:
    """The algorithm inside every transform around ``algorithm``, and its part of ``state``
    (of a population, member ``member``'s)."""
    while isinstance(algorithm, Wrapper):
        algorithm, state = algorithm.unwrap(state, member)
    return algorithm, state


@struct.dataclass
class FunctionAlgorithm(Algorithm):
    """An algorithm made by ``algorithm`` from an init function and a step function."""

    init_fn: Callable[..., PyTree] = static_field()
    step_fn: Callable[..., tuple[PyTree, Metrics]] = static_field()
    env_steps: int = static_field()
    iterations: int | None = static_field()
    hparams: PyTree = None

    def init(self, key: jax.Array) -> PyTree:
        return self.init_fn(key) if self.hparams is None else self.init_fn(key, self.hparams)

    def step(self, state: PyTree) -> tuple[PyTree, Metrics]:
        return self.step_fn(state) if self.hparams is None else self.step_fn(state, self.hparams)

    @property
    def steps_per_iteration(self) -> int:
        return self.env_steps

    @property
    def num_iterations(self) -> int | None:
        return self.iterations

    def config(self) -> dict[str, Any]:
        leaves = jax.tree_util.tree_leaves_with_path(self.hparams)
        return {
            "step": self.step_fn.__name__,
            **{jax.tree_util.keystr(p): plain(v) for p, v in leaves},
        }


def algorithm(
    *,
    init: Callable[..., PyTree],
    steps_per_iteration: int,
    num_iterations: int | None = None,
    hparams: PyTree = None,
) -> Callable[[Callable[..., tuple[PyTree, Metrics]]], FunctionAlgorithm]:
    """Turn a training-step function and ``init`` into an ``Algorithm``.

    ``init(key) -> state`` and ``step(state) -> (state, metrics)``; with
    ``hparams`` (a pytree of traced hyperparameters) they are called as
    ``init(key, hparams)`` and ``step(state, hparams)``.
    """

    def wrap(step: Callable[..., tuple[PyTree, Metrics]]) -> FunctionAlgorithm:
        return FunctionAlgorithm(init, step, steps_per_iteration, num_iterations, hparams)

    return wrap


def finite_flags(state: PyTree, metrics: Metrics, part: Callable[[str, PyTree], PyTree] | None = None) -> Flags:
    """For each state field (``"state.params"``, ...) and each metric (``"metrics.loss"``):
    whether every floating-point value in it is finite; of a field, every value in
    ``part(field, value)`` where ``part`` is given (``Algorithm.finite_part``)."""
    fields, _ = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda node: node is not state)
    checked = {field_name(path[0]): value if part is None else part(field_name(path[0]), value)
               for path, value in fields}
    zeros: dict[str, jax.Array] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path({"state": checked, "metrics": metrics}):
        if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            name = ".".join(field_name(k) for k in path[:2])
            # x * 0 is 0 for every finite x and NaN for NaN and infinities: a plain sum finds them
            # without overflowing, and fuses into the leaf's producer (few ops to compile)
            zeros[name] = zeros.get(name, 0.0) + jnp.sum(leaf * 0, dtype=jnp.float32)
    return {name: total == 0 for name, total in zeros.items()}


def setting_defaults(algorithm: Algorithm) -> dict[str, Any]:
    """The default of each of ``algorithm``'s settings that has one, JSON-ready as
    ``Algorithm.config`` writes its values, and those of the algorithms it wraps (a
    transform's configuration holds its algorithm's): what a configuration saved before
    the setting existed is read as holding (a setting is added with the default that keeps
    the behaviour the algorithm had without it)."""
    fields = dataclasses.fields(algorithm)  # type: ignore[arg-type]
    wrapped = [getattr(algorithm, f.name) for f in fields if isinstance(getattr(algorithm, f.name), Algorithm)]
    own = {f.name: plain(f.default) for f in fields if f.default is not dataclasses.MISSING and not callable(f.default)}
    return {k: v for inner in wrapped for k, v in setting_defaults(inner).items()} | own


def field_name(key: Any) -> str:
    """The name in one step of a pytree path (a dataclass field, dict key or index)."""
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def plain(value: Any) -> Any:
    """A JSON-ready copy: arrays (a population's stacked hyperparameters too) and tuples
    become lists or numbers."""
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return np.asarray(value).tolist() if hasattr(value, "shape") else value
