"""``compile`` an algorithm under a distribution policy into a ``Program``, and run it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frag import costs
from jaxrl_frag import metrics as metrics_lib
from jaxrl_frag.algorithm import Algorithm
from jaxrl_frag.errors import check
from jaxrl_frag.graph import FragmentGraph, format_bytes
from jaxrl_frag.sharding import Policy, SingleDevice
from jaxrl_frag.transforms import run_chunk

PyTree = Any
Row = dict[str, float]


@dataclasses.dataclass
class History:
    """What a run produced: one row of metrics per chunk, and the final state."""

    rows: list[Row]
    state: PyTree

    def __getitem__(self, name: str) -> np.ndarray:
        """One metric over the run, as an array (NaN where a chunk lacks it)."""
        return np.array([row.get(name, np.nan) for row in self.rows])

    @property
    def final(self) -> Row:
        return self.rows[-1] if self.rows else {}


@dataclasses.dataclass
class Explanation:
    """The fragment graph, the placement and XLA's cost figures for one iteration."""

    graph: FragmentGraph
    placement: str
    cost: dict[str, float]
    memory: dict[str, int]
    compile_seconds: dict[str, float]

    def __str__(self) -> str:
        lines = [f"placement: {self.placement}", str(self.graph), "cost per iteration:"]
        lines += [f"  {k:<38} {v:.4g}" for k, v in self.cost.items()]
        lines += [f"  {k:<38} {format_bytes(v)}" for k, v in self.memory.items()]
        lines.append("compile seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in self.compile_seconds.items()))
        return "\n".join(lines)


class Program:
    """An algorithm compiled ahead of time under a policy.

    ``run`` executes ``chunk_iterations`` iterations per call (one on-device loop,
    state buffers donated), hands each chunk's reduced metrics to the host and
    keeps going until the requested number of iterations.
    """

    def __init__(self, algorithm: Algorithm, policy: Policy, chunk_iterations: int):
        check(chunk_iterations > 0, "chunk_iterations", chunk_iterations, "must be a positive iteration count")
        self.algorithm = algorithm
        self.policy = policy
        self.chunk_iterations = chunk_iterations
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        t0 = time.perf_counter()
        self._init = policy.jit(_init).lower(algorithm, key).compile()
        self._state_shape = jax.eval_shape(_init, algorithm, key)
        n = jax.ShapeDtypeStruct((), jnp.int32)
        self._chunk = policy.jit(run_chunk, donate_argnums=(1,)).lower(algorithm, self._state_shape, n).compile()
        self.compile_seconds = time.perf_counter() - t0

    def init(self, key: jax.Array) -> PyTree:
        """The training state at iteration 0, placed by the policy."""
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        return self._init(self.algorithm, key)

    def run(
        self,
        start: jax.Array | PyTree,
        iterations: int | None = None,
        *,
        on_chunk: Callable[[Row], None] | None = None,
    ) -> History:
        """Train from a key (a fresh state) or a state; returns the ``History``.

        ``iterations`` defaults to the algorithm's ``num_iterations``. Each row
        holds ``iteration``, ``env_steps``, ``sps`` and the chunk's metrics, and
        is passed to ``on_chunk`` as soon as it arrives. The next chunk is
        dispatched before the host reads the last one, so the device never waits.
        """
        iterations = self.algorithm.num_iterations if iterations is None else iterations
        check(iterations is not None and iterations > 0, "iterations", iterations,
              "give a positive number of iterations (this algorithm sets none by default)")
        state = self.init(start) if _is_key(start) else start
        rows: list[Row] = []
        done, pending = 0, None
        clock = time.perf_counter()
        while done < iterations or pending is not None:
            dispatched = None
            if done < iterations:
                n = min(self.chunk_iterations, iterations - done)
                state, chunk_metrics = self._chunk(self.algorithm, state, jnp.int32(n))
                done += n
                dispatched = (done, n, chunk_metrics)
            if pending is not None:
                end, n, chunk_metrics = pending
                host = jax.device_get(chunk_metrics)
                now = time.perf_counter()
                row = {"iteration": float(end), "env_steps": float(end * self.algorithm.steps_per_iteration),
                       "sps": n * self.algorithm.steps_per_iteration / max(now - clock, 1e-9),
                       **metrics_lib.finalize(host)}
                clock = now
                rows.append(row)
                if on_chunk is not None:
                    on_chunk(row)
            pending = dispatched
        return History(rows, state)

    def explain(self) -> Explanation:
        """The fragment graph with bytes per iteration, and XLA's FLOPs, bytes accessed
        and memory for one iteration (compiles the single step once more)."""
        traced = jax.make_jaxpr(_step)(self.algorithm, self._state_shape)
        graph = FragmentGraph.from_jaxpr(traced)
        t0 = time.perf_counter()
        step = self.policy.jit(_step).lower(self.algorithm, self._state_shape).compile()
        step_seconds = time.perf_counter() - t0
        analysis = step.cost_analysis() or {}
        if isinstance(analysis, list):  # older jax: one dict per computation
            analysis = analysis[0] if analysis else {}
        cost = {"flops": float(costs.flops(traced))}
        cost |= {f"XLA {k} (loop bodies once)": float(analysis[k]) for k in ("flops", "bytes accessed") if k in analysis}
        mem = step.memory_analysis()
        memory = {} if mem is None else {
            "argument bytes": mem.argument_size_in_bytes,
            "output bytes": mem.output_size_in_bytes,
            "temporary bytes": mem.temp_size_in_bytes,
        }
        return Explanation(graph, self.policy.describe(), cost, memory,
                           {"program": self.compile_seconds, "single step": step_seconds})


def compile(algorithm: Algorithm, policy: Policy | None = None, *, chunk_iterations: int = 10) -> Program:  # noqa: A001
    """Compile ``algorithm`` under ``policy`` (default ``SingleDevice()``) ahead of time."""
    return Program(algorithm, policy or SingleDevice(), chunk_iterations)


def _init(algorithm: Algorithm, key: jax.Array) -> PyTree:
    return algorithm.init(key)


def _step(algorithm: Algorithm, state: PyTree) -> tuple[PyTree, metrics_lib.Metrics]:
    return algorithm.step(state)


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and (
        jnp.issubdtype(x.dtype, jax.dtypes.prng_key) or (x.shape == (2,) and x.dtype == jnp.uint32)
    )
