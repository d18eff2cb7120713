"""The ``jaxrl-frag`` command line.

    jaxrl-frag train ppo --env CartPole-v1 [--total-steps N] [--num-envs N] [--seed S] [--run-dir DIR]
    jaxrl-frag explain ppo --env CartPole-v1
    jaxrl-frag envs

Every recipe setting is a flag, generated from the recipe's dataclass. A wrong
setting prints one paragraph on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import time
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_frag.errors import ConfigError, check

USAGE_ERROR = 2
POLICIES = ("single", "data-parallel", "population")


def _int(text: str) -> int:
    """An integer, also written as ``5e5`` or ``500_000``."""
    value = float(text.replace("_", ""))
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def _widths(text: str) -> tuple[int, ...]:
    try:
        return tuple(_int(w) for w in text.split(",") if w.strip())
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of widths, e.g. 64,64") from None


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
        kind = hints[field.name]
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            name = getattr(kind, "__name__", str(kind)) if kind in (int, float, str) else str(kind)
            group.add_argument(flag, type=_PARSERS[name.replace("typing.", "")], default=None, metavar=field.name.upper(),
                               help=help_text)


def _recipe_overrides(args: argparse.Namespace, recipe: type) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(recipe)
            if f.name != "env" and getattr(args, f.name, None) is not None}


def build_parser() -> argparse.ArgumentParser:
    from jaxrl_frag.recipes import RECIPES

    parser = argparse.ArgumentParser(prog="jaxrl-frag", description="RL algorithms compiled whole into XLA programs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser("train", help="train a recipe and write a run directory")
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
            sub.add_argument("--chunk-iterations", type=_int, default=None,
                             help="iterations per row of metrics.csv (default: 50 rows per run)")
            sub.add_argument("--seeds", type=_int, default=1,
                             help="train this many seeds (from --seed on) as one population (default 1)")
            sub.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2|NAME=DIST:LOW:HIGH",
                             help="sweep a hyperparameter over values, or draw it from uniform/loguniform "
                                  "(with --samples); repeatable; every setting runs with every seed")
            sub.add_argument("--samples", type=_int, default=None, help="random-search settings to draw")
            if command is train:
                sub.add_argument("--run-dir", type=Path, default=None,
                                 help="where config.json, metrics.csv and learning_curve.png go "
                                      "(default runs/RECIPE-ENV-TIME)")
                sub.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
            _add_recipe_flags(sub, recipe)
            sub.set_defaults(handler=handler, recipe_cls=recipe)
    return parser


def _add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=_int, default=None,
                        help="devices per process for data-parallel (default all); on CPU, forces that many host devices")
    parser.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                        help="multi-process run: address of process 0's coordinator (or $JAXRL_FRAG_COORDINATOR)")
    parser.add_argument("--num-processes", type=_int, default=None, help="multi-process run: number of processes")
    parser.add_argument("--process-id", type=_int, default=None, help="multi-process run: this process's index")


def _configure_runtime(argv: Sequence[str] | None) -> None:
    """Device count and multi-process runtime, from their flags read ahead of the full
    parser: both must be set before jax's first operation (importing gymnax is one).
    ``--devices`` touches only the CPU backend; an accelerator keeps its real devices."""
    from jaxrl_frag import distributed

    early = argparse.ArgumentParser(add_help=False)
    _add_runtime_flags(early)
    args = early.parse_known_args(argv)[0]
    if args.devices is not None:
        check(args.devices > 0, "devices", args.devices, "must be a positive device count")
        import jax

        try:
            jax.config.update("jax_num_cpu_devices", args.devices)
        except RuntimeError:  # backend already up (main called in-process): fine if it has enough
            have = len(jax.devices("cpu"))
            check(have >= args.devices, "devices", args.devices,
                  f"the CPU backend is already running with {have} devices; start a new process")
    distributed.initialize(args.coordinator, args.num_processes, args.process_id)


def _make_policy(args: argparse.Namespace) -> Any:
    import jax

    from jaxrl_frag.sharding import DataParallel, Population, SingleDevice

    if args.policy == "single":
        return SingleDevice()
    devices = None if args.devices is None else args.devices * jax.process_count()
    if args.policy == "population":
        return Population(pop=devices, shuffle=args.shuffle)
    return DataParallel(devices, shuffle=args.shuffle)


def _make_algorithm(args: argparse.Namespace) -> tuple[Any, list[tuple[dict[str, float], int]] | None]:
    """The algorithm, and for a population (``--seeds`` > 1 or ``--sweep``) its members'
    settings and seeds, in member order."""
    from jaxrl_frag import sweeps
    from jaxrl_frag.transforms import Population

    if args.chunk_iterations is not None:
        check(args.chunk_iterations > 0, "chunk_iterations", args.chunk_iterations, "must be a positive iteration count")
    overrides = _recipe_overrides(args, args.recipe_cls)
    if args.seeds == 1 and not args.sweep:
        check(args.samples is None, "samples", args.samples, "--samples is for random search with --sweep")
        return args.recipe_cls.create(args.env, **overrides), None
    setting_list = sweeps.settings(args.sweep, args.samples, args.seed)
    sweeps.check_traced(args.recipe_cls, list(setting_list[0]))
    members = sweeps.members(setting_list, args.seeds, args.seed)
    algorithms = [args.recipe_cls.create(args.env, **{**overrides, **setting}) for setting, _ in members]
    return Population.of(algorithms, [seed for _, seed in members]), members


def _enable_compilation_cache() -> None:
    import jax

    cache = os.environ.get("JAXRL_FRAG_CACHE_DIR", str(Path.home() / ".cache" / "jaxrl_frag" / "xla"))
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def _train(args: argparse.Namespace) -> int:
    import jax

    import jaxrl_frag as jf
    from jaxrl_frag.distributed import is_main_process
    from jaxrl_frag.progress import Progress
    from jaxrl_frag.rundir import RunDir

    main_process = is_main_process()  # only process 0 prints and writes
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = RunDir(args.run_dir or Path("runs") / f"{args.recipe}-{args.env}-{stamp}")
    if main_process:
        run_dir.check_free(args.overwrite)
    algo, members = _make_algorithm(args)
    policy = _make_policy(args)
    _enable_compilation_cache()
    say = print if main_process else _quiet
    say(f"{args.recipe} on {args.env}: {algo.num_iterations} iterations of {algo.steps_per_iteration} steps "
        f"-> {run_dir.path}")
    program = jf.compile(algo, policy, chunk_iterations=args.chunk_iterations)  # validates the placement too
    say(f"compiled in {program.compile_seconds:.1f} s; {policy.describe()}")
    on_chunk = None
    if main_process:
        run_dir.create(args.overwrite)
        run_dir.write_config({"recipe": args.recipe, "seed": args.seed, "chunk_iterations": program.chunk_iterations,
                              "policy": args.policy, "devices": policy.device_count, "processes": jax.process_count(),
                              "shuffle": args.shuffle, "jax": jax.__version__, "backend": jax.default_backend(),
                              **algo.config()})
        progress = Progress(algo.num_iterations * algo.steps_per_iteration)

        def on_chunk(row: dict[str, Any]) -> None:
            if members is None:
                run_dir.append_metrics(row)
                progress.update(row)
                return
            for i, (setting, seed) in enumerate(members):
                run_dir.append_metrics({"member": i, "seed": seed, **setting,
                                        **{k: v[i] if np.ndim(v) else v for k, v in row.items()}})
            progress.update({k: float(np.nanmean(v)) for k, v in row.items()})

    start = time.perf_counter()
    try:
        history = program.run(jax.random.PRNGKey(args.seed), on_chunk=on_chunk)
    finally:
        if main_process:
            progress.close()
    seconds = time.perf_counter() - start
    final = history.final
    say(f"trained {int(final['env_steps']):,} steps in {seconds:.1f} s; "
        f"final mean episode return {float(np.nanmean(final.get('episode_return', np.nan))):.2f}")
    if main_process:
        title = f"{args.recipe} on {args.env}"
        if members is None:
            curve = run_dir.plot(title)
        else:
            curve = _write_population_report(run_dir, history, members, title)
        print(f"wrote {run_dir.path / 'config.json'}, {run_dir.path / 'metrics.csv'}, {curve}")
    return 0


def _write_population_report(run_dir: Any, history: Any, members: list[tuple[dict[str, float], int]],
                             title: str) -> Path:
    """The summary table per setting (printed, and saved as summary.md and summary.csv)
    and the learning curves with 95% intervals; returns the plot's path."""
    import csv

    from jaxrl_frag import plots, summary

    rows = summary.by_setting(history.final["episode_return"], members)
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

    algo, _ = _make_algorithm(args)
    policy = _make_policy(args)
    _enable_compilation_cache()
    program = jf.compile(algo, policy, chunk_iterations=args.chunk_iterations)
    print(f"{args.recipe} on {args.env}: {algo.steps_per_iteration} environment steps per iteration")
    print(program.explain())
    return 0


def _envs(args: argparse.Namespace) -> int:
    from jaxrl_frag import envs

    print("\n".join(envs.available()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    try:
        _configure_runtime(argv)
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except ConfigError as error:
        print(f"jaxrl-frag: error: {error}", file=sys.stderr)
        return USAGE_ERROR
