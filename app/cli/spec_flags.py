"""The flags of ``train`` and ``explain`` that make a ``RunSpec``: a recipe's (from its
dataclass fields), actor boosting's (from ``Boosted``'s), ``run_spec``, the one place
where parsed flags become a specification, and ``--config``, a run file whose settings
are the flags' defaults (``with_run_file``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxrl_frag.app import fields
from jaxrl_frag.app.cli import flags, policies
from jaxrl_frag.app.spec import RunSpec, boost_flags, recipe_flags, transform_flags
from jaxrl_frag.errors import ConfigError

# train's and explain's settings that are the specification's own fields, by the same name
_OWN = ("seed", "seeds", "samples", "boost", "boost_calibrate", "eval_every", "eval_episodes", "chunk_iterations",
        "checkpoint_every", "keep_checkpoints", "wandb")


def add_recipe_flags(parser: argparse.ArgumentParser, recipe: type) -> None:
    group = parser.add_argument_group(f"{recipe.__name__} settings (defaults shown are for most environments)")
    for flag in recipe_flags(recipe):
        flag.add_to(group)


def add_boost_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of adaptive actor boosting (``jaxrl_frag.transforms.boost``), one per setting."""
    from jaxrl_frag.sharding import running
    from jaxrl_frag.transforms.boost import STRATEGIES, Boosted

    group = parser.add_argument_group(f"actor boosting (ppo, a2c, impala; --policy {' or '.join(running('boosts', True))})")
    (strategy,) = [f for f in Boosted.settings() if f.name == "strategy"]
    group.add_argument(strategy.metadata["flag"], dest="boost", choices=(*STRATEGIES, "off"), default="off",
                       help=f"{strategy.metadata['help']} (default {strategy.default!r}); off: a fixed --num-envs "
                            "(default off)")
    for flag in boost_flags():
        flag.add_to(group)
    group.add_argument("--boost-calibrate", action="store_true",
                       help="time each rung's actor, learner and probe first, so that rows report device-seconds "
                            "and cost (implied by --budget-cost)")


def add_transform_flags(parser: argparse.ArgumentParser) -> None:
    """``--transform NAME`` (repeatable, in order) and every plugin transform's settings."""
    from jaxrl_frag import transforms

    group = parser.add_argument_group("plugin transforms (--transform) and their settings")
    group.add_argument("--transform", dest="transforms", action="append", default=[], metavar="NAME",
                       choices=list(transforms.plugins()),
                       help="apply this installed transform around the algorithm; repeatable, applied in order "
                            f"(installed: {', '.join(transforms.plugins()) or 'none'})")
    for flag in transform_flags():
        flag.add_to(group)


def run_spec(args: argparse.Namespace) -> RunSpec:
    """The run that the parsed flags of ``train`` or ``explain`` (which lacks train's
    checkpoint, evaluation and boosting flags: their defaults) describe."""
    boost = {dest[len("boost_"):]: value for dest, value in flags.given_values(args, boost_flags()).items()}
    return RunSpec(args.recipe, args.env, recipe_settings=flags.given_values(args, recipe_flags(args.recipe_cls)),
                   policy=args.policy, policy_settings=policies.given(args), sweep=tuple(args.sweep), boost_settings=boost,
                   transforms=tuple(args.transforms), transform_settings=flags.given_values(args, transform_flags()),
                   **{name: getattr(args, name) for name in _OWN if hasattr(args, name)})


def flag_values(spec: RunSpec) -> dict[str, Any]:
    """The parsed flags that make ``spec`` (``run_spec``'s inverse), by destination: an
    explicit none as the flag gives it (``fields.NONE``)."""
    boost = {f"boost_{name}": value for name, value in spec.boost_settings.items()}
    given = {name: fields.NONE if value is None else value
             for name, value in {**spec.recipe_settings, **boost, **spec.transform_settings}.items()}
    return {"recipe": spec.recipe, "env": spec.env, "policy": spec.policy, **spec.policy_settings,
            "sweep": list(spec.sweep), "transforms": list(spec.transforms), **{name: getattr(spec, name) for name in _OWN},
            **given}


def with_run_file(argv: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """``argv`` with the recipe that its ``--config RUN.toml`` names (``train`` and
    ``explain``: ``train --config run.toml`` is ``train ppo --config run.toml``), and the
    flags' values the file gives, for the parser's defaults (flags given override them).
    ``argv`` unchanged, and no defaults, where it has no ``--config``."""
    argv = list(argv)
    early = flags.Parser(add_help=False)
    early.add_argument("--config", type=Path, default=None)
    path = early.parse_known_args(argv)[0].config
    if argv[:1] not in (["train"], ["explain"]) or path is None:
        return argv, {}
    spec = RunSpec.from_toml(path)
    named = len(argv) > 1 and not argv[1].startswith("-")
    if named and argv[1] != spec.recipe:
        raise ConfigError("config", str(path), f"names the recipe {spec.recipe!r}, and the command {argv[1]!r}; "
                                               "give one (`jaxrl-frag train --config FILE` takes the file's)")
    return (argv if named else [argv[0], spec.recipe, *argv[1:]]), flag_values(spec)
