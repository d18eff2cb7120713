"""Distribution policies over device meshes."""

from jaxrl_frag.sharding.policy import DataParallel, Policy, Population, Shared, SingleDevice, make_mesh

__all__ = ["DataParallel", "Policy", "Population", "Shared", "SingleDevice", "make_mesh"]
