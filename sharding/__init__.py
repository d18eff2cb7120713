"""Distribution policies over device meshes."""

from jaxrl_frag.sharding.policy import Policy, SingleDevice

__all__ = ["Policy", "SingleDevice"]
