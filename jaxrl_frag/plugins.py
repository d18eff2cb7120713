"""Plugins: what installed packages declare in an entry-point group (recipes,
environments, distribution policies), found without loading them, and loaded with a
``ConfigError`` naming the entry point where one fails."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jaxrl_frag.errors import ConfigError, check


def declared(group: str, taken: Callable[[str], bool]) -> dict[str, importlib.metadata.EntryPoint]:
    """The entry points of ``group`` by name, not loaded: a name ``taken`` by a shipped one
    is left out, and of two packages declaring one name the first found is kept."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for entry_point in importlib.metadata.entry_points(group=group):
        if not taken(entry_point.name):
            found.setdefault(entry_point.name, entry_point)
    return found


def describe_entry_point(entry_point: importlib.metadata.EntryPoint) -> str:
    """``entry point NAME = MODULE:OBJECT (group G, package P VERSION)``."""
    dist = getattr(entry_point, "dist", None)
    package = f", package {dist.name} {dist.version}" if dist is not None else ""
    return f"entry point {entry_point.name} = {entry_point.value} (group {entry_point.group}{package})"


def load_plugin(entry_point: importlib.metadata.EntryPoint, field: str, value: Any) -> Any:
    """The object ``entry_point`` names, loaded; a ``ConfigError`` for setting ``field``
    (``value``), naming the entry point and what went wrong, where it fails to load."""
    try:
        return entry_point.load()
    except Exception as error:
        reason = " ".join(str(error).split()) or "no message"
        reason = reason if len(reason) <= 300 else reason[:297] + "..."
        raise ConfigError(field, value, f"its plugin failed to load: {describe_entry_point(entry_point)}: "
                                        f"{type(error).__name__}: {reason}; fix or reinstall that package, or uninstall "
                                        "it") from None


def named(name: str, setting: str, shipped: Mapping[str, Any], entry_points: Mapping[str, importlib.metadata.EntryPoint],
          fits: Callable[[Any], bool], wanted: str) -> Any:
    """The ``setting`` (a recipe, a policy, ...) called ``name``: a ``shipped`` one, or the
    object its entry point names, loaded; a ``ConfigError`` for an unknown name, a plugin
    that fails to load, or an object that ``fits`` refuses (``wanted`` says what fits)."""
    if name in shipped:
        return shipped[name]
    check(name in entry_points, setting, name, f"unknown {setting}; choose one of {', '.join([*shipped, *entry_points])}")
    entry_point = entry_points[name]
    found = load_plugin(entry_point, setting, name)
    if not fits(found):
        raise ConfigError(setting, name, f"its plugin's {describe_entry_point(entry_point)} names {found!r}, not {wanted}")
    return found


def loading(names: Iterable[str], get: Callable[[str], Any]) -> dict[str, Any]:
    """``get(name)`` of each of ``names`` that loads, by name (one that fails is left to ``get``, which says why)."""
    loaded = {}
    for name in names:
        try:
            loaded[name] = get(name)
        except ConfigError:
            continue
    return loaded
