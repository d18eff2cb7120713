"""The runtime a command runs in, set before jax's first operation: the CPU device
count (``--devices``, or a policy's device groups), the multi-process runtime, and
XLA's compilation cache.

jax fixes its device count when its backend starts, at its first operation (importing
gymnax is one). The command line sets it first; called in a process where something
already started jax with fewer CPU devices, it says what did, where this module can
know it (the first event jax's public monitoring records after the command line is
imported: the first operation's compile), and what to set before it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from jaxrl_frag.app import fields
from jaxrl_frag.app.build import cpu_devices, devices_flags
from jaxrl_frag.app.cli import flags, policies
from jaxrl_frag.app.spec import parse_overrides, policy_kinds
from jaxrl_frag.bounds import CPU_DEVICES_MAX, INT32_MAX, check_count
from jaxrl_frag.errors import check

_FORCE_FLAG = "--xla_force_host_platform_device_count"
_PASSING_THROUGH = ("jax", "jaxlib", "importlib", "functools", "contextlib")
# what started jax's backend and what a remedy must come before, once it started (None: not known)
_started: list[tuple[str, str] | None] = []


def _outside_jax(frame: FrameType) -> bool:
    """Whether ``frame`` runs code of neither jax nor the machinery between it and its caller."""
    name = str(frame.f_globals.get("__name__", ""))
    return not (name.split(".")[0] in _PASSING_THROUGH or name == __name__)


def _where(frame: FrameType) -> str:
    path = Path(frame.f_code.co_filename)
    try:
        return f"{path.resolve().relative_to(Path.cwd())}:{frame.f_lineno}"
    except (ValueError, OSError):
        return f"{path}:{frame.f_lineno}"


def _starter(frame: FrameType | None) -> tuple[str, str]:
    """What started jax's backend, from the stack of its initialisation, and what a
    remedy must come before: the outermost module being imported (the import a user
    wrote, with the line that ran jax), or with no import under way the function that ran jax."""
    line, imported = None, None
    while frame is not None:
        if _outside_jax(frame):
            if line is None:
                line = frame
            if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") != "__main__":
                imported = frame
        frame = frame.f_back
    if line is None:
        return "jax itself", "jax starts"
    if imported is not None:
        module = imported.f_globals.get("__name__")
        return f"importing {module} (its first jax operation: {_where(line)})", f"importing {module}"
    where = f"{line.f_globals.get('__name__')}.{line.f_code.co_name}"
    return f"{where} at {_where(line)}", f"{where} runs"


def _record_start(_event: str, _seconds: float, **_: Any) -> None:
    """A jax monitoring listener: notes where jax's first operation ran (it starts the
    backend; its first compile is the first event jax records), and never fails it."""
    if _started:
        return
    try:
        _started.append(_starter(sys._getframe(1)))
    except Exception:
        _started.append(None)


def watch_backend() -> None:
    """Record where jax's first operation runs from now on (``started_by``), through
    jax's public monitoring events, or that jax already runs."""
    import jax.monitoring

    if _backend_running():
        _started.append(("something this process ran before it imported jaxrl_frag.app.cli", "importing jax"))
    else:
        jax.monitoring.register_event_duration_secs_listener(_record_start)


def _backend_running() -> bool:
    """Whether jax's backend has started: jax refuses to change its CPU device count once
    it has, so a change (undone at once) tells."""
    import jax

    count = jax.config.jax_num_cpu_devices
    try:
        jax.config.update("jax_num_cpu_devices", 2 if count == 1 else 1)
    except RuntimeError:
        return True
    jax.config.update("jax_num_cpu_devices", count)
    return False


def started_by() -> tuple[str, str]:
    """What started jax's backend, as far as is known, and what a remedy must come before."""
    if not _started or _started[0] is None:
        return "something this process ran before the command", "jax starts"
    return _started[0]


def force_cpu_devices(count: int, asked_by: str = "--devices") -> None:
    """Give XLA's CPU client ``count`` devices, as the flags ``asked_by`` ask; a
    ``ConfigError`` naming them, what started jax and the remedy, where its backend
    already runs with fewer (an accelerator's backend keeps its real devices)."""
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # backend already up (main called in-process): fine if it has enough
        if jax.default_backend() != "cpu":
            return
        have = len(jax.devices("cpu"))
        what, before = started_by()
        need = "need" if " + " in asked_by else "needs"
        check(have >= count, "devices", count,
              f"{asked_by} {need} {count} CPU devices, but the CPU backend is already running with {have}, started by "
              f"{what}; set XLA_FLAGS={_FORCE_FLAG}={count} before {before} (jax reads it once, as it starts), or run "
              "the command in a new process")


def add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    """The multi-process runtime's flags."""
    parser.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                        help="multi-process run: address of process 0's coordinator (or $JAXRL_FRAG_COORDINATOR)")
    parser.add_argument("--num-processes", type=fields.parse_int, default=None,
                        help="multi-process run: number of processes")
    parser.add_argument("--process-id", type=fields.parse_int, default=None, help="multi-process run: this process's index")
    parser.add_argument("--join-timeout", type=_seconds, default=None, metavar="SECONDS",
                        help="multi-process run: give up (exit status 2, naming the processes that never joined) after "
                             "waiting this long for the others to start (or $JAXRL_FRAG_JOIN_TIMEOUT; default 300)")


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None


def configure_runtime(argv: Sequence[str] | None, defaults: Mapping[str, Any] | None = None) -> None:
    """Device count and multi-process runtime, from their flags read ahead of the full
    parser (``defaults``: a run file's values of them): both must be set before jax's
    first operation (importing gymnax is one). ``--devices`` touches only the CPU
    backend; an accelerator keeps its real devices."""
    from jaxrl_frag import distributed

    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[:2] if argv[:1] in (["train"], ["explain"]) else argv[:1]  # with its recipe
    prog = " ".join(["jaxrl-frag", *(word for word in command if not word.startswith("-"))])
    early = flags.Parser(prog=prog, add_help=False)  # its errors read as the full parser's
    add_runtime_flags(early)
    policies.add_flags(early, choices=False)
    early.set_defaults(**(defaults or {}))
    args = early.parse_known_args(argv)[0]
    if argv[:1] == ["resume"]:  # the saved policy and device counts, unless overridden
        early.add_argument("run_dir", type=Path, nargs="?")
        early.add_argument("--override", action="append", default=[])
        resume = early.parse_known_args(argv[1:])[0]
        if resume.run_dir is not None:
            from jaxrl_frag.app.rundir import RunDir

            run_dir = RunDir(resume.run_dir)
            saved = {**run_dir.read_config()["settings"], **parse_overrides(resume.override)}
            for name, kind in policy_kinds().items():
                value = saved.get(name, getattr(args, name))
                try:
                    setattr(args, name, value if value is None else kind.load(value))
                except ValueError:
                    raise run_dir.config_error(
                        f"holds {name}={value!r}, which --{name.replace('_', '-')} cannot be") from None
    settings = policies.given(args)
    devices = cpu_devices(args.policy, settings)
    if devices is not None:
        check_count("devices", devices, CPU_DEVICES_MAX,
                    "on CPU it forces that many host devices: XLA's CPU client takes half a minute to start 8,192, "
                    "twenty minutes 16,384, and aborts from 32,768; an accelerator keeps the devices it has")
        force_cpu_devices(devices, devices_flags(args.policy, settings))
    if args.num_processes is not None:
        check_count("num_processes", args.num_processes, INT32_MAX, "jax's distributed runtime counts in int32")
    distributed.initialize(args.coordinator, args.num_processes, args.process_id, join_timeout=args.join_timeout)
