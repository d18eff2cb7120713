"""``jaxrl-frag train``: the flags of a run's directory, checkpoints, evaluation during
training and W&B logging; training itself is ``app.training.train`` of the ``RunSpec``
the flags make."""

from __future__ import annotations

import argparse
from pathlib import Path

from jaxrl_frag.app import fields
from jaxrl_frag.app.cli.spec_flags import run_spec
from jaxrl_frag.app.spec import EVAL_EPISODES


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``train``'s own flags (its run directory, checkpoints, evaluation and W&B)."""
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="where config.json, metrics.csv and learning_curve.png go "
                             "(default runs/RECIPE-ENV-TIME)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    parser.add_argument("--print-config", action="store_true",
                        help="print the run's settings as a TOML file for --config, every default resolved, and exit "
                             "without training")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --run-dir from its newest checkpoint (same settings)")
    parser.add_argument("--checkpoint-every", type=fields.parse_int, default=None, metavar="ITERATIONS",
                        help="save the whole training state every this many iterations, a multiple of "
                             "--chunk-iterations (default: every 10 rows of metrics); also saved at the end")
    parser.add_argument("--keep-checkpoints", type=fields.parse_int, default=3, help="checkpoints kept (default 3)")
    parser.add_argument("--eval-every", type=fields.parse_int, default=None, metavar="ITERATIONS",
                        help="every this many iterations, also play greedy episodes of the current policy on fresh "
                             "environments, inside the compiled program: eval_return and eval_length columns "
                             "(default: no evaluation)")
    parser.add_argument("--eval-episodes", type=fields.parse_int, default=None, metavar="N",
                        help=f"episodes per evaluation of --eval-every (default {EVAL_EPISODES})")
    parser.add_argument("--wandb", default=None, metavar="PROJECT",
                        help="also log each row of metrics.csv to this Weights & Biases project, the run's "
                             "configuration as its config, its files in RUN_DIR/wandb (pip install "
                             "'jaxrl-frag[wandb]'; WANDB_MODE=offline logs without a network, for `wandb sync` "
                             "to upload later); a resumed run continues the same W&B run (default: off)")


def train(args: argparse.Namespace) -> int:
    from jaxrl_frag.app import training

    if args.print_config:
        from jaxrl_frag.app.build import resolved_spec

        print(resolved_spec(run_spec(args)).to_toml(), end="")
        return 0
    return training.train(run_spec(args), args.run_dir, overwrite=args.overwrite, resume=args.resume)
