"""Hyperparameter sweeps and seeds as the members of one population.

A sweep spec is ``name=v1,v2,...`` (a grid axis) or ``name=DIST:low:high`` with
``DIST`` one of ``uniform`` and ``loguniform`` (random search, ``samples``
settings drawn with ``seed``). Grid axes alone give their full product; with any
random axis, each of the ``samples`` settings draws every axis (a grid axis
uniformly from its values). Every setting is run with every seed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_frag.errors import ConfigError, check

DISTRIBUTIONS = ("uniform", "loguniform")


def parse_spec(spec: str) -> tuple[str, list[float] | tuple[str, float, float]]:
    """``"lr=1e-4,3e-4"`` -> ``("lr", [1e-4, 3e-4])``; ``"lr=loguniform:1e-5:1e-2"`` ->
    ``("lr", ("loguniform", 1e-5, 1e-2))``."""
    name, sep, values = spec.partition("=")
    check(bool(sep and name and values), "sweep", spec, "write NAME=V1,V2,... or NAME=loguniform:LOW:HIGH")
    if ":" not in values:
        return name, [_number(spec, v) for v in values.split(",")]
    dist, _, bounds = values.partition(":")
    check(dist in DISTRIBUTIONS, "sweep", spec, f"the distribution must be one of {', '.join(DISTRIBUTIONS)}")
    parts = bounds.split(":")
    check(len(parts) == 2, "sweep", spec, "write NAME=DIST:LOW:HIGH, e.g. lr=loguniform:1e-5:1e-2")
    low, high = (_number(spec, v) for v in parts)
    check(low < high and (dist == "uniform" or low > 0), "sweep", spec, "give LOW < HIGH (both positive for loguniform)")
    return name, (dist, low, high)


def _number(spec: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError("sweep", spec, "values must be numbers, e.g. lr=1e-4,3e-4 or lr=loguniform:1e-5:1e-2") from None


def parse_specs(specs: Sequence[str]) -> dict[str, list[float] | tuple[str, float, float]]:
    """Every spec's axis, by name (``parse_spec``); ``ConfigError`` for a name swept twice
    (which of the two was meant is for the user to say)."""
    axes: dict[str, list[float] | tuple[str, float, float]] = {}
    first: dict[str, str] = {}
    for spec in specs:
        name, axis = parse_spec(spec)
        check(name not in axes, "sweep", spec,
              f"sweeps {name} again (also --sweep {first.get(name)}): give each name once, its values in one list "
              "(NAME=V1,V2,...)")
        axes[name], first[name] = axis, spec
    return axes


def count(specs: Sequence[str], samples: int | None = None) -> int:
    """How many settings ``settings(specs, samples)`` gives (0 where it refuses them),
    without listing them."""
    axes = list(parse_specs(specs).values())
    if any(isinstance(v, tuple) for v in axes):
        return samples or 0
    return math.prod(len(v) for v in axes)


def settings(specs: Sequence[str], samples: int | None = None, seed: int = 0) -> list[dict[str, float]]:
    """The hyperparameter settings that ``specs`` describe (one empty setting without specs)."""
    axes = parse_specs(specs)
    grid = {k: v for k, v in axes.items() if isinstance(v, list)}
    random = {k: v for k, v in axes.items() if isinstance(v, tuple)}
    if not random:
        check(samples is None, "samples", samples, "--samples is for random search (NAME=loguniform:LOW:HIGH)")
        return [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    check(samples is not None and samples > 0, "samples", samples, "random search needs --samples N (N > 0)")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(samples):
        setting = {k: float(rng.choice(v)) for k, v in grid.items()}
        for k, (dist, low, high) in random.items():
            u = rng.uniform()
            setting[k] = float(low + u * (high - low) if dist == "uniform" else np.exp(np.log(low) + u * np.log(high / low)))
        out.append(setting)
    return out


def check_traced(recipe: type, names: Sequence[str]) -> None:
    """Refuse sweeping a name that is not a traced hyperparameter of ``recipe``."""
    fields = {f.name: f for f in dataclasses.fields(recipe)}
    for name in names:
        if name not in fields or name == "env":
            traced = [n for n, f in fields.items() if f.metadata.get("pytree_node", True)]
            raise ConfigError("sweep", name, f"not a hyperparameter of {recipe.__name__}; sweepable: {', '.join(traced)}")
        if not fields[name].metadata.get("pytree_node", True):
            raise ConfigError(
                "sweep", name,
                "is a static field (a shape or count): every member of one population shares one compiled "
                "program, so it cannot vary; sweep it with separate runs",
            )


def members(setting_list: Sequence[dict[str, Any]], seeds: int, first_seed: int = 0) -> list[tuple[dict[str, Any], int]]:
    """Every setting paired with every seed: the population's members, in order."""
    check(seeds > 0, "seeds", seeds, "must be a positive number of seeds")
    return [(s, first_seed + i) for s in setting_list for i in range(seeds)]
