"""The command line's parser: the commands, and per recipe its flags, generated from
the recipe's dataclass, the policies' and boosting's (``flags``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxrl_frag.app import fields
from jaxrl_frag.app.cli import envs, evaluate, explain, flags, policies, resume, runtime, spec_flags, train
from jaxrl_frag.errors import ConfigError

_COMMANDS_WITH_RECIPES = ("train", "explain")


def _summary(name: str, load: bool) -> str:
    """A recipe's line in ``--help``: its docstring's first line (a plugin's only with ``load``)."""
    from jaxrl_frag import recipes

    if name not in recipes.RECIPES and not load:
        return f"plugin {recipes.plugins()[name].value}"
    try:
        recipe = recipes.get(name)
    except ConfigError:
        return f"plugin {recipes.plugins()[name].value} (fails to load: run 'jaxrl-frag train {name}' for why)"
    return (recipe.__doc__ or "").strip().split("\n")[0]


def _add_recipe_command(sub: argparse.ArgumentParser, command: str, recipe: type, defaults: Mapping[str, Any]) -> None:
    """The flags of ``command`` (train or explain) with ``recipe``, defaulting to ``defaults``
    (a run file's, by destination) where they hold them."""
    sub.add_argument("--config", type=Path, default=None, metavar="RUN.toml",
                     help="the run's settings from a TOML file (keys as in a run's config.json; `train ... "
                          "--print-config` writes one); flags given override them")
    sub.add_argument("--env", required="env" not in defaults, help="environment id (see `jaxrl-frag envs`)")
    sub.add_argument("--seed", type=fields.parse_int, default=0, help="random seed (default 0)")
    policies.add_flags(sub)
    runtime.add_runtime_flags(sub)
    sub.add_argument("--chunk-iterations", type=fields.parse_int, default=None,
                     help="iterations per row of metrics.csv (default: 50 rows per run)")
    sub.add_argument("--seeds", type=fields.parse_int, default=1,
                     help="train this many seeds (from --seed on) as one population (default 1)")
    sub.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2|NAME=DIST:LOW:HIGH",
                     help="sweep a hyperparameter over values, or draw it from uniform/loguniform "
                          "(with --samples); repeatable; every setting runs with every seed")
    sub.add_argument("--samples", type=fields.parse_int, default=None, help="random-search settings to draw")
    if command == "explain":
        explain.add_flags(sub)
    else:
        train.add_flags(sub)
    try:
        spec_flags.add_recipe_flags(sub, recipe)
    except fields.UnsupportedField as error:  # the recipe's author's to fix
        raise ConfigError("recipe", recipe.__name__, str(error)) from None
    except argparse.ArgumentError as error:  # a setting named as one of the command line's own flags
        raise ConfigError("recipe", recipe.__name__, f"a setting's flag clashes with the command line's own: {error}; "
                                                     "rename the field, or give it another flag in its metadata") from None
    spec_flags.add_transform_flags(sub)
    if command == "train":
        spec_flags.add_boost_flags(sub)
    handler = explain.explain if command == "explain" else train.train
    sub.set_defaults(handler=handler, recipe_cls=recipe, **{k: v for k, v in defaults.items() if k != "recipe"})


def build_parser(argv: Sequence[str] | None = None, defaults: Mapping[str, Any] | None = None) -> argparse.ArgumentParser:
    """The parser of the command line ``argv`` (default ``sys.argv[1:]``). Every recipe is
    a choice of ``train`` and ``explain``; only the one ``argv`` names gets its flags
    (a plugin's is loaded then, and a plugin that fails to load is a ``ConfigError``
    naming its entry point), so no other recipe can break the command. ``defaults``: the
    values of its flags that a run file gives (``spec_flags.with_run_file``)."""
    from jaxrl_frag import recipes

    argv = sys.argv[1:] if argv is None else list(argv)
    named = argv[:1] in (["train"], ["explain"]) and len(argv) > 1 and not argv[1].startswith("-")
    selected = tuple(argv[:2]) if named else None
    parser = flags.Parser(prog="jaxrl-frag", description="RL algorithms compiled whole into XLA programs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train_command = commands.add_parser("train", help="train a recipe and write a run directory")
    resume_command = commands.add_parser("resume", help="continue an interrupted run from its newest checkpoint")
    resume.add_flags(resume_command)
    resume_command.set_defaults(handler=resume.resume)
    evaluate_command = commands.add_parser("evaluate", help="play a run's trained policy for complete episodes "
                                                            "and write eval.csv (and a GIF of one, --video)")
    evaluate.add_flags(evaluate_command)
    evaluate_command.set_defaults(handler=evaluate.evaluate)
    explain_command = commands.add_parser("explain",
                                          help="print the fragment graph and XLA's cost figures, without training")
    commands.add_parser("envs", help="list the environment ids").set_defaults(handler=envs.list_envs)
    names = recipes.names()
    for command, command_parser in (("train", train_command), ("explain", explain_command)):
        choices = command_parser.add_subparsers(dest="recipe", required=True, metavar="RECIPE",
                                                help=f"one of: {', '.join(names)}")
        for name in names:
            if selected != (command, name):
                choices.add_parser(name, help=_summary(name, load=selected is None))
                continue
            recipe = recipes.get(name)
            sub = choices.add_parser(name, help=_summary(name, load=True))
            _add_recipe_command(sub, command, recipe, defaults or {})
            parser.elsewhere = _elsewhere(name, recipe)
    return parser


def _elsewhere(name: str, recipe: type) -> dict[str, str]:
    """The flags of the built-in recipes' settings that ``recipe`` (named ``name``) lacks,
    each with the recipes that take it."""
    from jaxrl_frag import recipes

    own = {fields.option_of(f) for f in fields.settings_of(recipe)}
    takers: dict[str, list[str]] = {}
    for other, cls in recipes.RECIPES.items():
        for option in {fields.option_of(f) for f in fields.settings_of(cls)} - own:
            takers.setdefault(option, []).append(other)
    return {option: f"a setting of {', '.join(names)}, not of {name}" for option, names in takers.items()}
