"""What a ``RunSpec`` builds: the algorithm (a population for several seeds or a sweep,
boosted, evaluated during training, as the specification says), the distribution
policy, and the run's resolved configuration. Every setting is validated here, before
anything is traced."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrl_frag.app import fields
from jaxrl_frag.app.spec import EVAL_EPISODES, PER_PROCESS, RunSpec, policy_flags, transform_settings_of
from jaxrl_frag.bounds import MEMBERS_MAX, SEED_MAX, check_count
from jaxrl_frag.errors import ConfigError, check

Members = list[tuple[dict[str, float], int]]  # a population's members: setting and seed, in member order
# caps the environment steps of every train and resume run (the README's commands run small in the test suite)
MAX_STEPS_VARIABLE = "JAXRL_FRAG_MAX_STEPS"


def make_algorithm(spec: RunSpec, *, capped: bool = True, round_seconds: Any = None) -> tuple[Any, Members | None]:
    """The algorithm ``spec`` makes, and for a population (several seeds or a sweep) its
    members' settings and seeds, in member order. With ``capped``, the run's steps are
    capped by ``$JAXRL_FRAG_MAX_STEPS`` where it is set (a run's, not an explanation's);
    ``round_seconds``: a boosted run's rounds' device-seconds as it was calibrated (a
    resumed run keeps them), else they are measured where the run asks for calibration."""
    from jaxrl_frag import costs
    from jaxrl_frag.app import sweeps
    from jaxrl_frag.transforms import Population
    from jaxrl_frag.transforms.boost import Boosted
    from jaxrl_frag.transforms.evaluated import Evaluated

    if spec.chunk_iterations is not None:
        check_count("chunk_iterations", spec.chunk_iterations)
    check_count("seed", spec.seed, SEED_MAX, "seeds are uint32", low=0)
    check_count("seeds", spec.seeds, SEED_MAX - spec.seed + 1, f"the seeds from --seed {spec.seed} on are uint32")
    overrides = dict(spec.recipe_settings)
    evaluating = _check_evaluation(spec)
    check_policy_runs(spec)
    settings = {"strategy": spec.boost, **spec.boost_settings} if spec.boosting else {}
    ladder = settings.get("ladder", Boosted.defaults()["ladder"])
    calibrating = spec.boosting and (spec.boost_calibrate or spec.boost_settings.get("budget_cost") is not None)
    if spec.boosting:
        check("num_envs" not in overrides, "num_envs", overrides.get("num_envs"),
              "a boosted run's environment counts are its --boost-ladder; drop --num-envs")
        for count in ladder:
            check_count("boost_ladder", count)
        overrides["num_envs"] = ladder[-1]

    cap = _steps_cap() if capped else None
    shortened: list[tuple[int, int]] = []  # the run's steps as given and as capped, where the cap lowers them

    def build(**recipe_settings: Any) -> Any:
        if cap is not None:
            recipe_settings = _capped(spec, recipe_settings, cap, shortened)
        recipe = spec.recipe_cls.create(spec.env, **recipe_settings)
        if not spec.boosting:
            return recipe
        budget = settings.get("budget_steps")
        if cap is not None and budget:  # at least one round at the bottom rung, as Boosted asks
            steps = max(cap, ladder[0] * recipe.num_steps)
            if budget > steps:
                shortened.insert(0, (budget, steps))
                settings["budget_steps"] = steps
        # calibrated after every setting is validated: until then rounds cost nothing
        seconds = np.zeros((len(ladder), 3)) if calibrating else None
        return Boosted.create(recipe, round_seconds=seconds, **settings)

    if not spec.population:
        check(spec.samples is None, "samples", spec.samples, "--samples is for random search with --sweep")
        algorithms, members = [build(**overrides)], None
    else:
        size = sweeps.count(spec.sweep, spec.samples) * spec.seeds
        check(size <= MEMBERS_MAX, "population", size,
              f"--sweep and --seeds make that many members (settings times seeds), and at most {MEMBERS_MAX:,} are "
              "built (one by one, on the host): sweep fewer values or seeds, or split the sweep over runs")
        setting_list = sweeps.settings(spec.sweep, spec.samples, spec.seed)
        sweeps.check_traced(spec.recipe_cls, list(setting_list[0]))
        members = sweeps.members(setting_list, spec.seeds, spec.seed)
        algorithms = [build(**{**overrides, **setting}) for setting, _ in members]
    if shortened:
        _say_capped(cap, shortened[0])
    costs.check_state_fits(algorithms[0], len(algorithms), memory_fix(spec, program=False))
    if evaluating:  # the first member validated and traced once, the others in its place
        episodes = EVAL_EPISODES if spec.eval_episodes is None else spec.eval_episodes
        evaluated = Evaluated.create(algorithms[0], spec.eval_every, episodes)
        algorithms = [evaluated.replace(algorithm=a) for a in algorithms]
    if calibrating:
        algorithms = _calibrated(algorithms, round_seconds)
    if spec.transforms:
        algorithms = [_transformed(spec, a) for a in algorithms]
    if members is None:
        return algorithms[0], None
    return Population.of(algorithms, [seed for _, seed in members]), members


def _steps_cap() -> int | None:
    """``$JAXRL_FRAG_MAX_STEPS``; ``None`` where it is unset or empty."""
    text = os.environ.get(MAX_STEPS_VARIABLE, "")
    if not text:
        return None
    try:
        cap = fields.parse_int(text)
    except (ValueError, argparse.ArgumentTypeError):
        cap = None
    check(cap is not None and cap > 0, MAX_STEPS_VARIABLE, text,
          "caps the environment steps of a run: give a positive whole number (e.g. 2048), or unset it")
    return cap


def _capped(spec: RunSpec, given: dict[str, Any], cap: int, shortened: list[tuple[int, int]]) -> dict[str, Any]:
    """``given`` with ``total_steps`` lowered to ``cap``, or to the least the settings allow
    (one iteration; an off-policy recipe's ``learning_starts``), where the run would take
    more; appends (resolved, capped) totals to ``shortened`` where it lowers one."""
    from jaxrl_frag.envs import base_id

    recipe = spec.recipe_cls
    if not all(hasattr(recipe, name) for name in ("fields", "defaults")):  # a plugin's recipe that is no Recipe
        return given
    resolved = {**recipe.fields(), **recipe.defaults(base_id(spec.env)), **given}
    if not all(name in resolved for name in ("total_steps", "num_envs", "num_steps")):
        return given
    least = max(resolved["num_envs"] * resolved["num_steps"], resolved.get("learning_starts", 0))
    steps = max(cap, least)
    if resolved["total_steps"] <= steps:
        return given
    shortened.append((resolved["total_steps"], steps))
    return {**given, "total_steps": steps}


def _say_capped(cap: int, totals: tuple[int, int]) -> None:
    """The line on stderr saying that ``$JAXRL_FRAG_MAX_STEPS`` shortened the run."""
    from jaxrl_frag.distributed import is_main_process

    if is_main_process():
        total, steps = totals
        least = "" if steps == cap else " (the least these settings allow)"
        print(f"jaxrl-frag: {MAX_STEPS_VARIABLE}={cap}: training for {steps:,} environment steps{least} instead of "
              f"{total:,}", file=sys.stderr, flush=True)


def check_policy_runs(spec: RunSpec) -> None:
    """Refuse a policy that does not run what ``spec`` makes: a population (several seeds
    or a sweep) or one algorithm, boosted or not, as the policy declares
    (``sharding.runs``); the fix names the policies that do."""
    from jaxrl_frag.sharding import get, running, runs

    declared = runs(get(spec.policy))
    given = [*(["--seeds"] if spec.seeds > 1 else []), *(["--sweep"] if spec.sweep else [])]
    made = " with ".join([*([f"--seeds {spec.seeds}"] if spec.seeds > 1 else []),
                          *([f"--sweep {spec.sweep[0]}"] if spec.sweep else [])])
    if spec.population and declared["populations"] == "refused":
        raise ConfigError("policy", spec.policy, (
            f"runs one algorithm and does not run populations, which {made} makes (a member per seed and "
            f"setting): to train several seeds or settings as one population use --policy "
            f"{' or '.join(running('populations', True))}, or drop {' and '.join(given)} to train one"))
    if not spec.population and declared["populations"] == "required":
        raise ConfigError("policy", spec.policy, (
            "splits a population's members over devices, and this run trains one member: give --seeds N (N > 1) "
            "or --sweep NAME=V1,V2 for several, or for one use --policy "
            f"{' or '.join(running('populations', False))}"))
    if spec.boosting and not declared["boosts"]:
        raise ConfigError("policy", spec.policy, (
            f"does not run boosted runs (--boost {spec.boost}: rounds on slices of one environment pool): boosting "
            f"takes --policy {' or '.join(running('boosts', True))}; or drop --boost"))


def _check_evaluation(spec: RunSpec) -> bool:
    """Whether the run evaluates during training (``eval_every``); ``ConfigError`` for
    ``eval_episodes`` without it."""
    check(spec.eval_every is not None or spec.eval_episodes is None, "eval_episodes", spec.eval_episodes,
          "sets the episodes of each evaluation during training: give --eval-every too, or drop it")
    return spec.eval_every is not None


def memory_fix(spec: RunSpec, program: bool) -> str:
    """What to change, in flags, for a run whose state (or with ``program``, whose
    compiled program) does not fit its devices' memory."""
    names = {f.name for f in dataclasses.fields(spec.recipe_cls)}
    sizes = ("num_envs", "num_steps", "buffer_size", "minibatch_size", "hidden") if program else (
        "num_envs", "buffer_size", "hidden")
    flag_names = [f"--{'boost_ladder' if spec.boosting and name == 'num_envs' else name}".replace("_", "-")
                  for name in sizes if name in names]
    if not flag_names:  # a recipe with none of the usual sizes
        fix = "lower the recipe's sizes"
    else:
        fix = f"lower {', '.join(flag_names[:-1])} or {flag_names[-1]}" if len(flag_names) > 1 else f"lower {flag_names[0]}"
    if program and "num_minibatches" in names:
        fix += ", or raise --num-minibatches"
    if spec.population:
        fix += ", or train fewer members (--seeds, --sweep)"
    return fix


def _transformed(spec: RunSpec, algorithm: Any) -> Any:
    """``algorithm`` with the plugin transforms of ``spec`` applied, in order, each with its settings."""
    from jaxrl_frag import transforms

    for name in spec.transforms:
        own = {field: spec.transform_settings[dest] for dest, field in transform_settings_of(name).items()
               if dest in spec.transform_settings}
        algorithm = transforms.get(name).create(algorithm, **own)
    return algorithm


def _calibrated(algorithms: list[Any], round_seconds: Any) -> list[Any]:
    """Boosted ``algorithms`` with their rounds' device-seconds ``round_seconds``, or
    measured (one calibration serves every member: the rounds' sizes do not depend on them)."""
    from jaxrl_frag.transforms import boost

    if round_seconds is not None:
        return [a.replace(round_seconds=np.asarray(round_seconds, np.float32)) for a in algorithms]
    print("calibrating: timing each rung's actor, learner and probe", flush=True)
    seconds = boost.calibrate(algorithms[0]).round_seconds
    for count, (actor, learner, probe) in zip(algorithms[0].ladder, np.asarray(seconds).tolist(), strict=True):
        print(f"  {count} environments: a round takes {actor * 1e3:.1f} ms acting, {learner * 1e3:.1f} ms learning, "
              f"{probe * 1e3:.1f} ms probing ({probe / (actor + learner + probe):.0%} of the round)")
    return [a.replace(round_seconds=seconds) for a in algorithms]


def _device_groups(policy: str, settings: Mapping[str, Any]) -> list[fields.Flag]:
    """The device-group counts (``*_devices`` settings) of ``policy`` that ``settings`` set."""
    return [p.flag for p in policy_flags() if policy in p.fields and p.flag.dest.endswith("_devices")
            and settings.get(p.flag.dest) is not None]


def cpu_devices(policy: str, settings: Mapping[str, Any]) -> int | None:
    """The host devices to force on CPU for ``policy`` with ``settings``: ``devices``, or
    else the sum of the policy's device-group counts (its ``*_devices`` settings);
    ``None`` for neither."""
    if settings.get(PER_PROCESS) is not None:
        return settings[PER_PROCESS]
    groups = _device_groups(policy, settings)
    return sum(settings[flag.dest] for flag in groups) if groups else None


def devices_flags(policy: str, settings: Mapping[str, Any]) -> str:
    """The flags ``cpu_devices`` counts from, as a user would read them."""
    if settings.get(PER_PROCESS) is not None:
        return f"--{PER_PROCESS}"
    return " + ".join(flag.option for flag in _device_groups(policy, settings))


def make_policy(spec: RunSpec) -> Any:
    """The distribution policy ``spec`` names, with its settings (``devices`` per process:
    times the run's processes)."""
    import jax

    from jaxrl_frag import sharding

    cls = sharding.get(spec.policy)
    kwargs = {}
    for policy_flag in policy_flags():
        field, value = policy_flag.fields.get(spec.policy), spec.policy_settings.get(policy_flag.flag.dest)
        if field is None or value is None:
            continue
        kwargs[field] = value * jax.process_count() if policy_flag.flag.dest == PER_PROCESS else value
    for field in dataclasses.fields(cls):
        if (field.init and field.name not in kwargs and field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING):
            raise ConfigError("policy", spec.policy, f"needs {fields.option_of(field)}")
    return cls(**kwargs)


def resolved_config(spec: RunSpec, algo: Any) -> dict[str, Any]:
    """The run's full configuration, every default filled in; validates the checkpoint
    interval (before anything is traced)."""
    from jaxrl_frag.checkpoints import check_settings
    from jaxrl_frag.program import default_chunk_iterations

    chunk = default_chunk_iterations(algo) if spec.chunk_iterations is None else spec.chunk_iterations
    every = 10 * chunk if spec.checkpoint_every is None else spec.checkpoint_every
    check_settings(every, spec.keep_checkpoints, chunk)
    policy = spec.to_json()
    return {"recipe": spec.recipe, "seed": spec.seed, "seeds": spec.seeds, "sweep": list(spec.sweep),
            "samples": spec.samples, **{k: policy[k] for k in ("policy", *(p.flag.dest for p in policy_flags()))},
            "chunk_iterations": chunk, "checkpoint_every": every, "keep_checkpoints": spec.keep_checkpoints,
            **algo.config()}


def resolved_spec(spec: RunSpec) -> RunSpec:
    """``spec`` with the defaults it leaves filled in as its run takes them: the recipe's
    for its environment (but settings swept, and a boosted run's ``num_envs``), boosting's,
    and the row and checkpoint intervals. Validated as the run is."""
    from jaxrl_frag import transforms
    from jaxrl_frag.app.spec import recipe_flags
    from jaxrl_frag.transforms.boost import Boosted

    algo, _ = make_algorithm(spec, capped=False)
    config = resolved_config(spec, algo)
    recipe = spec.recipe_cls.create(spec.env, **spec.recipe_settings)
    left = {flag.dest for flag in recipe_flags(spec.recipe_cls)} - {s.partition("=")[0].strip() for s in spec.sweep}
    if spec.boosting:
        left.discard("num_envs")
    boost = {name: value for name, value in Boosted.defaults().items() if name != "strategy"} if spec.boosting else {}
    transform = {}
    for name in spec.transforms:
        defaults = {f.name: f.default for f in dataclasses.fields(transforms.get(name))}
        transform.update({dest: defaults[field] for dest, field in transform_settings_of(name).items()
                          if defaults[field] is not dataclasses.MISSING})
    return spec.replace(recipe_settings={**{name: getattr(recipe, name) for name in sorted(left)}, **spec.recipe_settings},
                        boost_settings={**boost, **spec.boost_settings},
                        transform_settings={**transform, **spec.transform_settings},
                        chunk_iterations=config["chunk_iterations"], checkpoint_every=config["checkpoint_every"])
