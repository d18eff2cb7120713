"""The ``jaxrl-frag`` command line.

    jaxrl-frag train ppo --env CartPole-v1 [--total-steps N] [--num-envs N] [--seed S] [--run-dir DIR]
    jaxrl-frag train ppo --env CartPole-v1 --boost nitro [--boost-ladder 8,16,32,64] [--budget-steps N]
    jaxrl-frag train ppo --env gymnasium:CartPole-v1 [--env-workers N] [--env-groups G] [--no-env-ring]
    jaxrl-frag resume RUN_DIR [--override total_steps=N] [--restart]
    jaxrl-frag explain ppo --env CartPole-v1 [--policy actor-learner --transfer-dtype bfloat16]
    jaxrl-frag envs

Every recipe setting is a flag, generated from the recipe's dataclass. A wrong
setting prints one paragraph on stderr and exits with status 2; a run that goes
non-finite stops with status 3, one whose host environment worker fails with status
4, one that cannot write its files (a full disk) with status 5; SIGINT or SIGTERM
saves a checkpoint and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import decimal
import logging
import os
import re
import signal
import sys
import threading
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_frag.bounds import CPU_DEVICES_MAX, INT32_MAX, MEMBERS_MAX, SEED_MAX, check_count
from jaxrl_frag.errors import ConfigError, check

USAGE_ERROR, NON_FINITE, ENV_WORKER_FAILED, WRITE_FAILED = 2, 3, 4, 5
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process that Ctrl-C ended
POLICIES = ("single", "data-parallel", "population", "actor-learner")
# settings a resumed run may change: they decide how long it runs, where and how it
# reports, not what it computes per iteration
# env_workers changes which processes step the host environments, not what they compute
RESUMABLE_CHANGES = ("total_steps", "checkpoint_every", "keep_checkpoints", "chunk_iterations", "devices", "env_workers")
# the actor-learner policy's settings
_ACTOR_LEARNER = ("actor_devices", "learner_devices", "staleness", "transfer_dtype")
# what config.json records beyond the settings, and is free to differ on resume
_RUNTIME_KEYS = ("jax", "backend", "processes", "device_count", "settings")


# a negative number in any form ``float`` reads (-3, -1e-3, -.5, -inf) is a flag's value, not a flag: the
# matcher of recent Pythons (older ones miss exponents), and the words for infinity and nan
_NEGATIVE_NUMBER = re.compile(r"-\.?\d|-(inf|infinity|nan)$", re.IGNORECASE)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, reporting a usage error in one line and a pointer to ``--help``
    (not the usage), and reading every negative number (``--lr -1e-3``) as a value."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def error(self, message: str) -> typing.NoReturn:
        self.exit(USAGE_ERROR, f"jaxrl-frag: error: {message}\nrun '{self.prog} --help' for the settings\n")


def _int(text: str) -> int:
    """An integer, also written as ``5e5`` or ``500_000`` (exactly: ``1e30`` is 10**30)."""
    try:
        value = decimal.Decimal(text.replace("_", ""))
    except decimal.InvalidOperation:
        value = decimal.Decimal("nan")
    if not (value.is_finite() and value == value.to_integral_value()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if value.adjusted() > 308:  # beyond float's range: refused before it is expanded digit by digit
        raise argparse.ArgumentTypeError(f"{text!r} is too large for any setting")
    return int(value)


def _widths(text: str) -> tuple[int, ...]:
    """Comma-separated whole numbers, e.g. ``64,64``."""
    try:
        widths = tuple(_int(w) for w in text.split(",") if w.strip())
    except argparse.ArgumentTypeError:
        widths = ()
    if not widths:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers, e.g. 64,64")
    return widths


_PARSERS: dict[str, Callable[[str], Any]] = {"int": _int, "float": float, "str": str, "tuple[int, ...]": _widths}


def _add_recipe_flags(parser: argparse.ArgumentParser, recipe: type) -> None:
    """One flag per field of the recipe dataclass, its help from the field's metadata.

    Defaults are left unset so that the recipe's per-environment defaults apply.
    """
    group = parser.add_argument_group(f"{recipe.__name__} settings (defaults shown are for most environments)")
    hints = typing.get_type_hints(recipe)
    for field in dataclasses.fields(recipe):
        if field.name == "env":
            continue
        flag = "--" + field.name.replace("_", "-")
        help_text = f"{field.metadata.get('help', '')} (default {field.default!r})"
        if hints[field.name] is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            group.add_argument(flag, type=_parser(hints[field.name]), default=None, metavar=field.name.upper(),
                               help=help_text)


def _parser(hint: Any) -> Callable[[str], Any]:
    """The parser of a flag for a field with type ``hint``."""
    name = getattr(hint, "__name__", str(hint)) if hint in (int, float, str) else str(hint)
    return _PARSERS[name.replace("typing.", "")]


def _add_boost_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of adaptive actor boosting (``jaxrl_frag.boost``), one per setting."""
    from jaxrl_frag.boost import STRATEGIES, Boosted

    group = parser.add_argument_group("actor boosting (ppo, a2c, impala; single or population policy)")
    hints = typing.get_type_hints(Boosted)
    for field in Boosted.settings():
        flag, help_text = field.metadata["flag"], f"{field.metadata['help']} (default {field.default!r})"
        if field.name == "strategy":
            group.add_argument(flag, dest="boost", choices=(*STRATEGIES, "off"), default="off",
                               help=f"{help_text}; off: a fixed --num-envs (default off)")
            continue
        group.add_argument(flag, dest=f"boost_{field.name}", type=_parser(hints[field.name]), default=None,
                           metavar=field.name.upper(), help=help_text)
    group.add_argument("--boost-calibrate", action="store_true",
                       help="time each rung's actor, learner and probe first, so that rows report device-seconds "
                            "and cost (implied by --budget-cost)")


def _boost_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The boost settings given on the command line (the strategy among them), by field name."""
    from jaxrl_frag.boost import Boosted

    given = {f.name: getattr(args, f"boost_{f.name}", None) for f in Boosted.settings() if f.name != "strategy"}
    return {"strategy": args.boost, **{k: v for k, v in given.items() if v is not None}}


def _recipe_overrides(args: argparse.Namespace, recipe: type) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(recipe)
            if f.name != "env" and getattr(args, f.name, None) is not None}


def build_parser() -> argparse.ArgumentParser:
    from jaxrl_frag.recipes import RECIPES
    from jaxrl_frag.transforms.precision import TRANSFER_DTYPES

    parser = _Parser(prog="jaxrl-frag", description="RL algorithms compiled whole into XLA programs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser("train", help="train a recipe and write a run directory")
    resume = commands.add_parser("resume", help="continue an interrupted run from its newest checkpoint")
    resume.add_argument("run_dir", type=Path, help="the run directory (holds config.json and checkpoints/)")
    resume.add_argument("--override", action="append", default=[], metavar="NAME=VALUE",
                        help=f"change a setting that a resumed run may change ({', '.join(RESUMABLE_CHANGES)}); repeatable")
    resume.add_argument("--restart", action="store_true",
                        help="start the run over from iteration 0 with its settings, its old rows kept aside as "
                             "metrics.DATE.csv (for a run left with no usable checkpoint)")
    _add_runtime_flags(resume, with_devices=False)
    resume.set_defaults(handler=_resume)
    explain = commands.add_parser("explain", help="print the fragment graph and XLA's cost figures, without training")
    commands.add_parser("envs", help="list the environment ids").set_defaults(handler=_envs)
    for command, handler in ((train, _train), (explain, _explain)):
        recipes = command.add_subparsers(dest="recipe", required=True, metavar="RECIPE",
                                         help=f"one of: {', '.join(RECIPES)}")
        for name, recipe in RECIPES.items():
            sub = recipes.add_parser(name, help=(recipe.__doc__ or "").split("\n")[0])
            sub.add_argument("--env", required=True, help="environment id (see `jaxrl-frag envs`)")
            sub.add_argument("--seed", type=_int, default=0, help="random seed (default 0)")
            sub.add_argument("--policy", choices=POLICIES, default="single",
                             help="distribution policy (default single)")
            _add_runtime_flags(sub)
            sub.add_argument("--shuffle", choices=("local", "exact"), default="local",
                             help="data-parallel minibatch shuffling: local (no trajectory traffic) or exact "
                                  "(equals single-device; moves samples) (default local)")
            sub.add_argument("--staleness", type=_int, default=1,
                             help="actor-learner: updates the actors' parameters may lag the learner's; 0 runs "
                                  "actors and learner in turn (equals single-device) (default 1)")
            sub.add_argument("--transfer-dtype", choices=TRANSFER_DTYPES, default="float32",
                             help="actor-learner: precision of trajectories and parameters crossing between the "
                                  "device groups; the learner computes in float32 (default float32)")
            sub.add_argument("--chunk-iterations", type=_int, default=None,
                             help="iterations per row of metrics.csv (default: 50 rows per run)")
            sub.add_argument("--seeds", type=_int, default=1,
                             help="train this many seeds (from --seed on) as one population (default 1)")
            sub.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2|NAME=DIST:LOW:HIGH",
                             help="sweep a hyperparameter over values, or draw it from uniform/loguniform "
                                  "(with --samples); repeatable; every setting runs with every seed")
            sub.add_argument("--samples", type=_int, default=None, help="random-search settings to draw")
            if command is explain:
                sub.add_argument("--draw", type=Path, default=None, metavar="FILE",
                                 help="also draw the fragment graph: .png, .svg or .pdf (Graphviz's dot where it "
                                      "exists, else matplotlib), .dot (Graphviz source) or .txt")
            if command is train:
                sub.add_argument("--run-dir", type=Path, default=None,
                                 help="where config.json, metrics.csv and learning_curve.png go "
                                      "(default runs/RECIPE-ENV-TIME)")
                sub.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
                sub.add_argument("--resume", action="store_true",
                                 help="continue the run in --run-dir from its newest checkpoint (same settings)")
                sub.add_argument("--checkpoint-every", type=_int, default=None, metavar="ITERATIONS",
                                 help="save the whole training state every this many iterations, a multiple of "
                                      "--chunk-iterations (default: every 10 rows of metrics); also saved at the end")
                sub.add_argument("--keep-checkpoints", type=_int, default=3, help="checkpoints kept (default 3)")
            _add_recipe_flags(sub, recipe)
            if command is train:
                _add_boost_flags(sub)
            sub.set_defaults(handler=handler, recipe_cls=recipe)
    return parser


def _add_runtime_flags(parser: argparse.ArgumentParser, with_devices: bool = True) -> None:
    if with_devices:
        parser.add_argument("--devices", type=_int, default=None,
                            help="devices per process for data-parallel (default all); on CPU, forces that many "
                                 "host devices")
        parser.add_argument("--actor-devices", type=_int, default=1,
                            help="actor-learner: devices of the actor group (default 1)")
        parser.add_argument("--learner-devices", type=_int, default=1,
                            help="actor-learner: devices of the learner group, after the actor's (default 1)")
    parser.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                        help="multi-process run: address of process 0's coordinator (or $JAXRL_FRAG_COORDINATOR)")
    parser.add_argument("--num-processes", type=_int, default=None, help="multi-process run: number of processes")
    parser.add_argument("--process-id", type=_int, default=None, help="multi-process run: this process's index")


def _configure_runtime(argv: Sequence[str] | None) -> None:
    """Device count and multi-process runtime, from their flags read ahead of the full
    parser: both must be set before jax's first operation (importing gymnax is one).
    ``--devices`` touches only the CPU backend; an accelerator keeps its real devices."""
    from jaxrl_frag import distributed

    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[:2] if argv[:1] in (["train"], ["explain"]) else argv[:1]  # with its recipe
    prog = " ".join(["jaxrl-frag", *(word for word in command if not word.startswith("-"))])
    early = _Parser(prog=prog, add_help=False)  # its errors read as the full parser's
    _add_runtime_flags(early)
    early.add_argument("--policy")
    args = early.parse_known_args(argv)[0]
    if argv[:1] == ["resume"]:  # the saved device count, unless overridden
        early.add_argument("run_dir", type=Path, nargs="?")
        early.add_argument("--override", action="append", default=[])
        resume = early.parse_known_args(argv[1:])[0]
        if resume.run_dir is not None:
            from jaxrl_frag.rundir import RunDir

            run_dir = RunDir(resume.run_dir)
            saved = {**run_dir.read_config()["settings"], **_parse_overrides(resume.override)}
            for name, kind in (("devices", int), ("policy", str), ("actor_devices", int), ("learner_devices", int)):
                value = saved.get(name, getattr(args, name))
                if not (value is None or type(value) is kind):
                    raise run_dir.config_error(f"holds {name}={value!r}, which --{name.replace('_', '-')} cannot be")
                setattr(args, name, value)
    if args.devices is None and args.policy == "actor-learner":
        args.devices = args.actor_devices + args.learner_devices
    if args.devices is not None:
        check_count("devices", args.devices, CPU_DEVICES_MAX,
                    "on CPU it forces that many host devices: XLA's CPU client takes half a minute to start 8,192, "
                    "twenty minutes 16,384, and aborts from 32,768; an accelerator keeps the devices it has")
        import jax

        try:
            jax.config.update("jax_num_cpu_devices", args.devices)
        except RuntimeError:  # backend already up (main called in-process): fine if it has enough
            have = len(jax.devices("cpu"))
            check(have >= args.devices, "devices", args.devices,
                  f"the CPU backend is already running with {have} devices; start a new process")
    if args.num_processes is not None:
        check_count("num_processes", args.num_processes, INT32_MAX, "jax's distributed runtime counts in int32")
    distributed.initialize(args.coordinator, args.num_processes, args.process_id)


def _make_policy(args: argparse.Namespace) -> Any:
    import jax

    from jaxrl_frag.sharding import ActorLearner, DataParallel, Population, SingleDevice

    if args.policy == "single":
        return SingleDevice()
    if args.policy == "actor-learner":
        check(args.seeds == 1 and not args.sweep, "policy", args.policy,
              "does not run populations (--seeds, --sweep) yet; use --policy population for those")
        return ActorLearner(args.actor_devices, args.learner_devices, args.staleness, args.transfer_dtype, args.shuffle)
    devices = None if args.devices is None else args.devices * jax.process_count()
    if args.policy == "population":
        return Population(pop=devices, shuffle=args.shuffle)
    return DataParallel(devices, shuffle=args.shuffle)


def _make_algorithm(args: argparse.Namespace) -> tuple[Any, list[tuple[dict[str, float], int]] | None]:
    """The algorithm, and for a population (``--seeds`` > 1 or ``--sweep``) its members'
    settings and seeds, in member order."""
    from jaxrl_frag import costs, sweeps
    from jaxrl_frag.boost import Boosted
    from jaxrl_frag.transforms import Population

    if args.chunk_iterations is not None:
        check_count("chunk_iterations", args.chunk_iterations)
    check_count("seed", args.seed, SEED_MAX, "seeds are uint32", low=0)
    check_count("seeds", args.seeds, SEED_MAX - args.seed + 1, f"the seeds from --seed {args.seed} on are uint32")
    overrides = _recipe_overrides(args, args.recipe_cls)
    boosting = getattr(args, "boost", "off") != "off"
    boost_settings = _boost_settings(args) if boosting else {}
    ladder = boost_settings.get("ladder", Boosted.defaults()["ladder"])
    calibrating = boosting and (args.boost_calibrate or args.boost_budget_cost is not None)
    if boosting:
        check(args.policy in ("single", "population"), "policy", args.policy,
              "boosted runs take the single or population policy (the ladder slices one environment pool)")
        check("num_envs" not in overrides, "num_envs", overrides.get("num_envs"),
              "a boosted run's environment counts are its --boost-ladder; drop --num-envs")
        for count in ladder:
            check_count("boost_ladder", count)
        overrides["num_envs"] = ladder[-1]

    def build(**settings: Any) -> Any:
        recipe = args.recipe_cls.create(args.env, **settings)
        if not boosting:
            return recipe
        # calibrated after every setting is validated: until then rounds cost nothing
        seconds = np.zeros((len(ladder), 3)) if calibrating else None
        return Boosted.create(recipe, round_seconds=seconds, **boost_settings)

    if args.seeds == 1 and not args.sweep:
        check(args.samples is None, "samples", args.samples, "--samples is for random search with --sweep")
        algorithms, members = [build(**overrides)], None
    else:
        size = sweeps.count(args.sweep, args.samples) * args.seeds
        check(size <= MEMBERS_MAX, "population", size,
              f"--sweep and --seeds make that many members (settings times seeds), and at most {MEMBERS_MAX:,} are "
              "built (one by one, on the host): sweep fewer values or seeds, or split the sweep over runs")
        setting_list = sweeps.settings(args.sweep, args.samples, args.seed)
        sweeps.check_traced(args.recipe_cls, list(setting_list[0]))
        members = sweeps.members(setting_list, args.seeds, args.seed)
        algorithms = [build(**{**overrides, **setting}) for setting, _ in members]
    costs.check_state_fits(algorithms[0], len(algorithms), _memory_fix(args, program=False))
    if calibrating:
        algorithms = _calibrated(args, algorithms)
    if members is None:
        return algorithms[0], None
    return Population.of(algorithms, [seed for _, seed in members]), members


def _memory_fix(args: argparse.Namespace, program: bool) -> str:
    """What to change, in flags, for a run whose state (or with ``program``, whose
    compiled program) does not fit its devices' memory."""
    fields = {f.name for f in dataclasses.fields(args.recipe_cls)}
    boosting = getattr(args, "boost", "off") != "off"
    sizes = ("num_envs", "num_steps", "buffer_size", "minibatch_size", "hidden") if program else (
        "num_envs", "buffer_size", "hidden")
    flags = [f"--{'boost_ladder' if boosting and name == 'num_envs' else name}".replace("_", "-")
             for name in sizes if name in fields]
    fix = f"lower {', '.join(flags[:-1])} or {flags[-1]}"
    if program and "num_minibatches" in fields:
        fix += ", or raise --num-minibatches"
    if args.seeds > 1 or args.sweep:
        fix += ", or train fewer members (--seeds, --sweep)"
    return fix


def _calibrated(args: argparse.Namespace, algorithms: list[Any]) -> list[Any]:
    """Boosted ``algorithms`` with their rounds' device-seconds measured (one calibration
    serves every member: the rounds' sizes do not depend on them), or as the resumed run
    was calibrated."""
    from jaxrl_frag import boost

    if getattr(args, "boost_round_seconds", None) is not None:
        return [a.replace(round_seconds=np.asarray(args.boost_round_seconds, np.float32)) for a in algorithms]
    print("calibrating: timing each rung's actor, learner and probe", flush=True)
    seconds = boost.calibrate(algorithms[0]).round_seconds
    for count, (actor, learner, probe) in zip(algorithms[0].ladder, np.asarray(seconds).tolist(), strict=True):
        print(f"  {count} environments: a round takes {actor * 1e3:.1f} ms acting, {learner * 1e3:.1f} ms learning, "
              f"{probe * 1e3:.1f} ms probing ({probe / (actor + learner + probe):.0%} of the round)")
    return [a.replace(round_seconds=seconds) for a in algorithms]


def _enable_compilation_cache() -> None:
    import jax

    cache = os.environ.get("JAXRL_FRAG_CACHE_DIR", str(Path.home() / ".cache" / "jaxrl_frag" / "xla"))
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """What ``train`` was given, by name: enough to build the same run again."""
    keys = ("recipe", "env", "seed", "seeds", "sweep", "samples", "policy", "devices", "shuffle", *_ACTOR_LEARNER,
            "chunk_iterations", "checkpoint_every", "keep_checkpoints", "boost", "boost_calibrate")
    boost = {f"boost_{k}": v for k, v in _boost_settings(args).items() if k != "strategy"}
    return {k: getattr(args, k) for k in keys} | boost | _recipe_overrides(args, args.recipe_cls)


def _resolved_config(args: argparse.Namespace, algo: Any) -> dict[str, Any]:
    """The run's full configuration, every default filled in; validates the checkpoint
    interval (before anything is traced)."""
    from jaxrl_frag.checkpoints import check_settings
    from jaxrl_frag.program import default_chunk_iterations

    chunk = default_chunk_iterations(algo) if args.chunk_iterations is None else args.chunk_iterations
    every = 10 * chunk if args.checkpoint_every is None else args.checkpoint_every
    check_settings(every, args.keep_checkpoints, chunk)
    return {"recipe": args.recipe, "seed": args.seed, "seeds": args.seeds, "sweep": args.sweep, "samples": args.samples,
            "policy": args.policy, "devices": args.devices, "shuffle": args.shuffle,
            **{k: getattr(args, k) for k in _ACTOR_LEARNER}, "chunk_iterations": chunk,
            "checkpoint_every": every, "keep_checkpoints": args.keep_checkpoints, **algo.config()}


def _train(args: argparse.Namespace) -> int:
    from jaxrl_frag.checkpoints import changed_settings
    from jaxrl_frag.distributed import is_main_process
    from jaxrl_frag.rundir import RunDir

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = RunDir(args.run_dir or Path("runs") / f"{args.recipe}-{args.env}-{stamp}")
    check(not (args.resume and args.overwrite), "resume", True, "--resume and --overwrite exclude each other; give one")
    check(not args.resume or args.run_dir is not None, "resume", True, "give the --run-dir of the run to continue")
    if is_main_process():
        run_dir.check_free(args.overwrite, args.resume)
    saved = run_dir.read_config() if args.resume else None
    if saved is not None:  # a boosted run keeps the rounds' device-seconds it was calibrated with
        args.boost_round_seconds = saved.get("round_seconds")
    algo, members = _make_algorithm(args)
    config = _resolved_config(args, algo)
    if saved is not None:
        changed = changed_settings(saved, config, _RUNTIME_KEYS)
        safe = [name for name in changed if name in RESUMABLE_CHANGES]
        check(not changed, "resume", ", ".join(changed.values()),
              f"these settings differ from the run in {run_dir.path}; resume it unchanged with "
              f"`jaxrl-frag resume {run_dir.path}`"
              + (f", changing only what may change with --override ({', '.join(f'{k}=...' for k in safe)})" if safe else "")
              + "; other changes need a new run")
    return _run(args, run_dir, algo, members, config)


def _resume(args: argparse.Namespace) -> int:
    from jaxrl_frag.checkpoints import changed_settings
    from jaxrl_frag.distributed import is_main_process
    from jaxrl_frag.rundir import RunDir

    run_dir = RunDir(args.run_dir)
    overrides = _parse_overrides(args.override)
    if is_main_process():
        run_dir.check_free(resume=True)  # a run's directory, writable, and written by no other process
    saved = run_dir.read_config()
    train_args = _saved_train_args(run_dir, saved, overrides)
    vars(train_args).update(resume=True, run_dir=run_dir.path, overwrite=False,
                            boost_round_seconds=saved.get("round_seconds"),
                            coordinator=args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
    algo, members = _make_algorithm(train_args)
    config = _resolved_config(train_args, algo)
    changed = changed_settings(saved, config, (*_RUNTIME_KEYS, *overrides))
    check(not changed, "config", ", ".join(changed.values()),
          "the saved settings no longer build the same run (was the recipe's code changed?); start a new run")
    return _run(train_args, run_dir, algo, members, config, restart=args.restart)


def _saved_train_args(run_dir: Any, saved: dict[str, Any], overrides: dict[str, Any]) -> argparse.Namespace:
    """``train``'s arguments for the run in ``run_dir``: its saved settings (the row and
    checkpoint intervals as they were, even where a default derived from the run length
    would now give another value), then ``overrides``. ``ConfigError`` where config.json
    holds a setting that ``train`` does not take, or a value that its flag cannot give."""
    from jaxrl_frag.boost import Boosted
    from jaxrl_frag.recipes import RECIPES

    settings = {**saved["settings"], "chunk_iterations": saved["chunk_iterations"],
                "checkpoint_every": saved["checkpoint_every"], **overrides}
    if settings["recipe"] not in RECIPES:
        raise run_dir.config_error(f"names the recipe {settings['recipe']!r}, not one of {', '.join(RECIPES)}")
    args = build_parser().parse_args(["train", settings["recipe"], "--env", settings["env"]])
    hints = typing.get_type_hints(args.recipe_cls) | {f"boost_{k}": v for k, v in typing.get_type_hints(Boosted).items()}
    known = vars(args).keys() & (_settings(args).keys() | hints.keys())
    for name, value in settings.items():
        if name not in known:
            raise run_dir.config_error(f"holds the setting {name!r}, which `train {settings['recipe']}` does not take")
        default = getattr(args, name)
        hint = type(default) if default is not None else hints.get(name, int)  # unset: a recipe's, or a count
        if not ((value is None and default is None) or _fits(value, hint)):
            raise run_dir.config_error(f"holds {name}={value!r}, which --{name.replace('_', '-')} cannot be")
    vars(args).update(settings)
    return args


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value``, read from JSON, is one that a flag of type ``hint`` gives (a tuple
    is saved as a list, a float may be saved as a whole number)."""
    if hint is float:
        return type(value) in (int, float)
    if hint is list or typing.get_origin(hint) is tuple:
        return isinstance(value, list) and all(_fits(v, (typing.get_args(hint) or (str,))[0]) for v in value)
    return type(value) is hint


def _parse_overrides(specs: Sequence[str]) -> dict[str, Any]:
    """``["total_steps=1e6"]`` -> ``{"total_steps": 1000000}``; only ``RESUMABLE_CHANGES``."""
    out: dict[str, Any] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        check(bool(sep and name and value), "override", spec, "write NAME=VALUE, e.g. total_steps=1e6")
        check(name in RESUMABLE_CHANGES, "override", spec,
              f"{name} cannot change in a resumed run (it would no longer be the same run); the settings that can: "
              f"{', '.join(RESUMABLE_CHANGES)}; start a new run to change {name}")
        try:
            out[name] = _int(value)
        except (ValueError, argparse.ArgumentTypeError):
            raise ConfigError("override", spec, f"{name} must be a whole number") from None
    return out


def _run(args: argparse.Namespace, run_dir: Any, algo: Any, members: list[tuple[dict[str, float], int]] | None,
         config: dict[str, Any], restart: bool = False) -> int:
    """Compile, then train (from the newest checkpoint when resuming; with ``restart`` from
    iteration 0, the old rows kept aside), writing the run directory while holding its lock.
    A write that the disk or its permissions refuse ends the run with ``WRITE_FAILED``."""
    from jaxrl_frag.rundir import CONFIG, write_failure

    absl = logging.getLogger("absl")
    absl.addFilter(_not_from_orbax)
    try:
        with run_dir:
            return _run_locked(args, run_dir, algo, members, config, restart)
    except Exception as error:
        failure = write_failure(error, run_dir.path)
        if failure is None:
            raise
        again = (f"continue it with `jaxrl-frag resume {run_dir.path}`" if (run_dir.path / CONFIG).exists()
                 else "run the command again")
        print(f"jaxrl-frag: error: could not write {failure}; the run stopped, the checkpoints it saved before are "
              f"intact. Once there is room (or permission), {again}", file=sys.stderr)
        return WRITE_FAILED
    finally:
        absl.removeFilter(_not_from_orbax)


def _not_from_orbax(record: logging.LogRecord) -> bool:
    """Drops orbax's log records: a failed checkpoint write is logged, traceback and all, by
    each of its threads it passes through, and reaches the run as one error, reported once."""
    return "orbax" not in Path(record.pathname).parts


def _run_locked(args: argparse.Namespace, run_dir: Any, algo: Any, members: list[tuple[dict[str, float], int]] | None,
                config: dict[str, Any], restart: bool) -> int:
    """``_run``'s work; ``_run`` closes ``run_dir``, releasing its lock."""
    import jax

    import jaxrl_frag as jf
    from jaxrl_frag import costs
    from jaxrl_frag.checkpoints import Checkpoints
    from jaxrl_frag.distributed import is_main_process
    from jaxrl_frag.envs import EnvWorkerError
    from jaxrl_frag.errors import NonFiniteError
    from jaxrl_frag.rundir import METRICS

    main_process = is_main_process()  # only process 0 prints and writes
    say = print if main_process else _quiet
    if main_process and args.resume:
        run_dir.lock()  # a new run's directory is locked as it is made, once compiled
    policy = _make_policy(args)
    _enable_compilation_cache()
    size = f"{'up to ' if algo.iterations_vary else ''}{algo.num_iterations} iterations of " + (
        f"at least {algo.steps_per_iteration} steps (boosted)" if algo.iterations_vary else f"{algo.steps_per_iteration} steps")
    say(f"{args.recipe} on {args.env}: {size} -> {run_dir.path}")
    program = jf.compile(algo, policy, chunk_iterations=config["chunk_iterations"])  # validates the placement too
    costs.check_program_fits(program.executables, _memory_fix(args, program=True))  # before anything runs
    _Interrupt.raise_if_received()  # before anything is written
    say(f"compiled in {program.compile_seconds:.1f} s; {policy.describe()}")
    if main_process and not args.resume:
        run_dir.create(args.overwrite)
    config = {**config, "device_count": policy.device_count, "processes": jax.process_count(), "jax": jax.__version__,
              "backend": jax.default_backend(), "settings": _settings(args)}
    checkpoints = Checkpoints(run_dir.checkpoints, every=config["checkpoint_every"], keep=config["keep_checkpoints"])
    try:
        start = _resume_point(program, checkpoints, run_dir, say) if args.resume and not restart else None
        done = 0 if start is None else start.iteration
        finished = start is not None and bool(algo.finished(start.state))
        check(finished or done <= algo.num_iterations, "total_steps", algo.num_iterations * algo.steps_per_iteration,
              f"is below the {done * algo.steps_per_iteration} steps the run has already taken; give more")
        if main_process and restart:
            aside = run_dir.set_aside_metrics() if (run_dir.path / METRICS).exists() else None
            say("starting the run over from iteration 0" + (f"; its old rows are kept in {aside}" if aside else ""))
        elif main_process and args.resume:
            rows = None if start is None else start.meta.get("rows")
            note = run_dir.keep_metrics(done, None if rows is None else [r for row in rows for r in _member_rows(row, members)])
            if note is not None:
                say(note)
        if finished:
            say(f"the run in {run_dir.path} is complete: its budget is spent ({done} iterations)")
            return 0
        if done == algo.num_iterations:
            say(f"the run in {run_dir.path} is complete ({done} iterations); to train on, resume it with "
                f"--override total_steps=N (N > {done * algo.steps_per_iteration})")
            return 0
        if main_process:
            run_dir.write_config(config)
            run_dir.open_log(purge_step=done * algo.steps_per_iteration + 1)
        on_chunk = _Reporter(run_dir, members, algo, done) if main_process else None
        stop = _StopOnSignal()
        try:
            with stop:
                history = program.run(jax.random.PRNGKey(args.seed) if start is None else start, on_chunk=on_chunk,
                                      checkpoints=checkpoints, stop=stop, meta={"run_config": config})
        except NonFiniteError as error:
            last = checkpoints.steps()
            kept = f"the last good checkpoint is iteration {last[-1]} in {checkpoints.directory}" if last else "no checkpoint"
            print(f"jaxrl-frag: error: {error}; stopped, {kept}. Lower the learning rate or check the environment, "
                  "and start a new run", file=sys.stderr)
            return NON_FINITE
        except EnvWorkerError as error:
            last = checkpoints.steps()
            kept = (f"the last checkpoint is iteration {last[-1]}: resume with jaxrl-frag resume {run_dir.path} (the "
                    "environments start afresh)") if last else "no checkpoint was written yet"
            print(f"jaxrl-frag: error: {error}; the run stopped, {kept}", file=sys.stderr)
            return ENV_WORKER_FAILED
        finally:
            if on_chunk is not None:
                on_chunk.close()
    finally:
        checkpoints.close()
    if history.stopped:
        say(f"stopped at iteration {history.iteration} of {algo.num_iterations}; checkpoint saved in "
            f"{checkpoints.directory}. Resume with: jaxrl-frag resume {run_dir.path}")
        return 0
    say(f"trained to {int(np.max(history.final['env_steps'])):,} steps; "
        f"final mean episode return {float(np.nanmean(history.last('episode_return'))):.2f}")
    if main_process:
        title = f"{args.recipe} on {args.env}"
        if members is None:
            curve = run_dir.plot(title)
        else:
            curve = _write_population_report(run_dir, history, members, title)
        print(f"wrote {run_dir.path / 'config.json'}, {run_dir.path / 'metrics.csv'}, {curve}, "
              f"{run_dir.path / 'tensorboard'}, {run_dir.checkpoints}")
    return 0


def _resume_point(program: Any, checkpoints: Any, run_dir: Any, say: Callable[..., None]) -> Any:
    """The checkpoint a resumed run continues from: the newest usable one, with a line for
    each unusable one and for a newest one that metrics.csv shows was saved but is gone; or
    ``None`` where none was due yet (a run killed before its first checkpoint starts again,
    which is the same run). ``ConfigError`` where a checkpoint was due and none is usable,
    or where metrics.csv is unusable and the checkpoint holds no rows to rebuild it from:
    config.json and metrics.csv are left as they are then. Every process decides alike."""
    import warnings

    last_row, problem = run_dir.inspect_metrics()
    every = run_dir.read_config()["checkpoint_every"]  # the interval the rows were written with
    with warnings.catch_warnings(record=True) as unusable:
        start = program.newest(checkpoints, allow_changes=RESUMABLE_CHANGES)
    for warning in unusable:
        say(f"jaxrl-frag: warning: {warning.message}", file=sys.stderr)
    due = last_row // every * every  # the newest checkpoint the rows show was saved, 0 for none
    damaged = [step for step in checkpoints.damaged_steps() if problem is not None or step <= last_row]
    if start is None:
        evidence = (f"metrics.csv has rows up to iteration {last_row}" if due else
                    f"step {damaged[-1]} was moved to {checkpoints.damaged} as unusable" if damaged else None)
        check(evidence is None, "checkpoint", str(checkpoints.directory),
              f"holds no usable checkpoint although {evidence}; its rows are left as they are. To start the run over "
              f"with them kept aside: jaxrl-frag resume {run_dir.path} --restart")
        say(f"no checkpoint in {checkpoints.directory} yet: starting the run from iteration 0")
        return None
    if start.iteration < due and due not in damaged:
        say(f"jaxrl-frag: warning: checkpoint step {due} is missing from {checkpoints.directory} (deleted, or never "
            f"completed), although metrics.csv has rows up to iteration {last_row}; resuming from step "
            f"{start.iteration}", file=sys.stderr)
    check(problem is None or "rows" in start.meta, "run_dir", str(run_dir.path),
          f"its metrics.csv {problem}, and checkpoint {start.iteration} holds no rows to rebuild it from; restore "
          f"metrics.csv from a copy, or start the run over with its old rows kept aside: jaxrl-frag resume "
          f"{run_dir.path} --restart")
    return start


class _Reporter:
    """Writes each row of metrics (one per member in a population) and shows progress."""

    def __init__(self, run_dir: Any, members: list[tuple[dict[str, float], int]] | None, algo: Any, done: int):
        from jaxrl_frag.progress import Progress

        self.run_dir, self.members = run_dir, members
        steps = algo.steps_per_iteration
        self.progress = Progress(algo.num_iterations * steps, initial=done * steps)

    def __call__(self, row: dict[str, Any]) -> None:
        for line in _member_rows(row, self.members):
            self.run_dir.append_metrics(line)
        self.progress.update(row if self.members is None else {k: float(np.nanmean(v)) for k, v in row.items()})

    def close(self) -> None:
        self.progress.close()


def _member_rows(row: dict[str, Any], members: list[tuple[dict[str, float], int]] | None) -> list[dict[str, Any]]:
    """A row of metrics as metrics.csv holds it: the row, or in a population one per member,
    with the member's index, seed and setting."""
    if members is None:
        return [row]
    return [{"member": i, "seed": seed, **setting, **{k: v[i] if np.ndim(v) else v for k, v in row.items()}}
            for i, (setting, seed) in enumerate(members)]


class _Interrupt:
    """SIGINT outside training ends the command with ``INTERRUPTED``. Python drops a
    ``KeyboardInterrupt`` raised inside a garbage-collector callback or a finaliser (jax
    runs some), reporting it as "unraisable" with a traceback, so the signal is also
    recorded, the report left out, and ``raise_if_received`` raises it again where the
    command is about to write."""

    received = False

    @classmethod
    @contextlib.contextmanager
    def handled(cls) -> Iterator[None]:
        """SIGINT handled so for the duration (in the main thread; elsewhere as it was)."""
        cls.received = False
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous, report = signal.signal(signal.SIGINT, cls._handle), sys.unraisablehook

        def unraisable(failure: Any) -> None:
            if not isinstance(failure.exc_value, KeyboardInterrupt):
                report(failure)

        sys.unraisablehook = unraisable
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
            sys.unraisablehook = report

    @classmethod
    def _handle(cls, _signum: int, _frame: Any) -> None:
        cls.received = True
        raise KeyboardInterrupt

    @classmethod
    def raise_if_received(cls) -> None:
        if cls.received:
            raise KeyboardInterrupt


class _StopOnSignal:
    """While active, SIGINT and SIGTERM (a preemption notice) ask the run to stop after
    its current call (calls last about ``Program.seconds_per_call``, whatever the chunk
    size); a second one ends the process at once with ``INTERRUPTED``, the checkpoint
    being written then left unfinished (orbax commits a step by renaming it, so the
    newest complete one is untouched)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __call__(self) -> bool:
        return self.requested

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name  # written unbuffered: the handler may run inside a print
        if self.requested:
            os.write(2, f"\njaxrl-frag: second {name}: exiting now; the newest complete checkpoint is kept\n".encode())
            os._exit(INTERRUPTED)
        self.requested = True
        os.write(2, f"\njaxrl-frag: {name} received: stopping after the current call (a few seconds) and saving a "
                    "checkpoint; send it again to exit at once\n".encode())

    def __enter__(self) -> _StopOnSignal:
        self.requested = _Interrupt.received  # one that reached the command's set-up, where Python dropped it
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *_: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _write_population_report(run_dir: Any, history: Any, members: list[tuple[dict[str, float], int]],
                             title: str) -> Path:
    """The summary table per setting (printed, and saved as summary.md and summary.csv)
    and the learning curves with 95% intervals; returns the plot's path."""
    import csv

    from jaxrl_frag import plots, summary

    rows = summary.by_setting(history.last("episode_return"), members)
    table = summary.markdown(rows)
    print(table)
    best = {k: v for k, v in rows[0].items() if k in members[0][0]}
    print(f"best setting: {best or 'all members share one setting'} (mean final return {rows[0]['mean_return']:.2f})")
    (run_dir.path / "summary.md").write_text(table + "\n")
    with open(run_dir.path / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, [k for k in rows[0] if k != "members"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    groups = [(", ".join(f"{k}={v:g}" for k, v in row.items() if k in members[0][0]) or "all seeds",
               row["members"]) for row in rows]
    curve = run_dir.path / "learning_curve.png"
    plots.population_curves(history["env_steps"], history["episode_return"], groups, title).savefig(curve, dpi=120)
    return curve


def _quiet(*_: Any, **__: Any) -> None:
    """``print`` on processes other than 0."""


def _explain(args: argparse.Namespace) -> int:
    import jaxrl_frag as jf
    from jaxrl_frag.drawing import check_path

    if args.draw is not None:
        check_path(args.draw)

    algo, _ = _make_algorithm(args)
    policy = _make_policy(args)
    _enable_compilation_cache()
    program = jf.compile(algo, policy, chunk_iterations=args.chunk_iterations)
    print(f"{args.recipe} on {args.env}: {algo.steps_per_iteration} environment steps per iteration")
    explanation = program.explain()
    print(explanation)
    if args.draw is not None:
        print(f"wrote {explanation.draw(args.draw)}")
    return 0


def _envs(args: argparse.Namespace) -> int:
    from jaxrl_frag import envs

    print("\n".join(envs.available()))
    print("gymnasium:<id>   any Gymnasium environment, in worker processes\n"
          "ale:<Game>       an Atari game (ale-py), standard preprocessing, in worker processes")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    try:
        with _Interrupt.handled():
            _configure_runtime(argv)
            args = build_parser().parse_args(argv)
            return args.handler(args)
    except ConfigError as error:
        print(f"jaxrl-frag: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:  # outside training (``_StopOnSignal`` handles SIGINT during it)
        print("jaxrl-frag: interrupted", file=sys.stderr)
        return INTERRUPTED
