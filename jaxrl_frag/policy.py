"""The ``Policy`` seam: how a compiled program is placed on devices and run.

A policy turns the program's state (its shape and which of its fields carry the
environment batch, read from the fragment declarations) into shardings, sets how
the framework primitives lower, and brings the ``Executor`` that compiles and runs
the program under it: one SPMD program over its devices by default
(``SpmdExecutor``), or anything else a policy needs (the actor/learner pipeline of
``sharding.ActorLearner``). ``Program`` drives whichever executor it is given; it
names no policy. ``SingleDevice``, the default, lives here; the distribution
policies live in ``jaxrl_frag.sharding``, one file each.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Sharding, SingleDeviceSharding

from jaxrl_frag import costs, primitives, tracing
from jaxrl_frag.algorithms import Algorithm, field_name
from jaxrl_frag.chunking import Chunk, run_iterations
from jaxrl_frag.collectives import audit
from jaxrl_frag.explanation import Explanation
from jaxrl_frag.graph import FragmentGraph

PyTree = Any
BatchAxes = Mapping[str, int]  # state field -> axis that carries the environment batch
NamedAxes = Mapping[str, Mapping[str, int]]  # axis name -> {state field: axis} (Algorithm.named_axes)


KEY_DATA = jax.ShapeDtypeStruct((2,), jnp.uint32)  # the raw key that the programs' initialisation takes
_COUNT = jax.ShapeDtypeStruct((), jnp.int32)  # an iteration count

# XLA's options for a program that runs once per run (``init``): its backend's optimisations off, which about
# halves its compilation and costs milliseconds of running
RUN_ONCE_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
# and on CPU, for any program compiled for compile time rather than run time: XLA's fusion emitters off (its older
# loop emitters instead), which more than halves a compilation again; a training program then runs 1.45-1.8x slower
QUICK_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}


def compile_options(run_once: bool = False) -> dict[str, Any]:
    """XLA's options for a program: ``RUN_ONCE_OPTIONS`` for one that runs once per run
    (``run_once``), and on CPU ``QUICK_CPU_OPTIONS`` too for such a program and for every
    program while JAX's ``jax_disable_most_optimizations`` is set (which asks for compile
    time over run time: short runs, tests); none otherwise (XLA's defaults)."""
    quick = run_once or jax.config.read("jax_disable_most_optimizations")
    cpu = QUICK_CPU_OPTIONS if quick and jax.default_backend() == "cpu" else {}
    return {**(RUN_ONCE_OPTIONS if run_once else {}), **cpu}


def compile_lowered(lowered: jax.stages.Lowered, run_once: bool = False) -> jax.stages.Compiled:
    """``lowered`` compiled with ``compile_options(run_once)``."""
    return lowered.compile(compiler_options=compile_options(run_once) or None)


def compile_together(*programs: tuple[jax.stages.Lowered, bool]) -> list[jax.stages.Compiled]:
    """Each ``(lowered, run_once)`` compiled as ``compile_lowered`` compiles it, all at once:
    the first in this thread, the others each on a thread of its own (XLA compiles outside
    Python's lock), so that building them takes about as long as the longest rather than the
    sum (``benchmarks/compile_one.py``). Their options are read here, in the caller's thread."""
    options = [compile_options(run_once) or None for _, run_once in programs]
    with ThreadPoolExecutor(max(len(programs) - 1, 1)) as pool:
        others = [pool.submit(lowered.compile, compiler_options=opts)
                  for (lowered, _), opts in zip(programs[1:], options[1:], strict=True)]
        first = programs[0][0].compile(compiler_options=options[0])
        return [first, *(other.result() for other in others)]


class Executor(Protocol):
    """How a ``Program`` runs under its policy: compiled programs, the state's layout."""

    state_shape: PyTree
    state_sharding: PyTree
    metric_shapes: dict[str, jax.ShapeDtypeStruct]  # an iteration's metrics (``Algorithm.checked_step``'s)

    def init(self, key: np.ndarray) -> PyTree:
        """The placed state at iteration 0 from a raw ``uint32[2]`` key."""
        ...

    def call(self, state: PyTree, chunk: Chunk, iterations: int, k: int, offset: int) -> tuple[
            PyTree, Chunk, dict[str, Any], Any, Any, dict[str, Any]]:
        """Up to ``iterations`` iterations from ``state``, continuing ``chunk`` (as
        ``chunking.run_iterations``): the state, the chunk in progress, each metric's
        rows of the chunks completed, their count, the iterations run and the finite
        flags of the last."""
        ...

    def trace_step(self) -> Any:
        """The jaxpr of one step under the policy's lowering (for the fragment graph)."""
        ...

    def compile(self) -> None:
        """Compile the programs it runs, once: ``Program`` calls it (and times it) before
        anything runs; ``explain`` alone compiles no more than its figures need."""
        ...

    def algorithm_state(self, state: PyTree) -> PyTree:
        """The algorithm's own state within a state of this executor."""
        ...

    def resumed(self, state: PyTree) -> PyTree:
        """A restored state with ``Algorithm.resumed`` applied to the algorithm's part, placed."""
        ...

    def explain(self, compile_seconds: dict[str, float]) -> Explanation:
        """What ``Program.explain`` shows: graph, placement, collectives, costs."""
        ...


class Policy(abc.ABC):
    """Places a training program's state, chooses how the primitives lower, and brings
    the executor that runs the program.

    A policy is a frozen dataclass. ``name`` is what the command line's ``--policy``
    calls it; the fields whose metadata has a ``help`` are its command-line settings
    (``flag`` names the flag where it is not the field's name).
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes],
                  named_axes: NamedAxes) -> tuple[Sharding, PyTree]:
        """The sharding of replicated values, and one sharding per leaf of ``state``
        (shapes); ``batch_axes`` is called if the policy needs to know the batched fields;
        ``named_axes`` are the algorithm's other axes a policy may split
        (``Algorithm.named_axes``)."""

    def lowering(self) -> primitives.Lowering:
        """How the primitives lower under this policy."""
        return primitives.Lowering()

    def executor(self, algorithm: Algorithm, max_rows: int, check_finite: bool) -> Executor:
        """Compile ``algorithm`` under this policy: one SPMD program over its devices."""
        return SpmdExecutor(algorithm, self, max_rows, check_finite)

    @property
    def device_count(self) -> int:
        """How many devices the program runs on."""
        return 1

    @classmethod
    def saved_like(cls, algorithm_like: PyTree, saved: Callable[[], PyTree]) -> PyTree:
        """What a checkpoint of a run under this policy holds, to restore it placed as
        ``algorithm_like`` (the algorithm's state: shapes with shardings) says, on other
        devices than the run's: by default the algorithm's state alone. ``saved()`` reads
        the checkpoint's own tree of shapes, for a policy whose checkpoints hold more."""
        return algorithm_like

    @classmethod
    def algorithm_part(cls, restored: PyTree) -> PyTree:
        """The algorithm's state within a checkpoint restored as ``saved_like`` says."""
        return restored

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for ``explain``: the devices and how the program is spread on them."""


@dataclasses.dataclass(frozen=True)
class SingleDevice(Policy):
    """Everything on one device (by default the first one)."""

    name: ClassVar[str] = "single"
    device: jax.Device | None = None

    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes],
                  named_axes: NamedAxes) -> tuple[Sharding, PyTree]:
        sharding = SingleDeviceSharding(self.device or jax.devices()[0])
        return sharding, jax.tree.map(lambda _: sharding, state)

    def describe(self) -> str:
        device = self.device or jax.devices()[0]
        return f"SingleDevice: {device.platform}:{device.id}"


class SpmdExecutor:
    """One program over the policy's whole mesh: ``run_iterations`` partitioned by
    ``jax.jit`` with the policy's shardings."""

    def __init__(self, algorithm: Algorithm, policy: Policy, max_rows: int, check_finite: bool):
        self.algorithm, self.policy = algorithm, policy
        self._rule = rule = policy.lowering()
        self._run_iterations = functools.partial(run_iterations, max_rows=max_rows, check_finite=check_finite)
        self._step_fn = tracing.under(rule, tracing.step)
        # every trace under the rule: the fragments' traces under it are made once and reused
        self.state_shape = jax.eval_shape(tracing.under(rule, tracing.init), algorithm, KEY_DATA)
        self._replicated, self.state_sharding = policy.shardings(
            self.state_shape, lambda: tracing.batch_axes(self.trace_step()), algorithm.named_axes)
        self.metric_shapes = jax.eval_shape(tracing.under(rule, tracing.checked_step), algorithm, self.state_shape)[1]
        rep, state = self._replicated, self.state_sharding
        # across processes traced under the rule, so that what it restarts (host environments' resets) runs in every
        # process on its own rows; within one, run as it is (no compilation)
        self._resumed = (jax.jit(tracing.under(rule, tracing.resumed), in_shardings=(rep, state), out_shardings=state)
                         if jax.process_count() > 1 else tracing.resumed)
        self._call = self._init = None

    def compile(self) -> None:
        """Lower and compile ``run_iterations`` and ``init``, at once (``Executor.compile``)."""
        if self._call is not None:
            return
        rule, rep, state, count = self._rule, self._replicated, self.state_sharding, _COUNT
        start = jax.jit(tracing.under(rule, tracing.init), in_shardings=(rep, rep), out_shardings=state).lower(
            self.algorithm, KEY_DATA)
        iterations = jax.jit(tracing.under(rule, self._run_iterations), in_shardings=(rep, state, rep, rep, rep, rep),
                             out_shardings=(state, rep, rep, rep, rep, rep), donate_argnums=(1,)).lower(
            self.algorithm, self.state_shape, Chunk.empty(self.metric_shapes), count, count, count)
        self._call, self._init = compile_together((iterations, False), (start, True))  # init compiled beside the rest

    def init(self, key: np.ndarray) -> PyTree:
        """The placed state at iteration 0 (``Executor.init``)."""
        return self._init(self.algorithm, key)

    def call(self, state: PyTree, chunk: Chunk, iterations: int, k: int, offset: int) -> tuple[
            PyTree, Chunk, dict[str, Any], Any, Any, dict[str, Any]]:
        """One call of the compiled ``run_iterations`` (``Executor.call``)."""
        return self._call(self.algorithm, state, chunk, np.int32(iterations), np.int32(k), np.int32(offset))

    def trace_step(self) -> Any:
        """The jaxpr of one step under the policy's lowering."""
        return jax.make_jaxpr(self._step_fn)(self.algorithm, self.state_shape)

    def algorithm_state(self, state: PyTree) -> PyTree:
        """``state`` itself: this executor's state is the algorithm's."""
        return state

    def resumed(self, state: PyTree) -> PyTree:
        """``Algorithm.resumed`` of a restored state, placed."""
        return jax.device_put(self._resumed(self.algorithm, state), self.state_sharding)

    def explain(self, compile_seconds: dict[str, float]) -> Explanation:
        """Compiles one iteration alone, for XLA's per-iteration figures."""
        traced = self.trace_step()
        t0 = time.perf_counter()
        rep, state = self._replicated, self.state_sharding
        step = jax.jit(self._step_fn, in_shardings=(rep, state), out_shardings=(state, rep))
        step = compile_lowered(step.lower(self.algorithm, self.state_shape))
        step_seconds = time.perf_counter() - t0
        return Explanation(FragmentGraph.from_jaxpr(traced), self._placement(), audit(step.as_text()),
                           {"flops": float(costs.flops(traced)), **costs.xla_cost(step)}, costs.xla_memory(step),
                           {**compile_seconds, "single step": step_seconds})

    def _placement(self) -> str:
        """The policy's own line, and which state fields are split (over which mesh axes)
        where it has devices to split over."""
        if self.policy.device_count == 1:
            return self.policy.describe()
        axes: dict[str, set[str]] = {}
        for path, sharding in jax.tree_util.tree_leaves_with_path(self.state_sharding):
            if path:
                spec, mesh = getattr(sharding, "spec", ()), getattr(sharding, "mesh", None)
                used = {a for part in spec if part for a in ((part,) if isinstance(part, str) else part)
                        if mesh is None or mesh.shape[a] > 1}  # an axis of one device splits nothing
                axes.setdefault(field_name(path[0]), set()).update(used)
        groups: dict[str, list[str]] = {}  # mesh axes -> the fields split over them
        for name, used in sorted(axes.items()):
            groups.setdefault(", ".join(sorted(used)), []).append(name)
        whole = groups.pop("", [])
        split = "; ".join(f"{', '.join(names)} (mesh axis {mesh})" for mesh, names in sorted(groups.items()))
        return (f"{self.policy.describe()}\n  split over devices: {split or 'nothing'}; "
                f"whole on every device: {', '.join(whole) or 'nothing'}")
