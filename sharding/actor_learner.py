"""``ActorLearner``: actor and learner fragments on disjoint device groups. The step is
cut into an actor program and a learner program (``partition``), each compiled for its
device group, run as a two-stage pipeline.

Each iteration the actor program steps its environments and encodes what the
learner needs (the trajectory) in the transfer precision, packed into two byte
buffers; those move to the learner group; the learner program unpacks them,
updates the parameters and packs those the actor reads; they move back. Moves are
``jax.device_put`` between the groups' shardings: device-to-device copies, two per
direction whatever the number of arrays. Dispatch is asynchronous, so with staleness ``k >= 1``, where the actor
runs one iteration ahead, the host enqueues the actor's iteration ``t + 1`` and
the learner's iteration ``t`` back to back and both groups compute at once. The
schedule is fixed, never first-come-first-served, so runs are reproducible.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from jaxrl_frag import costs, primitives, tracing
from jaxrl_frag import metrics as metrics_lib
from jaxrl_frag.algorithms import Algorithm, field_name, finite_flags
from jaxrl_frag.chunking import Chunk
from jaxrl_frag.collectives import audit, summary
from jaxrl_frag.errors import check
from jaxrl_frag.explanation import Explanation, Transfer
from jaxrl_frag.graph import FragmentGraph, describe_aval
from jaxrl_frag.metrics import Metrics
from jaxrl_frag.policy import KEY_DATA, BatchAxes, NamedAxes, Policy, compile_together
from jaxrl_frag.sharding import partition
from jaxrl_frag.sharding.data_parallel import SHUFFLE_HELP, DataParallel
from jaxrl_frag.sharding.mesh import check_runs, device_groups, make_mesh, move
from jaxrl_frag.transforms import packing, precision
from jaxrl_frag.transforms.precision import TRANSFER_DTYPES, check_dtype

STALENESS_MAX = 1024  # copies of the parameters queued for the actors, at most
PyTree = Any
Buffers = tuple[jax.Array, ...]  # a channel's packed bytes: (batched, replicated), either one only if empty
Flags = dict[str, jax.Array]
_NEVER = np.iinfo(np.int32).max  # "no iteration went non-finite"


@dataclasses.dataclass(frozen=True)
class GroupLowering(primitives.Lowering):
    """The learner group's lowering, with the fragments of each role in ``roles`` lowered
    as their own device group's."""

    roles: tuple[tuple[str, primitives.Lowering], ...] = ()

    def for_role(self, role: str) -> primitives.Lowering:
        """The lowering of ``role``'s group, or the learner group's."""
        return dict(self.roles).get(role, self)


@dataclasses.dataclass(frozen=True)
class ActorLearner(Policy):
    """MSRL's multi-actor / single-learner placement (Podracer's Sebulba): the actor
    fragments run on ``actor_devices`` devices, every other fragment on a disjoint group
    of ``learner_devices`` devices, each group data-parallel over its devices. Across
    processes (``jaxrl_frag.distributed``) both counts are per process, cleanba's layout:
    each process's actors step its share of the environments and hand their trajectories
    to its own learner devices, and the learner group spans every process, its gradients
    all-reduced across them.

    The step is cut at its fragment boundaries into two programs (``partition``),
    compiled for the two groups and dispatched asynchronously on a fixed schedule.
    Each iteration the actor's results (the trajectory) move to the learner group, and
    the learner's parameters back to the actor group, as device-to-device copies, in
    ``transfer_dtype`` (``float32``, ``bfloat16``, or ``int8`` with a per-tensor scale;
    the receiver computes in float32). Narrowed are the parameters and the per-sample
    vectors of the trajectory (observations); its per-sample scalars (log-probabilities,
    values, rewards) stay float32: they are few bytes, and V-trace's importance ratios
    lose the return when they are rounded (benchmarks/HISTORY.md). With ``staleness=k`` the actor acts with the
    parameters of ``k`` updates before the learner's: ``k = 0`` runs the groups in
    turn and equals ``SingleDevice`` (float tolerance, ``exact`` shuffling, float32
    transfers); ``k >= 1`` overlaps acting and learning, the actor running one
    iteration ahead, deterministic for a given seed. The learner's ``shuffle`` is as in
    ``DataParallel``.
    """

    name: ClassVar[str] = "actor-learner"
    # one algorithm cut into actor and learner programs: no population, and no boosted run (its rungs change the
    # shapes that cross between the groups) (``sharding.runs``)
    populations: ClassVar[str] = "refused"
    boosts: ClassVar[bool] = False
    actor_devices: int = dataclasses.field(default=1, metadata={"help": "devices of the actor group (in each process)"})
    learner_devices: int = dataclasses.field(default=1, metadata={
        "help": "devices of the learner group (in each process), after the actor's"})
    staleness: int = dataclasses.field(default=1, metadata={
        "help": "updates the actors' parameters may lag the learner's; 0 runs actors and learner in turn (equals "
                "single-device)"})
    transfer_dtype: str = dataclasses.field(default="float32", metadata={
        "choices": TRANSFER_DTYPES, "help": "precision of trajectories and parameters crossing between the device "
                                            "groups; the learner computes in float32"})
    shuffle: str = dataclasses.field(default="local", metadata={"choices": primitives.SHUFFLES, "help": SHUFFLE_HELP})
    actor: DataParallel = dataclasses.field(init=False)
    learner: DataParallel = dataclasses.field(init=False)

    @classmethod
    def saved_like(cls, algorithm_like: PyTree, saved: Callable[[], PyTree]) -> PipelineState:
        """A ``PipelineState``: the algorithm's state as ``algorithm_like``, what was in
        flight between the groups as the checkpoint saved it, placed as the algorithm's
        first leaf is."""
        sharding = jax.tree.leaves(algorithm_like)[0].sharding
        tree = saved()

        def like(buffers: Any) -> tuple[jax.ShapeDtypeStruct, ...]:
            return tuple(jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=sharding) for x in buffers)

        return PipelineState(algorithm_like, like(tree["actor_shared"]), tuple(like(q) for q in tree["lagged"]),
                             like(tree.get("in_flight") or ()))

    @classmethod
    def algorithm_part(cls, restored: PipelineState) -> PyTree:
        return restored.state

    def __post_init__(self) -> None:
        for name in ("actor_devices", "learner_devices"):
            value = getattr(self, name)
            check(isinstance(value, int) and value > 0, name, value, "must be a positive device count")
        check(isinstance(self.staleness, int) and self.staleness >= 0, "staleness", self.staleness,
              "must be 0 (synchronous) or a positive number of updates the actor may lag")
        check(self.staleness <= STALENESS_MAX, "staleness", self.staleness,
              f"must be at most {STALENESS_MAX}: the actors' devices hold a copy of the parameters for every update "
              "they may lag")
        check_dtype(self.transfer_dtype)
        local = jax.local_devices()
        wanted = self.actor_devices + self.learner_devices
        check(wanted <= len(local), "devices", wanted,
              f"actor_devices + learner_devices must not exceed the {len(local)} {local[0].platform} device(s) "
              f"{'of each process ' if jax.process_count() > 1 else ''}(on CPU the command line forces that many "
              "host devices)")
        actor, learner = device_groups((self.actor_devices, self.learner_devices))
        object.__setattr__(self, "actor", DataParallel(mesh=make_mesh(actor, data=len(actor)), shuffle=self.shuffle))
        object.__setattr__(self, "learner", DataParallel(mesh=make_mesh(learner, data=len(learner)),
                                                         shuffle=self.shuffle))

    def shardings(self, state: PyTree, batch_axes: Callable[[], BatchAxes],
                  named_axes: NamedAxes) -> tuple[Sharding, PyTree]:
        """The learner group's placement; each group places its own fields (``pipeline``)."""
        return self.learner.shardings(state, batch_axes, named_axes)

    def lowering(self) -> primitives.Lowering:
        """The learner group's lowering, the actor fragments' their group's."""
        learner = self.learner.lowering()
        return GroupLowering(learner.mesh, learner.axis, learner.shuffle, roles=((partition.ACTOR, self.actor.lowering()),))

    def executor(self, algorithm: Algorithm, max_rows: int, check_finite: bool) -> ActorLearnerExecutor:
        """The actor and learner programs, run as a two-stage pipeline."""
        return ActorLearnerExecutor(algorithm, self, check_finite)

    @property
    def device_count(self) -> int:
        return self.actor.device_count + self.learner.device_count

    def describe(self) -> str:
        """Both groups' devices, the staleness, the transfer precision and the shuffling."""

        def ids(group: DataParallel) -> str:
            return ",".join(str(d.id) for d in group.mesh.devices.flat)

        platform = self.actor.mesh.devices.flat[0].platform
        return (f"ActorLearner: actor fragments on {self.actor.device_count} {platform} device(s) [{ids(self.actor)}], "
                f"learner fragments on {self.learner.device_count} [{ids(self.learner)}], each group data-parallel"
                f"{f' across {jax.process_count()} processes' if jax.process_count() > 1 else ''}; "
                f"staleness {self.staleness}, transfers in {self.transfer_dtype}, {self.shuffle} minibatch shuffling")



@struct.dataclass
class PipelineState:
    """A run's state under ``ActorLearner``.

    ``state`` is the algorithm's state, each field on the device group that owns it
    (fields both groups keep, such as the random key, as the learner's copy);
    ``actor_shared`` the actor's copies of those; ``lagged`` the parameters last sent
    to the actor, oldest first (``max(staleness, 1)`` of them); with staleness
    ``>= 1``, ``in_flight`` is the actor's output for the learner's next iteration (its
    trajectory, metrics and finite flags), already on the learner group. What crossed
    stays as it crossed: encoded and packed into ``(batched, replicated)`` byte buffers.
    """

    state: PyTree
    actor_shared: tuple[jax.Array, ...]
    lagged: tuple[Buffers, ...]
    in_flight: Buffers | tuple[()]


class ActorLearnerExecutor:
    """Compiles and runs the actor and learner programs of ``algorithm`` under ``policy``."""

    def __init__(self, algorithm: Algorithm, policy: ActorLearner, check_finite: bool):
        check_runs(policy, algorithm)
        self.algorithm, self.policy, self.staleness = algorithm, policy, policy.staleness
        # across processes on CPU the two programs run in turn: gloo's collectives of two programs running at once
        # (the actor group's and the learner group's, between the same processes) take each other's messages
        self._in_turn = jax.process_count() > 1 and policy.actor.mesh.devices.flat[0].platform == "cpu"
        rule = policy.lowering()
        self._step_fn = tracing.under(rule, tracing.step)
        self._shape = jax.eval_shape(tracing.under(rule, tracing.init), algorithm, KEY_DATA)
        with_paths, self._treedef = jax.tree_util.tree_flatten_with_path(self._shape)
        self._fields = [field_name(path[0]) for path, _ in with_paths]
        children, _ = jax.tree_util.tree_flatten_with_path(self._shape, is_leaf=lambda node: node is not self._shape)
        self._field_trees = {field_name(path[0]): jax.tree.structure(value) for path, value in children}
        self._avals = [leaf for _, leaf in with_paths]
        axes = self._split_step(check_finite)
        a_rep, a_tree = policy.actor.shardings(self._shape, lambda: axes, algorithm.named_axes)
        l_rep, l_tree = policy.learner.shardings(self._shape, lambda: axes, algorithm.named_axes)
        flight, lagged = self._channels()
        self._build(rule, flight, lagged, (a_rep, jax.tree.leaves(a_tree)), (l_rep, jax.tree.leaves(l_tree)))
        # across processes, Algorithm.resumed traced under the actor's rule on the whole state placed on the actor
        # group, where what a resumed run restarts (the environments) lives, so that it runs in every process
        self._on_actor = a_tree
        self._resumed_across = jax.jit(tracing.under(rule.for_role(partition.ACTOR), tracing.resumed),
                                       in_shardings=(a_rep, a_tree), out_shardings=a_tree)
        # placed once, not sent with every call; through jit, which takes Python scalars on every process alike
        # (device_put compares them across processes as float64 against float32 and refuses)
        self._alg_actor, self._alg_learner = (jax.jit(lambda alg: alg, out_shardings=rep)(algorithm)
                                              for rep in (a_rep, l_rep))
        self._lay_out_state(flight, lagged, jax.tree.leaves(a_tree), jax.tree.leaves(l_tree))

    def _split_step(self, check_finite: bool) -> BatchAxes:
        """Trace one iteration and split it at the fragment roles (``partition.split_step``);
        the metrics' shapes, the finiteness flags' names, and what the actor's part reports.
        Returns the state's batch axes."""
        traced = self.trace_step()
        axes = tracing.batch_axes(traced)
        self.metric_shapes = jax.eval_shape(self._step_fn, self.algorithm, self._shape)[1]
        split = partition.split_step(traced, len(jax.tree.leaves(self.algorithm)), self._fields, axes,
                                     sorted(self.metric_shapes))
        self._split, self._check_finite = split, check_finite
        self._shared = sorted(set(split.actor_held) & set(split.learner_held))
        self._flag_names = sorted(jax.eval_shape(finite_flags, self._shape, self.metric_shapes)) if check_finite else []
        _, _, self._actor_metrics, self._actor_flags = jax.eval_shape(
            self._act, self.algorithm, [self._avals[i] for i in split.actor_held],
            [self._avals[i] for i in split.lagged])
        return axes

    def _act(self, alg: Algorithm, held: list[Any], lagged: list[Any]) -> tuple[list[Any], list[Any], Metrics, Flags]:
        """The actor's part of an iteration: its fields, what crosses to the learner, its metrics and flags."""
        split = self._split
        held, crossing, metrics = split.actor(jax.tree.leaves(alg), held, lagged)
        metrics = dict(zip(split.actor_metrics, metrics, strict=True))
        flags = (finite_flags(self._by_field(split.actor_held, held), metrics, alg.finite_part)
                 if self._check_finite else {})
        return held, crossing, metrics, flags

    def _by_field(self, indices: Sequence[int], values: Sequence[Any]) -> dict[str, Any]:
        """The state fields whose leaves ``values`` (at ``indices``) are, each rebuilt, for
        ``finite_flags`` (a field's leaves are held together: its fragments read it whole)."""
        leaves: dict[str, list[Any]] = {}
        for i, value in zip(indices, values, strict=True):
            leaves.setdefault(self._fields[i], []).append(value)
        return {name: self._field_trees[name].unflatten(found) for name, found in leaves.items()}

    def _channels(self) -> tuple[_Channel, _Channel]:
        """What crosses from the actor to the learner each iteration (the trajectory, the
        actor's metrics and flags) and back (the lagged parameters), in the transfer dtype."""
        dtype, split = self.policy.transfer_dtype, self._split
        reported = len(self._actor_metrics) + len(self._actor_flags)
        # per-sample scalars of the trajectory (log-probabilities, values, rewards) stay float32: few
        # bytes, and the learner's importance ratios and targets are sensitive to them
        flight = _Channel(
            [*(c.aval for c in split.crossing), *self._actor_metrics.values(), *self._actor_flags.values()],
            [dtype if _narrowable(c) else "float32" for c in split.crossing] + ["float32"] * reported,
            [_batch_axis(c) for c in split.crossing] + [None] * reported)
        lagged_avals = [self._avals[i] for i in split.lagged]
        return flight, _Channel(lagged_avals, [dtype] * len(lagged_avals), [None] * len(lagged_avals))

    def _build(self, rule: primitives.Lowering, flight: _Channel, lagged: _Channel,
               actor: tuple[Sharding, list[Sharding]], learner: tuple[Sharding, list[Sharding]]) -> None:
        """The actor's and the learner's iteration and initialisation, each jitted on its
        group (``actor`` and ``learner``: the replicated sharding and every field's) for
        ``compile``, and the placements of what moves between the groups."""
        split, avals, actor_metrics, actor_flags = self._split, self._avals, self._actor_metrics, self._actor_flags
        (a_rep, a_leaf), (l_rep, l_leaf) = actor, learner
        a_held_sh, l_held_sh = [a_leaf[i] for i in split.actor_held], [l_leaf[i] for i in split.learner_held]

        def actor_call(alg: Algorithm, held: list[Any], parameters: Buffers) -> tuple[list[Any], Buffers]:
            held, crossing, metrics, flags = self._act(alg, held, lagged.receive(parameters))
            return held, flight.send([*crossing, *metrics.values(), *flags.values()])

        def learner_call(alg: Algorithm, held: list[Any], trajectory: Buffers, totals: Metrics,
                         health: tuple[jax.Array, Flags]) -> tuple[Any, ...]:
            values = flight.receive(trajectory)
            count, metric_count = len(split.crossing), len(actor_metrics)
            held, metrics = split.learner(jax.tree.leaves(alg), held, values[:count])
            metrics = {**dict(zip(actor_metrics, values[count: count + metric_count], strict=True)),
                       **dict(zip(split.learner_metrics, metrics, strict=True))}
            actor_ok = dict(zip(actor_flags, values[count + metric_count:], strict=True))
            flags = (finite_flags(self._by_field(split.learner_held, held), metrics, alg.finite_part)
                     if self._check_finite else {})
            iteration, first_bad = health
            first_bad = {n: jnp.where(actor_ok.get(n, True) & flags.get(n, True), first_bad[n],
                                      jnp.minimum(first_bad[n], iteration)) for n in first_bad}
            parameters = lagged.send([held[split.learner_held.index(i)] for i in split.lagged])
            return held, parameters, metrics_lib.accumulate(totals, metrics), (iteration + 1, first_bad)

        def actor_init(alg: Algorithm, key: jax.Array) -> list[Any]:
            flat = jax.tree.leaves(tracing.under(rule.for_role(partition.ACTOR), tracing.init)(alg, key))
            return [flat[i] for i in split.actor_held]

        def learner_init(alg: Algorithm, key: jax.Array) -> tuple[list[Any], Buffers]:
            flat = jax.tree.leaves(tracing.under(rule, tracing.init)(alg, key))
            return [flat[i] for i in split.learner_held], lagged.send([flat[i] for i in split.lagged])

        flight_a, flight_l = flight.shardings(self.policy.actor, a_rep), flight.shardings(self.policy.learner, l_rep)
        lagged_a, lagged_l = lagged.shardings(self.policy.actor, a_rep), lagged.shardings(self.policy.learner, l_rep)
        self._to_learner = functools.partial(move, targets=flight_l)
        self._to_actor = functools.partial(move, targets=lagged_a)
        self._zeros = jax.device_put({k: np.zeros(v.shape, np.float32) for k, v in self.metric_shapes.items()}, l_rep)
        self._to_totals = functools.partial(jax.device_put, device=l_rep)
        self._health = jax.device_put((np.int32(0), {n: np.int32(_NEVER) for n in self._flag_names}), l_rep)
        algorithm = self.algorithm
        # (program, its arguments' shapes, whether it runs once): the learner's, the actor's, then their inits
        self._jitted = (
            (jax.jit(learner_call, in_shardings=(l_rep, l_held_sh, flight_l, l_rep, l_rep),
                     out_shardings=(l_held_sh, lagged_l, l_rep, l_rep), donate_argnums=(1,)),
             (algorithm, [avals[i] for i in split.learner_held], flight.shapes(), self._zeros, self._health), False),
            (jax.jit(actor_call, in_shardings=(a_rep, a_held_sh, lagged_a), out_shardings=(a_held_sh, flight_a),
                     donate_argnums=(1,)), (algorithm, [avals[i] for i in split.actor_held], lagged.shapes()), False),
            (jax.jit(actor_init, in_shardings=(a_rep, a_rep), out_shardings=a_held_sh), (algorithm, KEY_DATA), True),
            (jax.jit(learner_init, in_shardings=(l_rep, l_rep), out_shardings=(l_held_sh, lagged_l)),
             (algorithm, KEY_DATA), True))
        self._learner = self._actor = self._actor_init = self._learner_init = None
        self._lagged_on_actor, self._flight_on_learner = lagged_a, flight_l

    def compile(self) -> None:
        """Lower and compile the four programs, each beside the others (``Executor.compile``)."""
        if self._learner is not None:
            return
        self._learner, self._actor, self._actor_init, self._learner_init = compile_together(
            *((program.lower(*args), run_once) for program, args, run_once in self._jitted))

    def _lay_out_state(self, flight: _Channel, lagged: _Channel, a_leaf: list[Sharding], l_leaf: list[Sharding]) -> None:
        """The pipeline state's shapes and shardings (each field on the group that owns it,
        the lagged parameters queued on the actor's, a trajectory in flight on the
        learner's), and the transfers ``explain`` reports."""
        split, avals, fields = self._split, self._avals, self._fields
        queue = max(self.staleness, 1)
        owned = [a_leaf[i] if i in split.actor_held and i not in self._shared else l_leaf[i] for i in range(len(avals))]
        self.state_shape = PipelineState(self._shape, tuple(avals[i] for i in self._shared), (lagged.shapes(),) * queue,
                                         flight.shapes() if self.staleness else ())
        self.state_sharding = PipelineState(self._treedef.unflatten(owned), tuple(a_leaf[i] for i in self._shared),
                                            (self._lagged_on_actor,) * queue,
                                            self._flight_on_learner if self.staleness else ())
        self._transfers = (
            _transfers("actor -> learner", [(c.name, c.aval, _narrowable(c)) for c in split.crossing])
            + _transfers("actor -> learner", [("actor metrics, flags", v, False)
                                              for v in (*self._actor_metrics.values(), *self._actor_flags.values())])
            + _transfers("learner -> actor", [(f"state.{fields[i]}", avals[i], True) for i in split.lagged],
                         carried=True))

    def trace_step(self) -> Any:
        return jax.make_jaxpr(self._step_fn)(self.algorithm, self._shape)

    def init(self, key: np.ndarray) -> PipelineState:
        """The algorithm's initial state on both groups; with staleness ``>= 1`` the actor's
        first iteration already run (with the initial parameters) and in flight."""
        actor = self._settled(self._actor_init(self._alg_actor, key))
        learner, lagged = self._settled(self._learner_init(self._alg_learner, key))
        queue = (self._to_actor(lagged),) * max(self.staleness, 1)
        in_flight: Any = ()
        if self.staleness:
            actor, out = self._settled(self._actor(self._alg_actor, actor, queue[0]))
            in_flight = self._to_learner(out)
        return self._pipeline_state(actor, learner, queue, in_flight)

    def call(self, state: PipelineState, chunk: Chunk, iterations: int, k: int, offset: int) -> tuple[
            PipelineState, Chunk, dict[str, Any], int, int, dict[str, bool]]:
        actor, learner = self._held(state)
        queue, flight, health = state.lagged, state.in_flight, self._health
        total, count, completed = self._to_totals(chunk.totals), int(chunk.count), []
        for i in range(iterations):
            actor, out = self._settled(self._actor(self._alg_actor, actor, queue[0]))
            if not self.staleness:  # the learner waits for this iteration's trajectory
                flight = self._to_learner(out)
            learner, lagged, total, health = self._settled(
                self._learner(self._alg_learner, learner, flight, total, health))
            if self.staleness:  # the actor ran one iteration ahead: its output is the learner's next
                flight = self._to_learner(out)
            queue = (*queue[1:], self._to_actor(lagged))
            count += 1
            if (offset + i + 1) % k == 0:
                completed.append((total, count))
                total, count = self._zeros, 0
        completed, (_, first_bad) = jax.device_get((completed, health))
        first = min(first_bad.values(), default=_NEVER)
        ran = iterations if first == _NEVER else int(first) + 1
        completed = completed[:(offset + ran) // k]  # those that ended by the last iteration run
        rows = {name: np.stack([metrics_lib.reduce(t, np.float32(c))[name] for t, c in completed]) if completed
                else np.zeros((0, *v.shape), np.float32) for name, v in self._zeros.items()}
        flags = {n: bool(first == _NEVER or v != first) for n, v in first_bad.items()}
        state = self._pipeline_state(actor, learner, queue, flight)
        return state, Chunk(total, np.int32(count)), rows, len(completed), ran, flags

    def _settled(self, outputs: Any) -> Any:
        """``outputs`` once computed where the programs run in turn, else at once."""
        return jax.block_until_ready(outputs) if self._in_turn else outputs

    def _pipeline_state(self, actor: Sequence[Any], learner: Sequence[Any], queue: tuple[Buffers, ...],
                        flight: Buffers | tuple[()]) -> PipelineState:
        """The state from what each group holds and what is in flight."""
        flat: list[Any] = [None] * self._treedef.num_leaves
        for i, value in zip(self._split.learner_held, learner, strict=True):
            flat[i] = value
        shared = []
        for i, value in zip(self._split.actor_held, actor, strict=True):
            if i in self._shared:
                shared.append(value)
            else:
                flat[i] = value
        return PipelineState(self._treedef.unflatten(flat), tuple(shared), tuple(queue), flight)

    def _held(self, state: PipelineState) -> tuple[list[Any], list[Any]]:
        """What the actor group and the learner group hold, in their programs' order."""
        flat = self._treedef.flatten_up_to(state.state)
        shared = dict(zip(self._shared, state.actor_shared, strict=True))
        return ([shared.get(i, flat[i]) for i in self._split.actor_held], [flat[i] for i in self._split.learner_held])

    def algorithm_state(self, state: PipelineState) -> PyTree:
        return state.state

    def resumed(self, state: PipelineState) -> PipelineState:
        """``Algorithm.resumed`` on the algorithm's state (what a recipe replaces there, its
        environment state and observations, the actor group holds alone); across processes
        run on the actor group, each field then back on the group that owns it."""
        if jax.process_count() == 1:
            return state.replace(state=jax.device_put(self.algorithm.resumed(state.state), self.state_sharding.state))
        on_actor = self._settled(self._resumed_across(self._alg_actor, move(state.state, self._on_actor)))
        return state.replace(state=move(on_actor, self.state_sharding.state))

    def explain(self, compile_seconds: dict[str, float]) -> Explanation:
        """Compiles the programs (their own figures are per iteration) where not yet done."""
        if self._learner is None:
            t0 = time.perf_counter()
            self.compile()
            compile_seconds = {**compile_seconds, "actor and learner programs": time.perf_counter() - t0}
        traced = self.trace_step()
        programs = {"actor program": self._actor, "learner program": self._learner}
        cost: dict[str, float] = {"flops": float(costs.flops(traced))}
        memory: dict[str, int] = {}
        for name, program in programs.items():
            cost |= costs.xla_cost(program, name)
            memory |= costs.xla_memory(program, name)
        audits = {name: audit(program.as_text()) for name, program in programs.items()}
        groups = {}
        for role, group, found in (("actor", self.policy.actor, audits["actor program"]),
                                   ("learner", self.policy.learner, audits["learner program"])):
            devices = group.mesh.devices.flat
            groups[role] = "\n".join([f"{role} group: {devices[0].platform} devices "
                                       f"[{','.join(str(d.id) for d in devices)}]", *summary(found)])
        return Explanation(FragmentGraph.from_jaxpr(traced), self.policy.describe(),
                           [c for found in audits.values() for c in found], cost, memory, compile_seconds,
                           self._transfers, self.policy.transfer_dtype, groups, {partition.ACTOR: "actor"})


def _batch_axis(crossing: partition.Crossing) -> int | None:
    axis = crossing.batch_axis
    return axis if axis is not None and axis < crossing.aval.ndim else None


class _Channel:
    """Values that cross between the groups in one direction, once per iteration: each
    encoded in its transfer dtype, then all packed into two buffers (``packing``);
    ``receive`` unpacks and decodes them back to ``like``'s dtypes."""

    def __init__(self, like: list[Any], dtypes: list[str], batch_axes: list[int | None]):
        self.like, self.dtypes = like, dtypes
        encoded = jax.eval_shape(self._encode, like)
        leaves, self._treedef = jax.tree.flatten(encoded)
        axes = [a for item, axis in zip(encoded, batch_axes, strict=True)
                for a in ((axis, None) if isinstance(item, precision.Int8) else (axis,))]
        self.layout = packing.Layout.of(leaves, axes)

    def _encode(self, values: list[Any]) -> list[Any]:
        return [precision.encode(v, d) for v, d in zip(values, self.dtypes, strict=True)]

    def send(self, values: list[jax.Array]) -> Buffers:
        return self.layout.pack(jax.tree.leaves(self._encode(values)))

    def receive(self, buffers: Buffers) -> list[jax.Array]:
        return precision.decode(self._treedef.unflatten(self.layout.unpack(buffers)), self.like)

    def shapes(self) -> tuple[jax.ShapeDtypeStruct, ...]:
        return jax.eval_shape(self.layout.pack, jax.tree.leaves(jax.eval_shape(self._encode, self.like)))

    def shardings(self, group: DataParallel, replicated: NamedSharding) -> tuple[NamedSharding, ...]:
        """The buffers on ``group``: the batched one split along its first axis."""
        split = NamedSharding(group.mesh, PartitionSpec("data", None))
        return ((split,) if self.layout.batched else ()) + ((replicated,) if self.layout.replicated else ())


def _narrowable(crossing: partition.Crossing) -> bool:
    """Whether a crossing value is narrowed in transfer: per-sample vectors (observations)
    and replicated values are; per-sample scalars (``[T, N]``, batch axis last) are not."""
    return crossing.batch_axis is None or crossing.aval.ndim > crossing.batch_axis + 1


def _transfers(direction: str, values: list[tuple[str, Any, bool]], carried: bool = False) -> list[Transfer]:
    """One ``Transfer`` per name, its leaves' bytes summed for each precision (leaves not
    narrowed stay float32); ``carried``: for the next iteration."""
    grouped: dict[str, list[tuple[Any, bool]]] = {}
    for name, aval, narrowed in values:
        grouped.setdefault(name, []).append((aval, narrowed))
    return [Transfer(direction, name, tuple(describe_aval(a) for a, _ in leaves),
                     {d: sum(precision.encoded_bytes(a, d if n else "float32") for a, n in leaves)
                      for d in TRANSFER_DTYPES}, carried)
            for name, leaves in grouped.items()]
