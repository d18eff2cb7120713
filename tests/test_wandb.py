"""Weights & Biases beside metrics.csv and TensorBoard (``--wandb PROJECT``), as a user meets
it, with the real wandb logging offline (``WANDB_MODE=offline``: no network): what a run logs
reads back, from W&B's own files in the run directory, equal to its metrics.csv, with
config.json as its config; a resumed run continues the same W&B run; a population logs each
member's rows; ``--overwrite`` replaces a run holding W&B's files; and a run that cannot log
to W&B is refused with exit status 2 before anything is compiled or written."""

from __future__ import annotations

import csv
import json
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jaxrl_frag as jf
from jaxrl_frag.app.cli import main
from jaxrl_frag.app.rundir import RunDir

TINY = ["--num-envs", "8", "--num-steps", "16", "--chunk-iterations", "2"]  # 128 steps an iteration, a row every 2
TRAIN = ["train", "ppo", "--env", "CartPole-v1", *TINY, "--wandb", "jaxrl-frag-tests"]
BLOCK = 32768  # the blocks of W&B's transaction log (LevelDB's log format)


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """wandb logging offline, its settings and logs under ``tmp_path``; its process-wide state,
    which reads the environment once, reset before and after."""
    import wandb

    for name in [name for name in os.environ if name.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # wandb-core's own log
    monkeypatch.chdir(tmp_path)
    wandb.teardown()
    yield
    wandb.teardown()


def _records(path: Path) -> list[Any]:
    """The records of a W&B transaction log (``run-ID.wandb``): after a 7-byte header, chunks of
    LevelDB's log format in 32 KiB blocks (a block's tail shorter than a chunk's header is
    padding), each record a ``wandb_internal_pb2.Record`` whole in one chunk or split over several."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    records, pending, at = [], b"", 7
    while at + 7 <= len(data):
        if BLOCK - at % BLOCK < 7:
            at += BLOCK - at % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[at:at + 7])
        assert kind in (1, 2, 3, 4), (path, at, kind)  # full, first, middle, last
        pending += data[at + 7:at + 7 + length]
        at += 7 + length
        if kind in (1, 4):
            records.append(Record.FromString(pending))
            pending = b""
    return records


def _wandb_runs(run_dir: Path) -> list[dict[str, Any]]:
    """Each start of the run's W&B run, oldest first: its id, project, name, config, logged rows
    (W&B's own columns, ``_step`` and the like, left out) and exit code."""
    starts = []
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        (log,) = folder.glob("run-*.wandb")
        records = _records(log)
        (run,) = [r.run for r in records if r.HasField("run")]
        (exit_,) = [r.exit for r in records if r.HasField("exit")]
        rows = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
                for r in records if r.HasField("history")]
        starts.append({"id": run.run_id, "project": run.project, "name": run.display_name,
                       "config": {u.key: json.loads(u.value_json) for u in run.config.update if u.key != "_wandb"},
                       "rows": [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows],
                       "exit_code": exit_.exit_code})
    return starts


def _exact(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """``rows`` with each value as the float metrics.csv writes (NaN equal to NaN)."""
    return [{k: repr(float(v)) for k, v in row.items()} for row in rows]


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    status = main(argv)
    return status, capsys.readouterr().err


def test_an_offline_run_logs_metrics_csv_with_config_json_and_resumed_continues_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    assert _cli(capsys, [*TRAIN, "--total-steps", "256", "--run-dir", str(run)])[0] == 0
    trained = json.loads((run / "config.json").read_text())
    # resumed without wandb: refused before anything is compiled, naming the extra; then resumed with it
    with monkeypatch.context() as without:
        without.setitem(sys.modules, "wandb", None)
        status, err = _cli(capsys, ["resume", str(run), "--override", "total_steps=512"])
    assert status == 2 and "jaxrl-frag: error: wandb='jaxrl-frag-tests'" in err and \
        "pip install 'jaxrl-frag[wandb]'" in err and "Traceback" not in err, err
    assert _cli(capsys, ["resume", str(run), "--override", "total_steps=512"])[0] == 0

    config, rows = json.loads((run / "config.json").read_text()), _metrics(run)
    assert [row["iteration"] for row in rows] == ["2.0", "4.0"]
    first, resumed = _wandb_runs(run)
    assert first["id"] == resumed["id"] == config["wandb_run"]
    assert first["project"] == "jaxrl-frag-tests" and first["name"] == "run" and config["settings"]["wandb"] == "jaxrl-frag-tests"
    assert first["config"] == trained and resumed["config"] == config  # config.json as each wrote it
    assert _exact(first["rows"] + resumed["rows"]) == _exact(rows)  # every column, sps too: the same rows
    assert first["exit_code"] == resumed["exit_code"] == 0
    # W&B's files are the run's: --overwrite replaces it, refusing nothing
    RunDir(run).check_free(overwrite=True)


def test_a_population_from_python_logs_each_member_under_its_name(tmp_path: Path) -> None:
    spec = jf.RunSpec("ppo", "CartPole-v1", seeds=2, chunk_iterations=2, wandb="jaxrl-frag-tests",
                      recipe_settings={"num_envs": 8, "num_steps": 16, "total_steps": 512})
    assert jf.train(spec, tmp_path / "population") == 0
    (logged,) = _wandb_runs(tmp_path / "population")
    members = [{f"member{row['member']}/{k}": v for k, v in row.items() if k != "member"}
               for row in _metrics(tmp_path / "population")]
    by_step = [{**one, **two} for one, two in zip(members[::2], members[1::2], strict=True)]
    assert _exact(logged["rows"]) == _exact(by_step)


def test_the_project_is_a_setting_of_the_run_in_each_form(tmp_path: Path) -> None:
    from jaxrl_frag.app.cli.parser import build_parser
    from jaxrl_frag.app.cli.spec_flags import run_spec

    spec = jf.RunSpec("ppo", "CartPole-v1", wandb="jaxrl-frag-tests")
    assert spec.to_json()["wandb"] == "jaxrl-frag-tests" and "wandb" not in jf.RunSpec("ppo", "CartPole-v1").to_json()
    assert jf.RunSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    (tmp_path / "run.toml").write_text(spec.to_toml())
    assert jf.RunSpec.from_toml(tmp_path / "run.toml") == spec
    argv = ["train", "ppo", "--env", "CartPole-v1", "--wandb", "jaxrl-frag-tests"]
    assert run_spec(build_parser(argv).parse_args(argv)) == spec


@pytest.mark.parametrize(("flags", "env", "said"), [
    (["--wandb", "a/b"], {}, "wandb='a/b': give a W&B project name"),
    (["--wandb", "p"], {"WANDB_MODE": "sometimes"}, "wandb='p': W&B refuses its settings"),
    (["--wandb", "p"], {"WANDB_MODE": "online"}, "No API key configured"),
], ids=["project", "mode", "no-key"])
def test_a_run_that_cannot_log_to_wandb_is_refused_before_anything_is_written(
        flags: list[str], env: dict[str, str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no API key
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    status, err = _cli(capsys, ["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(tmp_path / "run"), *flags])
    assert status == 2 and said in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("jaxrl-frag: error:")
    assert not (tmp_path / "run").exists()


def test_train_without_wandb_installed_names_the_extra(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails, as where it is not installed
    status, err = _cli(capsys, [*TRAIN, "--run-dir", str(tmp_path / "run")])
    assert status == 2 and err.strip() == ("jaxrl-frag: error: wandb='jaxrl-frag-tests': logging to W&B needs the wandb "
                                           "package: pip install 'jaxrl-frag[wandb]'")
    assert not (tmp_path / "run").exists()
