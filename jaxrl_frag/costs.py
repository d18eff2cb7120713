"""FLOPs of a traced program, counting every loop iteration.

XLA's cost analysis counts the body of a loop once, whatever its trip count;
an RL step is mostly loops (environment steps, epochs, minibatches), so its
figure is far below the real work. This counter walks the jaxpr instead and
multiplies each ``scan`` body by its length: matrix products count
``2 * M * N * K``, every other primitive one operation per output element.
Loops whose trip count is only known at run time (``while``) count once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax.extend import core as jcore


def _size(aval: Any) -> int:
    return int(np.prod(getattr(aval, "shape", ()), dtype=np.int64))


def _dot_flops(eqn: Any) -> int:
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval
    contracted = int(np.prod([lhs.shape[d] for d in lhs_contract], dtype=np.int64))
    return 2 * _size(eqn.outvars[0].aval) * contracted


def flops(jaxpr: Any) -> int:
    """Floating-point operations of one evaluation of ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_flops(eqn)
        elif name == "scan":
            total += eqn.params["length"] * flops(eqn.params["jaxpr"])
        elif name == "cond":
            total += max(flops(branch) for branch in eqn.params["branches"])
        elif name == "while":
            total += flops(eqn.params["cond_jaxpr"]) + flops(eqn.params["body_jaxpr"])
        else:
            inner = [v for v in eqn.params.values() if isinstance(v, jcore.ClosedJaxpr | jcore.Jaxpr)]
            if inner:
                total += sum(flops(j) for j in inner)
            else:
                total += sum(_size(v.aval) for v in eqn.outvars)
    return total


def xla_cost(compiled: Any, of: str = "") -> dict[str, float]:
    """XLA's own FLOPs and bytes accessed for a compiled program (``of`` names it)."""
    analysis = compiled.cost_analysis() or {}
    if isinstance(analysis, list):  # older jax: one dict per computation
        analysis = analysis[0] if analysis else {}
    where = f", {of}" if of else ""
    return {f"XLA {k} (loop bodies once{where})": float(analysis[k]) for k in ("flops", "bytes accessed") if k in analysis}


def xla_memory(compiled: Any, of: str = "") -> dict[str, int]:
    """XLA's memory figures for a compiled program (``of`` names it)."""
    mem = compiled.memory_analysis()
    where = f" ({of})" if of else ""
    return {} if mem is None else {
        f"argument bytes{where}": mem.argument_size_in_bytes,
        f"output bytes{where}": mem.output_size_in_bytes,
        f"temporary bytes{where}": mem.temp_size_in_bytes,
    }
