"""``make``: an environment id to a batched, wrapped environment.

Besides the built-in families, ``make`` takes the ids that installed packages declare
in the entry-point group ``jaxrl_frag.envs`` (``PLUGIN_GROUP``): an entry point named
``MyEnv-v0`` serves that id, one named ``mysim:`` (ending in a colon) every id that
starts with ``mysim:``. Its object is a factory ``factory(env_id, num_envs, **options)
-> Env``, called with the id less its options, the batch size (``None`` for one
environment) and the options with ``make``'s extra keyword arguments; it returns one unbatched environment, which
``make`` batches and wraps as it does gymnax's, or a batch of exactly ``num_envs``
(a family that batches itself), which ``make`` takes as it is but for the
normalisation wrappers. Ids that a built-in family takes stay the built-in's.

Any JAX environment id with vector observations takes the option ``@obs=I,J,...``:
the environment observing only those entries of its observations (``ObservationMask``;
``CartPole-v1@obs=0,2`` is CartPole without its velocities, a task that needs memory).
A game of two players who move in turn (``Capabilities.alternating``) takes
``@opponent=random``: the game against uniformly random legal moves, a single-agent task
(``VersusRandom``; ``pgx:tic_tac_toe@opponent=random``).
Every JAX environment's id takes its constructor's options the same way
(``brax:ant@backend=positional``, ``jumanji:Maze-v0@time_limit=50``; ``envs.id_options``):
a registered or a plugin's factory gets them as keyword arguments, beside ``make``'s own,
and must name the environment it returns with them (``id_options.named``), since its name
is how ``evaluate`` and ``resume`` make it again.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
from collections.abc import Callable
from typing import Any

from jaxrl_frag.envs import brax_env, gymnax_env, id_options
from jaxrl_frag.envs.core import Env
from jaxrl_frag.envs.gymnax_env import GymnaxEnv
from jaxrl_frag.envs.host_env import PREFIXES, HostEnv, is_host
from jaxrl_frag.envs.wrappers import (
    OBS_MASK,
    VERSUS_RANDOM,
    EpisodeStatistics,
    NormalizeObservation,
    ObservationMask,
    ScaleReward,
    VecEnv,
    VersusRandom,
)
from jaxrl_frag.errors import ConfigError, check, did_you_mean
from jaxrl_frag.plugins import declared, describe_entry_point, load_plugin

_REGISTERED: dict[str, Callable[..., Env]] = {}
PLUGIN_GROUP = "jaxrl_frag.envs"
_FACTORIES: dict[tuple[str, str], Callable[..., Env]] = {}  # loaded plugin factories, by entry point


def _built_in(name: str) -> bool:
    return name in gymnax_env.ids() or name.startswith((brax_env.PREFIX, *PREFIXES))


@functools.cache
def plugins() -> dict[str, importlib.metadata.EntryPoint]:
    """The environment ids and id families (names ending in ``:``) that installed packages
    declare in entry-point group ``jaxrl_frag.envs``, not loaded; a name that a built-in
    family takes is left out, and of two packages declaring one name the first found is kept."""
    return declared(PLUGIN_GROUP, _built_in)


def plugin_families() -> dict[str, importlib.metadata.EntryPoint]:
    """The id families (prefixes ending in ``:``) that plugins serve."""
    return {name: ep for name, ep in plugins().items() if name.endswith(":")}


def _plugin_for(name: str) -> importlib.metadata.EntryPoint | None:
    """The plugin serving id ``name``: the one of that name, or the longest family prefix of it."""
    found = plugins()
    if name in found and not name.endswith(":"):
        return found[name]
    prefixes = [p for p in plugin_families() if name.startswith(p) and len(name) > len(p)]
    return found[max(prefixes, key=len)] if prefixes else None


def _from_plugin(entry_point: importlib.metadata.EntryPoint, name: str, num_envs: int | None,
                 kwargs: dict[str, Any]) -> Env:
    key = (entry_point.name, entry_point.value)
    if key not in _FACTORIES:
        factory = load_plugin(entry_point, "env", name)
        check(callable(factory), "env", name,
              f"its plugin's {describe_entry_point(entry_point)} is not callable: it must name a factory "
              "factory(env_id, num_envs, **options) -> Env")
        _FACTORIES[key] = factory
    env = _FACTORIES[key](name, num_envs, **kwargs)
    check(isinstance(env, Env), "env", name,
          f"its plugin's factory {entry_point.value} returned {type(env).__name__}, not a jaxrl_frag.envs.Env")
    batch = getattr(env, "num_envs", None)
    check(batch is None or (num_envs is not None and batch == num_envs), "env", name,
          f"its plugin's factory {entry_point.value} returned a batch of {batch} environments for num_envs={num_envs}: "
          "return one unbatched environment, or a batch of num_envs")
    return env


def register(name: str, factory: Callable[..., Env]) -> None:
    """Make ``factory(**kwargs)`` (one unbatched JAX environment) available to ``make``
    and to ``--env`` as ``name``.

    Args:
        name: The new id; not a gymnax id, and not starting with ``brax:``,
            ``gymnasium:`` or ``ale:``.
        factory: Called with ``make``'s extra keyword arguments; returns one unbatched
            ``Env``.

    Raises:
        ConfigError: If ``name`` is taken by a built-in family.
    """
    check(name not in gymnax_env.ids(), "name", name, "is a gymnax environment id already; choose another")
    check(not name.startswith((brax_env.PREFIX, *PREFIXES)), "name", name,
          f"ids starting {', '.join((brax_env.PREFIX, *PREFIXES))} are Brax's and the host families'; choose another")
    _REGISTERED[name] = factory


def base_id(name: str) -> str:
    """An environment id without its options (``envs.id_options``): the id a recipe's defaults are chosen by."""
    return id_options.split(name)[0]


def _options(full: str, name: str, options: dict[str, str],
             kwargs: dict[str, Any]) -> tuple[dict[str, Any], str | None, str | None]:
    """``kwargs`` with the constructor ``options`` written in id ``full`` (of environment
    ``name``), the observation entries its ``obs`` option keeps and its ``opponent``
    (``None`` without them); ``ConfigError`` for options on a host environment's id, or one
    also given as an argument."""
    keep, opponent = options.pop("obs", None), options.pop("opponent", None)
    check(keep is None or not is_host(name), "env", full,
          f"{OBS_MASK} masks JAX environments' observations; {name} runs on the host: drop {OBS_MASK}{keep}")
    check(opponent is None or not is_host(name), "env", full,
          f"{name} runs on the host, not a game of two players: drop @opponent={opponent}")
    check(not (options and is_host(name)), "env", full,
          lambda: f"{name} runs on the host and takes no options in its id (JAX environments do): drop "
                  f"{id_options.named('', options)}")
    given = sorted(set(options) & set(kwargs))
    check(not given, "env", full, lambda: f"sets {given[0]}, which is also given as an argument: set it once")
    return {**kwargs, **{option: id_options.value(text) for option, text in options.items()}}, keep, opponent


def _named_with(env: Env, full: str, options: dict[str, str]) -> Env:
    """``env``, made by a registered or a plugin's factory from id ``full`` with ``options``;
    ``ConfigError`` unless its name carries them (``id_options.named``), which is how
    ``evaluate`` and ``resume`` make it again."""
    named = {option: id_options.value(text) for option, text in id_options.split(env.name)[1].items()}
    given = {option: id_options.value(text) for option, text in options.items()}
    check(all(option in named and named[option] == value for option, value in given.items()), "env", full,
          lambda: f"its factory named the environment {env.name!r}, not with the options {id_options.named('', given)}, "
                  "so evaluate and resume could not make it again: the factory must name it with them "
                  "(jaxrl_frag.envs.id_options.named), or drop them")
    return env


def _masked(env: Env, name: str, keep: str) -> Env:
    """``env`` (one environment, or a batch) observing only the entries ``keep`` lists
    (``"0,2"``); ``ConfigError`` naming ``name`` for entries that are not whole numbers,
    repeat, or lie outside its observations, or an environment without vector observations."""
    check(not env.capabilities.masks_actions, "env", name, f"{env.name}'s observations carry its action mask: drop "
                                                           f"{OBS_MASK}{keep}")
    check(env.num_agents is None, "env", name, f"masks one agent's observations; {env.name} has {env.num_agents} "
                                               f"agents: drop {OBS_MASK}{keep}")
    shape = env.observation_space.shape
    check(len(shape) == 1, "env", name, f"masks vector observations; {env.name} observes shape {shape}: drop "
                                        f"{OBS_MASK}{keep}")
    entries = keep.split(",")
    check(all(e.strip().isdigit() for e in entries), "env", name,
          f"{OBS_MASK} takes comma-separated observation entries (whole numbers from 0), e.g. {env.name}{OBS_MASK}0,2")
    indices = tuple(int(e) for e in entries)
    check(len(set(indices)) == len(indices), "env", name, "names an observation entry twice: name each once")
    (size,) = shape
    outside = [i for i in indices if i >= size]
    check(not outside, "env", name, lambda: f"keeps observation entry {outside[0]}, but {env.name} observes {size} "
                                            f"entries (0 to {size - 1}): choose among them")
    return ObservationMask(env, indices)


def _versus(env: Env, name: str, opponent: str) -> Env:
    """``env``, one game of two players who move in turn, against ``opponent`` (``random``);
    ``ConfigError`` naming ``name`` for another opponent, a batch, or an environment that is
    not such a game."""
    check(opponent == "random", "env", name, f"takes @opponent=random (uniformly random legal moves), not "
                                             f"@opponent={opponent}: write {VERSUS_RANDOM}")
    check(env.capabilities.alternating, "env", name, f"{env.name} is not a game of two players who move in turn "
                                                     f"(Capabilities.alternating): drop @opponent={opponent}")
    check(getattr(env, "num_envs", None) is None, "env", name,
          f"{env.name}'s family batches its games itself, and the opponent plays one game: drop @opponent={opponent}")
    return VersusRandom(env)


def available() -> list[str]:
    """Every JAX environment id that ``make`` accepts (and any ``gymnasium:<id>`` or
    ``ale:<Game>``, and the ids of the plugins' families)."""
    plugin_ids = [name for name in plugins() if not name.endswith(":")]
    return sorted({*gymnax_env.ids(), *brax_env.ids(), *_REGISTERED, *plugin_ids})


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

    ``kwargs`` go to the environment's constructor, with the options written in a Brax or
    gymnax id (``envs.id_options``); a Brax id (``brax:<name>``) takes ``backend``,
    ``episode_length`` and ``action_repeat`` (``BraxEnv.make``). Host
    environments (``gymnasium:<id>``, ``ale:<Game>``) come batched only, and take
    ``workers``, ``groups`` and ``ring`` (``HostEnv.make``) besides their own arguments.
    A plugin's id (module docstring) goes to its factory with ``num_envs`` and ``kwargs``.

    Args:
        name: An id from ``available()``, ``gymnasium:<id>``, ``ale:<Game>`` or an id of
            a plugin's family.
        num_envs: Batch size; ``None`` for one unbatched JAX environment.
        normalize_obs: Standardise observations by running statistics
            (``NormalizeObservation``; JAX environments, batched).
        scale_reward: Scale rewards by the running spread of the discounted return
            (``ScaleReward``; JAX environments, batched).
        gamma: The discount ``scale_reward`` uses.
        **kwargs: Passed to the environment's constructor.

    Returns:
        The environment: ``EpisodeStatistics(VecEnv(env, num_envs))``, wrapped further
        as asked, with ``num_envs``; the bare environment without. With an
        ``@obs=I,J,...`` suffix, ``env`` observes only those entries (``ObservationMask``);
        with ``@opponent=random``, a game plays against random moves (``VersusRandom``).

    Raises:
        ConfigError: For an unknown id (with the closest ones), a non-positive
            ``num_envs``, options a host environment does not take, options in the id
            that the environment's constructor refuses or that a registered or plugin's
            factory does not name its environment with, a plugin that fails to load
            (naming its entry point), an ``@obs=`` option that names no observation
            entries of the environment, or an ``@opponent=`` other than ``random`` or on an
            environment that is not a game of two players.
    """
    full, (name, options) = name, id_options.split(name)
    kwargs, keep, opponent = _options(full, name, options, kwargs)
    if is_host(name):
        check(num_envs is not None, "num_envs", num_envs, f"host environments ({name}) come batched: give num_envs")
        for option, value in (("normalize_obs", normalize_obs), ("scale_reward", scale_reward)):
            check(not value, option, value, f"is for JAX environments; {name} runs on the host: turn it off")
        return HostEnv.make(name, num_envs, **kwargs)
    plugin = None
    if name.startswith(brax_env.PREFIX):
        takes = [option for option in inspect.signature(brax_env.BraxEnv.make).parameters if option != "name"]
        unknown = sorted(set(kwargs) - set(takes))
        check(not unknown, "env", full, lambda: f"{name} takes no option {unknown[0]}; its options: {', '.join(takes)}")
        env: Env = brax_env.BraxEnv.make(name, **kwargs)
    elif name in gymnax_env.ids():
        env = GymnaxEnv.make(name, **kwargs)
    elif name in _REGISTERED:
        env = _named_with(_REGISTERED[name](**kwargs), full, options)
    elif (plugin := _plugin_for(name)) is not None:
        check(num_envs is None or num_envs > 0, "num_envs", num_envs, "must be a positive number of environments")
        env = _named_with(_from_plugin(plugin, name, num_envs, kwargs), full, options)
    else:
        known = [*available(), *(f"{prefix}<id>" for prefix in plugin_families())]
        raise ConfigError("env", name, f"unknown environment; {did_you_mean(name, known)}available: {', '.join(known)}, "
                                      "and host environments gymnasium:<Gymnasium id> and ale:<Atari game>")
    if keep is not None:
        env = _masked(env, full, keep)
    if opponent is not None:
        env = _versus(env, full, opponent)
    if num_envs is None:
        return env
    check(num_envs > 0, "num_envs", num_envs, "must be a positive number of environments")
    if plugin is None or getattr(env, "num_envs", None) is None:  # a plugin's family may batch itself
        env = EpisodeStatistics(VecEnv(env, num_envs))
    for option, value in (("normalize_obs", normalize_obs), ("scale_reward", scale_reward)):
        check(not value or env.num_agents is None, option, value,
              f"standardises one agent's observations and rewards; {name} has {env.num_agents} agents: turn it off")
    check(not normalize_obs or not env.capabilities.masks_actions, "normalize_obs", normalize_obs,
          f"standardises observations of one array; {name}'s carry its action mask beside them: turn it off")
    if normalize_obs:
        env = NormalizeObservation(env)
    if scale_reward:
        env = ScaleReward(env, gamma=gamma)
    return env
