"""The command line: a real training run, explain, and every kind of bad input."""

from __future__ import annotations

import csv
import dataclasses
import enum
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from jaxrl_frag.app.cli import main


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


@pytest.mark.slow  # processes of their own
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


@pytest.mark.slow  # two runs of the command line
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


def test_a_run_saved_before_a_setting_existed_resumes_at_its_default(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A run whose config.json and checkpoints do not name ``clip_value`` (added to PPO after
    such runs were saved) resumes with it at its default, the behaviour it was trained
    with; asked to resume with the setting changed, it is refused."""
    run_dir = tmp_path / "run"
    assert run_cli(capsys, "train", "ppo", "--env", "CartPole-v1", "--total-steps", "2048",
                   "--run-dir", str(run_dir))[0] == 0
    saved = [run_dir / "config.json", *(run_dir / "checkpoints").glob("*/meta/metadata")]
    for path in saved:
        record = json.loads(path.read_text())
        config = record.get("config", record)  # a checkpoint's meta holds the run's config under "config"
        assert config.pop("clip_value") is True
        path.write_text(json.dumps(record))
    status, _, err = run_cli(capsys, "train", "ppo", "--env", "CartPole-v1", "--total-steps", "2048",
                             "--no-clip-value", "--run-dir", str(run_dir), "--resume")
    assert status == 2 and "clip_value: True -> False" in err
    status, _, err = run_cli(capsys, "resume", str(run_dir), "--override", "total_steps=3072")
    assert status == 0, err
    with open(run_dir / "metrics.csv") as f:
        assert [float(r["iteration"]) for r in csv.DictReader(f)][-1] == 6


@pytest.mark.slow  # three runs of the command line, each compiling its programs
def test_actor_learner_trains_explains_and_resumes_from_the_command_line(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    flags = ["--policy", "actor-learner", "--actor-devices", "2", "--learner-devices", "2", "--transfer-dtype", "int8",
             "--num-steps", "32"]
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


# -- flags generated from dataclass fields --------------------------------------------------------


def _flag_parser(cls: type):
    from jaxrl_frag.app import fields
    from jaxrl_frag.app.cli import flags

    parser = flags.Parser(prog="jaxrl-frag test")
    hints = fields.type_hints(cls)
    made = {f.name: fields.field_flag(cls, f, hints) for f in fields.settings_of(cls)}
    for flag in made.values():
        flag.add_to(parser)
    return parser, made


class Torso(enum.Enum):
    MLP = "mlp"
    CNN = "cnn"


HELP = {"help": "a setting"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """One field of every type a flag reads."""

    count: int = dataclasses.field(default=4, metadata=HELP)
    rate: float = dataclasses.field(default=0.5, metadata=HELP)
    name: str = dataclasses.field(default="x", metadata=HELP)
    on: bool = dataclasses.field(default=True, metadata=HELP)
    widths: tuple[int, ...] = dataclasses.field(default=(64, 64), metadata=HELP)
    scales: tuple[float, ...] = dataclasses.field(default=(1.0,), metadata=HELP)
    words: tuple[str, ...] = dataclasses.field(default=("a",), metadata=HELP)
    bounds: tuple[float, float] = dataclasses.field(default=(-1.0, 1.0), metadata=HELP)
    mode: Literal["fast", "exact"] = dataclasses.field(default="fast", metadata=HELP)
    level: Literal[1, 2, 3] = dataclasses.field(default=1, metadata=HELP)
    torso: Torso = dataclasses.field(default=Torso.MLP, metadata=HELP)
    clip: float | None = dataclasses.field(default=None, metadata=HELP)
    limit: int | None = dataclasses.field(default=10, metadata=HELP)
    style: str = dataclasses.field(default="plain", metadata={**HELP, "choices": ("plain", "fancy"), "flag": "look"})
    internal: int = 3  # no help: not a flag


def test_flags_are_generated_for_every_supported_field_type(capsys: pytest.CaptureFixture[str]) -> None:
    from jaxrl_frag.app import fields as flags

    parser, made = _flag_parser(Settings)
    assert "internal" not in made and made["style"].option == "--look"
    args = parser.parse_args(["--count", "5e3", "--rate=-1e-3", "--name", "y", "--no-on", "--widths", "32, 16",
                              "--scales", "0.5,2", "--words", "p,q", "--bounds=-2,2", "--mode", "exact", "--level", "3",
                              "--torso", "CNN", "--clip", "0.1", "--limit", "none", "--look", "fancy"])
    assert (args.count, args.rate, args.name, args.on) == (5000, -1e-3, "y", False)
    assert (args.widths, args.scales, args.words, args.bounds) == ((32, 16), (0.5, 2.0), ("p", "q"), (-2.0, 2.0))
    assert (args.mode, args.level, args.torso, args.clip) == ("exact", 3, Torso.CNN, 0.1)
    assert args.limit is flags.NONE and flags.given(args.limit) is None and args.style == "fancy"
    assert parser.parse_args(["--torso", "cnn"]).torso is Torso.CNN  # by value too
    unset = parser.parse_args([])
    assert all(getattr(unset, name) is None for name in made)  # unset: the dataclass's own defaults apply
    for name, value in vars(args).items():  # a value saved as JSON reads back as the flag gave it
        kind = made[name].kind
        assert kind.load(json.loads(json.dumps(kind.dump(value)))) == value
    for argv, message in ((["--bounds", "1,2,3"], "'1,2,3' is not 2 comma-separated numbers"),
                          (["--widths", "64,x"], "'64,x' is not a comma-separated list of whole numbers"),
                          (["--scales", ""], "'' is not a comma-separated list of numbers"),
                          (["--mode", "slow"], "invalid choice: 'slow' (choose from 'fast', 'exact')"),
                          (["--level", "4"], "invalid choice: '4'"),
                          (["--torso", "rnn"], "invalid choice: 'rnn' (choose from 'MLP', 'CNN')"),
                          (["--clip", "big"], "--clip: invalid float value: 'big'"),
                          (["--look", "odd"], "invalid choice: 'odd' (choose from 'plain', 'fancy')")):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "usage:" not in err, err
    for kind, saved in ((made["widths"].kind, ["64"]), (made["mode"].kind, "slow"), (made["torso"].kind, "GRU"),
                        (made["bounds"].kind, [1.0]), (made["count"].kind, 1.5), (made["on"].kind, 1)):
        with pytest.raises(ValueError):
            kind.load(saved)
    assert made["clip"].kind.load(None) is flags.NONE and made["level"].kind.load(2) == 2


def test_a_field_of_a_type_no_flag_reads_is_named() -> None:
    @dataclasses.dataclass
    class Odd:
        table: dict[str, int] = dataclasses.field(default_factory=dict, metadata={"help": "a table"})

    with pytest.raises(TypeError, match=r"Odd\.table cannot be a command-line flag"):
        _flag_parser(Odd)


def test_policy_flags_are_generated_from_the_policies_fields_each_shared_flag_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    from jaxrl_frag.app import fields, spec
    from jaxrl_frag.sharding import POLICIES

    generated = {p.flag.option: p for p in spec.policy_flags()}
    declared = {fields.option_of(f) for cls in POLICIES.values() for f in fields.settings_of(cls)}
    assert set(generated) == declared == {"--devices", "--shuffle", "--actor-devices", "--learner-devices",
                                          "--staleness", "--transfer-dtype", "--agent-shards"}
    assert generated["--devices"].fields == {"data-parallel": "devices", "population": "pop"}
    assert set(generated["--shuffle"].fields) == {"data-parallel", "population", "actor-learner"}
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("--shuffle {local,exact}") == 2  # the usage line and the help, once each
    assert "--devices DEVICES devices per process (on CPU, forces that many host devices); data-parallel:" in out
    assert "population: devices to split the members over" in out
    assert "actor-learner: devices of the actor group (in each process) (default 1)" in out
    assert "--transfer-dtype {float32,bfloat16,int8}" in out and "(default float32)" in out


def test_a_population_policy_takes_its_device_count_from_devices() -> None:
    from jaxrl_frag.app.build import cpu_devices, make_policy
    from jaxrl_frag.app.spec import RunSpec

    settings = {"devices": 2, "shuffle": "exact", "actor_devices": 1, "learner_devices": 1, "staleness": 1,
                "transfer_dtype": "float32"}
    policy = make_policy(RunSpec("ppo", "CartPole-v1", policy="population", policy_settings=settings, seeds=2))
    assert type(policy).__name__ == "PopulationParallel" and policy.mesh.shape["pop"] == 2 and policy.shuffle == "exact"
    assert cpu_devices("population", settings) == 2
    assert cpu_devices("actor-learner", {**settings, "devices": None, "actor_devices": 3, "learner_devices": 2}) == 5


# -- forcing CPU devices after jax started ---------------------------------------------------------

STARTED_BY_AN_IMPORT = """
import sys
from jaxrl_frag.app.cli import main
import starter
sys.exit(main(["explain", "ppo", "--env", "CartPole-v1", "--devices", "4"]))
"""
STARTED_BEFORE_THE_CLI = """
import sys
import jax
jax.devices()
from jaxrl_frag.app.cli import main
sys.exit(main(["explain", "ppo", "--env", "CartPole-v1", "--policy", "actor-learner", "--actor-devices", "2"]))
"""


@pytest.mark.slow  # a process of its own
@pytest.mark.parametrize(("script", "expected"), [
    (STARTED_BY_AN_IMPORT, ["devices=4: --devices needs 4 CPU devices, but the CPU backend is already running with 1",
                            "started by importing starter (its first jax operation: starter.py:3)",
                            "set XLA_FLAGS=--xla_force_host_platform_device_count=4 before importing starter"]),
    (STARTED_BEFORE_THE_CLI, ["devices=3: --actor-devices + --learner-devices need 3 CPU devices, but the CPU "
                              "backend is already running with 1",
                              "started by something this process ran before it imported jaxrl_frag.app.cli",
                              "set XLA_FLAGS=--xla_force_host_platform_device_count=3 before importing jax"]),
], ids=["by an import", "before the command line was imported"])
def test_devices_after_jax_started_names_what_started_it_and_the_remedy(tmp_path: Path, script: str,
                                                                       expected: list[str]) -> None:
    (tmp_path / "starter.py").write_text("import jax\n\nZERO = jax.numpy.zeros(1)  # starts jax's backend\n")
    (tmp_path / "script.py").write_text(script)
    env = {**os.environ, "XLA_FLAGS": ""}  # one CPU device
    proc = subprocess.run([sys.executable, "script.py"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for text in expected:
        assert text in proc.stderr, proc.stderr


@pytest.mark.slow  # a process of its own: the command sets the device count before jax starts
def test_devices_in_a_new_process_give_the_command_that_many_cpu_devices() -> None:
    env = {**os.environ, "XLA_FLAGS": ""}  # one CPU device unless the command sets more
    proc = subprocess.run([sys.executable, "-m", "jaxrl_frag", "explain", "ppo", "--env", "CartPole-v1", "--policy",
                           "data-parallel", "--devices", "4", "--num-envs", "8", "--num-steps", "8"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "environment batch split over 4 cpu devices" in proc.stdout, proc.stdout
