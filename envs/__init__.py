"""Environments: the pure ``Env`` protocol, gymnax and Brax adapters, and wrappers."""

from jaxrl_frag.envs.brax_env import BraxEnv
from jaxrl_frag.envs.core import Box, Discrete, Env, Space, TimeStep, Wrapper
from jaxrl_frag.envs.gymnax_env import GymnaxEnv
from jaxrl_frag.envs.registry import available, make, register
from jaxrl_frag.envs.wrappers import (
    EpisodeStatistics,
    NormalizeObservation,
    RunningMoments,
    ScaleReward,
    VecEnv,
)

__all__ = [
    "Box", "BraxEnv", "Discrete", "Env", "EpisodeStatistics", "GymnaxEnv", "NormalizeObservation",
    "RunningMoments", "ScaleReward", "Space", "TimeStep", "VecEnv", "Wrapper", "available", "make", "register",
]
