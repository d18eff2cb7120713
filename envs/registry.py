"""``make``: an environment id to a batched, wrapped environment."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import gymnax

from jaxrl_frag.envs import brax_env
from jaxrl_frag.envs.core import Env
from jaxrl_frag.envs.gymnax_env import GymnaxEnv
from jaxrl_frag.envs.host_env import PREFIXES, HostEnv, is_host
from jaxrl_frag.envs.wrappers import EpisodeStatistics, NormalizeObservation, ScaleReward, VecEnv
from jaxrl_frag.errors import ConfigError, check

_REGISTERED: dict[str, Callable[..., Env]] = {}


def register(name: str, factory: Callable[..., Env]) -> None:
    """Make ``factory(**kwargs)`` (one unbatched JAX environment) available to ``make``
    and to ``--env`` as ``name``."""
    check(name not in gymnax.registered_envs, "name", name, "is a gymnax environment id already; choose another")
    check(not name.startswith((brax_env.PREFIX, *PREFIXES)), "name", name,
          f"ids starting {', '.join((brax_env.PREFIX, *PREFIXES))} are Brax's and the host families'; choose another")
    _REGISTERED[name] = factory


def available() -> list[str]:
    """Every JAX environment id that ``make`` accepts (and any ``gymnasium:<id>`` or ``ale:<Game>``)."""
    return sorted([*gymnax.registered_envs, *brax_env.ids(), *_REGISTERED])


def make(
    name: str,
    *,
    num_envs: int | None = None,
    normalize_obs: bool = False,
    scale_reward: bool = False,
    gamma: float = 0.99,
    **kwargs: Any,
) -> Env:
    """Make environment ``name``; with ``num_envs``, a batch of them with episode
    statistics and, if asked, observation normalisation and reward scaling.

    ``kwargs`` go to the environment's constructor; a Brax id (``brax:<name>``) takes
    ``backend``, ``episode_length`` and ``action_repeat`` (``BraxEnv.make``). Host
    environments (``gymnasium:<id>``, ``ale:<Game>``) come batched only, and take
    ``workers``, ``groups`` and ``ring`` (``HostEnv.make``) besides their own arguments.
    """
    if is_host(name):
        check(num_envs is not None, "num_envs", num_envs, f"host environments ({name}) come batched: give num_envs")
        for option, value in (("normalize_obs", normalize_obs), ("scale_reward", scale_reward)):
            check(not value, option, value, f"is for JAX environments; {name} runs on the host: turn it off")
        return HostEnv.make(name, num_envs, **kwargs)
    if name.startswith(brax_env.PREFIX):
        env: Env = brax_env.BraxEnv.make(name, **kwargs)
    elif name not in gymnax.registered_envs and name not in _REGISTERED:
        close = difflib.get_close_matches(name, available(), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigError("env", name, f"unknown environment; {hint}available: {', '.join(available())}, "
                                      "and host environments gymnasium:<Gymnasium id> and ale:<Atari game>")
    else:
        env = _REGISTERED[name](**kwargs) if name in _REGISTERED else GymnaxEnv.make(name, **kwargs)
    if num_envs is None:
        return env
    check(num_envs > 0, "num_envs", num_envs, "must be a positive number of environments")
    env = EpisodeStatistics(VecEnv(env, num_envs))
    if normalize_obs:
        env = NormalizeObservation(env)
    if scale_reward:
        env = ScaleReward(env, gamma=gamma)
    return env
