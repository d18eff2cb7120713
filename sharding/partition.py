"""Split a traced training step at its fragment boundaries into an actor program and a
learner program (MSRL's fragmented dataflow graph, cut between device groups).

Every equation of the step's jaxpr is placed: ``actor`` fragments on the actor
side, every other fragment on the learner side, and glue with the latest
fragment it depends on. Glue that depends on no fragment (key splitting, say)
is computed by each side that needs it. Each state field is *owned* by the side
whose fragments compute it; a field no fragment touches (the random key) is
*shared*: each side keeps a copy and advances it identically.

What crosses per iteration:

- actor -> learner, *within* the iteration: the actor's results the learner
  consumes (the trajectory), and the actor-owned fields the learner reads;
- learner -> actor, *between* iterations: the learner-owned fields the actor
  reads (the parameters). ``ActorLearner``'s staleness is how many iterations
  old the actor's copy may be.

An actor fragment may not consume what the learner computes in the same
iteration: that would serialise the two groups, and is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from jax.extend import core as jcore

from jaxrl_frag.errors import ConfigError
from jaxrl_frag.graph import fragment_calls, output_ports

ACTOR, LEARNER = "actor", "learner"
_ORDER = {None: 0, ACTOR: 1, LEARNER: 2}


@dataclasses.dataclass(frozen=True)
class Crossing:
    """A value that crosses from the actor to the learner every iteration."""

    name: str  # "actor.rollout.traj", "state.obs"
    aval: Any
    batch_axis: int | None


@dataclasses.dataclass
class StepSplit:
    """The two sides of a step ``(algorithm, state) -> (state, metrics)``.

    ``actor(alg, held, lagged) -> (held, crossing, metrics)`` and
    ``learner(alg, held, crossing) -> (held, metrics)`` take and return flat lists;
    ``*_held`` are the state leaf indices each side keeps (shared ones on both),
    ``lagged`` the learner-owned leaves the actor reads, in that order.
    """

    actor: Callable[..., tuple[list[Any], list[Any], list[Any]]]
    learner: Callable[..., tuple[list[Any], list[Any]]]
    actor_held: list[int]
    learner_held: list[int]
    lagged: list[int]
    crossing: list[Crossing]
    actor_metrics: list[str]
    learner_metrics: list[str]


def split_step(closed: Any, num_alg: int, fields: Sequence[str], batch_axes: dict[str, int],
               metric_names: Sequence[str]) -> StepSplit:
    """Split ``closed = jax.make_jaxpr(step)(algorithm, state)``: its first ``num_alg``
    inputs are the algorithm's leaves, then one per state leaf (``fields`` names each
    leaf's top-level state field, ``batch_axes`` the environment-batched fields); its
    outputs are the state leaves, then the metrics named ``metric_names``."""
    jaxpr = closed.jaxpr
    alg_in, state_in = jaxpr.invars[:num_alg], jaxpr.invars[num_alg:]
    state_out, metric_out = jaxpr.outvars[: len(state_in)], jaxpr.outvars[len(state_in):]
    side_of_eqn, var_side, names, axes = _place(jaxpr)
    for i, v in enumerate(state_in):
        names[v], axes[v] = f"state.{fields[i]}", batch_axes.get(fields[i])

    owner = _owners(jaxpr, state_in, state_out, var_side, side_of_eqn)
    learner_held = [i for i, o in enumerate(owner) if o != ACTOR]
    learner_metrics = [i for i, v in enumerate(metric_out) if _side(var_side, v) != ACTOR]
    learner_targets = [state_out[i] for i in learner_held] + [metric_out[i] for i in learner_metrics]
    learner_eqns, learner_needs, foreign = _slice(jaxpr, learner_targets, LEARNER, side_of_eqn)
    crossing_vars = foreign + [v for i, v in enumerate(state_in) if owner[i] == ACTOR and v in learner_needs]

    actor_metrics = [i for i in range(len(metric_out)) if i not in learner_metrics]
    actor_held = [i for i, o in enumerate(owner) if o == ACTOR]
    while True:  # the shared fields the actor reads, and those their updates read
        targets = ([state_out[i] for i in actor_held] + list(crossing_vars) + [metric_out[i] for i in actor_metrics])
        actor_eqns, actor_needs, from_learner = _slice(jaxpr, targets, ACTOR, side_of_eqn)
        assert not from_learner, "actor-side values never depend on the learner's (checked in _place)"
        more = [i for i, v in enumerate(state_in) if owner[i] is None and v in actor_needs and i not in actor_held]
        if not more:
            break
        actor_held = sorted(actor_held + more)
    lagged = [i for i, v in enumerate(state_in) if owner[i] == LEARNER and v in actor_needs]

    def build(eqns: list[Any], inputs: list[Any], outputs: list[Any]) -> Callable[..., list[Any]]:
        effects = frozenset().union(*(e.effects for e in eqns))
        sub = jcore.Jaxpr(jaxpr.constvars, inputs, outputs, eqns, effects, jaxpr.debug_info.with_unknown_names())
        return jcore.jaxpr_as_fun(jcore.ClosedJaxpr(sub, closed.consts))

    actor_fn = build(actor_eqns, [*alg_in, *(state_in[i] for i in actor_held), *(state_in[i] for i in lagged)],
                     [*(state_out[i] for i in actor_held), *crossing_vars, *(metric_out[i] for i in actor_metrics)])
    learner_fn = build(learner_eqns, [*alg_in, *(state_in[i] for i in learner_held), *crossing_vars],
                       [*(state_out[i] for i in learner_held), *(metric_out[i] for i in learner_metrics)])
    n_held, n_cross = len(actor_held), len(crossing_vars)

    def actor(alg: list[Any], held: list[Any], lagged_values: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        out = actor_fn(*alg, *held, *lagged_values)
        return out[:n_held], out[n_held: n_held + n_cross], out[n_held + n_cross:]

    def learner(alg: list[Any], held: list[Any], crossing: list[Any]) -> tuple[list[Any], list[Any]]:
        out = learner_fn(*alg, *held, *crossing)
        return out[: len(learner_held)], out[len(learner_held):]

    return StepSplit(
        actor, learner, actor_held, learner_held, lagged,
        [Crossing(names.get(v, "glue value"), v.aval, axes.get(v)) for v in crossing_vars],
        [metric_names[i] for i in actor_metrics], [metric_names[i] for i in learner_metrics],
    )


def _side(var_side: dict[Any, str | None], atom: Any) -> str | None:
    return None if isinstance(atom, jcore.Literal) else var_side.get(atom)


def _place(jaxpr: Any) -> tuple[dict[int, str | None], dict[Any, str | None], dict[Any, str], dict[Any, int | None]]:
    """The side of every equation (by ``id``) and of every value, and the names and
    batch axes of fragment results."""
    side_of_eqn: dict[int, str | None] = {}
    var_side: dict[Any, str | None] = {}
    names: dict[Any, str] = {}
    axes: dict[Any, int | None] = {}
    for eqn, frag in fragment_calls(jaxpr):
        inputs = [_side(var_side, v) for v in eqn.invars]
        if frag is None:
            side = max(inputs, key=_ORDER.__getitem__, default=None)
        else:
            side = ACTOR if frag.role == ACTOR else LEARNER
            if side == ACTOR and LEARNER in inputs:
                raise ConfigError(
                    "policy", "ActorLearner",
                    f"fragment {frag.node_name} consumes a value that a learner-side fragment computes in the same "
                    "iteration, so actors and learners could never overlap; let the actor read only the training "
                    "state, or use DataParallel",
                )
            for v, port in zip(eqn.outvars, output_ports(eqn, frag), strict=True):
                names[v], axes[v] = f"{frag.node_name}.{port}", frag.batch_axis(port)
        side_of_eqn[id(eqn)] = side
        for v in eqn.outvars:
            var_side[v] = side
    return side_of_eqn, var_side, names, axes


def _owners(jaxpr: Any, state_in: list[Any], state_out: list[Any], var_side: dict[Any, str | None],
            side_of_eqn: dict[int, str | None]) -> list[str | None]:
    """Each state leaf's owner: the side whose fragments compute it; a leaf computed from
    the incoming state alone belongs to the owner of the leaves it reads, and is shared
    (``None``) when those are shared too."""
    owner = [_side(var_side, v) for v in state_out]
    reads = [_slice(jaxpr, [v], None, side_of_eqn)[1] for v in state_out]
    changed = True
    while changed:
        changed = False
        for i, o in enumerate(owner):
            if o is None:
                found = [owner[j] for j, v in enumerate(state_in) if v in reads[i] and owner[j] is not None]
                if found:
                    owner[i], changed = max(found, key=_ORDER.__getitem__), True
    return owner


def _slice(jaxpr: Any, targets: list[Any], side: str | None,
           side_of_eqn: dict[int, str | None]) -> tuple[list[Any], set[Any], list[Any]]:
    """The equations that compute ``targets`` on ``side``: its own and the fragment-free
    glue, in order; every value they read; and the values computed by the other side
    that they need (which must cross). ``side=None`` follows fragment-free glue only."""
    needed = {v for v in targets if not isinstance(v, jcore.Literal)}
    picked, foreign = [], []
    for eqn in reversed(jaxpr.eqns):
        wanted = [v for v in eqn.outvars if v in needed]
        if not wanted:
            continue
        if side_of_eqn[id(eqn)] in (side, None):
            picked.append(eqn)
            needed.update(v for v in eqn.invars if not isinstance(v, jcore.Literal))
        else:
            foreign.extend(v for v in wanted if v not in foreign)
    picked.reverse()
    return picked, needed, foreign[::-1]
