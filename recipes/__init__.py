"""Algorithms written once, as fragments, with no distribution code."""

from jaxrl_frag.recipes.a2c import A2C
from jaxrl_frag.recipes.dqn import DQN
from jaxrl_frag.recipes.impala import IMPALA
from jaxrl_frag.recipes.ppo import PPO
from jaxrl_frag.recipes.sac import SAC

RECIPES = {"ppo": PPO, "a2c": A2C, "impala": IMPALA, "dqn": DQN, "sac": SAC}

__all__ = ["A2C", "DQN", "IMPALA", "PPO", "RECIPES", "SAC"]
