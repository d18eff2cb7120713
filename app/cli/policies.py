"""The distribution policies' flags, generated from ``sharding.POLICIES``, and the policy
they build.

A policy's command-line settings are its dataclass fields with a ``help`` in their
metadata (``flag`` renames one, ``choices`` restricts it). A flag that several policies
share (``--shuffle``, ``--devices``) is defined once, with each policy's help; they
must read alike and share a default. ``--devices`` counts devices per process: the
policy gets it times the processes of a run, and on CPU it forces that many host
devices before jax starts (``runtime``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from typing import Any

from jaxrl_frag.app.cli import flags
from jaxrl_frag.errors import ConfigError

PER_PROCESS = "devices"  # the flag whose count is per process
# what the command line adds to a shared flag's help
_NOTES = {PER_PROCESS: "devices per process (on CPU, forces that many host devices)"}


@dataclasses.dataclass(frozen=True)
class PolicyFlag:
    """A flag of one or more policies: the flag, and the field it sets in each."""

    flag: flags.Flag
    fields: dict[str, str]  # policy name -> field name


def names() -> tuple[str, ...]:
    """``--policy``'s choices, in ``POLICIES`` order."""
    from jaxrl_frag.sharding import POLICIES

    return tuple(POLICIES)


def policy_flags() -> tuple[PolicyFlag, ...]:
    """Every policy's flags, each shared flag once, in the order the policies first declare them."""
    from jaxrl_frag.sharding import POLICIES

    return _policy_flags(tuple(POLICIES.items()))


@functools.cache
def _policy_flags(policies: tuple[tuple[str, type], ...]) -> tuple[PolicyFlag, ...]:
    merged: dict[str, dict[str, Any]] = {}
    for name, cls in policies:
        hints = flags.type_hints(cls)
        for field in flags.settings_of(cls):
            flag = flags.field_flag(cls, field, hints, dest=flags.option_of(field)[2:].replace("-", "_"), none=None)
            default = None if field.default is dataclasses.MISSING else field.default
            entry = merged.setdefault(flag.dest, {"flag": flag, "default": default, "helps": {}, "fields": {}})
            first = entry["flag"]
            if first.kind.signature != flag.kind.signature or entry["default"] != default:
                raise TypeError(f"{flag.option} is {first.kind.label} (default {entry['default']!r}) in one policy and "
                                f"{flag.kind.label} (default {default!r}) in {cls.__name__}.{field.name}: a shared flag "
                                "must read alike, with one default")
            entry["helps"].setdefault(field.metadata["help"], []).append(name)
            entry["fields"][name] = field.name
    out = []
    for dest, entry in merged.items():
        parts = [f"{', '.join(users)}: {text}" for text, users in entry["helps"].items()]
        if dest in _NOTES:
            parts.insert(0, _NOTES[dest])
        shown = "" if entry["default"] is None else f" (default {entry['default']})"
        first = entry["flag"]
        flag = flags.Flag(first.option, dest, first.kind, "; ".join(parts) + shown, entry["default"], dest.upper())
        out.append(PolicyFlag(flag, entry["fields"]))
    return tuple(out)


def add_flags(parser: argparse.ArgumentParser, choices: bool = True) -> None:
    """``--policy`` (with its ``choices``) and every policy's flags, as a group of ``parser``."""
    group = parser.add_argument_group("distribution policy (--policy) and its settings")
    group.add_argument("--policy", choices=names() if choices else None, default="single",
                       help="distribution policy (default single)")
    for policy_flag in policy_flags():
        policy_flag.flag.add_to(group)


def kinds() -> dict[str, flags.Kind]:
    """``--policy`` and the policies' flags: how each reads, by its name in config.json."""
    return {"policy": flags.one_of(names()), **{p.flag.dest: p.flag.kind for p in policy_flags()}}


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """``--policy`` and every policy flag's value, by name (as config.json records them)."""
    return {"policy": args.policy, **{p.flag.dest: getattr(args, p.flag.dest) for p in policy_flags()}}


def _device_groups(args: argparse.Namespace) -> list[flags.Flag]:
    """The chosen policy's device-group counts (its ``*_devices`` settings) that are set."""
    return [p.flag for p in policy_flags() if args.policy in p.fields and p.flag.dest.endswith("_devices")
            and getattr(args, p.flag.dest, None) is not None]


def cpu_devices(args: argparse.Namespace) -> int | None:
    """The host devices to force on CPU: ``--devices``, or else the sum of the chosen
    policy's device-group counts (its ``*_devices`` settings); ``None`` for neither."""
    if getattr(args, PER_PROCESS, None) is not None:
        return getattr(args, PER_PROCESS)
    groups = _device_groups(args)
    return sum(getattr(args, flag.dest) for flag in groups) if groups else None


def devices_flags(args: argparse.Namespace) -> str:
    """The flags ``cpu_devices`` counts from, as a user would read them."""
    if getattr(args, PER_PROCESS, None) is not None:
        return f"--{PER_PROCESS}"
    return " + ".join(flag.option for flag in _device_groups(args))


def make_policy(args: argparse.Namespace) -> Any:
    """The policy ``--policy`` names, with its settings from the flags."""
    import jax

    from jaxrl_frag.sharding import POLICIES

    cls = POLICIES[args.policy]
    kwargs = {}
    for policy_flag in policy_flags():
        field, value = policy_flag.fields.get(args.policy), getattr(args, policy_flag.flag.dest, None)
        if field is None or value is None:
            continue
        kwargs[field] = value * jax.process_count() if policy_flag.flag.dest == PER_PROCESS else value
    for field in dataclasses.fields(cls):
        if (field.init and field.name not in kwargs and field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING):
            raise ConfigError("policy", args.policy, f"needs {flags.option_of(field)}")
    return cls(**kwargs)
