"""``compile`` an algorithm under a distribution policy into a ``Program``, and run it."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from jaxrl_frag import metrics as metrics_lib
from jaxrl_frag.algorithms import Algorithm, plain, setting_defaults
from jaxrl_frag.checkpoints import Checkpoint, Checkpoints, changed_settings, check_settings, damaged_directory
from jaxrl_frag.chunking import Chunk
from jaxrl_frag.compilation_cache import use_compilation_cache
from jaxrl_frag.errors import NonFiniteError, check
from jaxrl_frag.explanation import Explanation
from jaxrl_frag.graph import FragmentGraph
from jaxrl_frag.policy import Executor, Policy, SingleDevice

PyTree = Any
Row = dict[str, float]


@dataclasses.dataclass
class History:
    """What a run produced: one row of metrics per chunk, the final state, the iteration
    it reached, and whether a ``stop`` request ended it early."""

    rows: list[Row]
    state: PyTree
    iteration: int = 0
    stopped: bool = False

    def __getitem__(self, name: str) -> np.ndarray:
        """One metric over the run, as an array (NaN where a chunk lacks it)."""
        return np.array([row.get(name, np.nan) for row in self.rows])

    @property
    def final(self) -> Row:
        """The last row (empty before any)."""
        return self.rows[-1] if self.rows else {}

    def last(self, name: str) -> float | np.ndarray:
        """The last value of metric ``name`` that is not NaN (per member in a population):
        a short last row may see no episode end, which leaves its return NaN."""
        if not self.rows:
            return float("nan")
        values = self[name]
        columns = values.reshape(len(self.rows), -1).T
        last = np.array([col[~np.isnan(col)][-1] if (~np.isnan(col)).any() else np.nan for col in columns])
        return float(last[0]) if values.ndim == 1 else last


@dataclasses.dataclass
class _Run:
    """Where ``Program.run`` is: the state, the iterations done, the environment steps
    (per member in a population), the chunk in progress, the rows of the run before its
    start (``earlier``, from a checkpoint) and those since."""

    state: PyTree
    done: int
    env_steps: np.ndarray | float
    chunk: Chunk
    earlier: list[Row]
    rows: list[Row] = dataclasses.field(default_factory=list)


class Program:
    """An algorithm compiled ahead of time under a policy.

    ``run`` trains in *chunks* of ``chunk_iterations`` iterations, each reduced on
    device to one row of metrics. One call of the compiled program runs as many
    iterations as fit in about ``seconds_per_call`` (state buffers donated), so the
    host wakes up rarely whatever the row resolution, and a stop request is seen
    within about that time however long a chunk is. A call may end inside a chunk;
    the chunk's running totals carry over, so rows do not depend on where calls end.
    """

    max_rows_per_call = 64

    def __init__(self, algorithm: Algorithm, policy: Policy, chunk_iterations: int, seconds_per_call: float,
                 check_finite: bool = True):
        check(chunk_iterations > 0, "chunk_iterations", chunk_iterations, "must be a positive iteration count")
        check(seconds_per_call > 0, "seconds_per_call", seconds_per_call, "must be a positive number of seconds")
        self.algorithm = algorithm
        self.policy = policy
        self.chunk_iterations = chunk_iterations
        self.seconds_per_call = seconds_per_call
        self.check_finite = check_finite
        t0 = time.perf_counter()
        self._executor: Executor = policy.executor(algorithm, self.max_rows_per_call, check_finite)
        self._executor.compile()
        self.compile_seconds = time.perf_counter() - t0

    def init(self, key: jax.Array) -> PyTree:
        """The training state at iteration 0, placed by the policy."""
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        return self._executor.init(np.asarray(key))  # host data: the same on every process

    @property
    def executables(self) -> list[jax.stages.Compiled]:
        """The ahead-of-time compiled programs it runs (for XLA's memory and cost analyses)."""
        return [part for part in vars(self._executor).values() if isinstance(part, jax.stages.Compiled)]

    def algorithm_state(self, state: PyTree) -> PyTree:
        """The algorithm's own state (parameters, optimizer and environment states) within
        a state of this program (``History.state``): the same object except under
        ``ActorLearner``, whose state also holds what is in flight between its groups."""
        return self._executor.algorithm_state(state)

    def run(
        self,
        start: jax.Array | Checkpoint | PyTree,
        iterations: int | None = None,
        *,
        on_chunk: Callable[[Row], None] | None = None,
        checkpoints: Checkpoints | None = None,
        stop: Callable[[], bool] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> History:
        """Train from a key (a fresh state), a ``Checkpoint`` (continuing from its
        iteration) or a state, up to iteration ``iterations`` (default: the algorithm's
        ``num_iterations``); returns the ``History``.

        Each row holds ``iteration``, ``env_steps`` (after the chunk; the algorithm's
        ``env_steps_total`` where it reports one), ``sps``, the chunk's metrics and the
        algorithm's ``counters`` (kept outside the program, as they stand after the call), and
        is passed to ``on_chunk`` as soon as its call returns, and once the checkpoint
        saved before it is on disk (a save is written while the next call runs), so no row
        that ``on_chunk`` sees is past a checkpoint a kill could still lose. A run ends early once the
        algorithm is ``finished``. With ``checkpoints`` the state is saved every
        ``checkpoints.every`` iterations, at the end and when ``stop()`` (asked after
        every call) returns true, with ``meta``, every row so far (``meta["rows"]``,
        from which ``metrics.csv`` can be rebuilt) and the running totals of a chunk
        stopped half-way (so a run resumed from it writes the same rows).
        Raises ``NonFiniteError`` at the first iteration whose state or metrics hold a
        NaN or an infinity (with ``check_finite``), after the rows and checkpoints
        before it, and the algorithm's own ``failure`` (after them too) where something
        outside the program made a call fail (a host environment's worker, say). A run
        started from a checkpoint continues from ``Algorithm.resumed`` of its state.
        """
        iterations = self.algorithm.num_iterations if iterations is None else iterations
        check(iterations is not None and iterations > 0, "iterations", iterations,
              "give a positive number of iterations (this algorithm sets none by default)")
        every = None if checkpoints is None else checkpoints.every
        if checkpoints is not None:
            check_settings(every, checkpoints.keep, self.chunk_iterations)
        run = self._starting_point(start, checkpoints)
        check(run.done <= iterations, "iterations", iterations,
              f"the run is already at iteration {run.done}; give a larger total to continue it")
        if checkpoints is not None:
            checkpoints.delete_after(run.done)  # steps past the start belong to a run that did not survive
        per_call, stopped, finished, saving = 1, False, False, False
        while run.done < iterations and not stopped and not finished:
            n = self._call_size(run.done, iterations, per_call, every)
            start_time = time.perf_counter()
            with _outside_failures_raised(self.algorithm, checkpoints):
                run.state, chunk, call_rows, num_rows, ran, flags = self._executor.call(
                    run.state, run.chunk, n, self.chunk_iterations, run.done % self.chunk_iterations)
                run.chunk, call_rows, num_rows, ran, flags = jax.device_get(
                    _ready((chunk, call_rows, num_rows, ran, flags)))
            seconds = time.perf_counter() - start_time
            ran = int(ran)
            bad = sorted(name for name, ok in flags.items() if not ok)
            finished = not bad and ran < n  # the algorithm ended itself within the call
            call_start = run.env_steps
            new = self._new_rows(run, call_rows, int(num_rows), ran, bad, finished or run.done + ran == iterations)
            if new and saving:  # no row past a checkpoint before it is on disk (a kill could still lose it)
                checkpoints.wait()
                saving = False
            counters = self.algorithm.counters()
            for row in new:
                row["sps"] = float(np.nanmean(run.env_steps - call_start)) / seconds  # NaN: a member without steps
                row.update(counters)
                if on_chunk is not None:
                    on_chunk(row)
            if bad:
                if checkpoints is not None:
                    checkpoints.wait()
                graph = FragmentGraph.from_jaxpr(self._executor.trace_step())
                raise NonFiniteError(run.done + ran, bad, graph.first_producer(bad))
            run.done += ran
            per_call = _same_on_all_processes(max(1, round(ran * self.seconds_per_call / max(seconds, 1e-6))))
            stopped = stop is not None and _on_any_process(stop()) and run.done < iterations and not finished
            end = run.done == iterations or stopped or finished
            if checkpoints is not None and ((every is not None and run.done % every == 0) or end):
                self._save(checkpoints, run, meta)
                saving = True
        if checkpoints is not None:
            checkpoints.wait()
        return History(run.rows, run.state, run.done, bool(stopped))

    def _starting_point(self, start: jax.Array | Checkpoint | PyTree, checkpoints: Checkpoints | None) -> _Run:
        """Where ``run`` starts from ``start`` (a key, a ``Checkpoint`` or a state)."""
        if not isinstance(start, Checkpoint):
            with _outside_failures_raised(self.algorithm, checkpoints):
                state = self.init(start) if _is_key(start) else start
            return _Run(state, 0, np.asarray(0.0), self._chunk(None), [])
        with _outside_failures_raised(self.algorithm, checkpoints):
            state = self._executor.resumed(start.state)
        env_steps = np.asarray(start.meta.get("env_steps", start.iteration * self.algorithm.steps_per_iteration))
        return _Run(state, start.iteration, env_steps, self._chunk(start.meta.get("chunk")),
                    list(start.meta.get("rows", [])))

    def _call_size(self, done: int, iterations: int, per_call: int, every: int | None) -> int:
        """The iterations of the next call: about ``per_call``, no further than the run's end
        or the next checkpoint, and completing no more chunks than a call has rows for."""
        until = iterations if every is None else min(iterations, (done // every + 1) * every)
        k = self.chunk_iterations
        return max(1, min(per_call, until - done, (done // k + self.max_rows_per_call) * k - done))

    def _new_rows(self, run: _Run, call_rows: dict[str, np.ndarray], num_rows: int, ran: int, bad: list[str],
                  ends_run: bool) -> list[Row]:
        """The rows a call completed (appended to ``run.rows``, ``run.env_steps`` moved to
        the last one's): one per chunk it completed, but the chunk of a bad iteration,
        and a partial last one where the run ends inside a chunk (``ends_run``)."""
        k = self.chunk_iterations
        if bad and (run.done + ran) % k == 0:
            num_rows -= 1  # the chunk that the bad iteration completed
        ends = [(run.done // k + r + 1) * k for r in range(num_rows)]
        results = [{name: values[r] for name, values in call_rows.items()} for r in range(num_rows)]
        if not bad and run.chunk.count and ends_run:
            ends.append(run.done + ran)  # the run ends inside a chunk: its last row is partial
            results.append(run.chunk.row())
            run.chunk = self._chunk(None)
        new = []
        for end, result in zip(ends, results, strict=True):
            metrics = metrics_lib.finalize(result)
            # where iterations vary in size, the algorithm's own count (per member in a population)
            run.env_steps = metrics.pop("env_steps_total", float(end * self.algorithm.steps_per_iteration))
            new.append({"iteration": float(end), "env_steps": run.env_steps, **metrics})
        run.rows += new
        return new

    def _save(self, checkpoints: Checkpoints, run: _Run, meta: dict[str, Any] | None) -> None:
        """Save ``run``'s state with every row so far (metrics.csv can be rebuilt from them)
        and a chunk in progress (a stop between rows), in the background."""
        checkpoints.save(run.done, run.state, {
            **(meta or {}), "config": self.algorithm.config(), "env_steps": plain(run.env_steps),
            "rows": [{name: plain(value) for name, value in row.items()} for row in run.earlier + run.rows],
            **({"chunk": jax.tree.map(plain, run.chunk._asdict())} if run.chunk.count else {})})

    def _chunk(self, saved: dict[str, Any] | None) -> Chunk:
        """A chunk with no iteration run, or one in progress as a checkpoint saved it."""
        if saved is None:
            return Chunk.empty(self._executor.metric_shapes)
        return Chunk({k: np.asarray(v, np.float32) for k, v in saved["totals"].items()}, np.int32(saved["count"]))

    def restore(self, path: str | Path | Checkpoints, allow_changes: Sequence[str] = ()) -> Checkpoint:
        """The newest usable checkpoint in ``path`` (see ``newest``); ``ConfigError`` also
        where there is none."""
        checkpoint = self.newest(path, allow_changes)
        directory = path.directory if isinstance(path, Checkpoints) else Path(path).absolute()
        check(checkpoint is not None, "checkpoint", str(directory),
              f"holds no usable checkpoint (unusable ones are in {damaged_directory(directory)}); start the run afresh")
        return checkpoint

    def newest(self, path: str | Path | Checkpoints, allow_changes: Sequence[str] = ()) -> Checkpoint | None:
        """The newest usable checkpoint in ``path``, placed as this program's state is
        (any mesh: arrays saved sharded over 4 devices restore onto 2), or ``None`` where
        none is usable. Raises ``ConfigError`` if the saved configuration differs from this
        algorithm's in a field not named in ``allow_changes``."""
        if not isinstance(path, Checkpoints):
            check(Path(path).is_dir(), "checkpoint", str(path), "is not a directory of checkpoints")
        manager = path if isinstance(path, Checkpoints) else Checkpoints(path)
        like = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                            self._executor.state_shape, self._executor.state_sharding)
        try:
            checkpoint = manager.restore(like)
        finally:
            if manager is not path:
                manager.close()
        if checkpoint is not None:
            changed = changed_settings(checkpoint.meta.get("config", {}), self.algorithm.config(), allow_changes,
                                       setting_defaults(self.algorithm))
            check(not changed, "config", ", ".join(changed.values()),
                  "differs from the checkpoint's; resume with the saved settings or start a new run")
        return checkpoint

    def explain(self) -> Explanation:
        """The fragment graph with bytes per iteration, the collectives (and, between
        device groups, the transfers) and XLA's FLOPs, bytes accessed and memory for one
        iteration."""
        return self._executor.explain({"program": self.compile_seconds})


def compile(  # noqa: A001
    algorithm: Algorithm,
    policy: Policy | None = None,
    *,
    chunk_iterations: int | None = None,
    seconds_per_call: float = 1.0,
    check_finite: bool = True,
) -> Program:
    """Compile ``algorithm`` under ``policy`` (default ``SingleDevice()``) ahead of time.

    ``chunk_iterations`` (iterations per row of metrics) defaults to a 50th of the
    algorithm's ``num_iterations``, or 10 when it sets none. ``check_finite`` stops a
    run at its first non-finite state or metric (see ``Program.run``). The programs are
    compiled with ``policy.compile_options``: XLA's defaults, but ``init`` compiled for
    compile time (it runs once), and on CPU every program so while JAX's
    ``jax_disable_most_optimizations`` is set (for short runs: from an empty cache about
    2.4x quicker to build, slower to run), all at once, each on a thread of its own
    (``policy.compile_together``: ``init``'s compile beside the iterations'). They go
    through XLA's persistent compilation cache (``compilation_cache.use_compilation_cache``):
    the same program compiled again, in this process or a new one, is read back from
    ``$JAXRL_FRAG_CACHE_DIR`` (by default ``~/.cache/jaxrl_frag/xla``) unless the process
    has set JAX's cache directory itself; ``jax.config.update("jax_enable_compilation_cache",
    False)`` for fresh compilations.
    """
    use_compilation_cache()
    if chunk_iterations is None:
        chunk_iterations = default_chunk_iterations(algorithm)
    return Program(algorithm, policy or SingleDevice(), chunk_iterations, seconds_per_call, check_finite)


def explain(algorithm: Algorithm, policy: Policy | None = None) -> Explanation:
    """What ``compile(algorithm, policy).explain()`` shows, but compiling only what its
    figures need rather than the training programs first: under an SPMD policy one
    iteration alone (``compile`` would build ``run_iterations`` and ``init`` besides), so
    its compile seconds are that iteration's."""
    use_compilation_cache()
    return (policy or SingleDevice()).executor(algorithm, Program.max_rows_per_call, True).explain({})


def default_chunk_iterations(algorithm: Algorithm) -> int:
    """Iterations per row of metrics by default: 50 rows per run, 10 iterations a row for
    an algorithm that sets no run length, one where iterations vary in size."""
    if algorithm.iterations_vary:
        return 1
    total = algorithm.num_iterations
    return max(1, total // 50) if total else 10


def _same_on_all_processes(value: int) -> int:
    """Process 0's ``value`` everywhere: every process must make the same calls, or the
    collectives inside them would wait for each other forever."""
    if jax.process_count() == 1:
        return value
    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def _on_any_process(flag: bool) -> bool:
    """Whether ``flag`` is set on any process (a preemption notice may reach one host)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))


@contextlib.contextmanager
def _outside_failures_raised(algorithm: Algorithm, checkpoints: Checkpoints | None) -> Iterator[None]:
    """A failure outside the program (``Algorithm.failure``: a host environment's worker,
    say), which XLA reports as a runtime error of the program, raised as itself once the
    checkpoints are written."""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        failure = algorithm.failure()
        if failure is None:
            raise
        if checkpoints is not None:
            checkpoints.wait()
        raise failure from error


def _ready(tree: PyTree) -> PyTree:
    """``tree`` once every array in it is computed, waited for in short sleeps rather than
    inside XLA: the host's signal handlers run while a call computes, even one that never
    ends."""
    arrays = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
    while not all(x.is_ready() for x in arrays):
        time.sleep(0.002)
    return tree


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and (
        jnp.issubdtype(x.dtype, jax.dtypes.prng_key) or (x.shape == (2,) and x.dtype == jnp.uint32)
    )
