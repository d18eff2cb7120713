"""A run directory: ``config.json``, ``metrics.csv``, TensorBoard event files,
``checkpoints/`` and ``learning_curve.png``."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from jaxrl_frag.errors import ConfigError

CONFIG, METRICS, CURVE, CHECKPOINTS, TENSORBOARD = (
    "config.json", "metrics.csv", "learning_curve.png", "checkpoints", "tensorboard")
_NOT_SCALARS = ("iteration", "env_steps", "member", "seed")


class RunDir:
    """Where one run's files go. Refuses to reuse a directory that holds a run
    unless told to resume it or to overwrite it, so nothing is lost by a mistyped path."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._columns: list[str] | None = None
        self._log: Any = None

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def check_free(self, overwrite: bool = False, resume: bool = False) -> None:
        """Raise ``ConfigError`` unless the directory is free, or holds files and
        ``overwrite`` is set, or holds a run and ``resume`` is set."""
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError("run_dir", str(self.path), "is a file; give a directory path")
        holds_files = self.path.is_dir() and any(self.path.iterdir())
        if resume:
            self.read_config()  # it must hold a run
        elif holds_files and not overwrite:
            raise ConfigError(
                "run_dir", str(self.path),
                "already holds files from an earlier run; continue it with --resume, give a new --run-dir, "
                "or pass --overwrite to replace it",
            )

    def create(self, overwrite: bool) -> None:
        self.check_free(overwrite)
        if self.path.is_dir() and overwrite:
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)

    def write_config(self, config: dict[str, Any]) -> None:
        _write_atomically(self.path / CONFIG, json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")

    def read_config(self) -> dict[str, Any]:
        """The saved configuration; ``ConfigError`` if the directory holds no run."""
        try:
            return json.loads((self.path / CONFIG).read_text())
        except FileNotFoundError:
            raise ConfigError("run_dir", str(self.path),
                              "holds no run to resume (no config.json); give the directory of an earlier run") from None
        except json.JSONDecodeError as error:
            raise ConfigError("run_dir", str(self.path), f"has an unreadable config.json ({error})") from None

    def open_log(self, purge_step: int | None = None) -> None:
        """Start TensorBoard event files in ``tensorboard/``. Events at or past
        ``purge_step`` (env steps) left by an interrupted run are hidden from readers."""
        from tensorboardX import SummaryWriter

        self._log = SummaryWriter(str(self.path / TENSORBOARD), purge_step=purge_step, flush_secs=10)

    def append_metrics(self, row: dict[str, float]) -> None:
        """Append one row to ``metrics.csv`` (the first row fixes the columns) and its
        scalars to the TensorBoard log, at step ``env_steps`` (per member in a population);
        both are on disk when it returns."""
        new = self._columns is None and not (self.path / METRICS).exists()
        if self._columns is None:
            self._columns = list(row) if new else self._read_header()
        with open(self.path / METRICS, "a", newline="") as f:
            writer = csv.DictWriter(f, self._columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({k: _cell(row.get(k, math.nan)) for k in self._columns})
        if self._log is not None:
            prefix = f"member{int(row['member'])}/" if "member" in row else ""
            for name, value in row.items():
                if name not in _NOT_SCALARS and isinstance(value, int | float) and math.isfinite(value):
                    self._log.add_scalar(prefix + name, value, int(row["env_steps"]))
            self._log.flush()  # on disk with its row of metrics.csv, before any checkpoint that follows

    def truncate_metrics(self, iteration: int) -> None:
        """Drop the rows past ``iteration`` (written after the checkpoint a run resumes from)."""
        if not (self.path / METRICS).exists():
            return
        with open(self.path / METRICS, newline="") as f:
            reader = csv.DictReader(f)
            columns = list(reader.fieldnames or [])
            kept = [r for r in reader if float(r["iteration"]) <= iteration]
        if not kept:
            (self.path / METRICS).unlink()
            return
        text = io.StringIO()
        writer = csv.DictWriter(text, columns)
        writer.writeheader()
        writer.writerows(kept)
        _write_atomically(self.path / METRICS, text.getvalue())
        self._columns = columns

    def read_metrics(self) -> dict[str, list[float]]:
        with open(self.path / METRICS, newline="") as f:
            rows = list(csv.DictReader(f))
        return {k: [float(r[k]) for r in rows] for k in (rows[0] if rows else {})}

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def plot(self, title: str) -> Path:
        from jaxrl_frag.plots import learning_curve

        out = self.path / CURVE
        learning_curve(self.read_metrics(), title).savefig(out, dpi=120)
        return out

    def _read_header(self) -> list[str]:
        with open(self.path / METRICS, newline="") as f:
            return next(csv.reader(f))


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _cell(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
