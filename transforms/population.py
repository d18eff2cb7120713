"""``Population``: many members of one algorithm, trained as one program.

Members share the algorithm's static fields (shapes, counts: one program) and
differ in seed and in any traced hyperparameter, stacked on a leading axis and
``vmap``-ped over. A distribution policy may split that axis over devices.

A member whose step gives a NaN or an infinity *fails*: it keeps its last finite
state while the others train on, untouched, and the run stops (as a single
algorithm's does) only once every member has failed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_frag import primitives
from jaxrl_frag.algorithms import Algorithm, Flags, Metrics, Wrapper, field_name, finite_flags, plain, static_field
from jaxrl_frag.errors import ConfigError, check

PyTree = Any
# the metric counting, per member and row, the iterations whose step the member failed
FAILED = "failed_count"


@dataclasses.dataclass(frozen=True)
class Failure:
    """A member that went non-finite: its index, seed and ``setting`` (the hyperparameters
    that tell it from the other members), and the first ``iteration`` whose step gave it a
    NaN or an infinity; its state stays that of the iteration before."""

    member: int
    seed: int
    setting: dict[str, Any]
    iteration: int

    def __str__(self) -> str:
        told = [f"seed {self.seed}", *(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in self.setting.items())]
        return f"member {self.member} ({', '.join(told)}) went non-finite at iteration {self.iteration}"


@struct.dataclass
class Population(Wrapper):
    """``members`` (one algorithm whose traced leaves carry a leading member axis),
    each started from its own ``seeds[i]``: member ``i`` is the run
    ``compile(algorithms[i]).run(jax.random.PRNGKey(seeds[i]))``, to float tolerance."""

    members: Algorithm
    seeds: jax.Array
    size: int = static_field()

    # its state leads with a member axis: a policy places it only where it declares it runs populations
    # (``sharding.runs``)
    population: ClassVar[bool] = True

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
    def inner(self) -> Algorithm:
        """The members, stacked: their steps, iterations and named axes are one member's (rows
        of metrics are per member; named axes are counted after the member axis, as a
        population policy places them)."""
        return self.members

    def unwrap(self, state: PyTree, member: int | None = None) -> tuple[Algorithm, PyTree]:
        """Member ``member`` and its state."""
        check(member is not None, "member", member, f"name one of the population's {self.size} members")
        return jax.tree.map(lambda x: x[member], (self.members, state))

    def init(self, key: jax.Array) -> PyTree:
        """Every member's initial state from its own seed (``key`` is not used)."""
        del key
        keys = jax.vmap(jax.random.PRNGKey)(self.seeds)
        return self._vmap(lambda member, k: member.init(k))(self.members, keys)

    def step(self, state: PyTree) -> tuple[PyTree, Metrics]:
        """Every member's step, ``vmap``-ped: metrics get a leading member axis."""
        return self._vmap(lambda member, s: member.step(s))(self.members, state)

    def checked_step(self, state: PyTree) -> tuple[PyTree, Metrics, Flags]:
        """``step`` as a run takes it. A member whose new state or metrics hold a NaN or an
        infinity (one reduction per member) keeps its state, so every later step fails it
        again (a step is a pure function of the state); its metrics are NaN and
        ``failed_count`` counts the iteration. The other members' values pass through
        unchanged. The flags (``finite_flags``'s) stay set while any member steps finitely."""
        new, metrics = self.step(state)
        flags = self._vmap(lambda member, s, m: finite_flags(s, m, member.finite_part))(self.members, new, metrics)
        ok = functools.reduce(jnp.logical_and, flags.values(), jnp.ones(self.size, bool))

        def where_ok(value: jax.Array, otherwise: jax.Array | float) -> jax.Array:
            return jnp.where(ok.reshape(-1, *[1] * (value.ndim - 1)), value, otherwise)

        metrics = {k: where_ok(v, jnp.nan) for k, v in metrics.items()}
        return (jax.tree.map(where_ok, new, state), {**metrics, FAILED: (~ok).astype(jnp.float32)},
                {name: ok.any() | flag.all() for name, flag in flags.items()})

    def resumed(self, state: PyTree) -> PyTree:
        """Every member's restored state as the member resumes it (``Algorithm.resumed``)."""
        return self._vmap(lambda member, s: member.resumed(s))(self.members, state)

    def finished(self, state: PyTree) -> jax.Array:
        """Whether every member is finished (those finished first idle until then)."""
        return self._vmap(lambda member, s: member.finished(s))(self.members, state).all()

    def _vmap(self, fn: Any) -> Any:
        # with a population mesh axis, constraints inside the members keep it on the member axis
        return jax.vmap(fn, spmd_axis_name=primitives.current().spmd_axis_name)

    def setting(self, member: int) -> dict[str, Any]:
        """The hyperparameters (traced fields) whose values tell member ``member`` from the
        others, by name."""
        return {".".join(field_name(k) for k in path): plain(values[member])
                for path, values in jax.tree_util.tree_leaves_with_path(jax.tree.map(np.asarray, self.members))
                if (values != values[:1]).any()}

    def failures(self, rows: Iterable[Mapping[str, Any]]) -> list[Failure]:
        """The members that failed in a run of this population, from its rows
        (``History.rows``, from the first): by member index."""
        first: dict[int, int] = {}
        for row in rows:
            failed = np.atleast_1d(np.asarray(row.get(FAILED, 0)))  # none in rows saved before failures were counted
            for i in np.flatnonzero(failed):  # the row's last failed[i] iterations failed member i
                first.setdefault(int(i), int(row["iteration"] - failed[i]) + 1)
        return [Failure(i, int(self.seeds[i]), self.setting(i), iteration) for i, iteration in sorted(first.items())]

    def config(self) -> dict[str, Any]:
        """The member count, the seeds and the members' configuration (hyperparameters as lists)."""
        return {"members": self.size, "seeds": [int(s) for s in self.seeds], **self.members.config()}


def _differing_static_field(a: Algorithm, b: Algorithm) -> str:
    """The static field that differs, a setting (``num_envs``) before an object built from one (``env``)."""
    differing = [f.name for f in dataclasses.fields(a)  # type: ignore[arg-type]
                 if not f.metadata.get("pytree_node", True) and getattr(a, f.name) != getattr(b, f.name)]
    settings = [name for name in differing if isinstance(getattr(a, name), int | float | str | bool | tuple)]
    return (settings or differing or ["algorithm"])[0]
