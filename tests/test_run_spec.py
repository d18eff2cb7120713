"""A run is one typed value, ``RunSpec``: what train's flags make, what a TOML run file
(``--config``) and config.json hold, and what Python trains (``jf.train``). Round trips
of each form; a run file trained from the command line and the same run built and trained
in Python write equal run directories, each resumed by the other side; bad run files
refused with exit status 2, nothing written."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from saved_state import read_state

import jaxrl_frag as jf
from jaxrl_frag.app.build import resolved_spec
from jaxrl_frag.app.cli import main
from jaxrl_frag.app.cli.parser import build_parser
from jaxrl_frag.app.cli.spec_flags import run_spec, with_run_file
from jaxrl_frag.errors import ConfigError

# a spec with a setting of each family, and of each kind: a tuple, an explicit none, a sweep, boosting
SPECS = [
    jf.RunSpec("ppo", "CartPole-v1", seed=3, recipe_settings={"total_steps": 20480, "hidden": (32, 32), "lr": 1e-3},
               policy="data-parallel", policy_settings={"devices": 2}, chunk_iterations=4, checkpoint_every=8),
    jf.RunSpec("ppo", "CartPole-v1", seeds=2, sweep=("lr=1e-3,3e-4",), recipe_settings={"num_envs": 8}),
    jf.RunSpec("ppo", "CartPole-v1", boost="nitro", boost_settings={"ladder": (4, 8), "budget_steps": 40960},
               eval_every=4, eval_episodes=2),
    jf.RunSpec("sac", "brax:inverted_pendulum", recipe_settings={"tau": 0.01, "total_steps": 4096}),
]


def _parsed(argv: list[str]) -> jf.RunSpec:
    """The spec the command line ``argv`` makes, as ``main`` reads it (a run file expanded)."""
    argv, defaults = with_run_file(argv)
    return run_spec(build_parser(argv, defaults).parse_args(argv))


@pytest.mark.parametrize("spec", SPECS, ids=["settings", "sweep", "boost", "sac"])
def test_each_form_gives_the_spec_back(spec: jf.RunSpec, tmp_path: Path) -> None:
    assert jf.RunSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    (tmp_path / "run.toml").write_text(spec.to_toml())
    assert jf.RunSpec.from_toml(tmp_path / "run.toml") == spec
    assert _parsed(["train", "--config", str(tmp_path / "run.toml")]) == spec


def test_flags_override_the_run_file(tmp_path: Path) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text('recipe = "ppo"\nenv = "CartPole-v1"\ntotal_steps = "2e4"\nnum_envs = 8\nseed = 1\n'
                        'policy = "data-parallel"\ndevices = 2\n')
    from_file = jf.RunSpec("ppo", "CartPole-v1", seed=1, recipe_settings={"total_steps": 20000, "num_envs": 8},
                           policy="data-parallel", policy_settings={"devices": 2})
    assert _parsed(["train", "--config", str(run_file)]) == from_file
    assert _parsed(["train", "ppo", "--config", str(run_file), "--num-envs", "16", "--seed", "4", "--env", "Acrobot-v1"]) \
        == from_file.replace(seed=4, env="Acrobot-v1", recipe_settings={"total_steps": 20000, "num_envs": 16})


def test_print_config_writes_the_resolved_run_as_a_file_that_trains_it(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # where a run directory would go
    assert main(["train", "ppo", "--env", "CartPole-v1", "--num-envs", "8", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "num_envs = 8\n" in printed and "num_steps = 128\n" in printed and "chunk_iterations = " in printed
    (tmp_path / "run.toml").write_text(printed)
    resolved = jf.RunSpec.from_toml(tmp_path / "run.toml")
    assert resolved == resolved_spec(jf.RunSpec("ppo", "CartPole-v1", recipe_settings={"num_envs": 8}))
    assert resolved_spec(resolved) == resolved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.toml"]  # trained nothing


BAD_FILES = [
    ('env = "CartPole-v1"\n', ["names the recipe None"]),
    ('recipe = "ppo"\nenv = "CartPole-v1"\nnum_envz = 4\n', ["'num_envz'", "does not take"]),
    ('recipe = "ppo"\nenv = "CartPole-v1"\nnum_envs = "four"\n', ["num_envs='four'", "--num-envs cannot be"]),
    ('recipe = "ppo"\nenv = "CartPole-v1"\ntotal_steps = 5e5\n', ["total_steps=500000.0", 'total_steps = "5e5"']),
    ('recipe = "ppo"\nenv = "CartPole-v1"\npolicy = "everywhere"\n', ["policy='everywhere'"]),
    ('recipe = "ppo"\nenv = "CartPole-v1\n', ["is not TOML"]),
    (None, ["cannot be read"]),
]


@pytest.mark.parametrize(("text", "said"), BAD_FILES, ids=[f"{i}" for i in range(len(BAD_FILES))])
def test_a_bad_run_file_is_refused_naming_it(text: str | None, said: list[str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    run_file = tmp_path / "run.toml"
    if text is not None:
        run_file.write_text(text)
    assert main(["train", "--config", str(run_file), "--run-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxrl-frag: error: config='{run_file}'") and err.count("\n") == 1, err
    for part in said:
        assert part in err
    assert sorted(p.name for p in tmp_path.iterdir()) == (["run.toml"] if text is not None else [])


def test_a_run_file_of_another_recipe_than_the_command_is_refused(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.toml").write_text('recipe = "ppo"\nenv = "CartPole-v1"\n')
    assert main(["train", "dqn", "--config", str(tmp_path / "run.toml")]) == 2
    assert "names the recipe 'ppo', and the command 'dqn'" in capsys.readouterr().err


def test_python_refuses_a_setting_its_recipe_lacks_and_reads_none_as_unset() -> None:
    assert jf.RunSpec("ppo", "CartPole-v1", recipe_settings={"lr": None}) == jf.RunSpec("ppo", "CartPole-v1")
    with pytest.raises(ConfigError, match=r"recipe_settings='num_envz': not a setting of `train ppo`"):
        jf.RunSpec("ppo", "CartPole-v1", recipe_settings={"num_envz": 4})
    with pytest.raises(ConfigError, match=r"policy_settings='actors'"):
        jf.RunSpec("ppo", "CartPole-v1", policy_settings={"actors": 4})


# 20 iterations of 4 x 128 steps, a row every 4, a checkpoint every 8; trained to half, then resumed to the end
RUN_FILE = 'recipe = "ppo"\nenv = "CartPole-v1"\ntotal_steps = 10240\nnum_envs = 4\nchunk_iterations = 4\n' \
           'checkpoint_every = 8\n'
PYTHON_TRAIN = """
import jaxrl_frag as jf
spec = jf.RunSpec("ppo", "CartPole-v1", recipe_settings={"total_steps": 5120, "num_envs": 4}, chunk_iterations=4,
                  checkpoint_every=8)
raise SystemExit(jf.train(spec, "py"))
"""
PYTHON_RESUME = """
import jaxrl_frag as jf
raise SystemExit(jf.resume("cli", {"total_steps": 10240}))
"""


def _user_env(home: Path) -> dict[str, str]:
    """The environment of a user's shell: no test settings (device counts, step caps), the suite's compiled programs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXRL_FRAG_", "XLA_", "JAX_"))}
    return {**env, "HOME": str(home), "JAXRL_FRAG_CACHE_DIR": os.environ["JAXRL_FRAG_CACHE_DIR"]}


def _user_runs(cwd: Path, *commands: list[str]) -> None:
    for command in commands:
        proc = subprocess.run(command, cwd=cwd, env=_user_env(cwd), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (command, proc.stderr)


def _directory(run_dir: Path) -> dict[str, object]:
    """What a run directory holds, but its wall-clock figures (steps/s) and orbax's file names."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with open(run_dir / "metrics.csv", newline="") as f:
        rows = [{k: v for k, v in row.items() if k != "sps"} for row in csv.DictReader(f)]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
               if not tag.endswith("sps")}
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir())
    return {"files": sorted(p.name for p in run_dir.iterdir()), "config": json.loads((run_dir / "config.json").read_text()),
            "rows": rows, "scalars": scalars, "curve": (run_dir / "learning_curve.png").read_bytes(), "steps": steps,
            "states": [read_state(run_dir / "checkpoints" / str(step)) for step in steps]}


def _assert_same(one: dict[str, object], other: dict[str, object]) -> None:
    states = one.pop("states"), other.pop("states")
    assert one == other
    for a, b in zip(*states, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@pytest.mark.slow
def test_a_run_file_on_the_command_line_and_the_same_run_in_python_are_one_run(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(RUN_FILE)
    cli = [sys.executable, "-m", "jaxrl_frag"]
    python = [sys.executable, "-c"]
    # each trained to half: the run file with a flag over it, the same run from Python
    _user_runs(tmp_path, [*cli, "train", "--config", "run.toml", "--total-steps", "5120", "--run-dir", "cli"],
               [*python, PYTHON_TRAIN])
    _assert_same(_directory(tmp_path / "cli"), _directory(tmp_path / "py"))
    # each resumed to the end by the other side
    _user_runs(tmp_path, [*python, PYTHON_RESUME], [*cli, "resume", "py", "--override", "total_steps=10240"])
    resumed = _directory(tmp_path / "cli")
    assert resumed["steps"] == [10, 16, 20] and resumed["rows"][-1]["iteration"] == "20.0"
    _assert_same(resumed, _directory(tmp_path / "py"))
