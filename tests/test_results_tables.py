"""benchmarks/RESULTS.md and docs/parity.md are what ``python benchmarks/results.py`` renders
from the committed records, to the byte, and every record says where its figures come from."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
KEYS = {"what", "values", "machine", "date", "command", "source"}


def load_results():
    """benchmarks/results.py as a module (the standard library only: no JAX)."""
    spec = importlib.util.spec_from_file_location("benchmark_results", BENCHMARKS / "results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


results = load_results()


def history_sections() -> set[str]:
    text = (BENCHMARKS / "HISTORY.md").read_text()
    return {m.group(1).strip() for m in re.finditer(r"^#{2,6} (.+)$", text, re.M)}


def record_files() -> list[Path]:
    return sorted((BENCHMARKS / "results").glob("*.json"))


@pytest.mark.parametrize("path", [results.RESULTS, results.PARITY_PAGE], ids=lambda p: p.name)
def test_the_committed_tables_are_what_the_records_render(path: Path) -> None:
    rendered = results.outputs()[path]
    assert path.read_text() == rendered, f"{path.relative_to(ROOT)} differs: run python benchmarks/results.py"


def test_every_record_names_its_source() -> None:
    sections = history_sections()
    assert record_files(), "no records in benchmarks/results"
    for path in record_files():
        records = json.loads(path.read_text())["records"]
        assert records, path
        for r in records:
            assert KEYS <= set(r), (path.name, r["what"], KEYS - set(r))
            source = r["source"]
            if source.startswith(results.HISTORY):
                assert source.removeprefix(results.HISTORY) in sections, (path.name, source)
            else:  # a run wrote it: the records file itself, or another JSON file of the repository
                assert source.endswith(".json") and (ROOT / source).is_file(), (path.name, source)
            if "json" in r:  # a benchmark's own output, read as it is
                assert (ROOT / r["json"]).is_file(), (path.name, r["json"])
    for row in (BENCHMARKS / "parity").glob("*-*.json"):  # the parity rows are read as parity.py run wrote them
        if "row" in (written := json.loads(row.read_text())):
            assert written["command"].startswith("python benchmarks/parity.py run"), row.name


def test_a_changed_figure_changes_the_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: a record's number changed, RESULTS.md no longer matches."""
    records = tmp_path / "results"
    shutil.copytree(BENCHMARKS / "results", records)
    overhead = json.loads((records / "overhead.json").read_text())
    overhead["records"][0]["values"]["train_ratio"] += 0.001
    (records / "overhead.json").write_text(json.dumps(overhead))
    monkeypatch.setattr(results, "RECORDS", records)
    rendered = results.outputs()
    assert rendered[results.RESULTS] != results.RESULTS.read_text()
    assert rendered[results.PARITY_PAGE] == results.PARITY_PAGE.read_text()  # the parity rows did not change


def test_a_run_replaces_its_own_record_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"records": [{"what": {"envs": 4}, "values": {"x": 1}},
                                            {"what": {"envs": 8}, "values": {"x": 2}}]}))
    results.save(path, [dict(results.record({"envs": 8}, {"x": 3}, "cpu")),
                        dict(results.record({"envs": 16}, {"x": 4}, "cpu"))])
    kept = json.loads(path.read_text())["records"]
    assert [(r["what"]["envs"], r["values"]["x"]) for r in kept] == [(4, 1), (8, 3), (16, 4)]
    assert kept[1]["source"].endswith("table.json") and KEYS <= set(kept[1])
    assert "cpu" in kept[1]["machine"]
