"""Generic program rewrites over an algorithm's step."""

from jaxrl_frag.transforms.chunking import run_chunk, run_chunks
from jaxrl_frag.transforms.population import Population

__all__ = ["Population", "run_chunk", "run_chunks"]
