"""Algorithm -> Algorithm rewrites: populations, adaptive actor boosting, evaluation
during training; and the transfer encodings (precision, packing) that policies apply to
what crosses devices.

Installed packages add transforms in the entry-point group ``jaxrl_frag.transforms``
(``PLUGIN_GROUP``): an entry point ``name = "module:Class"`` names a
``jaxrl_frag.algorithms.Wrapper`` dataclass whose ``name`` is ``name``, with a
classmethod ``create(algorithm, **settings)``; its fields with a ``help`` in their
metadata are its settings, the command line's ``--NAME-SETTING`` once a run asks for it
with ``--transform NAME``. ``get`` loads one by name, ``plugins_loaded`` every one that loads.
"""

import dataclasses
import functools
import importlib.metadata

from jaxrl_frag.algorithms import Wrapper
from jaxrl_frag.plugins import declared, loading, named
from jaxrl_frag.transforms.population import Failure, Population

PLUGIN_GROUP = "jaxrl_frag.transforms"


@functools.cache
def plugins() -> dict[str, importlib.metadata.EntryPoint]:
    """The transforms that installed packages declare in ``PLUGIN_GROUP``, by name, not loaded."""
    return declared(PLUGIN_GROUP, lambda _: False)


def get(name: str) -> type[Wrapper]:
    """The plugin transform called ``name``, loaded; ``ConfigError`` for an unknown name, or a
    plugin that fails to load or names no ``Wrapper`` dataclass of that name with ``create``."""
    return named(name, "transform", {}, plugins(),
                 lambda found: (isinstance(found, type) and issubclass(found, Wrapper) and dataclasses.is_dataclass(found)
                                and getattr(found, "name", None) == name and callable(getattr(found, "create", None))),
                 f"a jaxrl_frag Wrapper dataclass whose name is {name!r}, with create(algorithm, **settings)")


def plugins_loaded() -> dict[str, type[Wrapper]]:
    """Every plugin transform that loads, by name."""
    return loading(plugins(), get)


__all__ = ["PLUGIN_GROUP", "Failure", "Population", "get", "plugins", "plugins_loaded"]
