"""``jaxrl-frag resume``: continue a run from its newest checkpoint, with the settings
its config.json saved (and the few a resumed run may change, by ``--override``); a
finished run's learning curve, where it is missing or damaged, is drawn again."""

from __future__ import annotations

import argparse
from pathlib import Path

from jaxrl_frag.app.cli.runtime import add_runtime_flags
from jaxrl_frag.app.spec import RESUMABLE_CHANGES, parse_overrides


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
    from jaxrl_frag.app import training

    return training.resume(args.run_dir, parse_overrides(args.override), restart=args.restart)
