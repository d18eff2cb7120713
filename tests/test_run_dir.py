"""The run directory fails safely: ``--overwrite`` removes only a run, one process writes
a run at a time, a resume reads everything before it writes and loses no rows, and a
write that the disk refuses ends the run with status 5, resumable once there is room.
Real orbax checkpoints; real processes where one is needed (a lock held by another
process, concurrent resumes, a full disk), ``main`` in this process elsewhere."""

from __future__ import annotations

import contextlib
import csv
import json
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import snapshot
from saved_state import read_state

from jaxrl_frag.app.cli import main

# 64 iterations of 4 x 8 steps, a row every 4 iterations, a checkpoint every 8 (the last 3 kept)
TRAIN = ["train", "ppo", "--env", "CartPole-v1", "--num-envs", "4", "--num-steps", "8", "--total-steps", "2048",
         "--chunk-iterations", "4", "--checkpoint-every", "8"]
LAST = 64
CLI = [sys.executable, "-c", "import sys; from jaxrl_frag.app.cli import main; sys.exit(main())"]
HOLD_LOCK = ("import sys; from jaxrl_frag.app.rundir import RunDir; RunDir(sys.argv[1]).lock(); print('held', flush=True); "
             "sys.stdin.read()")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of ``TRAIN``, to copy."""
    run = tmp_path_factory.mktemp("run_dir") / "finished"
    assert main([*TRAIN, "--run-dir", str(run)]) == 0
    return run


def _rows(run: Path, *, sps: bool = True) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if sps or k != "sps"} for row in csv.DictReader(f)]


def _same_state(run: Path, finished: Path) -> None:
    """The final parameters (the whole state) are bitwise those of the finished run."""
    resumed, reference = read_state(run / "checkpoints" / str(LAST)), read_state(finished / "checkpoints" / str(LAST))
    assert jax.tree.structure(resumed) == jax.tree.structure(reference)
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(reference), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's own usage errors
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


# what a fault's setup does to the copy of the finished run (``run``) and the current
# directory (``cwd``, holding a user's notes.txt); it may start processes (``stack``
# ends them) and returns values for the placeholders of the case's strings

Setup = Callable[[Path, Path, contextlib.ExitStack], dict[str, str] | None]


def _nothing(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    return None


def _config(edit: Callable[[dict], object]) -> Setup:
    def setup(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps(edit(config)))
    return setup


def _without(key: str) -> Callable[[dict], dict]:
    return lambda config: {k: v for k, v in config.items() if k != key}


def _config_bytes(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    (run / "config.json").write_bytes(random.Random(1).randbytes(300))


def _config_dir(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    (run / "config.json").unlink()
    (run / "config.json").mkdir()


def _metrics_bytes(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    (run / "metrics.csv").write_bytes(random.Random(2).randbytes(3000))


def _metrics_renamed(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    text = (run / "metrics.csv").read_text()
    (run / "metrics.csv").write_text(text.replace("iteration,", "iter,", 1))


def _metrics_deleted(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    (run / "metrics.csv").unlink()


def _without_rows(damage: Setup) -> Setup:
    """``damage``, in a run whose checkpoints were saved without their rows (an older version's)."""
    def setup(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
        for meta in (run / "checkpoints").glob("*/meta/metadata"):
            meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != "rows"}))
        damage(run, cwd, stack)
    return setup


def _in_home(run: Path, cwd: Path, stack: contextlib.ExitStack) -> dict[str, str]:
    home = cwd.parent / "home"
    home.mkdir()
    (home / ".profile").write_text("a user's file\n")
    stack.enter_context(pytest.MonkeyPatch.context()).setenv("HOME", str(home))
    return {"home": str(home)}


def _not_a_run(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    (cwd / "photos").mkdir()
    (cwd / "photos" / "cat.jpg").write_bytes(b"\xff\xd8 not a run")


def _run_and_notes(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    (run / "notes.txt").write_text("a user's notes, kept in the run directory\n")


def _notes_a_level_down(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    """A user's files inside the run's folders, where only the run's own files go."""
    (run / "checkpoints" / "notes.txt").write_text("a user's file\n")
    (run / "tensorboard" / "notes.txt").write_text("a user's file\n")


def _held_lock(run: Path, cwd: Path, stack: contextlib.ExitStack) -> dict[str, str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    stack.callback(holder.wait, timeout=30)
    stack.callback(holder.stdin.close)  # the holder ends, releasing the lock
    assert holder.stdout.readline() == "held\n"
    return {"pid": str(holder.pid)}


def _damage_every_step(run: Path) -> None:
    """Garbage in place of every array file of every checkpoint step."""
    rng = random.Random(3)
    for array in (run / "checkpoints").glob("*/state/**/d/*"):
        array.write_bytes(rng.randbytes(array.stat().st_size))


def _damage_and_resume_once(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    """Every step damaged, and a first resume refused (it sets the damaged steps aside)."""
    _damage_every_step(run)
    rows = (run / "metrics.csv").read_bytes()
    assert main(["resume", str(run)]) == 2
    assert sorted(p.name.split("-")[0] for p in (run / "checkpoints.damaged").iterdir()) == ["48", "56", "64"]
    assert (run / "metrics.csv").read_bytes() == rows


def _lose_steps_and_rows(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    """Every step damaged and set aside by a refused resume, then metrics.csv deleted."""
    _damage_and_resume_once(run, cwd, stack)
    (run / "metrics.csv").unlink()


def _delete_steps(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    for step in (run / "checkpoints").iterdir():
        shutil.rmtree(step)


def _delete_newest(run: Path, cwd: Path, stack: contextlib.ExitStack) -> None:
    shutil.rmtree(run / "checkpoints" / str(LAST))


def _rebuilt(run: Path, finished: Path) -> None:
    """metrics.csv holds the finished run's rows again (its saved sps too), and a damaged
    file was kept aside unchanged, never deleted."""
    assert _rows(run) == _rows(finished)
    for kept in run.glob("metrics.*.csv"):
        assert kept.read_bytes() in (random.Random(2).randbytes(3000),
                                     (finished / "metrics.csv").read_text().replace("iteration,", "iter,", 1).encode())


def _resumed_from_56(run: Path, finished: Path) -> None:
    assert _rows(run, sps=False) == _rows(finished, sps=False) and not list(run.glob("metrics.*.csv"))
    _same_state(run, finished)


@dataclass(frozen=True)
class Fault:
    """A fault in a run directory or the path given for one: the command's exit status, what
    its output says (placeholders filled in from the setup), and what must stay as it was:
    ``"all"`` (every file in the run directory and the current directory, byte for byte) or
    ``"rows"`` (metrics.csv); ``then`` checks the result against the finished run."""

    name: str
    setup: Setup
    argv: list[str]
    status: int
    says: list[str]
    unchanged: str | None = "all"
    then: Callable[[Path, Path], None] | None = field(default=None)


RESUME = ["resume", "{run}"]
FAULTS = [
    # what a resume reads, refused before it compiles
    Fault("resume of a plain file", _nothing, ["resume", "{cwd}/notes.txt"], 2, ["notes.txt", "is a file"]),
    Fault("config.json is a list", _config(lambda c: [c]), RESUME, 2, ["config.json holds a JSON list"]),
    Fault("config.json lacks settings", _config(_without("settings")), RESUME, 2, ["config.json lacks settings"]),
    Fault("config.json lacks checkpoint_every", _config(_without("checkpoint_every")), RESUME, 2,
          ["config.json lacks checkpoint_every"]),
    Fault("config.json: checkpoint_every of another type", _config(lambda c: {**c, "checkpoint_every": "8"}), RESUME, 2,
          ["checkpoint_every='8'", "not a positive whole number"]),
    Fault("config.json: a setting of another type",
          _config(lambda c: {**c, "settings": {**c["settings"], "num_envs": "four"}}), RESUME, 2,
          ["num_envs='four'", "--num-envs cannot be"]),
    Fault("config.json: a device count of another type",
          _config(lambda c: {**c, "settings": {**c["settings"], "devices": "two"}}), RESUME, 2,
          ["devices='two'", "--devices cannot be"]),
    Fault("config.json: random bytes", _config_bytes, RESUME, 2, ["config.json is not readable JSON"]),
    Fault("config.json is a directory", _config_dir, RESUME, 2, ["config.json is a directory"]),
    # metrics.csv unusable and no rows to rebuild it from: refused before config.json is rewritten
    Fault("metrics.csv: random bytes, checkpoints without rows", _without_rows(_metrics_bytes),
          [*RESUME, "--override", "total_steps=4096"], 2, ["metrics.csv is not text", "no rows to rebuild it", "--restart"]),
    Fault("metrics.csv: header renamed, checkpoints without rows", _without_rows(_metrics_renamed),
          [*RESUME, "--override", "total_steps=4096"], 2, ["metrics.csv has no iteration column", "--restart"]),
    # metrics.csv rebuilt from the rows saved with the checkpoint
    Fault("metrics.csv: random bytes, rebuilt", _metrics_bytes, RESUME, 0,
          ["metrics.csv is not text: rebuilt its rows up to iteration 64 from the checkpoint; kept the old file as "
           "metrics."], None, _rebuilt),
    Fault("metrics.csv: header renamed, rebuilt", _metrics_renamed, RESUME, 0,
          ["metrics.csv has no iteration column: rebuilt its rows up to iteration 64"], None, _rebuilt),
    Fault("metrics.csv deleted, rebuilt", _metrics_deleted, RESUME, 0,
          ["metrics.csv is missing: rebuilt its rows up to iteration 64"], None, _rebuilt),
    # paths that cannot be written, refused before compiling
    Fault("--run-dir /proc/x", _nothing, [*TRAIN, "--run-dir", "/proc/x"], 2, ["run_dir='/proc/x'", "cannot be written"]),
    Fault("--run-dir /sys/x", _nothing, [*TRAIN, "--run-dir", "/sys/x"], 2, ["run_dir='/sys/x'", "cannot be written"]),
    Fault("--run-dir under a plain file", _nothing, [*TRAIN, "--run-dir", "{cwd}/notes.txt/run"], 2,
          ["notes.txt is a file"]),
    # what --overwrite never removes
    Fault("--run-dir '' --overwrite", _nothing, [*TRAIN, "--run-dir", "", "--overwrite"], 2,
          ["run_dir='.'", "is the current directory"]),
    Fault("--run-dir . --overwrite", _nothing, [*TRAIN, "--run-dir", ".", "--overwrite"], 2,
          ["is the current directory"]),
    Fault("--run-dir .. --overwrite", _nothing, [*TRAIN, "--run-dir", "..", "--overwrite"], 2,
          ["is a parent of the current directory"]),
    Fault("--run-dir HOME --overwrite", _in_home, [*TRAIN, "--run-dir", "{home}", "--overwrite"], 2,
          ["is the home directory"]),
    Fault("--run-dir / --overwrite", _nothing, [*TRAIN, "--run-dir", "/", "--overwrite"], 2,
          ["run_dir='/'", "is a filesystem root"]),
    Fault("--overwrite of a directory that holds no run", _not_a_run, [*TRAIN, "--run-dir", "{cwd}/photos", "--overwrite"],
          2, ["holds files but no run"]),
    Fault("--overwrite of a run that also holds a user's file", _run_and_notes,
          [*TRAIN, "--run-dir", "{run}", "--overwrite"], 2, ["holds a run and also notes.txt"]),
    Fault("--overwrite of a run with a user's file inside checkpoints/ and tensorboard/", _notes_a_level_down,
          [*TRAIN, "--run-dir", "{run}", "--overwrite"], 2,
          ["holds a run and also checkpoints/notes.txt, tensorboard/notes.txt, which no run writes"]),
    # one writer at a time
    Fault("resume of a run that another process writes", _held_lock, RESUME, 2,
          ["is being written by process {pid} on "]),
    Fault("--overwrite of a run that another process writes", _held_lock, [*TRAIN, "--run-dir", "{run}", "--overwrite"], 2,
          ["is being written by process {pid} on "]),
    # no usable checkpoint: every resume refuses alike, and the rows stay
    Fault("every step damaged, resumed a second time", _damage_and_resume_once, RESUME, 2,
          ["holds no usable checkpoint although metrics.csv has rows up to iteration 64", "resume {run} --restart"]),
    Fault("every step deleted", _delete_steps, RESUME, 2,
          ["holds no usable checkpoint although metrics.csv has rows up to iteration 64"]),
    Fault("every step damaged, then metrics.csv deleted", _lose_steps_and_rows, RESUME, 2,
          ["holds no usable checkpoint although step 64 was moved to"]),
    # a missing newest step is reported, the one before used
    Fault("newest step deleted", _delete_newest, RESUME, 0,
          ["checkpoint step 64 is missing", "resuming from step 56"], None, _resumed_from_56),
]


def test_the_fault_table_covers_the_cases_named() -> None:
    assert len(FAULTS) >= 25


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_run_directory_faults(fault: Fault, finished: Path, run: Path, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "notes.txt").write_text("a user's file\n")
    monkeypatch.chdir(cwd)
    with contextlib.ExitStack() as stack:
        values = {"run": str(run), "cwd": str(cwd), **(fault.setup(run, cwd, stack) or {})}
        capsys.readouterr()
        before, rows = snapshot(tmp_path), (run / "metrics.csv").read_bytes() if (run / "metrics.csv").is_file() else None
        status, out, err = _cli(capsys, [a.format(**values) for a in fault.argv])
    assert status == fault.status, err
    for text in fault.says:
        assert text.format(**values) in out + err, out + err
    assert "Traceback" not in err
    if status:
        assert len(err.strip().splitlines()) <= 4 and "error:" in err.strip().splitlines()[-1], err
    if fault.unchanged == "all":
        assert snapshot(tmp_path) == before
    elif fault.unchanged == "rows":
        assert (run / "metrics.csv").read_bytes() == rows
    if fault.then is not None:
        fault.then(run, finished)


def test_restart_after_every_checkpoint_is_lost_keeps_the_old_rows(finished: Path, run: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rows = (run / "metrics.csv").read_bytes()
    _damage_every_step(run)
    for _ in range(2):  # every resume refuses, the rows untouched
        status, _, err = _cli(capsys, ["resume", str(run)])
        assert status == 2 and "--restart" in err and (run / "metrics.csv").read_bytes() == rows
    status, out, err = _cli(capsys, ["resume", str(run), "--restart"])
    assert status == 0, err
    kept = list(run.glob("metrics.*.csv"))
    assert len(kept) == 1 and kept[0].read_bytes() == rows and f"its old rows are kept in {kept[0]}" in out
    assert _rows(run, sps=False) == _rows(finished, sps=False)  # the same run again
    _same_state(run, finished)


def test_two_trains_into_one_new_directory_one_refused(tmp_path: Path) -> None:
    """What the second of two trains started at once into a new directory meets, once
    compiled: the first holds the directory (refused, naming it), or has written its run
    there (refused: it holds files)."""
    from jaxrl_frag.app.rundir import RunDir
    from jaxrl_frag.errors import ConfigError

    new = tmp_path / "new"
    RunDir(new).check_free()  # both see it free before compiling
    with contextlib.ExitStack() as stack:
        new.mkdir()
        pid = _held_lock(new, tmp_path, stack)["pid"]
        with pytest.raises(ConfigError, match=f"is being written by process {pid} on "), RunDir(new) as second:
            second.create(overwrite=False)
    (new / "config.json").write_text(json.dumps({"recipe": "ppo", "settings": {}, "jax": "0"}))
    with pytest.raises(ConfigError, match="already holds files"), RunDir(new) as second:
        second.create(overwrite=False)
    assert [p.name for p in new.iterdir()] == ["config.json"]  # the first run's file kept, the lock released


@pytest.mark.slow
def test_concurrent_resumes_one_refused_naming_the_other(run: Path) -> None:
    """Two resumes of one run at once: one trains, the other exits 2 naming it; the rows
    stay in order with none twice."""
    first_rows = _rows(run)
    procs = [subprocess.Popen([*CLI, "resume", str(run), "--override", "total_steps=2048000"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    deadline = time.monotonic() + 120
    while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    refused = next(p for p in procs if p.poll() is not None)
    winner = next(p for p in procs if p is not refused)
    _, err = refused.communicate()
    assert refused.returncode == 2 and f"is being written by process {winner.pid} on " in err, err
    while len(_rows(run)) <= len(first_rows) + 2 and winner.poll() is None:  # it trains on
        time.sleep(0.05)
    winner.send_signal(signal.SIGTERM)
    _, err = winner.communicate(timeout=120)
    assert winner.returncode == 0, err
    rows = _rows(run)
    iterations = [float(r["iteration"]) for r in rows]
    assert iterations == sorted(set(iterations)) and rows[:len(first_rows)] == first_rows
    assert not (run / "run.lock").exists()


@contextlib.contextmanager
def _small_disk(path: Path, size: str) -> Iterator[Callable[[], None] | None]:
    """A tmpfs of ``size`` at ``path``; yields a function that gives it more room."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        yield None
        return
    try:
        yield lambda: subprocess.run(["mount", "-o", "remount,size=16m", str(path)], check=True)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.mark.slow
def test_a_full_disk_stops_the_run_with_status_5_and_it_resumes_to_the_same_run(finished: Path, tmp_path: Path) -> None:
    """The disk fills after the first checkpoint: exit 5, one paragraph naming the path, no
    traceback; with room again, ``resume`` ends where an uninterrupted run does, bitwise."""
    with _small_disk(tmp_path / "disk", "400k") as more_room:
        run = tmp_path / "disk" / "run"
        limit = None
        if more_room is None:  # no tmpfs here: a file-size limit, past the checkpoints' files
            limit = max(p.stat().st_size for p in (finished / "checkpoints").rglob("*") if p.is_file()) + 1
            if limit >= (finished / "learning_curve.png").stat().st_size:
                pytest.skip("neither a tmpfs can be mounted nor a file-size limit falls within this run")

        def limited() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        proc = subprocess.run([*CLI, *TRAIN, "--run-dir", str(run)], capture_output=True, text=True, timeout=300,
                              preexec_fn=limited if limit else None)
        assert proc.returncode == 5, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith(f"jaxrl-frag: error: could not write {run}")
        assert ("No space left on device" if limit is None else "File too large") in proc.stderr
        assert f"jaxrl-frag resume {run}" in proc.stderr
        if more_room is not None:
            assert (run / "checkpoints" / "8").is_dir() and not (run / "checkpoints" / str(LAST)).exists()
            more_room()
        proc = subprocess.run([*CLI, "resume", str(run)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert _rows(run, sps=False) == _rows(finished, sps=False)
        _same_state(run, finished)
        assert not list(run.glob("*.tmp"))
