"""``Population``: many members of one algorithm, trained as one program.

Members share the algorithm's static fields (shapes, counts: one program) and
differ in seed and in any traced hyperparameter, stacked on a leading axis and
``vmap``-ped over. A distribution policy may split that axis over devices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_frag import primitives
from jaxrl_frag.algorithms import Algorithm, Metrics, static_field
from jaxrl_frag.errors import ConfigError, check

PyTree = Any


@struct.dataclass
class Population(Algorithm):
    """``members`` (one algorithm whose traced leaves carry a leading member axis),
    each started from its own ``seeds[i]``: member ``i`` is the run
    ``compile(algorithms[i]).run(jax.random.PRNGKey(seeds[i]))``, to float tolerance."""

    members: Algorithm
    seeds: jax.Array
    size: int = static_field()

    @classmethod
    def of(cls, algorithms: Sequence[Algorithm], seeds: Sequence[int]) -> Population:
        """A population of ``algorithms[i]`` started from ``seeds[i]``."""
        check(len(algorithms) == len(seeds) and len(seeds) > 0, "seeds", list(seeds),
              f"give one seed per member ({len(algorithms)} members)")
        first = algorithms[0]
        env = getattr(first, "env", None)
        check(env is None or env.capabilities.traceable, "env", getattr(env, "name", None),
              "steps outside the compiled program, so a population (one vmapped program) cannot hold copies of it: "
              "train the members as separate runs, or use a JAX environment")
        for other in algorithms[1:]:
            if jax.tree.structure(other) != jax.tree.structure(first):
                field = _differing_static_field(first, other)
                raise ConfigError(
                    field, [getattr(a, field, None) for a in algorithms],
                    "is a static field (a shape or count) and must be the same for every member of one population, "
                    "which is one compiled program; sweep it with separate runs",
                )
        members = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *algorithms)
        return cls(members, jnp.asarray(seeds, jnp.uint32), len(seeds))

    @property
    def steps_per_iteration(self) -> int:
        """Environment steps of one member per iteration (rows of metrics are per member)."""
        return self.members.steps_per_iteration

    @property
    def num_iterations(self) -> int | None:
        return self.members.num_iterations

    @property
    def iterations_vary(self) -> bool:
        return self.members.iterations_vary

    @property
    def named_axes(self) -> Mapping[str, Mapping[str, int]]:
        """The members' (counted after the member axis, as a population policy places them)."""
        return self.members.named_axes

    def init(self, key: jax.Array) -> PyTree:
        """Every member's initial state from its own seed (``key`` is not used)."""
        del key
        keys = jax.vmap(jax.random.PRNGKey)(self.seeds)
        return self._vmap(lambda member, k: member.init(k))(self.members, keys)

    def step(self, state: PyTree) -> tuple[PyTree, Metrics]:
        """Every member's step, ``vmap``-ped: metrics get a leading member axis."""
        return self._vmap(lambda member, s: member.step(s))(self.members, state)

    def finished(self, state: PyTree) -> jax.Array:
        """Whether every member is finished (those finished first idle until then)."""
        return self._vmap(lambda member, s: member.finished(s))(self.members, state).all()

    def _vmap(self, fn: Any) -> Any:
        # with a population mesh axis, constraints inside the members keep it on the member axis
        return jax.vmap(fn, spmd_axis_name=primitives.current().population_axis)

    def config(self) -> dict[str, Any]:
        """The member count, the seeds and the members' configuration (hyperparameters as lists)."""
        return {"members": self.size, "seeds": [int(s) for s in self.seeds], **self.members.config()}


def _differing_static_field(a: Algorithm, b: Algorithm) -> str:
    """The static field that differs, a setting (``num_envs``) before an object built from one (``env``)."""
    differing = [f.name for f in dataclasses.fields(a)  # type: ignore[arg-type]
                 if not f.metadata.get("pytree_node", True) and getattr(a, f.name) != getattr(b, f.name)]
    settings = [name for name in differing if isinstance(getattr(a, name), int | float | str | bool | tuple)]
    return (settings or differing or ["algorithm"])[0]
