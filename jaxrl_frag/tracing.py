"""Tracing an algorithm's init and step under a policy's lowering of the primitives."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from jaxrl_frag import primitives
from jaxrl_frag.algorithms import Algorithm, Flags
from jaxrl_frag.errors import ConfigError
from jaxrl_frag.graph import STATE, FragmentGraph
from jaxrl_frag.metrics import Metrics

PyTree = Any


def init(algorithm: Algorithm, key: jax.Array) -> PyTree:
    return algorithm.init(key)


def step(algorithm: Algorithm, state: PyTree) -> tuple[PyTree, Metrics]:
    return algorithm.step(state)


def checked_step(algorithm: Algorithm, state: PyTree) -> tuple[PyTree, Metrics, Flags]:
    return algorithm.checked_step(state)


def resumed(algorithm: Algorithm, state: PyTree) -> PyTree:
    """``Algorithm.resumed``, as a function of the algorithm (jit's first argument)."""
    return algorithm.resumed(state)


def under(rule: primitives.Lowering, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` tracing the primitives under ``rule``. A new function object each time,
    so that jit's trace cache never serves a trace made under another rule."""

    @functools.wraps(fn)  # keeps the argument names that the graph reads back
    def traced(*args: Any) -> Any:
        with primitives.lowering(rule):
            return fn(*args)

    traced.__name__ = getattr(fn, "__name__", "run_iterations")
    return traced


def batch_axes(traced_step: Any) -> dict[str, int]:
    """The state fields that fragments declare environment-batched, with their axes,
    from the jaxpr of a step.

    Raises ``ConfigError`` for a field that a fragment writes environment-batched but no
    fragment reads as batched: a policy that splits the batch would keep it whole on
    every device (every device stepping every environment) while the rest is split.
    """
    graph = FragmentGraph.from_jaxpr(traced_step)
    axes = {e.src_port: e.batch_axis for e in graph.edges if e.src == STATE and e.batch_axis is not None}
    for e in graph.edges:
        if e.dst == STATE and e.batch_axis is not None and e.dst_port not in axes:
            raise ConfigError(
                f"state.{e.dst_port}", e.src, f"is written environment-batched (axis {e.batch_axis} of its output "
                f"{e.src_port!r}) but no fragment reads it as batched, so a policy that splits the batch would keep "
                f"it whole on every device: declare it in the batched= of the fragment that reads it, e.g. "
                f"@fragment(..., batched={{{e.dst_port!r}: {e.batch_axis}}})")
    return axes
