"""FLOPs of a traced program, counting every loop iteration; the memory a program needs,
against what its devices have.

XLA's cost analysis counts the body of a loop once, whatever its trip count;
an RL step is mostly loops (environment steps, epochs, minibatches), so its
figure is far below the real work. This counter walks the jaxpr instead and
multiplies each ``scan`` body by its length: matrix products count
``2 * M * N * K``, every other primitive one operation per output element.
Loops whose trip count is only known at run time (``while``) count once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from jaxrl_frag.errors import ConfigError


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


def available_memory(device: jax.Device) -> int | None:
    """Bytes a program may use on ``device``: its allocator's limit on an accelerator, the
    host's available memory on CPU (which every CPU device shares); ``None`` where unknown."""
    if device.platform != "cpu":
        return (device.memory_stats() or {}).get("bytes_limit")
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def state_bytes(algorithm: Any) -> int:
    """Bytes of ``algorithm``'s training state, from its shapes alone (nothing is compiled)."""
    shapes = jax.eval_shape(algorithm.init, jax.ShapeDtypeStruct((2,), jnp.uint32))
    return sum(_size(leaf) * leaf.dtype.itemsize for leaf in jax.tree.leaves(shapes))


def program_bytes(compiled: Any) -> int | None:
    """Bytes a compiled program holds on each of its devices while it runs, from XLA's
    memory analysis: arguments, outputs and temporaries, less the outputs that reuse
    (donated) arguments; ``None`` where XLA gives no analysis."""
    mem = compiled.memory_analysis()
    if mem is None:
        return None
    return mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes - mem.alias_size_in_bytes


def check_state_fits(algorithm: Any, copies: int, fix: str) -> None:
    """Refuse ``copies`` of ``algorithm``'s training state (a population's members) that
    exceed the memory of all the run's devices together, before anything is compiled
    (XLA aborts the process compiling absurd sizes); ``fix`` says what to change."""
    devices = jax.local_devices()
    limits = [available_memory(d) for d in (devices[:1] if devices[0].platform == "cpu" else devices)]
    if None in limits:
        return
    have, need = sum(limits) * jax.process_count(), copies * state_bytes(algorithm)
    if need > have:
        raise ConfigError("memory", _gib(need),
                          f"the training state alone needs that, more than the {_gib(have)} that the run's "
                          f"{devices[0].platform} devices have together; {fix}")


def check_program_fits(executables: Iterable[Any], fix: str) -> None:
    """Refuse compiled programs that cannot run in their devices' memory, before they run:
    each device must hold the largest of the ``executables`` placed on it, and CPU devices
    together the host's available memory; ``fix`` says what to change."""
    need: dict[jax.Device, int] = {}
    for compiled in executables:
        size = program_bytes(compiled)
        for device in {d for s in jax.tree.leaves(compiled.input_shardings) for d in s.addressable_devices}:
            need[device] = max(need.get(device, 0), size or 0)
    cpu = [d for d in need if d.platform == "cpu"]
    demands = [(f"the host's {len(cpu)} CPU device(s)", cpu)] if cpu else []
    demands += [(f"{d.platform}:{d.id}", [d]) for d in need if d.platform != "cpu"]
    for where, devices in demands:
        size, have = sum(need[d] for d in devices), available_memory(devices[0])
        if have is not None and size > have:
            raise ConfigError("memory", _gib(size),
                              f"the compiled program needs that on {where} (arguments, outputs and temporaries, by "
                              f"XLA's memory analysis), which have {_gib(have)} available; {fix}")


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"
