"""A population as a user trains one: ``jaxrl-frag train ... --seeds N --policy population
--devices D`` in a fresh process with nothing set (no ``XLA_FLAGS``, no test cache), more
members than devices included. Each member's rows equal its solo run's, and Ctrl-C while
the members train, or while a call never returns, ends the process within seconds with
the command that resumes it to the uninterrupted run."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import pytest
from resume_worker import STALLED
from saved_state import read_state

pytestmark = pytest.mark.slow  # real processes, each compiling and training for seconds
WORKER = Path(__file__).with_name("resume_worker.py")
# 16 iterations of 4 x 32 steps, a row and a checkpoint every 2
TINY = ["--num-envs", "4", "--num-steps", "32", "--total-steps", "2048", "--chunk-iterations", "2",
        "--checkpoint-every", "2"]
LAST = 16
TRAIN = ["train", "ppo", "--env", "CartPole-v1", *TINY]
# every number metrics.csv holds that a solo run computes too (not the wall clock, not the member's columns)
SKIP = {"sps", "member", "seed", "failed_count"}


def _clean_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user's fresh shell: none of this suite's settings (conftest's
    ``XLA_FLAGS`` with its 8 devices, its compilation cache), a home and cache of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_", "JAXRL_FRAG_", "PYTEST"))}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**env, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}


def _start(mode: str, argv: list[str], env: dict[str, str], n: int = 0) -> subprocess.Popen[str]:
    """``jaxrl-frag ARGV`` in a new process (through ``resume_worker.py``'s ``MODE`` and ``N``)."""
    return subprocess.Popen([sys.executable, "-u", str(WORKER), mode, str(n), "--", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc: subprocess.Popen[str], seconds: float = 400) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running after {seconds} s (a hang):\n{out[-2000:]}\n{err[-2000:]}") from None
    return proc.returncode, out, err


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _numbers(row: dict[str, str]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k not in SKIP}


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], list[dict[str, float]]]:
    """The rows of seed ``seed``'s solo run, trained once for the module's tests (in a fresh shell of its own)."""
    root = tmp_path_factory.mktemp("solo")
    env, runs = _clean_env(root), {}

    def rows(seed: int) -> list[dict[str, float]]:
        if seed not in runs:
            run_dir = root / f"solo-{seed}"
            status, _, err = _finish(_start("none", [*TRAIN, "--seed", str(seed), "--run-dir", str(run_dir)], env), 300)
            assert status == 0, err[-3000:]
            runs[seed] = [_numbers(row) for row in _rows(run_dir)]
        return runs[seed]

    return rows


# two members a device, on 2 devices (make test) and on 4 (make test-long: the same split, four processes' worth)
@pytest.mark.parametrize(("seeds", "devices"), [(4, 2), pytest.param(8, 4, marks=pytest.mark.long)])
def test_more_members_than_devices_finish_each_member_its_solo_run(
        tmp_path: Path, solo: Callable[[int], list[dict[str, float]]], seeds: int, devices: int) -> None:
    population = tmp_path / "population"
    proc = _start("none", [*TRAIN, "--seeds", str(seeds), "--policy", "population", "--devices", str(devices),
                           "--run-dir", str(population)], _clean_env(tmp_path))
    status, out, err = _finish(proc, 300)
    assert status == 0, err[-3000:]
    assert f"members split over {devices} devices" in out
    rows = _rows(population)
    assert sorted({int(row["member"]) for row in rows}) == list(range(seeds))
    for seed in (0, seeds - 1):  # the first member on the first device, the last on the last
        mine = [_numbers(row) for row in rows if int(row["seed"]) == seed]
        theirs = solo(seed)
        assert len(mine) == len(theirs) == LAST // 2
        for a, b in zip(mine, theirs, strict=True):
            assert a.keys() == b.keys()
            np.testing.assert_allclose(list(a.values()), list(b.values()), rtol=2e-5, atol=1e-6)


def _equal_states(a: Path, b: Path) -> None:
    for x, y in zip(jax.tree.leaves(read_state(a)), jax.tree.leaves(read_state(b)), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# 2048 iterations of 4 x 32 steps for each of 8 members on 4 devices: seconds of training, in calls of about a second
POPULATION = ["train", "ppo", "--env", "CartPole-v1", "--num-envs", "4", "--num-steps", "32", "--total-steps", "262144",
              "--chunk-iterations", "16", "--checkpoint-every", "256", "--seeds", "8", "--policy", "population",
              "--devices", "4"]
POPULATION_LAST = 2048


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("population")
    run_dir = tmp_path / "uninterrupted"
    status, _, err = _finish(_start("none", [*POPULATION, "--run-dir", str(run_dir)], _clean_env(tmp_path)))
    assert status == 0, err[-3000:]
    return run_dir


@pytest.mark.long  # with its uninterrupted run, about three minutes on two cores
@pytest.mark.parametrize("call", ["computing", "never returning"])
def test_ctrl_c_inside_a_call_ends_within_seconds_and_resumes_to_the_uninterrupted_run(
        uninterrupted: Path, tmp_path: Path, call: str) -> None:
    env, run_dir = _clean_env(tmp_path), tmp_path / "run"
    # "stall": the calls after the eighth never return
    proc = _start("none" if call == "computing" else "stall", [*POPULATION, "--run-dir", str(run_dir)], env, 8)
    if call == "computing":
        rows = run_dir / "metrics.csv"
        deadline = time.monotonic() + 300
        while not (rows.exists() and len(rows.read_text().splitlines()) > 1) and proc.poll() is None:
            assert time.monotonic() < deadline, "no rows written"
            time.sleep(0.05)
        time.sleep(0.5)  # well inside a call
    else:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.strip() == STALLED:
                break
        time.sleep(0.5)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGINT)
    status, out, err = _finish(proc, 60)
    ended_in = time.monotonic() - signalled
    assert ended_in < 5.0, f"ended {ended_in:.1f} s after Ctrl-C"
    assert f"Resume with: jaxrl-frag resume {run_dir}" in out + err, err[-3000:]
    assert "Traceback" not in err
    if call == "computing":
        assert status == 0 and "stopped at iteration" in out, err[-3000:]
    else:
        assert status == 130 and "still busy 4 s after SIGINT: exiting now" in err, err[-3000:]
    assert not (run_dir / "checkpoints" / str(POPULATION_LAST)).exists()

    status, _, err = _finish(_start("none", ["resume", str(run_dir)], env))
    assert status == 0, err[-3000:]
    assert [{k: v for k, v in r.items() if k != "sps"} for r in _rows(run_dir)] == \
        [{k: v for k, v in r.items() if k != "sps"} for r in _rows(uninterrupted)]
    _equal_states(run_dir / "checkpoints" / str(POPULATION_LAST), uninterrupted / "checkpoints" / str(POPULATION_LAST))
