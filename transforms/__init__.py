"""Generic program rewrites over an algorithm's step."""

from jaxrl_frag.transforms.chunking import run_chunk

__all__ = ["run_chunk"]
