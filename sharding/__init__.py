"""Distribution policies over device meshes, one file each; ``POLICIES`` by the name
the command line's ``--policy`` gives them."""

from jaxrl_frag.policy import Policy, SingleDevice
from jaxrl_frag.primitives import Shared
from jaxrl_frag.sharding.actor_learner import ActorLearner
from jaxrl_frag.sharding.data_parallel import DataParallel
from jaxrl_frag.sharding.mesh import make_mesh
from jaxrl_frag.sharding.population import PopulationParallel

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (SingleDevice, DataParallel, PopulationParallel, ActorLearner)}

__all__ = ["POLICIES", "ActorLearner", "DataParallel", "Policy", "PopulationParallel", "Shared", "SingleDevice",
           "make_mesh"]
