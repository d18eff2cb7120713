"""XLA's persistent compilation cache, where a run keeps its compiled programs: a second
run of the same program (in a new process too) reads them back instead of compiling."""

from __future__ import annotations

import os
from pathlib import Path


def compilation_cache_dir() -> Path:
    """Where runs keep XLA's compiled programs: ``$JAXRL_FRAG_CACHE_DIR``, else
    ``jaxrl_frag/xla`` in the user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    if os.environ.get("JAXRL_FRAG_CACHE_DIR"):
        return Path(os.environ["JAXRL_FRAG_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    user_cache = Path(xdg) if Path(xdg).is_absolute() else Path.home() / ".cache"  # a relative one is ignored, as the spec says
    return user_cache / "jaxrl_frag" / "xla"


def enable_compilation_cache() -> None:
    """Keep and read back this process's compiled programs in ``compilation_cache_dir()``
    (each that took at least half a second to compile)."""
    import jax

    cache = str(compilation_cache_dir())
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
