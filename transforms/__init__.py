"""Generic program rewrites over an algorithm's step."""

from jaxrl_frag.transforms.chunking import run_chunk, run_chunks

__all__ = ["run_chunk", "run_chunks"]
