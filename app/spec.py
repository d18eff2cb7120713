"""``RunSpec``: everything a run is, as one typed value.

The command line turns its flags into a ``RunSpec``; a run's ``config.json`` records it
(``to_json``, under ``settings``) and gives it back (``from_json``), so that ``resume``,
``evaluate`` and Python build the same run without a parser. Its settings are of three
families, each a dataclass's fields with a ``help`` in their metadata (``fields``): the
recipe's (``recipe_settings``, only those given: the recipe's defaults, which may depend
on the environment, fill the rest), the distribution policy's (``policy_settings``, by
flag name: policies share ``--devices`` and ``--shuffle``) and adaptive actor boosting's
(``boost_settings``, but its strategy, ``boost``).

A run can also be written as a TOML file (``from_toml``, ``to_toml``): the same flat
table as config.json's ``settings``, each value as config.json holds it or as its flag's
text in quotes (``total_steps = "5e5"``, ``max_grad_norm = "none"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxrl_frag.app import fields
from jaxrl_frag.errors import ConfigError, check

EVAL_EPISODES = 10  # episodes per evaluation of ``eval_every``, by default
PER_PROCESS = "devices"  # the policy setting whose count is per process
# settings a resumed run may change: they decide how long it runs, where and how it
# reports, not what it computes per iteration
# env_workers, env_backend and the backends' options change where the host environments step, not what they compute
RESUMABLE_CHANGES = ("total_steps", "checkpoint_every", "keep_checkpoints", "chunk_iterations", "devices", "env_workers",
                     "env_backend", "env_timeout", "env_address", "env_worker_cpus", "env_worker_resource",
                     "env_lost_workers", "env_keep_alive")
# what the command line adds to a shared policy flag's help
_NOTES = {PER_PROCESS: "devices per process (on CPU, forces that many host devices)"}


@functools.cache
def recipe_flags(recipe: type) -> tuple[fields.Flag, ...]:
    """One flag per setting of the recipe dataclass (a field with a ``help``, but ``env``),
    its help from the field's metadata. Unset by default, so that the recipe's
    per-environment defaults apply."""
    hints = fields.type_hints(recipe)
    return tuple(fields.field_flag(recipe, field, hints) for field in fields.settings_of(recipe, skip=("env",)))


@functools.cache
def boost_flags() -> tuple[fields.Flag, ...]:
    """The flags of adaptive actor boosting's settings but its strategy (``--boost``)."""
    from jaxrl_frag.transforms.boost import Boosted

    hints = fields.type_hints(Boosted)
    return tuple(fields.field_flag(Boosted, field, hints, dest=f"boost_{field.name}")
                 for field in Boosted.settings() if field.name != "strategy")


def transform_flags() -> tuple[fields.Flag, ...]:
    """The settings of every plugin transform that loads: ``--NAME-SETTING``, by destination ``NAME_SETTING``."""
    from jaxrl_frag import transforms

    return _transform_flags(tuple(transforms.plugins_loaded().items()))


@functools.cache
def _transform_flags(loaded: tuple[tuple[str, type], ...]) -> tuple[fields.Flag, ...]:
    out = []
    for name, cls in loaded:
        hints = fields.type_hints(cls)
        for field in fields.settings_of(cls):
            flag = fields.field_flag(cls, field, hints)
            out.append(dataclasses.replace(flag, option=f"--{name}-{fields.option_of(field)[2:]}",
                                           dest=_transform_dest(name, field.name), help=f"{name}: {flag.help}"))
    return tuple(out)


def _transform_dest(transform: str, field: str) -> str:
    """The name of setting ``field`` of plugin transform ``transform`` in a spec and config.json: ``NAME_FIELD``."""
    return f"{transform.replace('-', '_')}_{field}"


def transform_settings_of(name: str) -> dict[str, str]:
    """The settings of plugin transform ``name``: field name by destination."""
    from jaxrl_frag import transforms

    return {_transform_dest(name, field.name): field.name for field in fields.settings_of(transforms.get(name))}


@dataclasses.dataclass(frozen=True)
class PolicyFlag:
    """A flag of one or more policies: the flag, and the field it sets in each."""

    flag: fields.Flag
    fields: dict[str, str]  # policy name -> field name


def policy_names() -> tuple[str, ...]:
    """The distribution policies' names: the shipped ones, then the plugins'."""
    from jaxrl_frag import sharding

    return tuple(sharding.names())


def policy_flags() -> tuple[PolicyFlag, ...]:
    """Every policy's flags, each shared flag once, in the order the policies first declare
    them. A flag that several policies share (``--shuffle``, ``--devices``) is defined
    once, with each policy's help; they must read alike and share a default."""
    from jaxrl_frag import sharding

    return _policy_flags(tuple(sharding.policies().items()))


@functools.cache
def _policy_flags(policies: tuple[tuple[str, type], ...]) -> tuple[PolicyFlag, ...]:
    merged: dict[str, dict[str, Any]] = {}
    for name, cls in policies:
        hints = fields.type_hints(cls)
        for field in fields.settings_of(cls):
            flag = fields.field_flag(cls, field, hints, dest=fields.option_of(field)[2:].replace("-", "_"), none=None)
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
        flag = fields.Flag(first.option, dest, first.kind, "; ".join(parts) + shown, entry["default"], dest.upper())
        out.append(PolicyFlag(flag, entry["fields"]))
    return tuple(out)


def policy_kinds() -> dict[str, fields.Kind]:
    """``policy`` and the policies' settings: how each reads, by its name in config.json."""
    return {"policy": fields.one_of(policy_names()), **{p.flag.dest: p.flag.kind for p in policy_flags()}}


def boost_kinds() -> dict[str, fields.Kind]:
    """``boost`` (the strategy), ``boost_calibrate`` and the boost settings: how each reads, by name."""
    from jaxrl_frag.transforms.boost import STRATEGIES

    return {"boost": fields.one_of((*STRATEGIES, "off")), "boost_calibrate": fields.BOOL,
            **{flag.dest: flag.kind for flag in boost_flags()}}


# how the run's own settings read, by name (the policies', the recipe's and boosting's come from their dataclasses)
_OWN_KINDS = {"recipe": fields.STR, "env": fields.STR, "seed": fields.INT, "seeds": fields.INT, "sweep": fields.TEXTS,
              "transforms": fields.TEXTS,
              "samples": fields.optional(fields.INT, None), "chunk_iterations": fields.optional(fields.INT, None),
              "checkpoint_every": fields.optional(fields.INT, None), "keep_checkpoints": fields.INT,
              "eval_every": fields.optional(fields.INT, None), "eval_episodes": fields.optional(fields.INT, None),
              "wandb": fields.optional(fields.STR, None)}


def setting_kinds(recipe: type) -> dict[str, fields.Kind]:
    """How each setting of a run of ``recipe`` reads (from a flag's text, or saved in
    config.json), by its name in config.json."""
    return {**_OWN_KINDS, **policy_kinds(), **boost_kinds(), **{f.dest: f.kind for f in transform_flags()},
            **{f.dest: f.kind for f in recipe_flags(recipe)}}


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything a run is: the recipe and its settings on an environment, the seeds (one
    run, or a population of ``seeds`` per setting of ``sweep``), the distribution policy
    and its settings, adaptive actor boosting, evaluation during training, the plugin
    transforms it applies in order (``transforms``; their settings by ``NAME_SETTING``),
    the rows and checkpoints it writes, and the Weights & Biases project it logs its rows
    to as well (``wandb``; ``None``: none). Settings left unset (``None``) take their
    defaults as the run is built."""

    recipe: str
    env: str
    seed: int = 0
    recipe_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    policy: str = "single"
    policy_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    seeds: int = 1
    sweep: tuple[str, ...] = ()
    samples: int | None = None
    boost: str = "off"
    boost_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    boost_calibrate: bool = False
    eval_every: int | None = None
    eval_episodes: int | None = None
    transforms: tuple[str, ...] = ()
    transform_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    chunk_iterations: int | None = None
    checkpoint_every: int | None = None
    keep_checkpoints: int = 3
    wandb: str | None = None

    def __post_init__(self) -> None:
        """Refuses (``ConfigError``) a setting that a run of this recipe does not take;
        completes ``policy_settings`` with the policies' defaults (config.json records
        them) and drops a setting given as ``None`` that cannot be none (unset), so that
        a specification read back equals the one written."""
        self._check_names()
        given = {p.flag.dest: self.policy_settings.get(p.flag.dest, p.flag.default) for p in policy_flags()}
        object.__setattr__(self, "policy_settings", {name: value for name, value in given.items() if value is not None})
        kinds = setting_kinds(self.recipe_cls)
        for family, prefix in (("recipe_settings", ""), ("boost_settings", "boost_"), ("transform_settings", "")):
            object.__setattr__(self, family, {name: value for name, value in getattr(self, family).items()
                                              if value is not None or kinds[prefix + name].optional})

    def _check_names(self) -> None:
        """``ConfigError`` for a policy, transform or setting of another name than the run's can be."""
        from jaxrl_frag import transforms

        check(self.policy in policy_names(), "policy", self.policy, f"one of {', '.join(policy_names())}")
        for family, given, known in (
                ("recipe_settings", self.recipe_settings, {f.dest for f in recipe_flags(self.recipe_cls)}),
                ("policy_settings", self.policy_settings, {p.flag.dest for p in policy_flags()}),
                ("boost_settings", self.boost_settings, {f.dest[len("boost_"):] for f in boost_flags()})):
            unknown = sorted(set(given) - known)
            check(not unknown, family, ", ".join(unknown),
                  f"not a setting of `train {self.recipe}`; its settings: {', '.join(sorted(known))}")
        check(len(set(self.transforms)) == len(self.transforms), "transforms", list(self.transforms),
              "apply each transform once")
        applied = {dest for name in self.transforms for dest in transform_settings_of(name)}
        stray = sorted(set(self.transform_settings) - applied)
        if stray:
            owner = [name for name in transforms.plugins_loaded() if stray[0] in transform_settings_of(name)]
            option = "--" + stray[0].replace("_", "-")
            raise ConfigError("transform_settings", stray[0], (
                f"{option} is a setting of the transform {owner[0]}, which this run does not apply: add --transform "
                f"{owner[0]}, or drop {option}") if owner else "not a setting of an installed transform")

    @functools.cached_property
    def recipe_cls(self) -> type:
        """The recipe class ``recipe`` names (a plugin's, loaded); ``ConfigError`` for an unknown name."""
        from jaxrl_frag import recipes

        return recipes.get(self.recipe)

    @property
    def population(self) -> bool:
        """Whether the run trains a population: several seeds, or a sweep."""
        return self.seeds > 1 or bool(self.sweep)

    @property
    def boosting(self) -> bool:
        return self.boost != "off"

    def replace(self, **changes: Any) -> RunSpec:
        """This specification with ``changes``."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The specification as config.json's ``settings`` record it: a flat object, every
        policy setting by name (its default where unset: ``null`` for one without), the
        recipe's, boosting's and the transforms' given ones (boosting's prefixed ``boost_``);
        ``transforms`` and ``wandb`` only where there are any (as a run before them wrote it)."""
        kinds = setting_kinds(self.recipe_cls)
        given = {**{f"boost_{k}": v for k, v in self.boost_settings.items()}, **self.recipe_settings}
        return {"recipe": self.recipe, "env": self.env, "seed": self.seed, "seeds": self.seeds, "sweep": list(self.sweep),
                "samples": self.samples, "policy": self.policy,
                **{p.flag.dest: self.policy_settings.get(p.flag.dest, p.flag.default) for p in policy_flags()},
                "chunk_iterations": self.chunk_iterations, "checkpoint_every": self.checkpoint_every,
                "keep_checkpoints": self.keep_checkpoints, "boost": self.boost, "boost_calibrate": self.boost_calibrate,
                "eval_every": self.eval_every, "eval_episodes": self.eval_episodes,
                **({"transforms": list(self.transforms)} if self.transforms else {}),
                **({"wandb": self.wandb} if self.wandb is not None else {}),
                **{k: kinds[k].dump(v) for k, v in {**self.transform_settings, **given}.items()}}

    @classmethod
    def from_json(cls, settings: Mapping[str, Any], problem: Callable[[str], Exception] | None = None) -> RunSpec:
        """The specification that ``settings`` (``to_json``'s object) records, each value
        read back as its flag reads it (``fields.Kind.load``); a setting it lacks takes
        its default. Raises ``problem(what)`` (default: a ``ConfigError`` on ``settings``)
        where it names no recipe this installation has, a setting that a run of its
        recipe does not take, or a value its flag could not give."""
        fail = problem or (lambda what: ConfigError("settings", "", what))
        recipe_cls = recipe_cls_of(settings, fail)
        recipe = settings["recipe"]
        kinds = setting_kinds(recipe_cls)
        policy = {p.flag.dest for p in policy_flags()}
        boost = {flag.dest for flag in boost_flags()}
        transform = {flag.dest for flag in transform_flags()}
        optional_recipe = {f.dest for f in recipe_flags(recipe_cls)} | boost | transform
        own: dict[str, Any] = {}
        recipe_settings: dict[str, Any] = {}
        policy_settings: dict[str, Any] = {}
        boost_settings: dict[str, Any] = {}
        transform_settings: dict[str, Any] = {}
        for name, value in settings.items():
            if name not in kinds:
                raise fail(f"holds the setting {name!r}, which `train {recipe}` does not take")
            if value is None and not kinds[name].optional and (name in policy or name in optional_recipe):
                continue  # left unset, as the flag leaves it
            try:
                loaded = kinds[name].load(value)
            except ValueError:
                raise fail(f"holds {name}={value!r}, which --{name.replace('_', '-')} cannot be") from None
            if name in policy:
                if loaded is not None:
                    policy_settings[name] = loaded
            elif name in boost:
                boost_settings[name[len("boost_"):]] = fields.given(loaded)
            elif name in transform:
                transform_settings[name] = fields.given(loaded)
            elif name in _OWN_KINDS or name in ("policy", "boost", "boost_calibrate"):
                own[name] = tuple(loaded) if name in ("sweep", "transforms") else loaded
            else:
                recipe_settings[name] = fields.given(loaded)
        return cls(**own, recipe_settings=recipe_settings, policy_settings=policy_settings, boost_settings=boost_settings,
                   transform_settings=transform_settings)

    @classmethod
    def from_toml(cls, path: str | Path) -> RunSpec:
        """The run that the TOML file ``path`` writes (module docstring); ``ConfigError``
        naming the file where it cannot be read, or holds what ``from_json`` refuses."""
        path = Path(path)

        def problem(what: str) -> ConfigError:
            return ConfigError("config", str(path), f"{what}; write each setting as config.json holds it, or as its "
                                                    "flag's text in quotes (total_steps = \"5e5\")")

        try:
            table = tomllib.loads(path.read_text())
        except OSError as error:
            raise ConfigError("config", str(path), f"cannot be read ({error.strerror}); give a TOML file") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise ConfigError("config", str(path), f"is not TOML ({error})") from None
        kinds = setting_kinds(recipe_cls_of(table, problem))
        for name, value in table.items():
            if isinstance(value, str) and name in kinds and kinds[name] is not fields.STR:
                try:  # the flag's text, as config.json would hold it
                    table[name] = kinds[name].dump(kinds[name].parse(value))
                except (ValueError, argparse.ArgumentTypeError):
                    raise problem(f"holds {name}={value!r}, which --{name.replace('_', '-')} cannot be") from None
        return cls.from_json(table, problem)

    def to_toml(self) -> str:
        """The specification as a TOML file that ``from_toml`` reads back: config.json's
        ``settings``, but those unset (TOML has no null; an optional setting set to none
        is written ``"none"``)."""
        kinds = setting_kinds(self.recipe_cls)
        lines = []
        for name, value in self.to_json().items():
            if value is None:
                if not kinds[name].optional or kinds[name].load(None) is None:
                    continue  # unset: its default
                value = "none"
            lines.append(f"{name} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def recipe_cls_of(settings: Mapping[str, Any], problem: Callable[[str], Exception]) -> type:
    """The recipe class that ``settings`` names; raises ``problem(what)`` where they name none this installation has."""
    from jaxrl_frag import recipes

    recipe = settings.get("recipe")
    if recipe not in recipes.names():
        raise problem(f"names the recipe {recipe!r}, not one of {', '.join(recipes.names())}")
    return recipes.get(recipe)


def _toml_value(value: Any) -> str:
    """``value`` (JSON-ready: text, a number, on/off, a list of them) written as TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)  # text (JSON's escapes are TOML's), and numbers as TOML writes them


def parse_overrides(specs: Sequence[str]) -> dict[str, Any]:
    """``["total_steps=1e6"]`` -> ``{"total_steps": 1000000}``; only ``RESUMABLE_CHANGES``."""
    out: dict[str, Any] = {}
    for spec in specs:
        name, sep, value = (part.strip() for part in spec.partition("="))  # spaces around '=' are the shell's quoting
        check(bool(sep and name and value), "override", spec, "write NAME=VALUE, e.g. total_steps=1e6")
        check(name in RESUMABLE_CHANGES, "override", spec,
              f"{name!r} cannot change in a resumed run (it would no longer be the same run); the settings that can: "
              f"{', '.join(RESUMABLE_CHANGES)}; start a new run to change {name!r}")
        check(name not in out, "override", spec,
              f"{name} is overridden twice ({name}={out.get(name)!r} before); give it once")
        try:
            out[name] = fields.parse_int(value)
        except (ValueError, argparse.ArgumentTypeError):
            raise ConfigError("override", spec, f"{name} must be a whole number") from None
    return out
