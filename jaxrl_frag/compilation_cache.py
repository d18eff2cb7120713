"""XLA's persistent compilation cache, where ``compile`` keeps its programs: a second
compilation of the same program (in a new process too) reads it back instead of compiling,
from Python as from the command line."""

from __future__ import annotations

import os
from pathlib import Path

import jax


def compilation_cache_dir() -> Path:
    """Where compiled programs are kept: ``$JAXRL_FRAG_CACHE_DIR``, else ``jaxrl_frag/xla``
    in the user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    if os.environ.get("JAXRL_FRAG_CACHE_DIR"):
        return Path(os.environ["JAXRL_FRAG_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    user_cache = Path(xdg) if Path(xdg).is_absolute() else Path.home() / ".cache"  # a relative one is ignored, as the spec says
    return user_cache / "jaxrl_frag" / "xla"


def use_compilation_cache() -> None:
    """Keep and read back this process's compiled programs in ``compilation_cache_dir()``
    (each that took at least half a second to compile), unless the process has chosen a
    directory of its own for JAX's cache (``jax_compilation_cache_dir``, or
    ``$JAX_COMPILATION_CACHE_DIR``), which then stands with its settings. JAX's
    ``jax_enable_compilation_cache`` set false turns the cache off either way."""
    if jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", str(compilation_cache_dir()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
