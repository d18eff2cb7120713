"""Training a ``RunSpec`` into a run directory (config.json, metrics.csv, TensorBoard
events, checkpoints, the learning curve; W&B's files where it logs to W&B), and continuing
one: what ``jaxrl-frag train`` and ``jaxrl-frag resume`` do, and what Python calls
(``train``, ``resume``). Each returns the exit status the command line exits with, having
said why on stderr."""

from __future__ import annotations

import datetime
import logging
import secrets
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_frag.app.build import Members, make_algorithm, make_policy, memory_fix, resolved_config
from jaxrl_frag.app.signals import Interrupt, StopOnSignal
from jaxrl_frag.app.spec import RESUMABLE_CHANGES, RunSpec
from jaxrl_frag.app.wandb_log import check_project
from jaxrl_frag.errors import ENV_WORKER_FAILED, INTERRUPTED, NON_FINITE, WRITE_FAILED, check

# what config.json records beyond the settings, and is free to differ on resume (wandb_run: the id of the W&B run)
RUNTIME_KEYS = ("jax", "backend", "processes", "device_count", "settings", "wandb_run")


def train(spec: RunSpec, run_dir: str | Path | None = None, *, overwrite: bool = False, resume: bool = False) -> int:
    """Train ``spec`` into ``run_dir`` (default ``runs/RECIPE-ENV-TIME``), replacing a run
    there with ``overwrite``, or with ``resume`` continuing the run there, which must be
    the same run (a setting of ``RESUMABLE_CHANGES`` aside). Returns the exit status."""
    from jaxrl_frag.algorithms import setting_defaults
    from jaxrl_frag.app.rundir import RunDir
    from jaxrl_frag.checkpoints import changed_settings
    from jaxrl_frag.distributed import is_main_process

    check(not (resume and overwrite), "resume", True, "--resume and --overwrite exclude each other; give one")
    check(not resume or run_dir is not None, "resume", True, "give the --run-dir of the run to continue")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = RunDir(Path(run_dir) if run_dir is not None else Path("runs") / f"{spec.recipe}-{spec.env}-{stamp}")
    if is_main_process():
        run_dir.check_free(overwrite, resume)
        if spec.wandb is not None:
            check_project(spec.wandb)
    saved = run_dir.read_config() if resume else None
    # a boosted run keeps the rounds' device-seconds it was calibrated with
    algo, members = make_algorithm(spec, round_seconds=None if saved is None else saved.get("round_seconds"))
    config = resolved_config(spec, algo)
    if saved is not None:
        changed = changed_settings(saved, config, RUNTIME_KEYS, setting_defaults(algo))
        safe = [name for name in changed if name in RESUMABLE_CHANGES]
        check(not changed, "resume", ", ".join(changed.values()),
              f"these settings differ from the run in {run_dir.path}; resume it unchanged with "
              f"`jaxrl-frag resume {run_dir.path}`"
              + (f", changing only what may change with --override ({', '.join(f'{k}=...' for k in safe)})" if safe else "")
              + "; other changes need a new run")
    return run(spec, run_dir, algo, members, config, resume=resume, overwrite=overwrite)


def resume(run_dir: str | Path, overrides: Mapping[str, Any] | None = None, *, restart: bool = False) -> int:
    """Continue the run in ``run_dir`` from its newest checkpoint, with its saved settings
    but ``overrides`` (of ``RESUMABLE_CHANGES`` only, by name: ``spec.parse_overrides``
    reads them from text); with ``restart``, from iteration 0, its old rows kept aside. A
    finished run's learning curve, where it is missing or damaged, is drawn again.
    Returns the exit status."""
    from jaxrl_frag.algorithms import setting_defaults
    from jaxrl_frag.app.rundir import RunDir
    from jaxrl_frag.checkpoints import changed_settings
    from jaxrl_frag.distributed import is_main_process

    run_dir = RunDir(run_dir)
    overrides = dict(overrides or {})
    foreign = sorted(set(overrides) - set(RESUMABLE_CHANGES))
    check(not foreign, "override", ", ".join(foreign),
          f"cannot change in a resumed run; the settings that can: {', '.join(RESUMABLE_CHANGES)}")
    if is_main_process():
        run_dir.check_free(resume=True)  # a run's directory, writable, and written by no other process
    saved = run_dir.read_config()
    spec = saved_spec(run_dir, saved, overrides)
    if spec.wandb is not None and is_main_process():
        check_project(spec.wandb)
    algo, members = make_algorithm(spec, round_seconds=saved.get("round_seconds"))
    config = resolved_config(spec, algo)
    changed = changed_settings(saved, config, (*RUNTIME_KEYS, *overrides), setting_defaults(algo))
    check(not changed, "config", ", ".join(changed.values()),
          "the saved settings no longer build the same run (was the recipe's code changed?); start a new run")
    return run(spec, run_dir, algo, members, config, resume=True, restart=restart)


def saved_spec(run_dir: Any, saved: dict[str, Any], overrides: Mapping[str, Any]) -> RunSpec:
    """The specification of the run in ``run_dir`` (``saved``: its config.json): its saved
    settings (the row and checkpoint intervals as they were, even where a default derived
    from the run length would now give another value), then ``overrides``. ``ConfigError``
    naming config.json where it holds a setting that a run does not take, or a value that
    its flag cannot give."""
    settings = {**saved["settings"], "chunk_iterations": saved["chunk_iterations"],
                "checkpoint_every": saved["checkpoint_every"], **overrides}
    return RunSpec.from_json(settings, run_dir.config_error)


def run(spec: RunSpec, run_dir: Any, algo: Any, members: Members | None, config: dict[str, Any], *,
        resume: bool = False, overwrite: bool = False, restart: bool = False) -> int:
    """Compile, then train (from the newest checkpoint when resuming; with ``restart`` from
    iteration 0, the old rows kept aside), writing the run directory while holding its lock.
    A write that the disk or its permissions refuse ends the run with ``WRITE_FAILED``."""
    from jaxrl_frag.app.rundir import CONFIG, write_failure

    absl = logging.getLogger("absl")
    absl.addFilter(_not_from_orbax)
    try:
        with run_dir:
            status = _run_locked(spec, run_dir, algo, members, config, resume, overwrite, restart)
            run_dir.close(status)  # a W&B run ends with the exit status
            return status
    except Exception as error:
        failure = write_failure(error, run_dir.path)
        if failure is None:
            raise
        again = (f"continue it with `jaxrl-frag resume {run_dir.path}`" if (run_dir.path / CONFIG).exists()
                 else "run the command again")
        print(f"jaxrl-frag: error: could not write {failure}; the run stopped, the checkpoints it saved before are "
              f"intact. Once there is room (or permission), {again}", file=sys.stderr)
        return WRITE_FAILED
    finally:
        absl.removeFilter(_not_from_orbax)


def _not_from_orbax(record: logging.LogRecord) -> bool:
    """Drops orbax's log records: a failed checkpoint write is logged, traceback and all, by
    each of its threads it passes through, and reaches the run as one error, reported once."""
    return "orbax" not in Path(record.pathname).parts


def _run_locked(spec: RunSpec, run_dir: Any, algo: Any, members: Members | None, config: dict[str, Any],
                resume: bool, overwrite: bool, restart: bool) -> int:
    """``run``'s work; ``run`` closes ``run_dir``, releasing its lock."""
    import jax

    from jaxrl_frag.checkpoints import Checkpoints
    from jaxrl_frag.distributed import is_main_process

    main_process = is_main_process()  # only process 0 prints and writes
    say = print if main_process else _quiet
    if main_process and resume:
        run_dir.lock()  # a new run's directory is locked as it is made, once compiled
    program, policy = _compile(spec, run_dir, algo, config, say)
    if main_process and not resume:
        run_dir.create(overwrite)
    config = {**config, "device_count": policy.device_count, "processes": jax.process_count(), "jax": jax.__version__,
              "backend": jax.default_backend(), "settings": spec.to_json(),
              **_wandb_run(spec, run_dir, resume and not restart)}
    checkpoints = Checkpoints(run_dir.checkpoints, every=config["checkpoint_every"], keep=config["keep_checkpoints"])
    try:
        start, finished = _starting_point(program, checkpoints, run_dir, algo, members, resume, restart,
                                          main_process, say)
        if finished or _done(start) == algo.num_iterations:
            return _complete(spec, run_dir, algo, members, start, finished, main_process, say)
        outcome = _train(spec, run_dir, program, algo, members, config, checkpoints, start, main_process, say)
    finally:
        checkpoints.close()
    if isinstance(outcome, int):
        return outcome
    say(f"stopped at iteration {outcome.iteration} of {algo.num_iterations}; checkpoint saved in "
        f"{checkpoints.directory}. Resume with: jaxrl-frag resume {run_dir.path}")
    return 0


def _wandb_run(spec: RunSpec, run_dir: Any, continuing: bool) -> dict[str, str]:
    """config.json's ``wandb_run``, where ``spec`` logs to W&B: the id of its W&B run, the
    saved one where a run continues (not one started over), else a new one."""
    if spec.wandb is None:
        return {}
    saved = run_dir.read_config().get("wandb_run") if continuing else None
    return {"wandb_run": saved or secrets.token_hex(4)}


def _compile(spec: RunSpec, run_dir: Any, algo: Any, config: dict[str, Any],
             say: Callable[..., None]) -> tuple[Any, Any]:
    """Says what the run is and compiles its program, the placement validated and the
    program checked to fit the devices' memory, before anything is written (``KeyboardInterrupt``
    where a signal came meanwhile); the program and its policy."""
    from jaxrl_frag import costs
    from jaxrl_frag.program import compile as compile_program

    policy = make_policy(spec)
    size = f"{'up to ' if algo.iterations_vary else ''}{algo.num_iterations} iterations of " + (
        f"at least {algo.steps_per_iteration} steps (boosted)" if algo.iterations_vary else f"{algo.steps_per_iteration} steps")
    say(f"{spec.recipe} on {spec.env}: {size} -> {run_dir.path}")
    program = compile_program(algo, policy, chunk_iterations=config["chunk_iterations"])  # validates the placement too
    costs.check_program_fits(program.executables, memory_fix(spec, program=True))  # before anything runs
    Interrupt.raise_if_received()  # before anything is written
    say(f"compiled in {program.compile_seconds:.1f} s; {policy.describe()}")
    return program, policy


def _done(start: Any) -> int:
    """The iterations run before ``start``, the checkpoint a run continues from (``None``: 0)."""
    return 0 if start is None else start.iteration


def _starting_point(program: Any, checkpoints: Any, run_dir: Any, algo: Any, members: Members | None, resume: bool,
                    restart: bool, main_process: bool, say: Callable[..., None]) -> tuple[Any, bool]:
    """The checkpoint the run continues from (``None``: iteration 0) and whether its budget
    is spent; on process 0, with ``restart`` the old rows set aside, else on resuming
    metrics.csv kept up to the checkpoint. ``ConfigError`` where ``total_steps`` is below
    the steps already taken."""
    from jaxrl_frag.app.rundir import METRICS

    start = _resume_point(program, checkpoints, run_dir, say) if resume and not restart else None
    done = _done(start)
    finished = start is not None and bool(algo.finished(start.state))
    check(finished or done <= algo.num_iterations, "total_steps", algo.num_iterations * algo.steps_per_iteration,
          f"is below the {done * algo.steps_per_iteration} steps the run has already taken; give more")
    if main_process and restart:
        aside = run_dir.set_aside_metrics() if (run_dir.path / METRICS).exists() else None
        say("starting the run over from iteration 0" + (f"; its old rows are kept in {aside}" if aside else ""))
    elif main_process and resume:
        rows = None if start is None else start.meta.get("rows")
        note = run_dir.keep_metrics(done, None if rows is None else [r for row in rows for r in _member_rows(row, members)])
        if note is not None:
            say(note)
    return start, finished


def _complete(spec: RunSpec, run_dir: Any, algo: Any, members: Members | None, start: Any, finished: bool,
              main_process: bool, say: Callable[..., None]) -> int:
    """A run with nothing left to train (its budget spent where ``finished``, else all its
    iterations run) says so, and on process 0 draws its learning curve again where that is
    missing or damaged; the exit status."""
    done = _done(start)
    if finished:
        say(f"the run in {run_dir.path} is complete: its budget is spent ({done} iterations)")
    else:
        say(f"the run in {run_dir.path} is complete ({done} iterations); to train on, resume it with "
            f"--override total_steps=N (N > {done * algo.steps_per_iteration})")
    return _redraw_curve(spec, run_dir, start, members, algo) if main_process else 0


def _train(spec: RunSpec, run_dir: Any, program: Any, algo: Any, members: Members | None, config: dict[str, Any],
           checkpoints: Any, start: Any, main_process: bool, say: Callable[..., None]) -> Any:
    """Trains from ``start`` (``None``: iteration 0), process 0 writing config.json, the
    rows and their progress, then finishes the run; the exit status, or the ``History``
    of a run that a signal stopped (its checkpoint saved)."""
    import jax

    from jaxrl_frag.envs import EnvWorkerError
    from jaxrl_frag.errors import NonFiniteError

    done = _done(start)
    if main_process:
        run_dir.write_config(config)
        run_dir.open_log(purge_step=done * algo.steps_per_iteration + 1)
        if spec.wandb is not None:
            run_dir.open_wandb(spec.wandb, config["wandb_run"], config)
    earlier = [] if start is None else start.meta.get("rows", [])
    on_chunk = _Reporter(run_dir, members, algo, done, earlier) if main_process else None
    stop = StopOnSignal(resume=f"jaxrl-frag resume {run_dir.path}")
    try:
        with stop:
            history = program.run(jax.random.PRNGKey(spec.seed) if start is None else start, on_chunk=on_chunk,
                                  checkpoints=checkpoints, stop=stop, meta={"run_config": config})
            if not history.stopped:
                return _finish(spec, run_dir, history, members, on_chunk, stop, checkpoints, say)
    except (NonFiniteError, EnvWorkerError) as error:
        return _failed(error, checkpoints, run_dir)
    finally:
        if on_chunk is not None:
            on_chunk.close()
    return history


def _failed(error: Exception, checkpoints: Any, run_dir: Any) -> int:
    """Says why a run stopped on ``error`` (non-finite values, or a failed environment
    worker) and what checkpoint it kept; the exit status."""
    from jaxrl_frag.errors import NonFiniteError

    last = checkpoints.steps()
    if isinstance(error, NonFiniteError):
        kept = f"the last good checkpoint is iteration {last[-1]} in {checkpoints.directory}" if last else "no checkpoint"
        print(f"jaxrl-frag: error: {error}; stopped, {kept}. Lower the learning rate or check the environment, "
              "and start a new run", file=sys.stderr)
        return NON_FINITE
    kept = (f"the last checkpoint is iteration {last[-1]}: resume with jaxrl-frag resume {run_dir.path} (the "
            "environments start afresh)") if last else "no checkpoint was written yet"
    print(f"jaxrl-frag: error: {error}; the run stopped, {kept}", file=sys.stderr)
    return ENV_WORKER_FAILED


def _finish(spec: RunSpec, run_dir: Any, history: Any, members: Members | None, on_chunk: Any,
            stop: StopOnSignal, checkpoints: Any, say: Callable[..., None]) -> int:
    """A run trained to its end: the final line, then (process 0) the curve and, in a
    population, the summary; ``INTERRUPTED`` where a signal came meanwhile, after what was
    being written is whole (a single run's curve left unwritten: ``resume`` draws it)."""
    if on_chunk is not None:
        on_chunk.close()  # the progress bar ends before the line below
    say(f"trained to {int(np.nanmax(history.final['env_steps'])):,} steps; "
        f"final mean episode return {float(np.nanmean(history.last('episode_return'))):.2f}")
    if on_chunk is None:
        return 0
    if stop.requested and members is None:
        say(f"interrupted before writing the learning curve; the run is complete and checkpointed in "
            f"{checkpoints.directory}. To draw the curve: jaxrl-frag resume {run_dir.path}", file=sys.stderr)
        return INTERRUPTED
    title = f"{spec.recipe} on {spec.env}"
    if members is None:
        curve = run_dir.plot(title)
    else:
        curve = _write_population_report(run_dir, history, members, title, on_chunk.failures)
    wandb = "" if spec.wandb is None else f", {run_dir.path / 'wandb'}"
    print(f"wrote {run_dir.path / 'config.json'}, {run_dir.path / 'metrics.csv'}, {curve}, "
          f"{run_dir.path / 'tensorboard'}, {run_dir.checkpoints}{wandb}")
    if stop.requested:
        say("interrupted; the run is complete and every file written", file=sys.stderr)
        return INTERRUPTED
    return 0


def _redraw_curve(spec: RunSpec, run_dir: Any, start: Any, members: Members | None, algo: Any) -> int:
    """A complete run's learning curve (in a population, with its summary) drawn again
    from the rows of its last checkpoint, ``start``, where the curve is missing or damaged,
    saying so; the exit status: ``WRITE_FAILED`` where that write fails, else 0."""
    from jaxrl_frag.app.rundir import CURVE, report_write_failure
    from jaxrl_frag.program import History

    problem = run_dir.curve_problem()
    if problem is None:
        return 0
    title = f"{spec.recipe} on {spec.env}"
    try:
        if members is None:
            curve = run_dir.plot(title)  # from metrics.csv, which the checkpoint's rows have made whole
        else:
            history = History(start.meta["rows"], start.state, start.iteration)
            curve = _write_population_report(run_dir, history, members, title, algo.failures(history.rows))
    except OSError as error:
        return report_write_failure(error, run_dir.path, "; the run itself is complete, its checkpoints intact")
    print(f"{CURVE} {problem}: rewrote {curve}")
    return 0


def _resume_point(program: Any, checkpoints: Any, run_dir: Any, say: Callable[..., None]) -> Any:
    """The checkpoint a resumed run continues from: the newest usable one, with a line for
    each unusable one and for a newest one that metrics.csv shows was saved but is gone; or
    ``None`` where none can have reached the disk yet (a run killed before its first
    checkpoint was written starts again, which is the same run). ``ConfigError`` where the
    rows show a checkpoint was written and none is usable,
    or where metrics.csv is unusable and the checkpoint holds no rows to rebuild it from:
    config.json and metrics.csv are left as they are then. Every process decides alike."""
    import warnings

    last_row, problem = run_dir.inspect_metrics()
    every = run_dir.read_config()["checkpoint_every"]  # the interval the rows were written with
    with warnings.catch_warnings(record=True) as unusable:
        start = program.newest(checkpoints, allow_changes=RESUMABLE_CHANGES)
    for warning in unusable:
        say(f"jaxrl-frag: warning: {warning.message}", file=sys.stderr)
    due = last_row // every * every  # the newest checkpoint the rows show was due, 0 for none
    # and the newest they show is on disk: a row past a checkpoint is written once the checkpoint is
    # (Program.run), a row at its iteration before it is saved
    kept = max(last_row - 1, 0) // every * every
    damaged = [step for step in checkpoints.damaged_steps() if problem is not None or step <= last_row]
    if start is None:
        evidence = (f"metrics.csv has rows up to iteration {last_row}" if kept else
                    f"step {damaged[-1]} was moved to {checkpoints.damaged} as unusable" if damaged else None)
        check(evidence is None, "checkpoint", str(checkpoints.directory),
              f"holds no usable checkpoint although {evidence}; its rows are left as they are. To start the run over "
              f"with them kept aside: jaxrl-frag resume {run_dir.path} --restart")
        say(f"no checkpoint in {checkpoints.directory} yet: starting the run from iteration 0")
        return None
    if start.iteration < due and due not in damaged:
        say(f"jaxrl-frag: warning: checkpoint step {due} is missing from {checkpoints.directory} (deleted, or never "
            f"completed), although metrics.csv has rows up to iteration {last_row}; resuming from step "
            f"{start.iteration}", file=sys.stderr)
    check(problem is None or "rows" in start.meta, "run_dir", str(run_dir.path),
          f"its metrics.csv {problem}, and checkpoint {start.iteration} holds no rows to rebuild it from; restore "
          f"metrics.csv from a copy, or start the run over with its old rows kept aside: jaxrl-frag resume "
          f"{run_dir.path} --restart")
    return start


class _Reporter:
    """Writes each row of metrics (one per member in a population) and shows progress; in a
    population, says which members have failed (``failures``, those of the rows before
    ``done`` too) as they do."""

    def __init__(self, run_dir: Any, members: Members | None, algo: Any, done: int, earlier: list[dict[str, Any]]):
        from jaxrl_frag.app.progress import Progress

        self.run_dir, self.members, self.algo = run_dir, members, algo
        steps = algo.steps_per_iteration
        self.progress = Progress(algo.num_iterations * steps, initial=done * steps)
        self.rows = list(earlier)
        self.failures = [] if members is None else algo.failures(self.rows)

    def __call__(self, row: dict[str, Any]) -> None:
        for line in _member_rows(row, self.members):
            self.run_dir.append_metrics(line)
        self.progress.update(row if self.members is None else {k: float(np.nanmean(v)) for k, v in row.items()})
        if self.members is not None:
            self.rows.append(row)
            known = {failure.member for failure in self.failures}
            self.failures = self.algo.failures(self.rows)
            for failure in self.failures:
                if failure.member not in known:
                    print(f"jaxrl-frag: warning: {failure}; its state stays that of iteration {failure.iteration - 1} "
                          "and the other members train on", file=sys.stderr)

    def close(self) -> None:
        self.progress.close()


def _member_rows(row: dict[str, Any], members: Members | None) -> list[dict[str, Any]]:
    """A row of metrics as metrics.csv holds it: the row, or in a population one per member,
    with the member's index, seed and setting."""
    if members is None:
        return [row]
    return [{"member": i, "seed": seed, **setting, **{k: v[i] if np.ndim(v) else v for k, v in row.items()}}
            for i, (setting, seed) in enumerate(members)]


def _write_population_report(run_dir: Any, history: Any, members: Members,
                             title: str, failures: list[Any]) -> Path:
    """The summary table per setting (printed, and saved as summary.md and summary.csv),
    the members that failed (left out of it) below it, and the learning curves with 95%
    intervals; returns the plot's path."""
    import csv
    import io

    from jaxrl_frag.app import plots, summary
    from jaxrl_frag.writes import write_atomically

    rows = summary.by_setting(history.last("episode_return"), members, [failure.member for failure in failures])
    notes = "".join(f"\n- {failure}: left out of the statistics above" for failure in failures)
    table = summary.markdown(rows) + ("\n" + notes if notes else "")
    print(table)
    best = {k: v for k, v in rows[0].items() if k in members[0][0]}
    print(f"best setting: {best or 'all members share one setting'} (mean final return {rows[0]['mean_return']:.2f})")
    write_atomically(run_dir.path / "summary.md", table + "\n")
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, [k for k in rows[0] if k != "members"], extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_atomically(run_dir.path / "summary.csv", text.getvalue())
    groups = [(", ".join(f"{k}={v:g}" for k, v in row.items() if k in members[0][0]) or "all seeds",
               row["members"]) for row in rows]
    figure = plots.population_curves(history["env_steps"], history["episode_return"], groups, title)
    return write_atomically(run_dir.path / "learning_curve.png", lambda tmp: figure.savefig(tmp, dpi=120))


def _quiet(*_: Any, **__: Any) -> None:
    """``print`` on processes other than 0."""
