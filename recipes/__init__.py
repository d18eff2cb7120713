"""Algorithms written once, as fragments, with no distribution code."""

from jaxrl_frag.recipes.impala import IMPALA
from jaxrl_frag.recipes.ppo import PPO

RECIPES = {"ppo": PPO, "impala": IMPALA}

__all__ = ["IMPALA", "PPO", "RECIPES"]
