"""jaxrl_frag: RL algorithms written once as fragments, compiled whole, distributed by policy.

Names load on first use, so that importing the package (the command line does)
initialises no jax backend: device counts can still be set after it.

Importing it also sets two XLA CPU flags, each unless ``XLA_FLAGS`` already sets it,
because without them vmapped programs (a population, many seeds) can wedge, the
run waiting forever with every thread idle: ``--xla_cpu_multi_thread_eigen=false``
(single-threaded Eigen costs nothing measurable at RL network sizes) and
``--xla_cpu_enable_concurrency_optimized_scheduler=false`` (a 4-member SAC
population stalled on every run without it and finished with it;
benchmarks/HISTORY.md). They take effect if no jax backend is running yet.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

for _flag in ("xla_cpu_multi_thread_eigen", "xla_cpu_enable_concurrency_optimized_scheduler"):
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --{_flag}=false").strip()

_EXPORTS = {
    "Algorithm": "jaxrl_frag.algorithms",
    "algorithm": "jaxrl_frag.algorithms",
    "hyperparameter": "jaxrl_frag.algorithms",
    "static_field": "jaxrl_frag.algorithms",
    "ConfigError": "jaxrl_frag.errors",
    "Fragment": "jaxrl_frag.fragments",
    "fragment": "jaxrl_frag.fragments",
    "FragmentGraph": "jaxrl_frag.graph",
    "batch_moments": "jaxrl_frag.primitives",
    "flatten_batch": "jaxrl_frag.primitives",
    "minibatches": "jaxrl_frag.primitives",
    "standardize": "jaxrl_frag.primitives",
    "Explanation": "jaxrl_frag.explanation",
    "History": "jaxrl_frag.program",
    "Program": "jaxrl_frag.program",
    "compile": "jaxrl_frag.program",
    "explain": "jaxrl_frag.program",
    "export_policy": "jaxrl_frag.app.evaluation",
    "load_policy": "jaxrl_frag.app.evaluation",
    "evaluate": "jaxrl_frag.app.evaluation",
    "restore": "jaxrl_frag.app.evaluation",
    "RunSpec": "jaxrl_frag.app.spec",
    "train": "jaxrl_frag.app.training",
    "resume": "jaxrl_frag.app.training",
}
_SUBPACKAGES = ("envs", "primitives", "recipes", "sharding", "transforms")

__all__ = sorted([*_EXPORTS, *_SUBPACKAGES])


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"jaxrl_frag.{name}")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'jaxrl_frag' has no attribute {name!r}")


if TYPE_CHECKING:
    from jaxrl_frag import envs, primitives, recipes, sharding, transforms  # noqa: F401
    from jaxrl_frag.algorithms import Algorithm, algorithm, hyperparameter, static_field  # noqa: F401
    from jaxrl_frag.app.evaluation import evaluate, export_policy, load_policy, restore  # noqa: F401
    from jaxrl_frag.app.spec import RunSpec  # noqa: F401
    from jaxrl_frag.app.training import resume, train  # noqa: F401
    from jaxrl_frag.errors import ConfigError  # noqa: F401
    from jaxrl_frag.explanation import Explanation  # noqa: F401
    from jaxrl_frag.fragments import Fragment, fragment  # noqa: F401
    from jaxrl_frag.graph import FragmentGraph  # noqa: F401
    from jaxrl_frag.primitives import batch_moments, flatten_batch, minibatches, standardize  # noqa: F401
    from jaxrl_frag.program import History, Program, compile, explain  # noqa: A004, F401
