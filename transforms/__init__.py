"""Generic program rewrites over an algorithm's step."""

from jaxrl_frag.transforms.chunking import Chunk, run_iterations
from jaxrl_frag.transforms.population import Population

__all__ = ["Chunk", "Population", "run_iterations"]
