"""The distribution policies' flags, generated from every policy's dataclass (``sharding.policies``, ``spec.policy_flags``).

A policy's command-line settings are its dataclass fields with a ``help`` in their
metadata (``flag`` renames one, ``choices`` restricts it). A flag that several policies
share (``--shuffle``, ``--devices``) is defined once, with each policy's help.
``--devices`` counts devices per process: the policy gets it times the processes of a
run, and on CPU it forces that many host devices before jax starts (``runtime``).
"""

from __future__ import annotations

import argparse

from jaxrl_frag.app.cli import flags
from jaxrl_frag.app.spec import policy_flags, policy_names


def add_flags(parser: argparse.ArgumentParser, choices: bool = True) -> None:
    """``--policy`` (with its ``choices``) and every policy's flags, as a group of ``parser``."""
    group = parser.add_argument_group("distribution policy (--policy) and its settings")
    group.add_argument("--policy", choices=policy_names() if choices else None, default="single",
                       help="distribution policy (default single)")
    for policy_flag in policy_flags():
        policy_flag.flag.add_to(group)


def given(args: argparse.Namespace) -> dict[str, object]:
    """The policy settings that ``args`` holds, by name (those set)."""
    return flags.given_values(args, [p.flag for p in policy_flags()])
