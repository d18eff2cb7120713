"""Algorithms written once, as fragments, with no distribution code."""

from jaxrl_frag.recipes.ppo import PPO

RECIPES = {"ppo": PPO}

__all__ = ["PPO", "RECIPES"]
