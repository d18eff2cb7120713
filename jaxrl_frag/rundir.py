"""A run directory: ``config.json``, ``metrics.csv`` and ``learning_curve.png``."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from typing import Any

from jaxrl_frag.errors import ConfigError

CONFIG, METRICS, CURVE = "config.json", "metrics.csv", "learning_curve.png"


class RunDir:
    """Where one run's files go. Refuses to reuse a directory that holds a run
    unless told to overwrite it, so nothing is lost by a mistyped path."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._columns: list[str] | None = None

    def check_free(self, overwrite: bool) -> None:
        """Raise ``ConfigError`` if the directory holds files and ``overwrite`` is not set."""
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError("run_dir", str(self.path), "is a file; give a directory path")
        if self.path.is_dir() and any(self.path.iterdir()) and not overwrite:
            raise ConfigError(
                "run_dir", str(self.path),
                "already holds files from an earlier run; give a new --run-dir, or pass --overwrite to replace it",
            )

    def create(self, overwrite: bool) -> None:
        self.check_free(overwrite)
        if self.path.is_dir() and overwrite:
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)

    def write_config(self, config: dict[str, Any]) -> None:
        (self.path / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")

    def append_metrics(self, row: dict[str, float]) -> None:
        """Append one row to ``metrics.csv``; the first row fixes the columns."""
        new = self._columns is None
        if new:
            self._columns = list(row)
        with open(self.path / METRICS, "a", newline="") as f:
            writer = csv.DictWriter(f, self._columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({k: _cell(row.get(k, math.nan)) for k in self._columns})

    def read_metrics(self) -> dict[str, list[float]]:
        with open(self.path / METRICS, newline="") as f:
            rows = list(csv.DictReader(f))
        return {k: [float(r[k]) for r in rows] for k in (rows[0] if rows else {})}

    def plot(self, title: str) -> Path:
        from jaxrl_frag.plots import learning_curve

        out = self.path / CURVE
        learning_curve(self.read_metrics(), title).savefig(out, dpi=120)
        return out


def _cell(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
