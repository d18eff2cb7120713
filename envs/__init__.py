"""Environments: the pure ``Env`` protocol, gymnax, Brax and JaxMARL adapters, wrappers, and
host environments (Gymnasium, Atari) in worker processes or in this process."""

from jaxrl_frag.envs.brax_env import BraxEnv
from jaxrl_frag.envs.core import (
    Acting,
    AgentObs,
    Box,
    Capabilities,
    Discrete,
    Ended,
    Env,
    MaskedObs,
    Space,
    Steps,
    TimeStep,
    Wrapper,
    forget,
    random_legal,
)
from jaxrl_frag.envs.gymnax_env import GymnaxEnv
from jaxrl_frag.envs.host_env import HostEnv, is_host
from jaxrl_frag.envs.host_pool import EnvWorkerError
from jaxrl_frag.envs.registry import available, base_id, make, register
from jaxrl_frag.envs.wrappers import (
    VERSUS_RANDOM,
    EpisodeStatistics,
    NormalizeObservation,
    ObservationMask,
    RunningMoments,
    ScaleReward,
    VecEnv,
    VersusRandom,
)

__all__ = [
    "VERSUS_RANDOM", "Acting", "AgentObs", "Box", "BraxEnv", "Capabilities", "Discrete", "Ended", "Env", "EnvWorkerError",
    "EpisodeStatistics", "GymnaxEnv", "HostEnv", "MaskedObs", "NormalizeObservation", "ObservationMask", "RunningMoments",
    "ScaleReward", "Space", "Steps", "TimeStep", "VecEnv", "VersusRandom", "Wrapper", "available", "base_id", "forget",
    "is_host", "make", "random_legal", "register",
]
