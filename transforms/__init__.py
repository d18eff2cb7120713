"""Algorithm -> Algorithm rewrites: populations, adaptive actor boosting; and the
transfer encodings (precision, packing) that policies apply to what crosses devices."""

from jaxrl_frag.transforms.population import Failure, Population

__all__ = ["Failure", "Population"]
