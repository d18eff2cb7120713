"""Files written whole or not at all, and the paths that cannot be written, as a user
meets them: ``--overwrite`` of a run holding a user's file at any depth, paths too long
for the file system, ``run.lock`` as a directory and ``checkpoints``/``tensorboard`` as
files, ``evaluate``/``explain`` writing onto what cannot take a file, a write failing
half-way (a file-size limit, ``RLIMIT_FSIZE``, in a subprocess: EFBIG, a real fault), a
finished run's damaged learning curve (a population's too) restored by ``resume``, and too
few file descriptors (``RLIMIT_NOFILE``).

Tests run as root, so a chmod-based read-only directory does not refuse anything: the
unwritable places here are a path under /proc, a path whose parent is a regular file, a
directory in place of the target file, and a read-only tmpfs where one can be mounted."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import snapshot

from jaxrl_frag.app.cli import main

pytestmark = pytest.mark.slow  # real runs and CLI processes under resource limits

TINY = ["--num-envs", "4", "--num-steps", "8", "--total-steps", "64", "--chunk-iterations", "1"]
TRAIN = ["train", "ppo", "--env", "CartPole-v1", *TINY]
CLI = [sys.executable, "-c", "import sys; from jaxrl_frag.app.cli import main; sys.exit(main())"]
PNG_END = b"IEND\xaeB`\x82"
# a file-size limit would also refuse jax's compilation cache entries (a warning each): no cache there
NO_CACHE = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run (2 iterations, checkpoint step 2), to copy."""
    run = tmp_path_factory.mktemp("writes") / "finished"
    assert main([*TRAIN, "--run-dir", str(run)]) == 0
    return run


def _cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


def _one_error(err: str) -> None:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("jaxrl-frag: error:") and len(lines) <= 4, err


def _file_size_limit(limit: int) -> Callable[[], None]:
    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limited


# a user's file or folder inside a run, at some depth: --overwrite refuses, naming it, deleting nothing
USERS = [
    ("checkpoints/notes.txt", "file"),
    ("tensorboard/notes.txt", "file"),
    ("checkpoints/2/notes.txt", "file"),
    ("checkpoints/2/state/notes.txt", "file"),
    ("checkpoints/2/state/d/notes.txt", "file"),
    ("checkpoints/photos", "dir"),
    ("checkpoints.damaged/notes.txt", "file"),
    ("tensorboard/events.out.tfevents.1.host.1", "dir"),  # a run's name, but a folder: the wrong kind
    ("photos", "dir"),
]


@pytest.mark.parametrize(("where", "kind"), USERS, ids=[w for w, _ in USERS])
def test_overwrite_refuses_a_users_file_at_any_depth(run: Path, tmp_path: Path, where: str, kind: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    target = run / where
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dir":
        target.mkdir()
        (target / "a.jpg").write_bytes(b"a user's photo")
    else:
        target.write_text("a user's notes\n")
    before = snapshot(tmp_path)
    status, _, err = _cli(capsys, [*TRAIN, "--run-dir", str(run), "--overwrite"])
    assert status == 2, err
    _one_error(err)
    assert f"holds a run and also {where}" in err and "move that elsewhere first" in err, err
    assert snapshot(tmp_path) == before  # nothing deleted


def test_overwrite_replaces_only_a_runs_own_tree(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Everything a run writes, at every depth (a damaged step set aside, rows set aside, an
    interrupted write's temporary files, an orbax temporary step), goes; the run is new."""
    shutil.copytree(run / "checkpoints" / "2", run / "checkpoints.damaged" / "2-20260101-120000")
    shutil.copytree(run / "checkpoints" / "2", run / "checkpoints" / "4.orbax-checkpoint-tmp-17")
    (run / "metrics.20260101-120000.csv").write_text("iteration,env_steps\n")
    for name in ("learning_curve.tmp.png", "config.json.tmp", "eval.tmp.csv"):
        (run / name).write_text("partial")
    status, _, err = _cli(capsys, [*TRAIN, "--run-dir", str(run), "--overwrite"])
    assert status == 0, err
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json", "learning_curve.png",
                                                     "metrics.csv", "tensorboard"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2"]


LONG = "A" * 300


@pytest.mark.parametrize("argv", [
    [*TRAIN[:3], LONG, *TINY],  # a long --env id: its default run directory's name
    [*TRAIN, "--run-dir", f"{{tmp}}/{LONG}"],
    [*TRAIN, "--run-dir", "{tmp}/" + "a/" * 2100],  # the whole path past PATH_MAX
    ["resume", f"{{tmp}}/{LONG}"],
    ["evaluate", f"{{tmp}}/{LONG}"],
    ["evaluate", "{run}", "--video", f"{{tmp}}/{LONG}.gif"],
    ["explain", "ppo", "--env", "CartPole-v1", "--draw", f"{{tmp}}/{LONG}.png"],
], ids=["env", "run-dir", "run-dir-past-PATH_MAX", "resume", "evaluate", "video", "draw"])
def test_a_path_too_long_for_the_file_system_is_refused(argv: list[str], run: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    status, _, err = _cli(capsys, [a.format(tmp=tmp_path, run=run) for a in argv])
    assert status == 2, err
    _one_error(err)
    assert "is too long for the file system (File name too long" in err and "give a shorter path" in err, err
    assert snapshot(tmp_path) == before


def _misplace(run: Path, name: str) -> None:
    """Put a user's thing of the other kind where the run keeps ``name``."""
    if (run / name).is_dir():
        shutil.rmtree(run / name)
        (run / name).write_text("a user's file\n")
    else:
        (run / name).unlink(missing_ok=True)
        (run / name).mkdir()
        (run / name / "keep.txt").write_text("a user's file\n")


@pytest.mark.parametrize(("name", "kind"), [("run.lock", "directory"), ("checkpoints", "file"),
                                            ("tensorboard", "file")])
@pytest.mark.parametrize("argv", [["resume", "{run}"], ["resume", "{run}", "--restart"],
                                  [*TRAIN, "--run-dir", "{run}", "--overwrite"],
                                  ["train", "ppo", "--env", "CartPole-v1", "--run-dir", "{run}", "--resume", *TINY],
                                  ["evaluate", "{run}", "--episodes", "1"]],
                         ids=["resume", "restart", "overwrite", "train-resume", "evaluate"])
def test_a_run_part_of_the_wrong_kind_is_refused_and_nothing_changed(argv: list[str], name: str, kind: str, run: Path,
                                                                      tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _misplace(run, name)
    before = snapshot(tmp_path)
    status, _, err = _cli(capsys, [a.format(run=run) for a in argv])
    assert status == 2, err
    _one_error(err)
    assert f"holds {name} as a {kind}" in err and f"move that {kind} elsewhere ({run / name})" in err, err
    assert snapshot(tmp_path) == before


def test_resume_restart_of_a_run_whose_checkpoints_is_a_file_exits_2_at_once(run: Path, tmp_path: Path) -> None:
    """As the user met it: the command in its own process, which printed a traceback from
    orbax's thread and then never ended."""
    _misplace(run, "checkpoints")
    before = snapshot(tmp_path)
    done = subprocess.run([*CLI, "resume", str(run), "--restart"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    _one_error(done.stderr)
    assert "holds checkpoints as a file" in done.stderr, done.stderr
    assert snapshot(tmp_path) == before


@contextlib.contextmanager
def _read_only_copy(run: Path, tmp_path: Path) -> Iterator[Path]:
    """``run`` on a read-only tmpfs (skips where none can be mounted)."""
    disk = tmp_path / "ro"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(disk)], capture_output=True).returncode != 0:
        pytest.skip("no tmpfs can be mounted here")
    try:
        shutil.copytree(run, disk / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        yield disk / "run"
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.mark.parametrize(("target", "says"), [
    (["--video", "/proc/episode.gif"], "cannot be written: making a file in /proc fails"),
    (["--video", "{tmp}/notes.txt/episode.gif"], "notes.txt is not a directory"),  # its folder is a regular file
    (["--video", "{tmp}/folder.gif"], "is a directory; give the path of a file"),  # a directory in place of the file
    ([], "Read-only file system"),  # eval.csv into a run on a read-only file system
], ids=["video-under-proc", "video-under-a-file", "video-onto-a-directory", "eval.csv-read-only"])
def test_evaluate_refuses_what_cannot_be_written(target: list[str], says: str, run: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("a user's notes\n")
    (tmp_path / "folder.gif").mkdir()
    with contextlib.ExitStack() as stack:
        where = run if target else stack.enter_context(_read_only_copy(run, tmp_path))
        before = snapshot(where)
        status, _, err = _cli(capsys, ["evaluate", str(where), "--episodes", "2",
                                       *(a.format(tmp=tmp_path) for a in target)])
        assert status == 2, err
        _one_error(err)
        assert says in err, err
        assert snapshot(where) == before  # no eval.csv, nothing else


@pytest.mark.parametrize("draw", ["/proc/graph.png", "{tmp}/notes.txt/graph.png", "{tmp}/folder.png"],
                         ids=["under-proc", "under-a-file", "onto-a-directory"])
def test_explain_draw_refuses_what_cannot_be_written(draw: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("a user's notes\n")
    (tmp_path / "folder.png").mkdir()
    status, _, err = _cli(capsys, ["explain", "ppo", "--env", "CartPole-v1", "--draw", draw.format(tmp=tmp_path)])
    assert status == 2, err
    _one_error(err)
    assert "draw=" in err and draw.format(tmp=tmp_path) in err, err


def test_a_video_write_that_fails_exits_5_keeping_the_earlier_file(run: Path, tmp_path: Path) -> None:
    """The GIF outgrows a file-size limit (EFBIG): status 5 naming it and the cause; the
    earlier GIF byte for byte, no temporary file left; eval.csv (small) written whole."""
    video = tmp_path / "episode.gif"
    earlier = b"GIF89a" + b"\0" * 100  # an earlier GIF there, kept
    video.write_bytes(earlier)
    proc = subprocess.run([*CLI, "evaluate", str(run), "--episodes", "2", "--video", str(video)], capture_output=True,
                          text=True, timeout=300, env=NO_CACHE, preexec_fn=_file_size_limit(4096))
    assert proc.returncode == 5, proc.stderr
    _one_error(proc.stderr)
    assert f"could not write {video} (File too large)" in proc.stderr
    assert video.read_bytes() == earlier and sorted(p.name for p in tmp_path.iterdir()) == ["episode.gif", "run"]
    assert (run / "eval.csv").read_text().startswith("episode,return,length")


def test_a_drawing_write_that_fails_exits_5_keeping_the_earlier_file(tmp_path: Path) -> None:
    graph = tmp_path / "graph.svg"
    graph.write_text("<svg>an earlier drawing</svg>\n")
    proc = subprocess.run([*CLI, "explain", "ppo", "--env", "CartPole-v1", "--draw", str(graph)], capture_output=True,
                          text=True, timeout=300, env=NO_CACHE, preexec_fn=_file_size_limit(2048), cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr
    _one_error(proc.stderr)
    assert f"could not write {graph} (" in proc.stderr and ("File too large" in proc.stderr or "dot failed" in proc.stderr)
    assert graph.read_text() == "<svg>an earlier drawing</svg>\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.svg"]


def test_resume_restores_a_finished_runs_damaged_curve(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A truncated learning_curve.png: a resume that cannot write (EFBIG) exits 5 naming
    the file, the damaged one as it was; once it can, it says it rewrote a whole PNG."""
    curve = run / "learning_curve.png"
    damaged = curve.read_bytes()[:1000]
    curve.write_bytes(damaged)
    proc = subprocess.run([*CLI, "resume", str(run)], capture_output=True, text=True, timeout=300,
                          env=NO_CACHE, preexec_fn=_file_size_limit(8192))
    assert proc.returncode == 5, proc.stderr
    _one_error(proc.stderr)
    assert f"could not write {curve} (File too large)" in proc.stderr
    assert curve.read_bytes() == damaged and not list(run.glob("*.tmp*"))
    status, out, err = _cli(capsys, ["resume", str(run)])
    assert status == 0, err
    assert f"learning_curve.png is damaged (not a whole PNG): rewrote {curve}" in out
    assert curve.read_bytes().startswith(b"\x89PNG") and curve.read_bytes().endswith(PNG_END)


def test_resume_restores_a_finished_runs_missing_curve(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "learning_curve.png").unlink()
    status, out, err = _cli(capsys, ["resume", str(run)])
    assert status == 0, err
    assert "is complete" in out and f"learning_curve.png is missing: rewrote {run / 'learning_curve.png'}" in out
    assert (run / "learning_curve.png").read_bytes().endswith(PNG_END)


def test_resume_restores_a_finished_populations_curve_and_summary(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A population's curve is drawn from every member's rows (its checkpoint's): the
    summary comes with it, as the run first wrote them."""
    run = tmp_path / "population"
    status, out, err = _cli(capsys, [*TRAIN, "--seeds", "2", "--policy", "population", "--devices", "2", "--run-dir", str(run)])
    assert status == 0, err
    summary = (run / "summary.md").read_text()
    (run / "learning_curve.png").unlink()
    (run / "summary.md").unlink()
    status, out, err = _cli(capsys, ["resume", str(run)])
    assert status == 0, err
    assert "is complete" in out and f"learning_curve.png is missing: rewrote {run / 'learning_curve.png'}" in out
    assert (run / "learning_curve.png").read_bytes().endswith(PNG_END)
    assert (run / "summary.md").read_text() == summary


def test_too_few_file_descriptors_end_with_one_message(tmp_path: Path) -> None:
    """``ulimit -n 16``: the checkpoint's writes fail with EMFILE; the command ends with a
    nonzero status and one message naming the cause and the fix, first on stderr."""
    def few() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))

    run = tmp_path / "run"
    proc = subprocess.run([*CLI, *TRAIN, "--run-dir", str(run)], capture_output=True, text=True, timeout=300,
                          preexec_fn=few)
    assert proc.returncode == 5, proc.stderr
    first = proc.stderr.strip().splitlines()[0]
    assert first.startswith(f"jaxrl-frag: error: could not write {run}"), proc.stderr
    assert "Too many open files" in first and "ulimit -n" in first, first
