"""``fragment``: a pure function with a role, traced as a named node.

A fragment call is a nested ``jax.jit`` named ``"<role>.<function name>"`` (with a
suffix that keeps it unique where two fragments share that name).
XLA inlines it, so it costs nothing at run time, but it stays a distinct
equation in the traced program, with its arguments' and results' names in its
debug info: that is what ``FragmentGraph`` reads back. ``jax.vmap`` (a population)
drops the results' names from a call it batches; the fragment keeps those of each
structure it was traced with (``result_paths``) to name them again.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax

from jaxrl_frag import primitives

_BY_NAME: dict[str, Fragment] = {}


def node_name(role: str, fn: Callable[..., Any]) -> str:
    """The name a fragment shows in graphs and messages: ``"<role>.<function name>"``."""
    return f"{role}.{fn.__name__}"


def lookup(jit_name: str) -> Fragment | None:
    """The fragment whose traced node carries ``jit_name``, if any."""
    return _BY_NAME.get(jit_name)


@dataclasses.dataclass(frozen=True, eq=False)
class Fragment:
    """A pure function with a role and a declaration of its environment-batch axes.

    ``batched`` maps argument and result names to the axis that carries the
    environment batch; every other value is replicated (parameters, keys,
    hyperparameters). Results are named by ``outputs`` (positions of a returned
    tuple) or by the keys of a returned dict.

    Made by ``fragment``, not directly. Calling it calls ``fn`` as a named ``jax.jit``
    under the current lowering of the primitives, keeping the declared batched values
    split at its boundary. Used as a method (declared in a class body), it binds the
    instance as the first argument.

    Attributes:
        fn: The function.
        role: Its role (``"actor"``, ``"learner"``, ``"buffer"``, ...).
        batched: Argument and result names -> the axis of the environment batch.
        outputs: The names of the results of a function that returns a tuple.
        jit_name: The traced node's name: ``node_name``, made unique among fragments
            if need be.
    """

    fn: Callable[..., Any]
    role: str
    batched: Mapping[str, int]
    outputs: tuple[str, ...]
    jit_name: str  # the traced node's name: ``node_name``, made unique among fragments if need be

    @property
    def name(self) -> str:
        """The function's name."""
        return self.fn.__name__

    @property
    def node_name(self) -> str:
        """``"<role>.<function name>"``: its name in graphs and messages."""
        return node_name(self.role, self.fn)

    @functools.cached_property
    def _jitted(self) -> dict[primitives.Lowering, Callable[..., Any]]:
        return {}

    @functools.cached_property
    def _traced_results(self) -> dict[tuple[Leaf, ...], tuple[str, ...]]:
        """The result paths of each result structure traced, by its leaves' shapes and dtypes."""
        return {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # one jit per lowering of the primitives: jit's trace cache must not hand a
        # single-device trace to a sharded program
        rule = primitives.current().for_role(self.role)
        if rule not in self._jitted:
            signature = inspect.signature(self.fn)

            @functools.wraps(self.fn)
            def body(*args: Any, **kwargs: Any) -> Any:
                # declared environment-batched values stay split at the fragment's boundary
                bound = signature.bind(*args, **kwargs)
                for name, axis in self.batched.items():
                    if name in bound.arguments:
                        bound.arguments[name] = rule.constrain_tree(bound.arguments[name], axis)
                with primitives.lowering(rule):
                    results = self._constrain_results(rule, self.fn(*bound.args, **bound.kwargs))
                leaves = jax.tree_util.tree_leaves_with_path(results)
                self._traced_results[tuple(_leaf(x) for _, x in leaves)] = tuple(
                    f"result{jax.tree_util.keystr(path)}" for path, _ in leaves)
                return results

            body.__name__ = body.__qualname__ = self.jit_name
            self._jitted[rule] = jax.jit(body)
        return self._jitted[rule](*args, **kwargs)

    def _constrain_results(self, rule: primitives.Lowering, results: Any) -> Any:
        if isinstance(results, dict):
            return {k: rule.constrain_tree(v, self.batched[k]) if k in self.batched else v for k, v in results.items()}
        if isinstance(results, tuple) and self.outputs:
            return tuple(
                rule.constrain_tree(v, self.batched[name]) if (name := self.output_name(i)) in self.batched else v
                for i, v in enumerate(results)
            )
        return results

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        # used as a method: bind the instance (an algorithm pytree) as the first argument
        return self if instance is None else functools.partial(self, instance)

    def result_paths(self, avals: list[Any]) -> tuple[str, ...] | None:
        """The paths (``"result[0]['obs']"``, as jax's debug info writes them) of results
        with ``avals``, each maybe with the batch axes a ``vmap`` inserted, as this
        fragment's trace of that structure named them; ``None`` where none matches."""
        for leaves, paths in self._traced_results.items():
            if len(leaves) == len(avals) and all(map(_batched_from, avals, leaves)):
                return paths
        return None

    def output_name(self, index: int) -> str:
        """The name of result ``index`` of a returned tuple (``"out<index>"`` where ``outputs`` names none)."""
        return self.outputs[index] if index < len(self.outputs) else f"out{index}"

    def batch_axis(self, name: str) -> int | None:
        """The environment-batch axis of argument or result ``name``; ``None`` if replicated."""
        return self.batched.get(name)


Leaf = tuple[tuple[int, ...], str]  # a result's shape and dtype


def _leaf(x: Any) -> Leaf:
    return tuple(x.shape), str(x.dtype)


def _batched_from(aval: Any, leaf: Leaf) -> bool:
    """Whether ``aval`` is ``leaf`` with batch axes, or none, inserted anywhere."""
    shape, dtype = leaf
    sizes = iter(aval.shape)
    return str(aval.dtype) == dtype and all(size in sizes for size in shape)  # a subsequence of aval's shape


def fragment(
    role: str,
    *,
    batched: Iterable[str] | Mapping[str, int] = (),
    outputs: Iterable[str] = (),
) -> Callable[[Callable[..., Any]], Fragment]:
    """Declare a pure function as a fragment with ``role`` ("actor", "learner", ...).

    ``batched`` names the arguments and results that carry the environment batch,
    on axis 0, or maps each name to its axis; ``outputs`` names the results of a
    function that returns a tuple.

    Args:
        role: The fragment's role, an identifier (``"actor"``, ``"learner"``,
            ``"buffer"``, ``"evaluator"``, ...). Policies place fragments by role.
        batched: The names of arguments and results that carry the environment batch
            on axis 0, or a mapping from each such name to its axis (``{"traj": 1}``
            for a time-major trajectory). Every other value is replicated.
        outputs: The names of the results, in order, where the function returns a
            tuple (a function returning a dict is named by its keys).

    Returns:
        A decorator that turns the function (or method) into a ``Fragment``.

    Raises:
        ValueError: If ``role`` is not an identifier, or ``outputs`` is given and
            ``batched`` names something that is neither an argument nor an output.
    """
    if not (isinstance(role, str) and role.isidentifier()):
        raise ValueError(f"fragment role must be an identifier such as 'actor' or 'learner', got {role!r}")
    axes = dict(batched) if isinstance(batched, Mapping) else {name: 0 for name in batched}
    out_names = tuple(outputs)

    def wrap(fn: Callable[..., Any]) -> Fragment:
        params = inspect.signature(fn).parameters
        unknown = set(axes) - set(params) - set(out_names)
        if unknown and out_names:
            raise ValueError(
                f"fragment {fn.__name__}: batched names {sorted(unknown)} are neither arguments nor outputs"
            )
        name = node_name(role, fn)
        jit_name = name if name not in _BY_NAME else f"{name}_{len(_BY_NAME)}"
        frag = Fragment(fn, role, axes, out_names, jit_name)
        _BY_NAME[jit_name] = frag
        return frag

    return wrap
