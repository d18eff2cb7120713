"""Environments: the pure ``Env`` protocol, gymnax adapters and wrappers."""

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
    "Box", "Discrete", "Env", "EpisodeStatistics", "GymnaxEnv", "NormalizeObservation",
    "RunningMoments", "ScaleReward", "Space", "TimeStep", "VecEnv", "Wrapper", "available", "make", "register",
]
