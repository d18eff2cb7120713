"""Distribution policies over device meshes, one file each; ``POLICIES`` by the name
the command line's ``--policy`` gives them."""

from jaxrl_frag.policy import Policy, SingleDevice
from jaxrl_frag.primitives import Shared
from jaxrl_frag.sharding.actor_learner import ActorLearner
from jaxrl_frag.sharding.data_parallel import DataParallel
from jaxrl_frag.sharding.mesh import make_mesh
from jaxrl_frag.sharding.population import PopulationParallel

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (SingleDevice, DataParallel, PopulationParallel, ActorLearner)}

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

    return [name for name, cls in POLICIES.items() if fits(cls)]


__all__ = ["POLICIES", "POPULATIONS", "ActorLearner", "DataParallel", "Policy", "PopulationParallel", "Shared", "SingleDevice",
           "make_mesh", "running", "runs"]
