"""What ``train`` and ``explain`` build: a recipe's flags (from its dataclass fields),
actor boosting's flags (from ``Boosted``'s), and the algorithm they make, a population
for several seeds or a sweep."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from typing import Any

import numpy as np

from jaxrl_frag.app.cli import flags
from jaxrl_frag.bounds import MEMBERS_MAX, SEED_MAX, check_count
from jaxrl_frag.errors import ConfigError, check

Members = list[tuple[dict[str, float], int]]  # a population's members: setting and seed, in member order
EVAL_EPISODES = 10  # episodes per evaluation of --eval-every, by default
# caps the environment steps of every train and resume run (the README's commands run small in the test suite)
MAX_STEPS_VARIABLE = "JAXRL_FRAG_MAX_STEPS"


@functools.cache
def recipe_flags(recipe: type) -> tuple[flags.Flag, ...]:
    """One flag per setting of the recipe dataclass (a field with a ``help``, but ``env``),
    its help from the field's metadata. Unset by default, so that the recipe's
    per-environment defaults apply."""
    hints = flags.type_hints(recipe)
    return tuple(flags.field_flag(recipe, field, hints) for field in flags.settings_of(recipe, skip=("env",)))


def add_recipe_flags(parser: argparse.ArgumentParser, recipe: type) -> None:
    group = parser.add_argument_group(f"{recipe.__name__} settings (defaults shown are for most environments)")
    for flag in recipe_flags(recipe):
        flag.add_to(group)


@functools.cache
def boost_flags() -> tuple[flags.Flag, ...]:
    """The flags of adaptive actor boosting's settings but its strategy (``--boost``)."""
    from jaxrl_frag.transforms.boost import Boosted

    hints = flags.type_hints(Boosted)
    return tuple(flags.field_flag(Boosted, field, hints, dest=f"boost_{field.name}")
                 for field in Boosted.settings() if field.name != "strategy")


def boost_kinds() -> dict[str, flags.Kind]:
    """``--boost`` and ``--boost-calibrate`` and the boost settings' flags: how each reads, by name."""
    from jaxrl_frag.transforms.boost import STRATEGIES

    return {"boost": flags.one_of((*STRATEGIES, "off")), "boost_calibrate": flags.BOOL,
            **{flag.dest: flag.kind for flag in boost_flags()}}


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


def boost_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The boost settings given on the command line (the strategy among them), by field name."""
    given = {flag.dest[len("boost_"):]: getattr(args, flag.dest, None) for flag in boost_flags()}
    return {"strategy": args.boost, **{k: flags.given(v) for k, v in given.items() if v is not None}}


def recipe_overrides(args: argparse.Namespace, recipe: type) -> dict[str, Any]:
    """The recipe settings given on the command line, by field name."""
    return {flag.dest: flags.given(getattr(args, flag.dest)) for flag in recipe_flags(recipe)
            if getattr(args, flag.dest, None) is not None}


def make_algorithm(args: argparse.Namespace) -> tuple[Any, Members | None]:
    """The algorithm, and for a population (``--seeds`` > 1 or ``--sweep``) its members'
    settings and seeds, in member order."""
    from jaxrl_frag import costs
    from jaxrl_frag.app import sweeps
    from jaxrl_frag.transforms import Population
    from jaxrl_frag.transforms.boost import Boosted
    from jaxrl_frag.transforms.evaluated import Evaluated

    if args.chunk_iterations is not None:
        check_count("chunk_iterations", args.chunk_iterations)
    check_count("seed", args.seed, SEED_MAX, "seeds are uint32", low=0)
    check_count("seeds", args.seeds, SEED_MAX - args.seed + 1, f"the seeds from --seed {args.seed} on are uint32")
    overrides = recipe_overrides(args, args.recipe_cls)
    evaluating = _check_evaluation(args)
    boosting = getattr(args, "boost", "off") != "off"
    check_policy_runs(args, boosting)
    settings = boost_settings(args) if boosting else {}
    ladder = settings.get("ladder", Boosted.defaults()["ladder"])
    calibrating = boosting and (args.boost_calibrate or args.boost_budget_cost is not None)
    if boosting:
        check("num_envs" not in overrides, "num_envs", overrides.get("num_envs"),
              "a boosted run's environment counts are its --boost-ladder; drop --num-envs")
        for count in ladder:
            check_count("boost_ladder", count)
        overrides["num_envs"] = ladder[-1]

    cap = _steps_cap(args)
    capped: list[tuple[int, int]] = []  # the run's steps as given and as capped, where $JAXRL_FRAG_MAX_STEPS lowers them

    def build(**recipe_settings: Any) -> Any:
        if cap is not None:
            recipe_settings = _capped(args, recipe_settings, cap, capped)
        recipe = args.recipe_cls.create(args.env, **recipe_settings)
        if not boosting:
            return recipe
        budget = settings.get("budget_steps")
        if cap is not None and budget:  # at least one round at the bottom rung, as Boosted asks
            steps = max(cap, ladder[0] * recipe.num_steps)
            if budget > steps:
                capped.insert(0, (budget, steps))
                settings["budget_steps"] = steps
        # calibrated after every setting is validated: until then rounds cost nothing
        seconds = np.zeros((len(ladder), 3)) if calibrating else None
        return Boosted.create(recipe, round_seconds=seconds, **settings)

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
    if capped:
        _say_capped(cap, capped[0])
    costs.check_state_fits(algorithms[0], len(algorithms), memory_fix(args, program=False))
    if evaluating:  # the first member validated and traced once, the others in its place
        episodes = EVAL_EPISODES if args.eval_episodes is None else args.eval_episodes
        evaluated = Evaluated.create(algorithms[0], args.eval_every, episodes)
        algorithms = [evaluated.replace(algorithm=a) for a in algorithms]
    if calibrating:
        algorithms = _calibrated(args, algorithms)
    if members is None:
        return algorithms[0], None
    return Population.of(algorithms, [seed for _, seed in members]), members


def _steps_cap(args: argparse.Namespace) -> int | None:
    """``$JAXRL_FRAG_MAX_STEPS``, read for train and resume (whose arguments name a run
    directory; explain's do not); ``None`` where it is unset or empty."""
    text = os.environ.get(MAX_STEPS_VARIABLE, "")
    if not text or not hasattr(args, "run_dir"):
        return None
    try:
        cap = flags.parse_int(text)
    except (ValueError, argparse.ArgumentTypeError):
        cap = None
    check(cap is not None and cap > 0, MAX_STEPS_VARIABLE, text,
          "caps the environment steps of a run: give a positive whole number (e.g. 2048), or unset it")
    return cap


def _capped(args: argparse.Namespace, given: dict[str, Any], cap: int, capped: list[tuple[int, int]]) -> dict[str, Any]:
    """``given`` with ``total_steps`` lowered to ``cap``, or to the least the settings allow
    (one iteration; an off-policy recipe's ``learning_starts``), where the run would take
    more; appends (resolved, capped) totals to ``capped`` where it lowers one."""
    recipe = args.recipe_cls
    if not all(hasattr(recipe, name) for name in ("fields", "defaults")):  # a plugin's recipe that is no Recipe
        return given
    resolved = {**recipe.fields(), **recipe.defaults(args.env), **given}
    if not all(name in resolved for name in ("total_steps", "num_envs", "num_steps")):
        return given
    least = max(resolved["num_envs"] * resolved["num_steps"], resolved.get("learning_starts", 0))
    steps = max(cap, least)
    if resolved["total_steps"] <= steps:
        return given
    capped.append((resolved["total_steps"], steps))
    return {**given, "total_steps": steps}


def _say_capped(cap: int, totals: tuple[int, int]) -> None:
    """The line on stderr saying that ``$JAXRL_FRAG_MAX_STEPS`` shortened the run."""
    from jaxrl_frag.distributed import is_main_process

    if is_main_process():
        total, steps = totals
        least = "" if steps == cap else " (the least these settings allow)"
        print(f"jaxrl-frag: {MAX_STEPS_VARIABLE}={cap}: training for {steps:,} environment steps{least} instead of "
              f"{total:,}", file=sys.stderr, flush=True)


def check_policy_runs(args: argparse.Namespace, boosting: bool) -> None:
    """Refuse a ``--policy`` that does not run what the other flags make: a population
    (``--seeds`` > 1 or ``--sweep``) or one algorithm, boosted or not, as the policy
    declares (``sharding.runs``); the fix names the policies that do."""
    from jaxrl_frag.sharding import POLICIES, running, runs

    declared = runs(POLICIES[args.policy])
    population = args.seeds > 1 or bool(args.sweep)
    given = [*(["--seeds"] if args.seeds > 1 else []), *(["--sweep"] if args.sweep else [])]
    made = " with ".join([*([f"--seeds {args.seeds}"] if args.seeds > 1 else []), *([f"--sweep {args.sweep[0]}"]
                                                                                     if args.sweep else [])])
    if population and declared["populations"] == "refused":
        raise ConfigError("policy", args.policy, (
            f"runs one algorithm and does not run populations, which {made} makes (a member per seed and "
            f"setting): to train several seeds or settings as one population use --policy "
            f"{' or '.join(running('populations', True))}, or drop {' and '.join(given)} to train one"))
    if not population and declared["populations"] == "required":
        raise ConfigError("policy", args.policy, (
            "splits a population's members over devices, and this run trains one member: give --seeds N (N > 1) "
            "or --sweep NAME=V1,V2 for several, or for one use --policy "
            f"{' or '.join(running('populations', False))}"))
    if boosting and not declared["boosts"]:
        raise ConfigError("policy", args.policy, (
            f"does not run boosted runs (--boost {args.boost}: rounds on slices of one environment pool): boosting "
            f"takes --policy {' or '.join(running('boosts', True))}; or drop --boost"))


def _check_evaluation(args: argparse.Namespace) -> bool:
    """Whether the run evaluates during training (``--eval-every``); ``ConfigError`` for
    ``--eval-episodes`` without it."""
    every, episodes = getattr(args, "eval_every", None), getattr(args, "eval_episodes", None)
    check(every is not None or episodes is None, "eval_episodes", episodes,
          "sets the episodes of each evaluation during training: give --eval-every too, or drop it")
    return every is not None


def memory_fix(args: argparse.Namespace, program: bool) -> str:
    """What to change, in flags, for a run whose state (or with ``program``, whose
    compiled program) does not fit its devices' memory."""
    fields = {f.name for f in dataclasses.fields(args.recipe_cls)}
    boosting = getattr(args, "boost", "off") != "off"
    sizes = ("num_envs", "num_steps", "buffer_size", "minibatch_size", "hidden") if program else (
        "num_envs", "buffer_size", "hidden")
    flag_names = [f"--{'boost_ladder' if boosting and name == 'num_envs' else name}".replace("_", "-")
                  for name in sizes if name in fields]
    if not flag_names:  # a recipe with none of the usual sizes
        fix = "lower the recipe's sizes"
    else:
        fix = f"lower {', '.join(flag_names[:-1])} or {flag_names[-1]}" if len(flag_names) > 1 else f"lower {flag_names[0]}"
    if program and "num_minibatches" in fields:
        fix += ", or raise --num-minibatches"
    if args.seeds > 1 or args.sweep:
        fix += ", or train fewer members (--seeds, --sweep)"
    return fix


def _calibrated(args: argparse.Namespace, algorithms: list[Any]) -> list[Any]:
    """Boosted ``algorithms`` with their rounds' device-seconds measured (one calibration
    serves every member: the rounds' sizes do not depend on them), or as the resumed run
    was calibrated."""
    from jaxrl_frag.transforms import boost

    if getattr(args, "boost_round_seconds", None) is not None:
        return [a.replace(round_seconds=np.asarray(args.boost_round_seconds, np.float32)) for a in algorithms]
    print("calibrating: timing each rung's actor, learner and probe", flush=True)
    seconds = boost.calibrate(algorithms[0]).round_seconds
    for count, (actor, learner, probe) in zip(algorithms[0].ladder, np.asarray(seconds).tolist(), strict=True):
        print(f"  {count} environments: a round takes {actor * 1e3:.1f} ms acting, {learner * 1e3:.1f} ms learning, "
              f"{probe * 1e3:.1f} ms probing ({probe / (actor + learner + probe):.0%} of the round)")
    return [a.replace(round_seconds=seconds) for a in algorithms]
