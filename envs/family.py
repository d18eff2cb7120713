"""What an environment family's module shares with the others: its package imported
where one of its environments is first made (an optional extra, named with the command
that installs it), and the refusal of an id it does not serve."""

from __future__ import annotations

import importlib
from collections.abc import Collection, Mapping, Sequence
from types import ModuleType
from typing import Any

from jaxrl_frag.errors import ConfigError, check, did_you_mean


def package_module(name: str, env_id: str, install: str) -> ModuleType:
    """Module ``name`` of a family's package; ``ConfigError`` naming ``env_id`` and the
    ``install`` command where that package is not installed (a module missing inside an
    installed package is raised as it is)."""
    package = name.split(".")[0]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != package:
            raise
        raise ConfigError("env", env_id, f"needs the {package} package, which is not installed: {install}") from None


def unknown_id(env_id: str, family: str, ids: Sequence[str], note: str = "") -> ConfigError:
    """The refusal of ``env_id``, which ``family`` does not serve: the closest of its
    ``ids``, then all of them (and ``note``)."""
    return ConfigError("env", env_id, f"unknown {family} environment; {did_you_mean(env_id, ids)}the {family} ids are "
                                      f"{', '.join(ids)}{note}")


def check_parameters(env_id: str, family: str, options: Mapping[str, Any], known: Collection[str]) -> None:
    """``ConfigError`` naming ``env_id`` and the ``known`` parameters where ``options``
    names one that ``family``'s parameters do not have."""
    unknown = sorted(set(options) - set(known))
    check(not unknown, "env", env_id, lambda: f"{family}'s parameters have no {', '.join(unknown)}; they are "
                                              f"{', '.join(known)}")
