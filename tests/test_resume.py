"""A run killed at any moment and resumed is the same run: parameters and metrics
bitwise equal to an uninterrupted one. Real processes, real SIGKILL and SIGTERM, real
orbax checkpoints on disk."""

from __future__ import annotations

import csv
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from resume_worker import STARTED
from saved_state import read_state

pytestmark = pytest.mark.slow  # real processes, each training for seconds
WORKER = Path(__file__).with_name("resume_worker.py")
# 200 iterations of 4 x 128 steps, a row every 4 iterations, a checkpoint every 20
TRAIN = ["train", "ppo", "--env", "CartPole-v1", "--total-steps", "102400", "--chunk-iterations", "4",
         "--checkpoint-every", "20"]
LAST = 200


def _worker(mode: str, n: int, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(WORKER), mode, str(n), "--", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    """metrics.csv as text, without the wall-clock column."""
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k != "sps"} for row in csv.DictReader(f)]


def _logged(tag: str, run_dir: Path) -> list[tuple[int, float]]:
    """(step, value) of a TensorBoard scalar, as a reader sees it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _final_state(run_dir: Path) -> dict:
    return read_state(run_dir / "checkpoints" / str(LAST))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("resume") / "uninterrupted"
    status, _, err = _finish(_worker("none", 0, *TRAIN, "--run-dir", str(run_dir)))
    assert status == 0, err
    return run_dir


def _kill_at_random_moment(run_dir: Path) -> subprocess.Popen[str]:
    """SIGKILL from outside, at a random moment once a fifth of the rows are written."""
    proc = _worker("none", 0, *TRAIN, "--run-dir", str(run_dir))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        rows = run_dir / "metrics.csv"
        if rows.exists() and len(rows.read_text().splitlines()) > 10:
            break
        time.sleep(0.01)
    time.sleep(random.Random(7).uniform(0.0, 0.2))
    proc.send_signal(signal.SIGKILL)
    return proc


@pytest.mark.parametrize(
    "kill",
    ["during the 3rd checkpoint's commit", "after the 27th row (past a checkpoint)", "at a random moment",
     "by SIGTERM (preemption notice)"],
)
def test_killed_run_resumes_to_the_same_parameters_and_metrics(uninterrupted: Path, tmp_path: Path, kill: str) -> None:
    run_dir = tmp_path / "run"
    if kill.startswith("during"):
        proc = _worker("commit", 3, *TRAIN, "--run-dir", str(run_dir))
    elif kill.startswith("after"):
        proc = _worker("rows", 27, *TRAIN, "--run-dir", str(run_dir))
    elif kill.startswith("at a random"):
        proc = _kill_at_random_moment(run_dir)
    else:
        proc = _worker("none", 0, *TRAIN, "--run-dir", str(run_dir))
        while not (run_dir / "metrics.csv").exists() and proc.poll() is None:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
    status, out, err = _finish(proc)
    if kill.startswith("by SIGTERM"):
        assert status == 0 and "Resume with: jaxrl-frag resume" in out, err
        assert "SIGTERM received" in err
    else:
        assert status == -signal.SIGKILL, err
    assert not (run_dir / "checkpoints" / str(LAST)).exists()  # it was stopped before the end

    status, out, err = _finish(_worker("none", 0, "resume", str(run_dir)))
    assert status == 0, err
    assert _metrics(run_dir) == _metrics(uninterrupted)
    assert _logged("loss", run_dir) == _logged("loss", uninterrupted)  # no duplicate or missing events
    resumed, reference = _final_state(run_dir), _final_state(uninterrupted)
    assert jax.tree.structure(resumed) == jax.tree.structure(reference)
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(reference), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_resume_with_changed_settings_is_refused(uninterrupted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jaxrl_frag.app.cli import main

    before = {p: p.read_bytes() for p in uninterrupted.rglob("*") if p.is_file()}
    changed = list(TRAIN)
    changed[TRAIN.index("--total-steps") + 1] = "2e5"
    assert main([*changed, "--run-dir", str(uninterrupted), "--resume", "--lr", "1e-3"]) == 2
    err = capsys.readouterr().err
    assert "lr: 0.00025 -> 0.001" in err and "total_steps: 102400 -> 200000" in err
    assert "--override (total_steps=...)" in err
    assert main(["resume", str(uninterrupted), "--override", "lr=1e-3"]) == 2
    assert "'lr' cannot change in a resumed run" in capsys.readouterr().err
    assert before == {p: p.read_bytes() for p in uninterrupted.rglob("*") if p.is_file()}


# 500 iterations of 8 x 128 steps as ONE row, seconds of training: a call is bounded in time, not by the chunk
WHOLE_ITERATIONS = 500
WHOLE = ["train", "ppo", "--env", "CartPole-v1", "--num-envs", "8", "--total-steps", str(WHOLE_ITERATIONS * 8 * 128),
         "--chunk-iterations", str(WHOLE_ITERATIONS)]


def _started(argv: list[str]) -> tuple[subprocess.Popen[str], float]:
    """``jaxrl-frag`` in a new process, returned once it has compiled and begun training."""
    proc = subprocess.Popen([sys.executable, "-u", str(WORKER), "none", "0", "--", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("compiled in"):
            return proc, time.monotonic()
    raise AssertionError(f"never compiled: {proc.communicate()}")


def test_sigterm_stops_within_seconds_inside_a_chunk_and_resumes_to_the_same_run(tmp_path: Path) -> None:
    reference, run_dir = tmp_path / "uninterrupted", tmp_path / "stopped"
    status, _, err = _finish(_worker("none", 0, *WHOLE, "--run-dir", str(reference)))
    assert status == 0, err
    proc, _ = _started([*WHOLE, "--run-dir", str(run_dir)])
    time.sleep(3.0)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    status, out, err = _finish(proc)
    stopped_in = time.monotonic() - signalled
    assert status == 0 and "Resume with: jaxrl-frag resume" in out, err
    assert stopped_in < 5.0, f"stopped {stopped_in:.1f} s after SIGTERM"
    steps = [int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps and 0 < max(steps) < WHOLE_ITERATIONS  # inside the run's only chunk: no row written yet
    assert not (run_dir / "metrics.csv").exists() or len(_metrics(run_dir)) == 0

    status, out, err = _finish(_worker("none", 0, "resume", str(run_dir)))
    assert status == 0, err
    assert len(_metrics(run_dir)) == 1 and _metrics(run_dir) == _metrics(reference)  # the chunk's totals carried over
    resumed, expected = (read_state(d / "checkpoints" / str(WHOLE_ITERATIONS)) for d in (run_dir, reference))
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_second_ctrl_c_exits_at_once_and_keeps_the_newest_checkpoint(uninterrupted: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc, _ = _started([*TRAIN, "--run-dir", str(run_dir)])
    while not any(p.name.isdigit() for p in (run_dir / "checkpoints").glob("*")) and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    assert proc.stderr is not None
    for line in proc.stderr:  # the first one handled (two arriving before Python's handler runs would count once)
        if "SIGINT received" in line:
            break
    signalled = time.monotonic()
    proc.send_signal(signal.SIGINT)
    status, _, err = _finish(proc)
    assert status == 130 and time.monotonic() - signalled < 3.0, err
    assert "exiting now" in err and "Traceback" not in err
    status, _, err = _finish(_worker("none", 0, "resume", str(run_dir)))
    assert status == 0, err
    assert _metrics(run_dir) == _metrics(uninterrupted)
    for a, b in zip(jax.tree.leaves(_final_state(run_dir)), jax.tree.leaves(_final_state(uninterrupted)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_ctrl_c_before_training_starts_exits_130_writing_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _worker("none", 0, *TRAIN, "--run-dir", str(run_dir))
    assert proc.stderr.readline().strip() == STARTED  # Python has imported the package: the command starts
    time.sleep(1.0)  # parsing, making the environment and tracing: long before the first call
    proc.send_signal(signal.SIGINT)
    status, _, err = _finish(proc)
    assert status == 130 and "interrupted" in err and "Traceback" not in err, err
    assert not run_dir.exists()


def test_sigterm_after_training_ends_130_saying_so_and_resume_draws_the_curve(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-u", str(WORKER), "none", "0", "--", "train", "ppo", "--env", "CartPole-v1",
                             "--num-envs", "4", "--num-steps", "8", "--total-steps", "256", "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("trained to"):
            break
    proc.send_signal(signal.SIGTERM)  # while the curve is drawn, or just before
    status, _, err = _finish(proc)
    assert status == 130 and "SIGTERM received" in err and "Traceback" not in err, err
    assert "interrupted" in err
    status, out, err = _finish(_worker("none", 0, "resume", str(run_dir)))
    assert status == 0 and ("learning_curve.png" in out + err or "complete" in out), err
    png = (run_dir / "learning_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and png.endswith(b"IEND\xaeB`\x82")


def test_a_second_sigterm_exits_130_at_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc, _ = _started([*WHOLE, "--run-dir", str(run_dir)])
    time.sleep(2.0)  # training
    proc.send_signal(signal.SIGTERM)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "SIGTERM received" in line:
            break
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    status, _, err = _finish(proc)
    assert status == 130 and time.monotonic() - signalled < 3.0, err
    assert f"second SIGTERM: exiting now; the newest complete checkpoint is kept. Resume with: jaxrl-frag resume " \
           f"{run_dir}" in err and "Traceback" not in err
