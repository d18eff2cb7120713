"""jaxrl_frag: RL algorithms written once as fragments, compiled whole, distributed by policy."""

from jaxrl_frag import envs, primitives, recipes, sharding, transforms
from jaxrl_frag.algorithm import Algorithm, algorithm, hyperparameter, static_field
from jaxrl_frag.errors import ConfigError
from jaxrl_frag.fragment import Fragment, fragment
from jaxrl_frag.graph import FragmentGraph
from jaxrl_frag.primitives import batch_moments, minibatches, standardize
from jaxrl_frag.program import Explanation, History, Program, compile  # noqa: A004

__all__ = [
    "Algorithm", "ConfigError", "Explanation", "Fragment", "FragmentGraph", "History", "Program",
    "algorithm", "batch_moments", "compile", "envs", "fragment", "hyperparameter", "minibatches",
    "primitives", "recipes", "sharding", "standardize", "static_field", "transforms",
]
