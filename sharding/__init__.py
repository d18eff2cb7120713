"""Distribution policies over device meshes, one file each; ``POLICIES`` (the shipped
ones) by the name the command line's ``--policy`` gives them. Installed packages add
theirs in the entry-point group ``jaxrl_frag.policies`` (``PLUGIN_GROUP``): an entry
point ``name = "module:Class"`` names a ``Policy`` dataclass whose ``name`` is ``name``;
its fields with a ``help`` in their metadata are its command-line settings. ``get``
loads one by name, ``policies`` every one that loads."""

import dataclasses
import functools
import importlib.metadata

from jaxrl_frag.plugins import declared, loading, named
from jaxrl_frag.policy import Policy, SingleDevice
from jaxrl_frag.primitives import Shared
from jaxrl_frag.sharding.actor_learner import ActorLearner
from jaxrl_frag.sharding.data_parallel import DataParallel
from jaxrl_frag.sharding.mesh import make_mesh
from jaxrl_frag.sharding.population import PopulationParallel

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (SingleDevice, DataParallel, PopulationParallel, ActorLearner)}
PLUGIN_GROUP = "jaxrl_frag.policies"


@functools.cache
def plugins() -> dict[str, importlib.metadata.EntryPoint]:
    """The policies that installed packages declare in ``PLUGIN_GROUP``, by name, not
    loaded; a shipped policy's name is left out."""
    return declared(PLUGIN_GROUP, POLICIES.__contains__)


def names() -> list[str]:
    """Every policy's name: the shipped ones, then the plugins'."""
    return [*POLICIES, *plugins()]


def get(name: str) -> type[Policy]:
    """The policy called ``name``, a plugin's loaded; ``ConfigError`` for an unknown name, or
    a plugin that fails to load or names no ``Policy`` dataclass of that name."""
    return named(name, "policy", POLICIES, plugins(),
                 lambda found: (isinstance(found, type) and issubclass(found, Policy)
                                and dataclasses.is_dataclass(found) and getattr(found, "name", None) == name),
                 f"a jaxrl_frag Policy dataclass whose name is {name!r}")


def policies() -> dict[str, type[Policy]]:
    """Every policy that loads, by name: the shipped ones, then the plugins'."""
    return loading(names(), get)


# What a policy declares it runs, as class attributes (one that declares neither runs what ``SingleDevice`` runs:
# one algorithm or a population, boosted or not):
# ``populations``: "refused" (one algorithm only), "allowed", or "required" (a population only: it places members);
# ``boosts``: whether it runs a boosted algorithm (``transforms.boost``: rounds on slices of one environment pool).
POPULATIONS = ("refused", "allowed", "required")


def runs(policy: type[Policy] | Policy) -> dict[str, object]:
    """What ``policy`` (a class or an instance) declares it runs: ``populations`` (one of
    ``POPULATIONS``) and ``boosts``."""
    populations = getattr(policy, "populations", "allowed")
    if populations not in POPULATIONS:
        raise TypeError(f"{getattr(policy, 'name', policy)}.populations={populations!r}: one of {', '.join(POPULATIONS)}")
    return {"populations": populations, "boosts": bool(getattr(policy, "boosts", True))}


def running(what: str, value: object) -> list[str]:
    """The names of the policies that declare ``what`` (``runs``) as ``value`` or, for
    ``populations``, a population (``value`` ``True``) or one algorithm (``False``)."""
    def fits(cls: type[Policy]) -> bool:
        declared = runs(cls)[what]
        if what == "populations" and isinstance(value, bool):
            return declared != ("refused" if value else "required")
        return declared == value

    return [name for name, cls in policies().items() if fits(cls)]


__all__ = ["PLUGIN_GROUP", "POLICIES", "POPULATIONS", "ActorLearner", "DataParallel", "Policy", "PopulationParallel",
           "Shared", "SingleDevice", "get", "make_mesh", "names", "plugins", "policies", "running", "runs"]
