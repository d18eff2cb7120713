"""Plugins: a package of a user's own (tests/plugin_example: a REINFORCE recipe and a chain
environment, declared in the entry-point groups ``jaxrl_frag.recipes`` and
``jaxrl_frag.envs``), installed into a temporary directory, is picked up by every command
of the real command line; a plugin that fails to load is one line naming its entry point,
and breaks no command that does not use it."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxrl_frag.app.cli import main

EXAMPLE = Path(__file__).with_name("plugin_example")
SCRIPT = Path(sys.executable).parent / "jaxrl-frag"
# a second package whose module is missing (a plugin whose dependency is not installed, say)
BROKEN = {"broken_plugin-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n",
          "broken_plugin-0.1.dist-info/entry_points.txt": "[jaxrl_frag.recipes]\nbroken = not_a_module.anywhere:Algo\n\n"
                                                         "[jaxrl_frag.envs]\nBroken-v0 = not_a_module.anywhere:make\n"}
# 16 iterations of 8 x 16 steps, a row every 4
SIZE = ["--num-envs", "8", "--num-steps", "16", "--total-steps", "2048", "--chunk-iterations", "4"]
TRAIN = ["train", "reinforce", "--env", "chain:5", *SIZE]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin installed (from a copy: building writes into the source tree)
    into a directory of its own, with the broken package beside it."""
    root = tmp_path_factory.mktemp("plugins")
    source, target = root / "source", root / "site"
    shutil.copytree(EXAMPLE, source)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(target), str(source)], check=True, timeout=300, capture_output=True)
    for name, text in BROKEN.items():
        (target / name).parent.mkdir(exist_ok=True)
        (target / name).write_text(text)
    return target


def cli(site: Path, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``jaxrl-frag ARGV`` (the console script) with the plugins' directory on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def test_envs_lists_the_plugins_ids_and_families_without_loading_them(site: Path) -> None:
    proc = cli(site, "envs")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "Chain-v0" in lines and "Broken-v0" in lines and "CartPole-v1" in lines
    (family,) = [line for line in lines if line.startswith("chain:<id>")]
    assert "jaxrl-frag-example-plugin" in family and "frag_example.chain:make_chain" in family


def test_a_plugin_recipe_trains_on_a_plugin_env_resumes_and_explains(site: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = cli(site, *TRAIN, "--baseline", "standardize", "--max-grad-norm", "1", "--logit-range=-5,5",
               "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "reinforce on chain:5: 16 iterations of 128 steps" in proc.stdout and "final mean episode return" in proc.stdout
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["recipe"], config["env"], config["baseline"]) == ("reinforce", "chain:5", "standardize")
    assert config["logit_range"] == [-5.0, 5.0] and config["max_grad_norm"] == 1.0
    assert config["settings"]["logit_range"] == [-5.0, 5.0] and config["settings"]["baseline"] == "standardize"

    proc = cli(site, "resume", str(run_dir), "--override", "total_steps=3072")  # the finished run trains on
    assert proc.returncode == 0, proc.stderr
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["iteration"]) for r in rows] == [4, 8, 12, 16, 20, 24]
    assert float(rows[-1]["env_steps"]) == 3072 and {"loss", "entropy", "episode_return"} <= set(rows[0])
    assert json.loads((run_dir / "config.json").read_text())["logit_range"] == [-5.0, 5.0]

    proc = cli(site, "explain", "reinforce", "--env", "Chain-v0", "--policy", "data-parallel", "--devices", "2")
    assert proc.returncode == 0, proc.stderr
    assert "actor.rollout" in proc.stdout and "learner.learn" in proc.stdout
    assert "DataParallel: environment batch split over 2 cpu devices" in proc.stdout


def test_a_plain_algorithm_with_create_is_a_plugin_that_learns_resumes_and_explains(site: Path, tmp_path: Path) -> None:
    """tests/plugin_example/frag_example/tabular_q.py: a jaxrl_frag.Algorithm, no Recipe; one file and one entry point."""
    run_dir = tmp_path / "run"
    proc = cli(site, "train", "tabular-q", "--env", "chain:5", "--epsilon", "0.05", "--total-steps", "4096",
               "--chunk-iterations", "4", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "tabular-q on chain:5: 32 iterations of 128 steps" in proc.stdout
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["recipe"], config["epsilon"], config["settings"]["epsilon"]) == ("tabular-q", 0.05, 0.05)
    proc = cli(site, "resume", str(run_dir), "--override", "total_steps=8192")
    assert proc.returncode == 0, proc.stderr
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["env_steps"]) == 8192
    # a random walk reaches the end of 5 cells within its 20 steps in about 60% of episodes; the learned policy always
    # (its slips and 5% random moves aside), in 4 moves
    assert float(rows[0]["episode_return"]) < 0.8 and float(rows[-1]["episode_return"]) > 0.97, rows
    assert float(rows[-1]["episode_length"]) < 6, rows
    proc = cli(site, "explain", "tabular-q", "--env", "chain:5", "--policy", "data-parallel", "--devices", "2")
    assert proc.returncode == 0, proc.stderr
    assert "DataParallel: environment batch split over 2 cpu devices" in proc.stdout


def test_a_plugin_policy_trains_explains_and_resumes(site: Path, tmp_path: Path) -> None:
    """tests/plugin_example/frag_example/pinned.py: a Policy of a package's own; one file and one entry point."""
    run_dir = tmp_path / "run"
    pinned = ["--policy", "pinned", "--devices", "2", "--device-index", "1"]
    proc = cli(site, *TRAIN, *pinned, "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    settings = json.loads((run_dir / "config.json").read_text())["settings"]
    assert (settings["policy"], settings["device_index"], settings["devices"]) == ("pinned", 1, 2)
    proc = cli(site, "resume", str(run_dir), "--override", "total_steps=3072")
    assert proc.returncode == 0, proc.stderr
    with open(run_dir / "metrics.csv") as f:
        assert [float(r["iteration"]) for r in csv.DictReader(f)] == [4, 8, 12, 16, 20, 24]
    proc = cli(site, "explain", "reinforce", "--env", "chain:5", *pinned)
    assert proc.returncode == 0, proc.stderr
    assert "Pinned: cpu:1" in proc.stdout
    proc = cli(site, "train", "reinforce", "--env", "chain:5", "--policy", "pinned", "--device-index", "99", cwd=tmp_path)
    assert proc.returncode == 2 and "device_index=99: this process has" in proc.stderr, proc.stderr
    proc = cli(site, "train", "reinforce", "--help")
    assert "--device-index" in proc.stdout and "pinned: the device to run on" in proc.stdout


def test_a_plugin_transform_trains_explains_and_resumes(site: Path, tmp_path: Path) -> None:
    """tests/plugin_example/frag_example/early_stop.py: a transform of a package's own; one file and one entry point."""
    solved = tmp_path / "solved"
    proc = cli(site, "train", "reinforce", "--env", "chain:5", "--num-envs", "8", "--num-steps", "16", "--total-steps",
               "1e5", "--chunk-iterations", "4", "--transform", "early-stop", "--early-stop-target", "0.95",
               "--run-dir", str(solved))
    assert proc.returncode == 0, proc.stderr
    with open(solved / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    # stopped inside the compiled program once solved (a random walk returns about 0.6), long before its 781 iterations
    assert float(rows[-1]["env_steps"]) <= 20_480 and float(rows[-1]["episode_return"]) >= 0.9, rows
    settings = json.loads((solved / "config.json").read_text())["settings"]
    assert (settings["transforms"], settings["early_stop_target"]) == (["early-stop"], 0.95)

    unsolved = tmp_path / "unsolved"  # a target no episode reaches: trains to its end, and resumes
    proc = cli(site, *TRAIN, "--transform", "early-stop", "--early-stop-target", "2", "--run-dir", str(unsolved))
    assert proc.returncode == 0, proc.stderr
    proc = cli(site, "resume", str(unsolved), "--override", "total_steps=3072")
    assert proc.returncode == 0, proc.stderr
    with open(unsolved / "metrics.csv") as f:
        assert [float(r["iteration"]) for r in csv.DictReader(f)] == [4, 8, 12, 16, 20, 24]

    proc = cli(site, "explain", "reinforce", "--env", "chain:5", "--transform", "early-stop", "--early-stop-target",
               "0.95", "--policy", "data-parallel", "--devices", "2")
    assert proc.returncode == 0, proc.stderr
    assert "whole on every device: early_stop" in proc.stdout
    proc = cli(site, *TRAIN, "--early-stop-target", "0.9", cwd=tmp_path)
    assert proc.returncode == 2 and "add --transform early-stop, or drop --early-stop-target" in proc.stderr, proc.stderr


def test_a_plugin_that_fails_to_load_is_one_line_naming_its_entry_point(site: Path) -> None:
    for argv, entry_point in ((["train", "broken", "--env", "Chain-v0"], "broken = not_a_module.anywhere:Algo"),
                              (["train", "ppo", "--env", "Broken-v0"], "Broken-v0 = not_a_module.anywhere:make")):
        proc = cli(site, *argv)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert lines[0].startswith("jaxrl-frag: error: ") and entry_point in lines[0], proc.stderr
        assert "package broken-plugin 0.1" in lines[0] and "No module named 'not_a_module'" in lines[0]
    proc = cli(site, "train", "--help")  # the other recipes, the working plugin's among them, are listed
    assert proc.returncode == 0, proc.stderr
    assert "REINFORCE: the policy gradient" in proc.stdout and "fails to load" in proc.stdout


@pytest.fixture
def installed(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The plugins visible to ``main`` in this process, for this test only: every group's list of
    them (recipes, environments, policies, transforms) is read again with them and again without."""
    from jaxrl_frag import recipes, sharding, transforms
    from jaxrl_frag.envs import registry

    groups = (recipes.plugins, registry.plugins, sharding.plugins, transforms.plugins)
    monkeypatch.syspath_prepend(str(site))
    for group in groups:
        group.cache_clear()
    yield
    for group in groups:
        group.cache_clear()


@pytest.mark.parametrize(("argv", "expected"), [
    (["--baseline", "best"], ["--baseline: invalid choice: 'best'", "'none', 'mean', 'standardize'"]),
    (["--logit-range", "1,2,3"], ["--logit-range: '1,2,3' is not 2 comma-separated numbers"]),
    (["--logit-range", "low,high"], ["--logit-range: 'low,high' is not 2 comma-separated numbers"]),
    (["--logit-range=5,-5"], ["logit_range=(5.0, -5.0)", "LOW < HIGH"]),
    (["--max-grad-norm=-1"], ["max_grad_norm=-1.0", "none for no clipping"]),
    (["--max-grad-norm", "x"], ["--max-grad-norm: invalid float value: 'x'"]),
    (["--env", "chain:x"], ["env='chain:x'", "chain:<cells>"]),
    (["--env", "Chain-v1"], ["env='Chain-v1'", "did you mean Chain-v0", "chain:<id>"]),
])
def test_a_plugin_recipes_generated_flags_refuse_bad_values(installed: None, argv: list[str], expected: list[str],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(["train", "reinforce", *([] if "--env" in argv else ["--env", "chain:5"]), *argv, *SIZE])
    except SystemExit as exit_:
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    for text in expected:
        assert text in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2


def test_an_optional_setting_reads_none(installed: None, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["explain", "reinforce", "--env", "chain:4", "--max-grad-norm", "none", "--baseline", "none"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "reinforce on chain:4: 256 environment steps per iteration" in out


ODD_RECIPES = '''
from flax import struct

from jaxrl_frag.algorithms import static_field
from jaxrl_frag.recipes import PPO


@struct.dataclass
class Odd(PPO):
    """A recipe with a setting of a type no flag reads."""

    table: dict = static_field(None, help="a table")


@struct.dataclass
class Clash(PPO):
    """A recipe with a setting named as one of the command line's own flags."""

    seeds: int = static_field(1, help="seeds of its own")
'''


def test_a_plugin_recipe_whose_settings_cannot_be_flags_breaks_only_its_own_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import EntryPoint

    from jaxrl_frag import recipes

    (tmp_path / "odd_recipes.py").write_text(ODD_RECIPES)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {name: EntryPoint(name, f"odd_recipes:{cls}", recipes.PLUGIN_GROUP) for name, cls in
             (("odd", "Odd"), ("clash", "Clash"))}
    monkeypatch.setattr(recipes, "plugins", lambda: found)
    for name, expected in (("odd", "recipe='Odd': Odd.table cannot be a command-line flag"),
                           ("clash", "recipe='Clash': a setting's flag clashes with the command line's own")):
        assert main(["train", name, "--env", "CartPole-v1"]) == 2
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1, err
    assert main(["train", "ppo", "--env", "CartPole-v1", "--total-steps", "100"]) == 2  # the others read as ever
    assert "total_steps=100" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "A recipe with a setting of a type no flag reads" in out and "odd" in out and "clash" in out
