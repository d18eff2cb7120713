"""An environment id's options: ``ID@name=value@name=value``.

``brax:ant@backend=positional`` is Brax's ant on its positional physics, and
``Breakout-MinAtar@use_minimal_action_set=false`` MinAtar's Breakout with all six
actions. An option is a keyword argument of the environment's constructor
(``BraxEnv.make``'s ``backend``, ``episode_length`` and ``action_repeat``; a gymnax
environment's own), but for ``obs``, which ``make`` takes itself (``ObservationMask``).
A value reads as a whole number, a real number, ``true`` or ``false``, or else as text.
An environment made with options is named with them, by name, so that ``make`` makes
it again from its name, and the id (with its options) is all a run's configuration says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from jaxrl_frag.errors import check

SEPARATOR = "@"
_OPTION = re.compile(r"([A-Za-z_]\w*)=(.*)", re.S)


def split(env_id: str) -> tuple[str, dict[str, str]]:
    """``env_id`` without its options, and the options as written (values as text).

    Raises:
        ConfigError: Naming ``env_id``, for an option that is not ``name=value`` or one
            given twice.
    """
    base, *written = env_id.split(SEPARATOR)
    options: dict[str, str] = {}
    for option in written:
        match = _OPTION.fullmatch(option)
        check(match is not None, "env", env_id,
              f"takes options as {SEPARATOR}name=value after the id (brax:ant{SEPARATOR}backend=positional); "
              f"{SEPARATOR}{option} is not one")
        name, text = match.groups()
        check(name not in options, "env", env_id, f"gives the option {name} twice: give it once")
        options[name] = text
    return base, options


def value(text: str) -> bool | int | float | str:
    """An option's value: a whole number, a real number, ``true``/``false``, or the text itself."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def named(base: str, options: Mapping[str, Any]) -> str:
    """``base`` with ``options`` after it, ``@name=value`` each, in their order by name
    (``split`` and ``value`` read it back)."""
    written = (f"{SEPARATOR}{name}={str(v).lower() if isinstance(v, bool) else v}" for name, v in sorted(options.items()))
    return base + "".join(written)
