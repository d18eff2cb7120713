"""``jaxrl-frag resume``: continue a run from its newest checkpoint, with the settings
its config.json saved (and the few a resumed run may change, by ``--override``); a
finished run's learning curve, where it is missing or damaged, is drawn again."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxrl_frag.app.cli import flags
from jaxrl_frag.app.cli.runtime import add_runtime_flags
from jaxrl_frag.app.cli.train import RESUMABLE_CHANGES, RUNTIME_KEYS, resolved_config, run, setting_kinds
from jaxrl_frag.errors import ConfigError, check


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="the run directory (holds config.json and checkpoints/)")
    parser.add_argument("--override", action="append", default=[], metavar="NAME=VALUE",
                        help=f"change a setting that a resumed run may change ({', '.join(RESUMABLE_CHANGES)}); "
                             "repeatable")
    parser.add_argument("--restart", action="store_true",
                        help="start the run over from iteration 0 with its settings, its old rows kept aside as "
                             "metrics.DATE.csv (for a run left with no usable checkpoint)")
    add_runtime_flags(parser)


def resume(args: argparse.Namespace) -> int:
    from jaxrl_frag.algorithms import setting_defaults
    from jaxrl_frag.app.cli.algorithm import make_algorithm
    from jaxrl_frag.app.rundir import RunDir
    from jaxrl_frag.checkpoints import changed_settings
    from jaxrl_frag.distributed import is_main_process

    run_dir = RunDir(args.run_dir)
    overrides = parse_overrides(args.override)
    if is_main_process():
        run_dir.check_free(resume=True)  # a run's directory, writable, and written by no other process
    saved = run_dir.read_config()
    train_args = saved_train_args(run_dir, saved, overrides)
    vars(train_args).update(resume=True, run_dir=run_dir.path, overwrite=False,
                            boost_round_seconds=saved.get("round_seconds"),
                            coordinator=args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
    algo, members = make_algorithm(train_args)
    config = resolved_config(train_args, algo)
    changed = changed_settings(saved, config, (*RUNTIME_KEYS, *overrides), setting_defaults(algo))
    check(not changed, "config", ", ".join(changed.values()),
          "the saved settings no longer build the same run (was the recipe's code changed?); start a new run")
    return run(train_args, run_dir, algo, members, config, restart=args.restart)


def saved_train_args(run_dir: Any, saved: dict[str, Any], overrides: dict[str, Any]) -> argparse.Namespace:
    """``train``'s arguments for the run in ``run_dir``: its saved settings (the row and
    checkpoint intervals as they were, even where a default derived from the run length
    would now give another value), then ``overrides``, each read back as its flag reads
    (``flags.Kind.load``). ``ConfigError`` where config.json holds a setting that
    ``train`` does not take, or a value that its flag cannot give."""
    from jaxrl_frag import recipes
    from jaxrl_frag.app.cli.parser import build_parser

    settings = {**saved["settings"], "chunk_iterations": saved["chunk_iterations"],
                "checkpoint_every": saved["checkpoint_every"], **overrides}
    if settings["recipe"] not in recipes.names():
        raise run_dir.config_error(f"names the recipe {settings['recipe']!r}, not one of {', '.join(recipes.names())}")
    argv = ["train", settings["recipe"], "--env", settings["env"]]
    args = build_parser(argv).parse_args(argv)
    kinds = setting_kinds(args.recipe_cls)
    for name, value in settings.items():
        if name not in kinds:
            raise run_dir.config_error(f"holds the setting {name!r}, which `train {settings['recipe']}` does not take")
        if value is None and getattr(args, name) is None and not kinds[name].optional:
            continue  # left unset, as the flag leaves it
        try:
            settings[name] = kinds[name].load(value)
        except ValueError:
            raise run_dir.config_error(f"holds {name}={value!r}, which --{name.replace('_', '-')} cannot be") from None
    vars(args).update(settings)
    return args


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
            out[name] = flags.parse_int(value)
        except (ValueError, argparse.ArgumentTypeError):
            raise ConfigError("override", spec, f"{name} must be a whole number") from None
    return out
