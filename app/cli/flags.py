"""The command line's parser: argparse's, with one-line usage errors, negative numbers
read as values and no flag given twice (the flags themselves come from dataclass
fields: ``jaxrl_frag.app.fields``)."""

from __future__ import annotations

import argparse
import itertools
import re
import sys
import typing
from collections.abc import Sequence
from typing import Any

from jaxrl_frag.app import fields
from jaxrl_frag.errors import USAGE_ERROR

# a negative number in any form ``float`` reads (-3, -1e-3, -.5, -inf) is a flag's value, not a flag: the
# matcher of recent Pythons (older ones miss exponents), and the words for infinity and nan
_NEGATIVE_NUMBER = re.compile(r"-\.?\d|-(inf|infinity|nan)$", re.IGNORECASE)
# the actions a flag may repeat: each gathers every value (or, for help and version, acts on the first)
_GATHERING = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction, argparse._HelpAction,
              argparse._VersionAction)


class Parser(argparse.ArgumentParser):
    """argparse's parser, reporting a usage error in one line and a pointer to ``--help``
    (not the usage), and reading every negative number (``--lr -1e-3``) as a value. No
    flag may be abbreviated (``--num`` is not ``--num-processes``): its subparsers are of
    this class too (argparse makes them so), and refuse abbreviations alike."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_NUMBER
        self.elsewhere: dict[str, str] = {}  # flags the command lacks -> where they are, said when one is given

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        """argparse's, refusing a setting given twice first (argparse keeps the last and
        drops the other): ``--num-envs 4 --num-envs 8``, ``--x --no-x``. Repeatable flags
        (``--sweep``, ``--override``) gather every value, as they say."""
        args = sys.argv[1:] if args is None else list(args)
        first: dict[str, str] = {}
        tokens = list(itertools.takewhile(lambda token: token != "--", args))
        for token, following in itertools.pairwise([*tokens, ""]):
            option = token.split("=", 1)[0]
            action = self._option_string_actions.get(option)
            if action is None or isinstance(action, _GATHERING):
                continue
            written = token if "=" in token or action.nargs == 0 else f"{token} {following}".rstrip()
            if action.dest in first:
                self.error(f"'{written}' given after '{first[action.dest]}': a setting takes one value "
                           f"(one of the two would be dropped); give it once")
            first[action.dest] = written
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> typing.NoReturn:
        unknown = message.removeprefix("unrecognized arguments: ").split()
        flag = unknown[0].split("=")[0] if message.startswith("unrecognized arguments: ") and unknown else ""
        if flag in self.elsewhere:
            message += f" ({flag} is {self.elsewhere[flag]})"
        self.exit(USAGE_ERROR, f"jaxrl-frag: error: {message}\nrun '{self.prog} --help' for the settings\n")


def given_values(args: argparse.Namespace, flags: Sequence[fields.Flag]) -> dict[str, Any]:
    """The values of ``flags`` that ``args`` holds, by destination: those set (``none`` as ``None``)."""
    return {flag.dest: fields.given(getattr(args, flag.dest)) for flag in flags
            if getattr(args, flag.dest, None) is not None}
