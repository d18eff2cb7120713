"""A real multi-process JAX runtime on localhost: 2 processes x 2 CPU devices, gloo collectives."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
from saved_state import read_state

ROOT = Path(__file__).resolve().parents[1]
WORKER = [sys.executable, str(ROOT / "tests" / "multiprocess_worker.py")]
LAUNCH = str(ROOT / "launch" / "local.sh")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and not k.startswith("JAXRL_FRAG_")}
    return {**env, **extra}


def load(path: Path) -> list[np.ndarray]:
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def test_two_processes_of_two_devices_equal_one_process_of_four(tmp_path: Path) -> None:
    one = subprocess.run([*WORKER, str(tmp_path / "one.npz"), "4"], env=clean_env(), capture_output=True,
                         text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([LAUNCH, "2", *WORKER, str(tmp_path / "two.npz"), "2", str(tmp_path / "ckpt")],
                         env=clean_env(), capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "processes=2 devices=4" in two.stdout and "processes=1 devices=4" in one.stdout
    for a, b in zip(load(tmp_path / "one.npz"), load(tmp_path / "two.npz"), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # both processes wrote their shards of one checkpoint; read back whole, it is the final state
    assert sorted(int(p.name) for p in (tmp_path / "ckpt").iterdir()) == [2, 4]
    saved = read_state(tmp_path / "ckpt" / "4")
    for a, b in zip(jax.tree.leaves(saved["params"]), load(tmp_path / "two.npz"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_dead_process_stops_the_run_instead_of_hanging(tmp_path: Path) -> None:
    start = time.monotonic()
    run = subprocess.run([LAUNCH, "2", *WORKER, str(tmp_path / "x.npz"), "2"],
                         env=clean_env(JAXRL_FRAG_TEST_DIE="1"), capture_output=True, text=True, timeout=200)
    assert run.returncode != 0
    assert "process 1 exited with status 3; stopping the others" in run.stderr
    assert time.monotonic() - start < 120
    assert not (tmp_path / "x.npz").exists()
