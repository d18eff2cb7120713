"""A run directory: ``config.json``, ``metrics.csv``, TensorBoard event files,
``checkpoints/`` and ``learning_curve.png`` (and W&B's files in ``wandb/``, where the run
logs to W&B), written by one process at a time.

The writer holds ``run.lock``: an exclusive ``flock``, released by the system when
its process ends, so the lock of a killed run is free at once. ``--overwrite``
removes only what a run writes (recognised by name and kind at every depth), and
only from a directory that holds a run. Every file a command writes goes through
``write_atomically``: a failed write leaves the earlier file whole.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import io
import json
import math
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jaxrl_frag.app.wandb_log import WandbLog
from jaxrl_frag.errors import WRITE_FAILED, ConfigError
from jaxrl_frag.writes import WriteError, write_atomically

CONFIG, METRICS, CURVE, CHECKPOINTS, TENSORBOARD, LOCK, EVAL, WANDB = (
    "config.json", "metrics.csv", "learning_curve.png", "checkpoints", "tensorboard", "run.lock", "eval.csv", "wandb")
EVAL_COLUMNS = ("episode", "return", "length")  # eval.csv's, one row per episode (``jaxrl-frag evaluate``)


class _Opaque:
    """What another program keeps in a run directory, of any kind (links too), its contents its own: not entered."""


_OPAQUE = _Opaque()
# what a run writes (and evaluate), by name and kind at every depth: all that --overwrite removes. A
# pattern maps to None (a file), to what the folder it names may hold, or to _OPAQUE; a file may also be
# there as its temporary name (``write_atomically``'s, or the ``NAME.tmp`` of earlier versions)
_Tree = dict[str, "_Tree | _Opaque | None"]
_HEX = r"[0-9a-f]+"
_ORBAX_TMP = r"(\.orbax-checkpoint-tmp[-\d]*)?"
_ORBAX_ITEM: _Tree = {  # what orbax writes for an item of a step (its state, its meta)
    r"_METADATA|_sharding|manifest\.ocdbt|metadata|commit_success\.txt|_CHECKPOINT_METADATA": None,
    r"ocdbt\.process_\d+": {r"manifest\.ocdbt": None, "d": {_HEX: None}},
    "array_metadatas": {r"process_\d+": None},
    "d": {_HEX: None},
    "descriptor": {r"descriptor\.pbtxt": None},
}
_STEP: _Tree = {r"_CHECKPOINT_METADATA|commit_success\.txt": None, f"(state|meta){_ORBAX_TMP}": _ORBAX_ITEM}
_FILES = (CONFIG, METRICS, CURVE, EVAL, "summary.md", "summary.csv")
_RUN_TREE: _Tree = {
    "|".join(rf"{re.escape(stem)}(\.tmp)?\{suffix}(\.tmp)?" for stem, suffix in map(os.path.splitext, _FILES)): None,
    r"run\.lock|metrics\.\d{8}-\d{6}(-\d+)?\.csv": None,  # the lock; rows set aside (metrics.DATE.csv)
    CHECKPOINTS: {rf"\d+{_ORBAX_TMP}": _STEP},
    CHECKPOINTS + r"\.damaged": {r"\d+-\d{8}-\d{6}(-\d+)?": _STEP},
    TENSORBOARD: {r"events\.out\.tfevents\.\d+\.[\w.-]+": None},
    # W&B's: a folder per start of its run (wandb.init), and links to the newest one and its logs
    WANDB: {r"(offline-)?run-\d{8}_\d{6}-\w+|latest-run|debug(-internal)?\.log": _OPAQUE},
}
# what a run killed or failing before its first write may leave: the directory is still free
_LEFTOVERS = frozenset({LOCK, CONFIG + ".tmp", METRICS + ".tmp", "config.tmp.json", "metrics.tmp.csv"})
# keys of every config.json a run writes, and the intervals a resume reads from it
_RUN_KEYS = ("recipe", "settings", "jax")
_INTERVALS = ("chunk_iterations", "checkpoint_every", "keep_checkpoints")
_NOT_SCALARS = ("iteration", "env_steps", "member", "seed")
# errors of a write that the run directory's disk or permissions refused
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                           errno.EMFILE, errno.ENFILE})
# what a cause adds to its strerror, where the fix is not room or permission
_HINTS = {errno.EMFILE: "; raise the limit of open files, `ulimit -n 4096`",
          errno.ENFILE: "; the system's table of open files is full: close other programs"}


class RunDir:
    """Where one run's files go. Refuses to reuse a directory that holds a run
    unless told to resume it or to overwrite it, so nothing is lost by a mistyped path."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._columns: list[str] | None = None
        self._log: _EventLog | None = None
        self._wandb: WandbLog | None = None
        self._lock: int | None = None

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def check_free(self, overwrite: bool = False, resume: bool = False) -> None:
        """Raise ``ConfigError`` unless a run may be written here: the directory is new or
        holds no files, or holds a run and ``resume`` is set, or holds only a run's files and
        ``overwrite`` is set; and files can be made in it, and no other process writes it."""
        _check_name("run_dir", self.path)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError("run_dir", str(self.path), "is a file; give a directory path")
        self._check_kinds()
        if resume:
            self.read_config()  # it must hold a run
        elif self._holds_files():
            if not overwrite:
                raise ConfigError(
                    "run_dir", str(self.path),
                    "already holds files from an earlier run; continue it with --resume, give a new --run-dir, "
                    "or pass --overwrite to replace it",
                )
            self._check_replaceable()
        self.check_writable()
        holder = self._holder()
        if holder is not None:
            raise self._in_use(holder)

    def create(self, overwrite: bool) -> None:
        """Make the directory and take its lock; then, holding it, check again that the
        directory is free (a run may have started here since ``check_free``), and with
        ``overwrite`` remove what the run before wrote."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock()
        self.check_free(overwrite)
        if overwrite:
            for name in os.listdir(self.path):
                if name != LOCK:
                    _remove(self.path / name)

    def lock(self) -> None:
        """Hold the directory's lock until ``close`` (or until this process ends), with this
        process named in it; ``ConfigError`` naming the holder where another process has it."""
        path = self.path / LOCK
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except IsADirectoryError:
                raise self._lock_is_a_directory() from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise self._in_use(holder) from None
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            os.close(fd)  # its holder removed it as we opened it: take the one there now
        self._lock = fd
        holder = f"process {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
        try:
            os.ftruncate(fd, 0)
            os.write(fd, holder.encode())
        except OSError:
            self._unlock()
            raise

    def write_config(self, config: dict[str, Any]) -> None:
        write_atomically(self.path / CONFIG, _json_text(config))

    def read_config(self) -> dict[str, Any]:
        """The saved configuration; ``ConfigError`` naming config.json unless it is one a run
        wrote, or naming what stands where the run keeps its lock or a folder of its own."""
        _check_name("run_dir", self.path)
        if not self.path.is_dir():
            raise ConfigError("run_dir", str(self.path), ("is a file, not a run directory" if self.path.exists()
                                                          else "does not exist") + "; give the directory of an earlier run")
        self._check_kinds()
        try:
            config = json.loads((self.path / CONFIG).read_bytes())
        except FileNotFoundError:
            raise ConfigError("run_dir", str(self.path),
                              "holds no run to resume (no config.json); give the directory of an earlier run") from None
        except IsADirectoryError:
            raise self.config_error("is a directory") from None
        except OSError as error:
            raise self.config_error(f"cannot be read ({error.strerror})") from None
        except ValueError as error:  # not JSON, not text
            raise self.config_error(f"is not readable JSON ({error})") from None
        problem = _config_problem(config)
        if problem is not None:
            raise self.config_error(problem)
        return config

    def inspect_metrics(self) -> tuple[int, str | None]:
        """The iteration of the last row of ``metrics.csv`` (0 where it has none), and what
        makes it unusable (``"is missing"``, ``"is empty"``, ...), or ``None``."""
        try:
            text = (self.path / METRICS).read_bytes().decode()
        except FileNotFoundError:
            return 0, "is missing"
        except OSError as error:
            return 0, f"cannot be read ({error.strerror})"
        except UnicodeDecodeError:
            return 0, "is not text"
        if not text:
            return 0, "is empty"
        try:
            header, *rows = csv.reader(io.StringIO(text, newline=""))
        except csv.Error as error:
            return 0, f"is not CSV ({error})"
        missing = [name for name in ("iteration", "env_steps") if name not in header]
        if missing:
            return 0, f"has no {' or '.join(missing)} column"
        at, member = header.index("iteration"), header.index("member") if "member" in header else None
        last = (0.0, -1.0)
        for line, row in enumerate(rows, 2):
            if len(row) != len(header):
                return 0, f"has {len(row)} cells on line {line}, {len(header)} in its header"
            try:
                key = (float(row[at]), -1.0 if member is None else float(row[member]))
            except ValueError:
                return 0, f"has iteration {row[at]!r} on line {line}"
            if not (key[0].is_integer() and key > last):
                return 0, f"has iteration {row[at]} out of order on line {line}"
            last = key
        return int(last[0]), None

    def keep_metrics(self, iteration: int, rows: list[dict[str, Any]] | None) -> str | None:
        """Leave in ``metrics.csv`` its rows up to ``iteration``, dropping those after. With
        ``rows`` (every row up to ``iteration``, saved with the checkpoint), a file that does
        not hold exactly them is set aside and rebuilt from them; without, an unusable file is
        set aside (a run starting over). Returns a line saying what was set aside or rebuilt."""
        _, problem = self.inspect_metrics()
        absent = problem in ("is missing", "is empty")
        if rows is None:
            if problem is None:
                self.truncate_metrics(iteration)
            return None if problem is None or absent else f"metrics.csv {problem}: kept it as {self.set_aside_metrics().name}"
        header = self._read_header() if problem is None else []
        columns = header if not rows or set(header) == set(rows[0]) else list(rows[0])
        expected = _csv_text(rows, columns) if rows else ""
        if problem is None and self._rows_up_to(iteration) == list(csv.DictReader(io.StringIO(expected))):
            self.truncate_metrics(iteration)
            return None
        if absent and not rows:
            return None
        kept = "" if absent else f"; kept the old file as {self.set_aside_metrics().name}"
        if rows:
            write_atomically(self.path / METRICS, expected)
            self._columns = columns
        return (f"metrics.csv {problem or 'differed from the rows saved with the checkpoint'}: rebuilt its rows up to "
                f"iteration {iteration} from the checkpoint{kept}")

    def set_aside_metrics(self) -> Path:
        """Move ``metrics.csv`` to ``metrics.DATE.csv``, kept out of the run's way; returns its new path."""
        stamp, n = time.strftime("%Y%m%d-%H%M%S"), 0
        target = self.path / f"metrics.{stamp}.csv"
        while target.exists():
            n += 1
            target = self.path / f"metrics.{stamp}-{n}.csv"
        os.rename(self.path / METRICS, target)
        self._columns = None
        return target

    def open_log(self, purge_step: int | None = None) -> None:
        """Start TensorBoard event files in ``tensorboard/``. Events at or past
        ``purge_step`` (env steps) left by an interrupted run are hidden from readers."""
        self._log = _EventLog(self.path / TENSORBOARD, purge_step)

    def open_wandb(self, project: str, run_id: str, config: dict[str, Any]) -> None:
        """Start the W&B run ``run_id`` of ``project`` (or continue it), its config ``config``
        as config.json holds it, its files in ``wandb/``; ``append_metrics`` logs each row to it."""
        self._wandb = WandbLog(self.path, project, run_id, json.loads(_json_text(config)))

    def append_metrics(self, row: dict[str, float]) -> None:
        """Append one row to ``metrics.csv`` (the first row fixes the columns), whole or not at
        all, and its scalars to the TensorBoard log, at step ``env_steps`` (per member in a
        population); both are written when it returns. The row goes to the W&B run too, where
        one is open (``open_wandb``)."""
        path = self.path / METRICS
        new = not path.exists() or path.stat().st_size == 0
        if self._columns is None:
            self._columns = list(row) if new else self._read_header()
        _append(path, _csv_text([row], self._columns, header=new))
        if self._log is not None and math.isfinite(row["env_steps"]):  # NaN: a failed population member's
            prefix = f"member{int(row['member'])}/" if "member" in row else ""
            for name, value in row.items():
                if name not in _NOT_SCALARS and isinstance(value, int | float) and math.isfinite(value):
                    self._log.add(prefix + name, value, int(row["env_steps"]))
            self._log.flush()  # on disk with its row of metrics.csv, before any checkpoint that follows
        if self._wandb is not None:
            self._wandb.log(row)

    def truncate_metrics(self, iteration: int) -> None:
        """Drop the rows past ``iteration`` (written after the checkpoint a run resumes from)."""
        if not (self.path / METRICS).exists():
            return
        with open(self.path / METRICS, newline="") as f:
            reader = csv.DictReader(f)
            columns = list(reader.fieldnames or [])
            rows = list(reader)
        kept = [r for r in rows if float(r["iteration"]) <= iteration]
        self._columns = columns
        if len(kept) == len(rows):
            return
        if not kept:
            (self.path / METRICS).unlink()
            self._columns = None
            return
        text = io.StringIO()
        writer = csv.DictWriter(text, columns)
        writer.writeheader()
        writer.writerows(kept)
        write_atomically(self.path / METRICS, text.getvalue())

    def check_eval(self) -> None:
        """Raise ``ConfigError`` where ``eval.csv`` is there and no evaluation wrote it (its
        columns are not ``EVAL_COLUMNS``): ``write_eval`` replaces only its own."""
        path = self.path / EVAL
        if not path.exists():
            return
        try:
            with open(path, newline="") as f:
                header = tuple(next(csv.reader(f), []))
        except (OSError, UnicodeDecodeError, csv.Error):
            header = ()
        if header != EVAL_COLUMNS:
            raise ConfigError("run_dir", str(self.path), f"holds an {EVAL} that no evaluation wrote (its columns are "
                                                         f"not {', '.join(EVAL_COLUMNS)}); move it elsewhere first")

    def write_eval(self, rows: list[dict[str, float]]) -> Path:
        """Write ``eval.csv`` (``EVAL_COLUMNS``, one row per episode) whole, replacing one that
        an evaluation wrote (``check_eval``); returns its path."""
        self.check_eval()
        path = self.path / EVAL
        write_atomically(path, _csv_text(rows, list(EVAL_COLUMNS)))
        return path

    def read_metrics(self) -> dict[str, list[float]]:
        with open(self.path / METRICS, newline="") as f:
            rows = list(csv.DictReader(f))
        return {k: [float(r[k]) for r in rows] for k in (rows[0] if rows else {})}

    def close(self, exit_code: int = 0) -> None:
        """Close the TensorBoard log, finish the W&B run (as failed where ``exit_code``, the
        run's exit status, is not 0) and release the lock."""
        try:
            if self._log is not None:
                self._log, log = None, self._log
                log.close()
        finally:
            try:
                if self._wandb is not None:
                    self._wandb, wandb = None, self._wandb
                    wandb.close(exit_code)
            finally:
                if self._lock is not None:
                    self._unlock()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.close(0 if kind is None else 1)

    def plot(self, title: str) -> Path:
        """Draw ``metrics.csv`` into ``learning_curve.png`` (whole, or the earlier one kept); returns its path."""
        from jaxrl_frag.app.plots import learning_curve

        figure = learning_curve(self.read_metrics(), title)
        return write_atomically(self.path / CURVE, lambda tmp: figure.savefig(tmp, dpi=120))

    def curve_problem(self) -> str | None:
        """What is wrong with ``learning_curve.png`` (``"is missing"``, ``"is damaged"``, ...), or
        ``None`` where it is a whole PNG."""
        try:
            data = (self.path / CURVE).read_bytes()
        except FileNotFoundError:
            return "is missing"
        except OSError as error:
            return f"cannot be read ({error.strerror})"
        if not (data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(b"IEND\xaeB`\x82")):
            return "is damaged (not a whole PNG)"
        return None

    def _read_header(self) -> list[str]:
        with open(self.path / METRICS, newline="") as f:
            return next(csv.reader(f))

    def _rows_up_to(self, iteration: int) -> list[dict[str, str]]:
        """The rows of ``metrics.csv`` up to ``iteration``, as text."""
        with open(self.path / METRICS, newline="") as f:
            return [row for row in csv.DictReader(f) if float(row["iteration"]) <= iteration]

    def _holds_files(self) -> bool:
        return self.path.is_dir() and any(name not in _LEFTOVERS for name in os.listdir(self.path))

    def _check_replaceable(self) -> None:
        """Raise ``ConfigError`` unless ``--overwrite`` may clear the directory: it holds a run
        (a config.json that a run wrote) and nothing else, and it is not a filesystem root, the
        home directory, the current directory or one of its parents."""
        where, cwd = self.path.resolve(), Path.cwd().resolve()
        what = ("a filesystem root" if os.path.ismount(where) else "the home directory" if where == Path.home().resolve()
                else "the current directory" if where == cwd else "a parent of the current directory"
                if where in cwd.parents else None)
        if what is not None:
            raise ConfigError("run_dir", str(self.path),
                              f"is {what}; --overwrite only ever replaces a run's own directory: give that")
        try:
            config = json.loads((self.path / CONFIG).read_bytes())
        except (OSError, ValueError):
            config = None
        if not (isinstance(config, dict) and all(key in config for key in _RUN_KEYS)):
            raise ConfigError("run_dir", str(self.path),
                              "holds files but no run (no config.json that jaxrl-frag wrote); --overwrite only replaces "
                              "a run: give a new --run-dir, or empty the directory yourself")
        others = _foreign(self.path, _RUN_TREE)
        if others:
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            raise ConfigError("run_dir", str(self.path),
                              f"holds a run and also {shown}, which no run writes; --overwrite removes only a run's "
                              f"files: move {'that' if len(others) == 1 else 'those'} elsewhere first, or give a new "
                              "--run-dir")

    def check_writable(self) -> None:
        """Raise ``ConfigError`` unless a directory can be made in the run directory (in its
        nearest existing parent where it is new); the one made to find out is removed."""
        existing = self.path.absolute()
        while not os.path.lexists(existing):
            existing = existing.parent
        if not os.path.isdir(existing):
            raise ConfigError("run_dir", str(self.path), f"cannot be made: {existing} is a file; give a directory path")
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".jaxrl-frag-", dir=existing))
        except OSError as error:
            raise ConfigError("run_dir", str(self.path),
                              f"cannot be written: making a directory in {existing} fails ({error.strerror}); give a "
                              "--run-dir on a writable filesystem") from None

    def _holder(self) -> str | None:
        """Who holds the lock (``"process 12 on host, since ..."``), or ``None`` where no other process does."""
        if self._lock is not None:
            return None
        try:
            fd = os.open(self.path / LOCK, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released on close
            return None
        except BlockingIOError:
            return _read_holder(fd)
        finally:
            os.close(fd)

    def _check_kinds(self) -> None:
        """Raise ``ConfigError`` where the run's lock is a directory, or one of its folders
        (checkpoints, tensorboard) is something else: a run cannot write there."""
        if (self.path / LOCK).is_dir() and not (self.path / LOCK).is_symlink():
            raise self._lock_is_a_directory()
        for name, what in ((CHECKPOINTS, "checkpoints"), (TENSORBOARD, "TensorBoard event files")):
            path = self.path / name
            if os.path.lexists(path) and not path.is_dir():
                raise ConfigError("run_dir", str(self.path),
                                  f"holds {name} as a file, where a run keeps the folder of its {what}; move that "
                                  f"file elsewhere ({path}) and run the command again")

    def _lock_is_a_directory(self) -> ConfigError:
        return ConfigError("run_dir", str(self.path),
                           f"holds {LOCK} as a directory, where a run keeps its lock file; move that directory "
                           f"elsewhere ({self.path / LOCK}) and run the command again")

    def _in_use(self, holder: str) -> ConfigError:
        return ConfigError("run_dir", str(self.path),
                           f"is being written by {holder}; wait for that run to end (or stop it), or give another "
                           "directory")

    def config_error(self, problem: str) -> ConfigError:
        """The error for a config.json that is not what a run writes, saying ``problem``."""
        return ConfigError("run_dir", str(self.path),
                           f"holds no run that can be resumed: its config.json {problem}; restore config.json from a "
                           "copy, or start a new run with `jaxrl-frag train`")

    def _unlock(self) -> None:
        """Remove the lock file and release it (in that order: a process that opened it meanwhile
        sees that it is gone, and takes a new one)."""
        fd, self._lock = self._lock, None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path / LOCK)
        os.close(fd)


class _EventLog:
    """TensorBoard scalars written as they come (tensorboardX's writer writes from a thread
    of its own, where a failed write is lost and the writes after it block)."""

    def __init__(self, directory: Path, purge_step: int | None):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        self.directory = directory
        with _named(directory):
            directory.mkdir(exist_ok=True)
            self._writer = EventsWriter(str(directory / "events"), f".{os.getpid()}")
            if purge_step is not None:  # as tensorboardX's SummaryWriter(purge_step=...) marks a restart
                self._writer.write_event(Event(step=purge_step, file_version="brain.Event:2"))
                self._writer.write_event(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def add(self, tag: str, value: float, step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        with _named(self.directory):
            self._writer.write_event(Event(wall_time=time.time(), step=step, summary=scalar(tag, value)))

    def flush(self) -> None:
        with _named(self.directory):
            self._writer.flush()

    def close(self) -> None:
        with _named(self.directory):
            self._writer.close()


def write_failure(error: BaseException, where: Path) -> str | None:
    """``"PATH (cause)"`` where ``error``, or an error it was raised from, is a write that the
    disk or the permissions refused: an ``OSError``, or tensorstore's report of one in an orbax
    checkpoint (a ``ValueError`` with an ``os_error_code``); ``where`` names a path the error
    does not. ``None`` for any other error."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, WriteError) or (isinstance(cause, OSError) and cause.errno in _WRITE_ERRNOS):
            return f"{cause.filename or where} ({cause.strerror}{_HINTS.get(cause.errno, '')})"
        code = re.search(r"os_error_code='(\d+)'", str(cause))
        if code is not None and int(code.group(1)) in _WRITE_ERRNOS:
            path = re.search(r'local file "([^"]+)"', str(cause))
            step = re.sub(r"\.orbax-checkpoint-tmp.*", "", path.group(1)) if path else where
            number = int(code.group(1))
            return f"{step} ({os.strerror(number)}{_HINTS.get(number, '')})"
        cause = cause.__cause__ or cause.__context__
    return None


def _config_problem(config: Any) -> str | None:
    """What makes ``config`` (config.json, parsed) other than what a run writes, or ``None``."""
    if not isinstance(config, dict):
        return f"holds a JSON {type(config).__name__}, not an object of settings"
    missing = [key for key in (*_RUN_KEYS, *_INTERVALS) if key not in config]
    if missing:
        return f"lacks {', '.join(missing)}"
    settings = config["settings"]
    if not isinstance(settings, dict):
        return f"holds settings={settings!r}, not an object of settings"
    for key in _INTERVALS:
        value = config[key]
        if not (type(value) is int and value > 0):
            return f"holds {key}={value!r}, not a positive whole number"
    for key in ("recipe", "env"):
        if not isinstance(settings.get(key), str):
            return f"holds settings.{key}={settings.get(key)!r}, not a name"
    return None


def _json_text(config: dict[str, Any]) -> str:
    """``config`` as config.json holds it."""
    return json.dumps(config, indent=2, sort_keys=True, default=str) + "\n"


def _read_holder(fd: int) -> str:
    """What the lock's holder wrote in it (empty for the moment after it took the lock)."""
    return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"


def _csv_text(rows: list[dict[str, Any]], columns: list[str], header: bool = True) -> str:
    """``rows`` as lines of ``metrics.csv`` with ``columns`` (NaN where a row lacks one)."""
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, extrasaction="ignore")
    if header:
        writer.writeheader()
    writer.writerows({k: _cell(row.get(k, math.nan)) for k in columns} for row in rows)
    return text.getvalue()


def _append(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` whole or not at all: a failed write leaves no part of it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size, data = os.fstat(fd).st_size, text.encode()
        try:
            with _named(path):
                while data:
                    data = data[os.write(fd, data):]
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def report_write_failure(error: BaseException, where: Path, after: str = "") -> int:
    """Print the one paragraph for ``error``, a write that failed (``write_failure``), with
    ``after`` following it, and return ``WRITE_FAILED``; re-raise ``error`` where it is another."""
    import sys

    failure = write_failure(error, where)
    if failure is None:
        raise error
    print(f"jaxrl-frag: error: could not write {failure}{after}", file=sys.stderr)
    return WRITE_FAILED


def check_output(field: str, path: str | Path) -> Path:
    """``path``, a file a command is to write, if it can be: its name is not too long, it is not
    a directory, and its folder exists and takes new files; else ``ConfigError`` naming ``field``."""
    path = Path(path)
    _check_name(field, path)
    if path.is_dir():
        raise ConfigError(field, str(path), "is a directory; give the path of a file to write")
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(field, str(path), f"{folder} is not a directory: give a path in an existing one")
    try:
        fd, probe = tempfile.mkstemp(prefix=".jaxrl-frag-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise ConfigError(field, str(path), f"cannot be written: making a file in {folder} fails "
                                            f"({error.strerror}); give a path on a writable filesystem") from None
    return path


@contextlib.contextmanager
def _named(path: str | Path) -> Iterator[None]:
    """An ``OSError`` of a write to ``path`` that names no file (a write that the disk
    refused) names ``path``."""
    try:
        yield
    except OSError as error:
        error.filename = error.filename or str(path)
        raise


def _check_name(field: str, path: Path) -> None:
    """``ConfigError`` naming ``field`` where ``path`` is too long for the file system: a name
    in it longer than the file system takes, or the whole longer than a path may be."""
    existing = path.absolute()
    while not os.path.isdir(existing) and existing != existing.parent:
        existing = existing.parent
    name_max, path_max = 255, 4096
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
        too_long = (max((len(os.fsencode(part)) for part in path.parts), default=0) > name_max
                    or len(os.fsencode(path.absolute())) >= path_max)
        if not too_long:
            os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as error:
        if error.errno != errno.ENAMETOOLONG:
            return
        too_long = True
    if too_long:
        raise ConfigError(field, str(path), f"is too long for the file system ({os.strerror(errno.ENAMETOOLONG)}: a "
                                            f"name in it has more than {name_max} bytes, or the whole more than "
                                            f"{path_max}); give a shorter path")


def _foreign(folder: Path, tree: _Tree, prefix: str = "") -> list[str]:
    """The paths under ``folder`` (relative to it, ``prefix`` before them) that ``tree`` does not
    name, by name and kind: what no run writes. A folder that is foreign is listed, not entered;
    one that ``tree`` maps to ``_OPAQUE`` is neither."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as error:
        return [f"{prefix or './'} (it cannot be listed: {error.strerror})"]
    found = []
    for name in names:
        path = folder / name
        link, is_dir = path.is_symlink(), path.is_dir()
        kinds = [children for pattern, children in tree.items() if re.fullmatch(pattern, name)]
        fits = [children for children in kinds if children is _OPAQUE
                or (not link and ((children is None) == (not is_dir and path.is_file())))]
        if not fits:
            found.append(prefix + name + ("/" if is_dir and not link else ""))
        elif isinstance(fits[0], dict):
            found += _foreign(path, fits[0], f"{prefix}{name}/")
    return found


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _cell(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
