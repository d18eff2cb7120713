"""Algorithms written once, as fragments, with no distribution code.

``RECIPES`` maps the command line's names to the shipped recipes. Installed packages
add theirs in the entry-point group ``jaxrl_frag.recipes`` (``PLUGIN_GROUP``): an
entry point ``name = "module:Class"`` names an algorithm dataclass (a ``Recipe``, or
any ``jaxrl_frag.Algorithm``) with a classmethod ``create(env_id, **settings)``; its
fields with a ``help`` in their metadata are its command-line settings.
``get`` loads one by name; a plugin that fails to load is reported when it is asked for.
"""

import dataclasses
import functools
import importlib.metadata

from jaxrl_frag.plugins import declared, named
from jaxrl_frag.recipes.a2c import A2C
from jaxrl_frag.recipes.alphazero import AlphaZero
from jaxrl_frag.recipes.dqn import DQN
from jaxrl_frag.recipes.impala import IMPALA
from jaxrl_frag.recipes.multi_agent import IPPO, MAPPO, PQNVDN
from jaxrl_frag.recipes.ppo import PPO
from jaxrl_frag.recipes.pqn import PQN
from jaxrl_frag.recipes.qmix import QMIX
from jaxrl_frag.recipes.qrdqn import QRDQN
from jaxrl_frag.recipes.sac import SAC
from jaxrl_frag.recipes.td3 import TD3

RECIPES = {"ppo": PPO, "a2c": A2C, "impala": IMPALA, "dqn": DQN, "qrdqn": QRDQN, "pqn": PQN, "sac": SAC, "td3": TD3,
           "ippo": IPPO, "mappo": MAPPO, "pqn-vdn": PQNVDN, "qmix": QMIX, "alphazero": AlphaZero}
PLUGIN_GROUP = "jaxrl_frag.recipes"


@functools.cache
def plugins() -> dict[str, importlib.metadata.EntryPoint]:
    """The recipes that installed packages declare in entry-point group
    ``jaxrl_frag.recipes``, by name, not loaded; a name of a shipped recipe is left out,
    and of two packages declaring one name the first found is kept."""
    return declared(PLUGIN_GROUP, RECIPES.__contains__)


def names() -> list[str]:
    """Every recipe's name: the shipped ones, then the plugins'."""
    return [*RECIPES, *plugins()]


def get(name: str) -> type:
    """The recipe called ``name``: a shipped one, or a plugin's, loaded.

    Raises:
        ConfigError: For an unknown name, or a plugin that fails to load or does not
            name an algorithm class with the recipe interface (naming its entry point).
    """
    return named(name, "recipe", RECIPES, plugins(),
                 lambda found: isinstance(found, type) and dataclasses.is_dataclass(found)
                 and callable(getattr(found, "create", None)),
                 "an algorithm dataclass with create(env_id, **settings)")


__all__ = ["A2C", "DQN", "IMPALA", "IPPO", "MAPPO", "PPO", "PQN", "PQNVDN", "QMIX", "QRDQN", "RECIPES", "SAC", "TD3",
           "AlphaZero", "get", "names", "plugins"]
