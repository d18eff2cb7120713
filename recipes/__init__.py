"""Algorithms written once, as fragments, with no distribution code.

``RECIPES`` maps the command line's names to the shipped recipes. Installed packages
add theirs in the entry-point group ``jaxrl_frag.recipes`` (``PLUGIN_GROUP``): an
entry point ``name = "module:Class"`` names an algorithm class with the recipe
interface (``create(env_id, **settings)``, ``fields()``, and dataclass fields with a
``help`` in their metadata, each a command-line setting), as ``Recipe`` has it.
``get`` loads one by name; a plugin that fails to load is reported when it is asked for.
"""

import dataclasses
import functools
import importlib.metadata

from jaxrl_frag.envs.registry import describe_entry_point, load_plugin
from jaxrl_frag.errors import ConfigError, check
from jaxrl_frag.recipes.a2c import A2C
from jaxrl_frag.recipes.dqn import DQN
from jaxrl_frag.recipes.impala import IMPALA
from jaxrl_frag.recipes.multi_agent import IPPO, MAPPO, PQNVDN
from jaxrl_frag.recipes.ppo import PPO
from jaxrl_frag.recipes.pqn import PQN
from jaxrl_frag.recipes.sac import SAC

RECIPES = {"ppo": PPO, "a2c": A2C, "impala": IMPALA, "dqn": DQN, "pqn": PQN, "sac": SAC,
           "ippo": IPPO, "mappo": MAPPO, "pqn-vdn": PQNVDN}
PLUGIN_GROUP = "jaxrl_frag.recipes"


@functools.cache
def plugins() -> dict[str, importlib.metadata.EntryPoint]:
    """The recipes that installed packages declare in entry-point group
    ``jaxrl_frag.recipes``, by name, not loaded; a name of a shipped recipe is left out,
    and of two packages declaring one name the first found is kept."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for entry_point in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        if entry_point.name not in RECIPES:
            found.setdefault(entry_point.name, entry_point)
    return found


def names() -> list[str]:
    """Every recipe's name: the shipped ones, then the plugins'."""
    return [*RECIPES, *plugins()]


def get(name: str) -> type:
    """The recipe called ``name``: a shipped one, or a plugin's, loaded.

    Raises:
        ConfigError: For an unknown name, or a plugin that fails to load or does not
            name an algorithm class with the recipe interface (naming its entry point).
    """
    if name in RECIPES:
        return RECIPES[name]
    check(name in plugins(), "recipe", name, f"unknown recipe; the recipes are {', '.join(names())}")
    entry_point = plugins()[name]
    recipe = load_plugin(entry_point, "recipe", name)
    if not (isinstance(recipe, type) and dataclasses.is_dataclass(recipe) and callable(getattr(recipe, "create", None))
            and callable(getattr(recipe, "fields", None))):
        raise ConfigError("recipe", name, f"its plugin's {describe_entry_point(entry_point)} names {recipe!r}, not an "
                                          "algorithm class with create(env_id, **settings) and fields() (see Recipe)")
    return recipe


__all__ = ["A2C", "DQN", "IMPALA", "IPPO", "MAPPO", "PPO", "PQN", "PQNVDN", "RECIPES", "SAC", "get", "names", "plugins"]
