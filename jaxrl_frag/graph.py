"""``FragmentGraph``: the fragments of a traced step and the data between them.

Recovered from the jaxpr of one training step: every equation that is a
fragment call becomes a node; every other equation is glue that passes on where
its inputs came from. An edge joins the producer of a value (a fragment's
result, or the incoming training state) to the fragment or output that consumes
it, with the shapes, dtypes and bytes that cross it once per iteration. Values
entering the step are named by their argument and field (``state.params``,
``algorithm.lr``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
from jax.extend import core as jcore

from jaxrl_frag import costs
from jaxrl_frag.fragments import Fragment, lookup

STATE = "state"  # the training state leaving the step
METRICS = "metrics"  # the metrics leaving it


def _port(path: str) -> str:
    """The top-level name in a debug path such as ``"traj['obs']"`` or ``"result[0].x"``."""
    return re.split(r"[.\[]", path, maxsplit=1)[0]


def _result_index(path: str) -> int | None:
    m = re.match(r"result\[(\d+)\]", path)
    return int(m.group(1)) if m else None


def _result_key(path: str) -> str | None:
    m = re.match(r"result\['([^']+)'\]", path)
    return m.group(1) if m else None


def _nbytes(aval: Any) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def describe_aval(aval: Any) -> str:
    """An abstract value as ``dtype[shape]``, e.g. ``float32[128,4]``."""
    return f"{np.dtype(aval.dtype).name}[{','.join(map(str, aval.shape))}]"


@dataclasses.dataclass(frozen=True)
class Node:
    """One fragment call: its traced name (``"<role>.<function name>"``), role, input and
    output names, the declared batch axes of its arguments and results, and its FLOPs
    per call."""

    name: str
    role: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    batched: dict[str, int]
    flops: int


@dataclasses.dataclass
class Edge:
    """Data from ``src.src_port`` to ``dst.dst_port``, once per iteration: the leaves'
    ``dtype[shape]``, their bytes, and the axis that carries the environment batch
    (``None``: replicated). From an argument of the step, ``src`` is its name
    (``"state"``, ``"algorithm"``); into its results, ``dst`` is ``"state"`` or
    ``"metrics"``."""

    src: str
    src_port: str
    dst: str
    dst_port: str
    leaves: list[str] = dataclasses.field(default_factory=list)
    nbytes: int = 0
    batch_axis: int | None = None

    @property
    def label(self) -> str:
        """``"src.port -> dst.port"``."""

        def end(name: str, port: str) -> str:
            return f"{name}.{port}" if port else name

        return f"{end(self.src, self.src_port)} -> {end(self.dst, self.dst_port)}"


@dataclasses.dataclass
class FragmentGraph:
    """Fragments (nodes, in execution order) and the values that flow between them
    (edges); ``producers`` maps each output of the step (``"state.params"``,
    ``"metrics.loss"``) to the fragments its value comes from."""

    nodes: list[Node]
    edges: list[Edge]
    producers: dict[str, set[str]] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_jaxpr(cls, closed: Any) -> FragmentGraph:
        """The graph of a traced step, ``jax.make_jaxpr(step)(algorithm, state)``.

        Args:
            closed: The closed jaxpr of one step, traced with the argument names
                ``algorithm`` and ``state`` (the names label the edges).

        Returns:
            The fragments in execution order, the data between them with its bytes, and
            which fragments each output of the step comes from.
        """
        jaxpr = closed.jaxpr
        sources: dict[Any, set[tuple[str, str]]] = {}
        for v, path in zip(jaxpr.invars, jaxpr.debug_info.safe_arg_names(len(jaxpr.invars)), strict=True):
            parts = [p for p in re.split(r"[.\[\]']+", path or "") if p] or [STATE]
            sources[v] = {(parts[0], parts[1] if len(parts) > 1 else "")}
        nodes: list[Node] = []
        edges: dict[tuple[str, str, str, str], Edge] = {}
        seen: set[tuple[tuple[str, str, str, str], Any]] = set()
        batch_axes: dict[tuple[str, str], int | None] = {}

        def connect(var: Any, dst: str, dst_port: str, axis: int | None) -> None:
            if isinstance(var, jcore.Literal):
                return
            for src, src_port in sorted(sources.get(var, ())):
                key = (src, src_port, dst, dst_port)
                edge = edges.setdefault(key, Edge(src, src_port, dst, dst_port, batch_axis=axis))
                if edge.batch_axis is None:
                    edge.batch_axis = batch_axes.get((src, src_port))
                if (key, var) not in seen:
                    seen.add((key, var))
                    edge.leaves.append(describe_aval(var.aval))
                    edge.nbytes += _nbytes(var.aval)

        for eqn, frag in fragment_calls(jaxpr):
            if frag is None:  # glue: outputs come from wherever the inputs came from
                origin = set().union(*(sources.get(v, set()) for v in eqn.invars if not isinstance(v, jcore.Literal)))
                for v in eqn.outvars:
                    sources[v] = origin
                continue
            inner = eqn.params["jaxpr"].jaxpr
            arg_names = inner.debug_info.safe_arg_names(len(eqn.invars))
            arg_ports = [_port(n) if n else f"in{i}" for i, n in enumerate(arg_names)]
            out_ports = output_ports(eqn, frag)
            for v, port in zip(eqn.invars, arg_ports, strict=True):
                connect(v, frag.node_name, port, frag.batch_axis(port))
            for v, port in zip(eqn.outvars, out_ports, strict=True):
                sources[v] = {(frag.node_name, port)}
                batch_axes[(frag.node_name, port)] = frag.batch_axis(port)
            nodes.append(
                Node(
                    frag.node_name, frag.role, tuple(dict.fromkeys(arg_ports)), tuple(dict.fromkeys(out_ports)),
                    dict(frag.batched), costs.flops(inner),
                )
            )

        result_paths = jaxpr.debug_info.safe_result_paths(len(jaxpr.outvars))
        fragment_names = {n.name for n in nodes}
        producers: dict[str, set[str]] = {}
        for v, path in zip(jaxpr.outvars, result_paths, strict=True):
            fields = [p for p in re.split(r"[.\[\]']+", path or "") if p]
            if _result_index(path) == 1:
                connect(v, METRICS, "", None)
                output = f"{METRICS}.{fields[2]}" if len(fields) > 2 else METRICS
            else:
                connect(v, STATE, fields[2] if len(fields) > 2 else "", None)
                output = f"{STATE}.{fields[2]}" if len(fields) > 2 else STATE
            origin = {src for src, _ in sources.get(v, ()) if src in fragment_names}
            producers.setdefault(output, set()).update(origin)
        kept = [e for e in edges.values() if e.src in fragment_names or e.dst in fragment_names]
        return cls(nodes, _merge_inputs(kept), producers)

    def first_producer(self, outputs: list[str]) -> str | None:
        """The first fragment, in execution order, that produces one of the step's
        ``outputs`` (``"state.params"``, ``"metrics.loss"``), if any does.

        Args:
            outputs: Outputs of the step, as ``"state.<field>"`` or ``"metrics.<name>"``.

        Returns:
            The fragment's node name (``"learner.update"``), or ``None``.
        """
        makers = set().union(*(self.producers.get(o, set()) for o in outputs))
        return next((n.name for n in self.nodes if n.name in makers), None)

    def edges_between(self, src_role: str, dst_role: str) -> list[Edge]:
        """The edges from fragments of role ``src_role`` to fragments of role ``dst_role``."""
        roles = {n.name: n.role for n in self.nodes}
        return [e for e in self.edges if roles.get(e.src) == src_role and roles.get(e.dst) == dst_role]

    def __str__(self) -> str:
        lines = [f"fragments ({len(self.nodes)}):"]
        for n in self.nodes:
            batched = [p for p in dict.fromkeys((*n.inputs, *n.outputs)) if p in n.batched]
            lines.append(
                f"  {n.role:<9} {n.name:<24} {n.flops:.3g} flops  in: {', '.join(n.inputs)}  out: {', '.join(n.outputs)}"
                + (f"  [env-batched: {', '.join(batched)}]" if batched else "")
            )
        lines.append("data per iteration:")
        for e in self.edges:
            axis = "replicated" if e.batch_axis is None else f"env batch on axis {e.batch_axis}"
            shapes = ", ".join(e.leaves[:4]) + (f", ... ({len(e.leaves)} arrays)" if len(e.leaves) > 4 else "")
            lines.append(f"  {e.label:<52} {format_bytes(e.nbytes):>10}  {axis:<22} {shapes}")
        return "\n".join(lines)


def _merge_inputs(edges: list[Edge]) -> list[Edge]:
    """One edge per step argument and destination: the fields of a hyperparameter
    dataclass feeding a bound fragment's ``self`` become one edge."""
    merged: dict[tuple[str, str, str], Edge] = {}
    for e in edges:
        key = (e.src, e.dst, e.dst_port)
        if key in merged:
            m = merged[key]
            m.src_port, m.leaves, m.nbytes = "", m.leaves + e.leaves, m.nbytes + e.nbytes
        else:
            merged[key] = dataclasses.replace(e, leaves=list(e.leaves))
    return list(merged.values())


def output_ports(eqn: Any, frag: Fragment) -> list[str]:
    """The output name (``"traj"``, ``"params"``) of each result of fragment call ``eqn``."""
    paths = eqn.params["jaxpr"].jaxpr.debug_info.safe_result_paths(len(eqn.outvars))
    if not any(paths):  # a call jax.vmap batched keeps no result paths: the fragment's trace has them
        paths = frag.result_paths([v.aval for v in eqn.outvars]) or paths
    ports = []
    for position, path in enumerate(paths):
        key, index = _result_key(path), _result_index(path)
        if index is None:  # one returned value, not a tuple: all its leaves are the one output
            index = 0 if len(frag.outputs) == 1 else position
        ports.append(key if key is not None else frag.output_name(index))
    return ports


def fragment_calls(jaxpr: Any) -> Iterator[tuple[Any, Fragment | None]]:
    """Each equation of ``jaxpr`` with the fragment it calls, or ``None`` for glue."""
    for eqn in jaxpr.eqns:
        name = eqn.params.get("name") if eqn.primitive.name in ("jit", "pjit") else None
        yield eqn, (lookup(name) if isinstance(name, str) else None)


def format_bytes(n: float) -> str:
    """``n`` bytes in B, KiB, MiB or GiB, e.g. ``"1.5 MiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
