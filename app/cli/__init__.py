"""The ``jaxrl-frag`` command line.

    jaxrl-frag train ppo --env CartPole-v1 [--total-steps N] [--num-envs N] [--seed S] [--run-dir DIR]
    jaxrl-frag train ppo --env CartPole-v1 --boost nitro [--boost-ladder 8,16,32,64] [--budget-steps N]
    jaxrl-frag train ppo --env gymnasium:CartPole-v1 [--env-workers N] [--env-groups G] [--no-env-ring]
    jaxrl-frag train ppo --env CartPole-v1 --eval-every K [--eval-episodes N]
    jaxrl-frag train --config run.toml [flags overriding it] [--print-config]
    jaxrl-frag resume RUN_DIR [--override total_steps=N] [--restart]
    jaxrl-frag evaluate RUN_DIR [--episodes N] [--greedy | --sample] [--seed S] [--member I] [--video out.gif]
    jaxrl-frag explain ppo --env CartPole-v1 [--policy actor-learner --transfer-dtype bfloat16]
    jaxrl-frag envs

Every recipe setting is a flag, generated from the recipe's dataclass, and so is every
distribution policy's (``flags``, ``policies``). Installed packages add recipes and
environments through the entry-point groups ``jaxrl_frag.recipes`` and
``jaxrl_frag.envs``. A wrong setting prints one paragraph on stderr and exits with
status 2; a run that goes non-finite stops with status 3, one whose host environment
worker fails with status 4, one that cannot write its files (a full disk) with status
5; SIGINT or SIGTERM saves a checkpoint and exits 0.

One module per command (``train``, ``resume``, ``evaluate``, ``explain``, ``envs``); ``parser``
builds the parser, ``spec_flags`` the ``RunSpec`` that train's and explain's flags make
(the only thing flags become: what runs is ``jaxrl_frag.app``'s), ``runtime`` what must
be set before jax starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from jaxrl_frag.app.cli import runtime, spec_flags
from jaxrl_frag.app.cli.parser import build_parser
from jaxrl_frag.app.signals import Interrupt
from jaxrl_frag.errors import ENV_WORKER_FAILED, INTERRUPTED, NON_FINITE, USAGE_ERROR, WRITE_FAILED, ConfigError

runtime.watch_backend()  # to say what started jax, should it start before the command sets its devices


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        with Interrupt.handled():
            argv, defaults = spec_flags.with_run_file(argv)
            runtime.configure_runtime(argv, defaults)
            args = build_parser(argv, defaults).parse_args(argv)
            return args.handler(args)
    except ConfigError as error:
        print(f"jaxrl-frag: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:  # SIGINT or SIGTERM outside training (``StopOnSignal`` handles them during it)
        print("jaxrl-frag: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # what reads stdout stopped reading (`jaxrl-frag envs | head`): quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush cannot fail again
        return 1


__all__ = ["ENV_WORKER_FAILED", "INTERRUPTED", "NON_FINITE", "USAGE_ERROR", "WRITE_FAILED", "build_parser", "main"]
