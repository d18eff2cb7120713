"""The command line: a real training run, explain, and every kind of bad input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxrl_frag.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        status = main(list(argv))
    except SystemExit as exit_:  # argparse's own errors
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


def test_train_writes_config_metrics_and_curve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    status, out, _ = run_cli(capsys, "train", "ppo", "--env", "CartPole-v1", "--total-steps", "2e4",
                             "--lr", "3e-4", "--seed", "3", "--run-dir", str(run_dir))
    assert status == 0
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"] == "CartPole-v1" and config["lr"] == pytest.approx(3e-4) and config["seed"] == 3
    assert config["total_steps"] == 20_000 and config["num_envs"] == 4
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert {"env_steps", "episode_return", "episode_length", "sps", "loss", "value_loss"} <= set(rows[0])
    assert float(rows[-1]["env_steps"]) == (20_000 // 512) * 512
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "steps/s" in out and "final mean episode return" in out

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"episode_return", "episode_length", "loss", "value_loss", "entropy", "sps", "learning_rate"} <= tags
    for tag in ("episode_return", "learning_rate"):
        logged = events.Scalars(tag)
        column = [float(r[tag]) for r in rows if r[tag] != "nan"]
        assert [e.step for e in logged] == [int(float(r["env_steps"])) for r in rows if r[tag] != "nan"]
        np.testing.assert_allclose([e.value for e in logged], column, rtol=1e-6)
    lr = [e.value for e in events.Scalars("learning_rate")]
    assert lr[0] == pytest.approx(3e-4, rel=0.1) and lr[-1] < lr[0] / 5  # annealed towards zero


def test_explain_data_parallel_shows_placement_and_collectives(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(capsys, "explain", "ppo", "--env", "CartPole-v1", "--policy", "data-parallel",
                             "--devices", "4")
    assert status == 0
    assert "DataParallel: environment batch split over 4 cpu devices" in out
    assert "all-reduce" in out and "all-gather" not in out and "x16" in out


def test_explain_shows_fragments_bytes_and_flops(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(capsys, "explain", "ppo", "--env", "CartPole-v1")
    assert status == 0
    assert "actor.rollout" in out and "learner.learn" in out
    assert "actor.rollout.traj -> learner.learn.traj" in out and "19.0 KiB" in out
    assert "flops" in out


def test_console_script_and_module_entry_exit_2_without_traceback() -> None:
    for cmd in (["jaxrl-frag"], [sys.executable, "-m", "jaxrl_frag"]):
        exe = Path(sys.executable).parent / cmd[0] if cmd[0] == "jaxrl-frag" else cmd[0]
        proc = subprocess.run([str(exe), *cmd[1:], "train", "ppo", "--env", "CartPole-v1", "--num-envs", "0"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert "num_envs=0" in proc.stderr and "Traceback" not in proc.stderr


def test_recipe_on_an_action_space_it_cannot_act_in() -> None:
    from flax import struct

    from jaxrl_frag import ConfigError, envs
    from jaxrl_frag.recipes import PPO

    @struct.dataclass
    class ContinuousOnly(PPO):
        action_spaces = (envs.Box,)

    with pytest.raises(ConfigError) as err:
        ContinuousOnly.create("CartPole-v1")
    message = str(err.value)
    assert err.value.field == "env" and "CartPole-v1" in message
    assert "discrete actions" in message and "supports continuous actions only" in message


def test_sweep_writes_member_rows_summary_and_curves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "sweep"
    status, out, _ = run_cli(capsys, "train", "ppo", "--env", "CartPole-v1", "--total-steps", "4096", "--seeds", "2",
                             "--sweep", "lr=1e-4,1e-3", "--run-dir", str(run_dir))
    assert status == 0
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["member"] for r in rows} == {"0", "1", "2", "3"} and {r["seed"] for r in rows} == {"0", "1"}
    assert {float(r["lr"]) for r in rows} == {1e-4, 1e-3}
    summary = (run_dir / "summary.md").read_text()
    assert "mean_return" in summary and "ci95_low" in summary and "iqm_return" in summary
    assert "best setting: {'lr':" in out
    assert json.loads((run_dir / "config.json").read_text())["members"] == 4
    assert (run_dir / "learning_curve.png").exists() and (run_dir / "summary.csv").exists()


def test_resume_trains_on_to_a_longer_total_with_default_intervals(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    assert run_cli(capsys, "train", "ppo", "--env", "CartPole-v1", "--total-steps", "4096",
                   "--run-dir", str(run_dir))[0] == 0  # 8 iterations of 512 steps, a row each
    status, out, err = run_cli(capsys, "resume", str(run_dir), "--override", "total_steps=6144")
    assert status == 0, err
    with open(run_dir / "metrics.csv") as f:
        assert [float(r["iteration"]) for r in csv.DictReader(f)] == list(range(1, 13))
    assert json.loads((run_dir / "config.json").read_text())["total_steps"] == 6144
    assert "12" in {p.name for p in (run_dir / "checkpoints").iterdir()}
    status, out, _ = run_cli(capsys, "resume", str(run_dir))
    assert status == 0 and "is complete (12 iterations)" in out
    status, _, err = run_cli(capsys, "resume", str(run_dir), "--override", "total_steps=2048")
    assert status == 2 and "total_steps=2048" in err and "already taken" in err


def test_actor_learner_trains_explains_and_resumes_from_the_command_line(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    flags = ["--policy", "actor-learner", "--actor-devices", "2", "--learner-devices", "2", "--transfer-dtype", "int8"]
    status, out, err = run_cli(capsys, "train", "impala", "--env", "CartPole-v1", "--total-steps", "4096", *flags,
                               "--run-dir", str(run_dir))  # 8 iterations of 16 x 32 steps
    assert status == 0, err
    assert "actor fragments on 2 cpu device(s) [0,1], learner fragments on 2 [2,3]" in out and "int8" in out
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["policy"], config["staleness"], config["transfer_dtype"]) == ("actor-learner", 1, "int8")
    status, _, err = run_cli(capsys, "resume", str(run_dir), "--override", "total_steps=6144")
    assert status == 0, err
    with open(run_dir / "metrics.csv") as f:
        assert [float(r["iteration"]) for r in csv.DictReader(f)] == list(range(1, 13))
    status, out, _ = run_cli(capsys, "explain", "impala", "--env", "CartPole-v1", *flags)
    assert status == 0 and "transfers between device groups per iteration (this program: int8)" in out
    assert "learner -> actor   state.params" in out
