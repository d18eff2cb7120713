"""Distribution policies over device meshes."""

from jaxrl_frag.sharding.policy import ActorLearner, DataParallel, Policy, Population, Shared, SingleDevice, make_mesh

__all__ = ["ActorLearner", "DataParallel", "Policy", "Population", "Shared", "SingleDevice", "make_mesh"]
