"""The flags of ``train`` and ``explain`` that make a ``RunSpec``: a recipe's (from its
dataclass fields), actor boosting's (from ``Boosted``'s), and ``run_spec``, the one place
where parsed flags become a specification."""

from __future__ import annotations

import argparse

from jaxrl_frag.app.cli import flags, policies
from jaxrl_frag.app.spec import RunSpec, boost_flags, recipe_flags

# train's and explain's settings that are the specification's own fields, by the same name
_OWN = ("seed", "seeds", "samples", "boost", "boost_calibrate", "eval_every", "eval_episodes", "chunk_iterations",
        "checkpoint_every", "keep_checkpoints")


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


def run_spec(args: argparse.Namespace) -> RunSpec:
    """The run that the parsed flags of ``train`` or ``explain`` (which lacks train's
    checkpoint, evaluation and boosting flags: their defaults) describe."""
    boost = {dest[len("boost_"):]: value for dest, value in flags.given_values(args, boost_flags()).items()}
    return RunSpec(args.recipe, args.env, recipe_settings=flags.given_values(args, recipe_flags(args.recipe_cls)),
                   policy=args.policy, policy_settings=policies.given(args), sweep=tuple(args.sweep), boost_settings=boost,
                   **{name: getattr(args, name) for name in _OWN if hasattr(args, name)})
