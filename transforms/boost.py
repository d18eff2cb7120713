"""Adaptive actor boosting (Nitro, PVLDB 2024): more environments in the rounds where
the loss surface is locally convex, under a budget.

A ``Boosted`` run keeps its recipe's state for ``ladder[-1]`` environments (the pool)
and runs each round (one iteration of the recipe) at one rung of the ladder: on the
pool's first ``n`` environments, the others keeping their state. What stays fixed
across the rungs is ``minibatches``:

- ``"batch"`` (the default): every round gathers the bottom rung's batch, rung ``n``
  stepping each environment ``num_steps * ladder[0] / n`` times, and learns from it as
  the bottom rung does. More actors gather the same samples in fewer sequential steps:
  at equal environment steps a run makes as many policy iterations and updates at
  every rung; a rung changes the rollouts' length (how soon advantages bootstrap).
- ``"size"``: the batch grows with the rung and so does the minibatch count (rung ``n``
  takes ``num_minibatches * n / ladder[0]``), each minibatch the bottom rung's size: a
  sample is learned from as often at every rung (RLlib's fixed SGD minibatch size,
  which Nitro ran on), but a larger rung is one policy iteration for more samples.
- ``"count"``: the batch grows and every rung splits it into ``num_minibatches``: the
  larger the rung, the fewer updates per sample.

Every rung is one branch of a conditional in the compiled training program, so the
whole ladder is compiled ahead of time with it and moving between rungs is a branch
taken on device: no recompiling, no host round trip.

The controller runs on device too, and its state is part of the training state (and
so of every checkpoint). Each round it chooses a rung from what earlier rounds showed:

- ``nitro``: the curvature ratio ``-lambda_max / lambda_min`` of the learner's loss on
  the round's batch (``curvature.extreme_eigenvalues``), decayed as ``R_t = ratio *
  decay**t`` and scaled to ``boost_t`` in [0, 1] by the minimum and maximum of the last
  ``window`` rounds;
- ``gns``: the gradient noise scale (the critical batch) over the largest batch;
- ``random``: ``boost_t`` uniform in [0, 1], the ablation of the signal;
- ``fixed``: always ``fixed_actors``.

The rung is the one nearest ``clip(top * boost_t, floor_t, top)``, where the floor
falls geometrically from the top rung to the bottom one as the budget is spent. The
budget is environment steps and, optionally, a cost: the actor's and the learner's
device-seconds per round (``calibrate`` measures them per rung) at their prices. A
round that would overspend runs at the largest rung that fits; when none fits the run
is ``finished``. The learning rate anneals with the budget spent, where the recipe
anneals it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import typing
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_frag import primitives, tracing
from jaxrl_frag.algorithms import Algorithm, Wrapper, field_name, hyperparameter, plain, static_field
from jaxrl_frag.bounds import INT32_MAX, check_count
from jaxrl_frag.errors import ConfigError, check
from jaxrl_frag.metrics import Metrics
from jaxrl_frag.transforms import curvature

PyTree = Any
STRATEGIES = ("nitro", "gns", "random", "fixed")
PROBING = ("nitro", "gns")
Minibatches = Literal["batch", "size", "count"]  # what stays fixed across the rungs: the batch, the minibatch size or count
MINIBATCHES: tuple[str, ...] = typing.get_args(Minibatches)


@runtime_checkable
class Boostable(Protocol):
    """What boosting needs of a recipe (the on-policy recipes have it): settings to make
    it again at another environment count, one iteration as a ``round`` that also returns
    what it learned from, the ``samples`` of that, and the ``loss`` on a minibatch of them
    (probed for curvature and gradient noise). ``rollout`` and ``learn`` are its actor and
    learner fragments (timed by ``calibrate``). A recipe that declares itself
    ``recurrent`` (it learns from whole environments' sequences) is not boosted."""

    env: Any
    num_envs: int
    num_steps: int
    num_minibatches: int
    total_steps: int
    lr: Any
    anneal_lr: bool

    @classmethod
    def fields(cls) -> dict[str, Any]: ...

    @classmethod
    def create(cls, env: str, **settings: Any) -> Boostable: ...

    @classmethod
    def validate(cls, settings: dict[str, Any]) -> None: ...

    def replace(self, **changes: Any) -> Boostable: ...

    def init(self, key: jax.Array) -> PyTree: ...

    def round(self, state: PyTree) -> tuple[PyTree, Metrics, tuple[Any, ...]]: ...

    def samples(self, *lesson: Any) -> PyTree: ...

    def loss(self, params: PyTree, *minibatch: Any) -> tuple[jax.Array, Metrics]: ...

    def rollout(self, *args: Any) -> Any: ...

    def learn(self, *args: Any) -> Any: ...


@struct.dataclass
class Controller:
    """What the controller has counted and seen: rounds run, environment steps,
    device-seconds and cost spent, the last ``window`` decayed curvature ratios (the
    newest last; ``seen`` of them are real), running means of the gradient noise
    terms ``(|G|^2, tr Sigma)``, and its own key."""

    rounds: jax.Array
    env_steps: jax.Array
    seconds: jax.Array
    cost: jax.Array
    ratios: jax.Array
    seen: jax.Array
    noise: jax.Array
    key: jax.Array


@struct.dataclass
class BoostState:
    pool: PyTree  # the recipe's state over all ladder[-1] environments
    controller: Controller


@struct.dataclass
class Boosted(Wrapper):
    """A recipe run rung by rung on a ladder of environment counts, under a budget."""

    recipe: Boostable  # its environment is the pool: ladder[-1] environments
    rung_envs: tuple[Any, ...] = static_field()
    batched: tuple[tuple[str, int], ...] = static_field()  # the recipe state's environment-batched fields, axes
    rung_minibatches: tuple[int, ...] = static_field()  # each rung's num_minibatches (the recipe's: the bottom's)
    rung_steps: tuple[int, ...] = static_field()  # each rung's num_steps (the recipe's: the bottom's)
    strategy: str = static_field("nitro", flag="--boost", help="nitro (curvature), gns (gradient noise scale), "
                                 "random (ablation) or fixed (always --boost-fixed-actors)")
    ladder: tuple[int, ...] = static_field((8, 16, 32, 64), flag="--boost-ladder",
                                           help="environment counts a round may run at, ascending")
    minibatches: Minibatches = static_field(
        "batch", flag="--boost-minibatches",
        help="batch: every rung gathers the bottom rung's batch (rung n steps each environment num_steps * "
             "ladder[0] / n times) and learns from it in --num-minibatches; size: the batch grows with the rung, "
             "its minibatches the bottom rung's size (rung n takes num_minibatches * n / ladder[0]: updates per "
             "sample stay fixed); count: the batch grows, split into --num-minibatches (fewer updates per sample "
             "at larger rungs)")
    fixed_actors: int = static_field(0, flag="--boost-fixed-actors",
                                     help="fixed: the rung every round runs at (0: the top)")
    window: int = static_field(6, flag="--boost-window", help="nitro: rounds whose ratios scale the newest one")
    probe_iterations: int = static_field(10, flag="--boost-probe-iterations",
                                         help="Lanczos iterations of the curvature probe each round")
    budget_steps: int = static_field(0, flag="--budget-steps",
                                     help="environment steps the run may spend (0: the recipe's total_steps)")
    decay: float = hyperparameter(0.96, flag="--boost-decay", help="nitro: R_t = ratio * decay**t")
    noise_smoothing: float = hyperparameter(0.9, flag="--boost-noise-smoothing",
                                            help="gns: weight of the past in the running means of the noise terms")
    convexity_floor: float = hyperparameter(1e-3, flag="--boost-convexity-floor",
                                            help="nitro: |lambda_min| counts as at least this fraction of "
                                                 "lambda_max (bounds the ratio where the loss is convex)")
    budget_cost: float = hyperparameter(float("inf"), flag="--budget-cost",
                                        help="cost the run may spend: actor and learner device-seconds at their "
                                             "prices (needs a calibrated run; inf: no limit)")
    actor_price: float = hyperparameter(1.0, flag="--actor-price", help="cost of an actor device-second")
    learner_price: float = hyperparameter(1.0, flag="--learner-price", help="cost of a learner device-second")
    worker_price: float = hyperparameter(0.0, flag="--worker-price",
                                         help="cost of an environment worker-second (host environments: a round "
                                              "pays for the workers it steps over its seconds; the others count as "
                                              "released, and starting one as free)")
    round_seconds: jax.Array = hyperparameter(None)  # [rungs, 3]: actor, learner and probe seconds of one round

    counts: ClassVar[tuple[str, ...]] = ("window", "probe_iterations")

    @classmethod
    def settings(cls) -> list[dataclasses.Field]:
        """The fields a user sets (each with its flag and help)."""
        return [f for f in dataclasses.fields(cls) if "flag" in f.metadata]

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every setting's default, by field name."""
        return {f.name: f.default for f in cls.settings()}

    @classmethod
    def create(cls, recipe: Boostable, round_seconds: Any = None, **settings: Any) -> Boosted:
        """``recipe`` (its ``num_envs`` aside) boosted with ``settings``; validated.
        ``round_seconds`` (``[rungs, 3]``: actor, learner and probe seconds of a round at
        each rung) is what ``calibrate`` measures; without it rounds cost nothing."""
        s = cls._given_settings(recipe, settings)
        cls._check_settings(recipe, s, round_seconds)
        ladder, minibatches = s["ladder"], s["minibatches"]
        steps = cls._rung_steps(recipe, ladder, minibatches, s["budget_steps"])
        counts = cls._rung_minibatches(recipe, ladder, minibatches)
        rungs = cls._make_rungs(recipe, ladder, steps, counts, minibatches)
        # the pool's recipe keeps the given steps and count, so that its configuration rebuilds the same run
        top = rungs[-1].replace(num_steps=recipe.num_steps, num_minibatches=recipe.num_minibatches)
        batched = cls._batched_axes(top)
        seconds = cls._round_seconds(round_seconds, len(ladder))
        return cls(top, tuple(r.env for r in rungs), batched, counts, steps, round_seconds=seconds, **s)

    @classmethod
    def _given_settings(cls, recipe: Boostable, settings: dict[str, Any]) -> dict[str, Any]:
        """Every setting: ``settings`` over the defaults, the ladder's counts as ints and
        ``budget_steps`` 0 as the recipe's ``total_steps``. ``ConfigError`` where one is not
        a boost setting."""
        names = [f.name for f in cls.settings()]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise ConfigError(unknown[0], settings[unknown[0]], f"not a boost setting; they are {', '.join(names)}")
        s = cls.defaults() | settings
        s["ladder"] = tuple(int(n) for n in s["ladder"])
        s["budget_steps"] = int(s["budget_steps"] or recipe.total_steps)
        return s

    @classmethod
    def _check_settings(cls, recipe: Boostable, s: dict[str, Any], round_seconds: Any) -> None:
        """``ConfigError`` where ``recipe`` cannot be boosted, or where a setting of ``s`` is
        out of range or does not go with the others."""
        ladder = s["ladder"]
        check(isinstance(recipe, Boostable), "recipe", type(recipe).__name__,
              "boosting runs on-policy recipes (ppo, a2c, impala: see ``Boostable``); an off-policy recipe's replay "
              "buffer is shaped by its environment count")
        check(s["strategy"] in STRATEGIES, "boost", s["strategy"], f"choose one of {', '.join(STRATEGIES)} or off")
        check(s["minibatches"] in MINIBATCHES, "boost_minibatches", s["minibatches"],
              "choose batch (every rung the bottom rung's batch), size (every rung's minibatches the bottom "
              "rung's size) or count (every rung's batch in num_minibatches)")
        capabilities = recipe.env.capabilities
        check(capabilities.traceable or capabilities.elastic, "boost", s["strategy"],
              "steps a slice of a pool of environments traced into the program, or a prefix of a pool of whole "
              "workers outside it (--env-backend processes or ray); these step as one batch a group (--env-backend "
              "in-process): choose processes or ray, or turn boosting off")
        check(capabilities.traceable or recipe.num_envs == ladder[-1], "num_envs", recipe.num_envs,
              f"host environments are made once, for the top rung, and the rungs step a prefix of them: make the "
              f"recipe with num_envs = {ladder[-1]}, the ladder's top")
        check(not getattr(recipe, "recurrent", False), "memory", getattr(recipe, "memory", "recurrent"),
              "a recurrent policy learns from whole environments' sequences, and boosting changes how many "
              "environments a round steps and for how long from rung to rung (so the sequences' shapes, within one "
              "compiled program): boost a feed-forward policy (--memory none), or turn boosting off (--boost off)")
        check(len(ladder) > 0 and all(n > 0 for n in ladder) and list(ladder) == sorted(set(ladder)), "boost_ladder",
              ",".join(map(str, ladder)), "give distinct positive environment counts in ascending order, e.g. 8,16,32,64")
        fixed = s["fixed_actors"] or ladder[-1]
        check(fixed in ladder, "boost_fixed_actors", s["fixed_actors"],
              f"must be a rung of the ladder ({', '.join(map(str, ladder))})")
        for name in cls.counts:
            check_count(f"boost_{name}", s[name], low=2)
        check(0 < s["decay"] <= 1, "boost_decay", s["decay"], "must lie in (0, 1]")
        check(0 <= s["noise_smoothing"] < 1, "boost_noise_smoothing", s["noise_smoothing"], "must lie in [0, 1)")
        check(s["convexity_floor"] > 0, "boost_convexity_floor", s["convexity_floor"], "must be positive")
        check(s["budget_cost"] > 0, "budget_cost", s["budget_cost"], "must be positive (inf: no cost limit)")
        for name in ("actor_price", "learner_price", "worker_price"):
            check(s[name] >= 0, name, s[name], "must be zero or positive")
        check(s["strategy"] != "gns" or recipe.num_minibatches >= 2, "num_minibatches", recipe.num_minibatches,
              "the gns strategy compares minibatch gradients: give at least 2 minibatches")
        check(round_seconds is not None or s["budget_cost"] == float("inf"), "budget_cost", s["budget_cost"],
              "needs the rounds' device-seconds: calibrate the run first (the command line does)")
        smallest = ladder[0] * recipe.num_steps
        check(s["budget_steps"] >= smallest, "budget_steps", s["budget_steps"],
              f"must cover one round at the bottom rung ({ladder[0]} * num_steps = {smallest} steps); raise it")

    @staticmethod
    def _rung_steps(recipe: Boostable, ladder: tuple[int, ...], minibatches: str, budget_steps: int) -> tuple[int, ...]:
        """Each rung's ``num_steps``: the recipe's, or under ``"batch"`` the bottom rung's batch
        over the rung's environments. ``ConfigError`` where that is not whole, or where
        ``budget_steps`` and the largest round overflow the controller's int32 count."""
        smallest = ladder[0] * recipe.num_steps
        steps = (recipe.num_steps,) * len(ladder)
        if minibatches == "batch":
            for n in ladder:
                check(smallest % n == 0, "boost_ladder", ",".join(map(str, ladder)),
                      lambda n=n: f"under --boost-minibatches batch the rung of {n} environments steps each "
                      f"num_steps * ladder[0] / {n} = {recipe.num_steps} * {ladder[0]} / {n} times (the bottom rung's "
                      f"batch), not a whole number: make every rung divide {smallest}, or give --boost-minibatches "
                      "size")
            steps = tuple(smallest // n for n in ladder)
        largest = max(n * length for n, length in zip(ladder, steps, strict=True))
        check(budget_steps <= INT32_MAX - largest, "budget_steps", budget_steps,
              f"must be at most {INT32_MAX:,} - {largest:,} (the largest round's steps; the controller counts the "
              "steps spent in int32): lower --budget-steps (default --total-steps)")
        return steps

    @staticmethod
    def _rung_minibatches(recipe: Boostable, ladder: tuple[int, ...], minibatches: str) -> tuple[int, ...]:
        """Each rung's ``num_minibatches``: the recipe's, or under ``"size"`` as many as keep
        the bottom rung's minibatch size. ``ConfigError`` where that is not whole."""
        base = recipe.num_minibatches  # the bottom rung's count
        if minibatches != "size":
            return (base,) * len(ladder)
        multiple = ladder[0] // math.gcd(base, ladder[0])  # the rungs whose count is whole
        whole = math.lcm(*(ladder[0] // math.gcd(n, ladder[0]) for n in ladder))  # the counts that make all whole
        for n in ladder:
            check(base * n % ladder[0] == 0, "boost_ladder", ",".join(map(str, ladder)),
                  lambda n=n: f"under --boost-minibatches size the rung of {n} environments takes "
                  f"num_minibatches * {n} / ladder[0] = {base} * {n} / {ladder[0]} minibatches (the bottom rung's "
                  f"size), not a whole number: make every rung a multiple of {multiple}, or --num-minibatches a "
                  f"multiple of {whole}, or give --boost-minibatches count")
        return tuple(base * n // ladder[0] for n in ladder)

    @staticmethod
    def _make_rungs(recipe: Boostable, ladder: tuple[int, ...], steps: tuple[int, ...], counts: tuple[int, ...],
                    minibatches: str) -> list[Boostable]:
        """The recipe made again at each rung, with its environments, steps and minibatch
        count; environments stepped outside the program are made once, the top rung's, and
        a rung steps their prefix (``Env.prefix``). ``ConfigError`` naming the rung where
        the recipe cannot run at one."""
        kind = type(recipe)
        own = {name: getattr(recipe, name) for name in kind.fields()}
        rungs = []
        for n, count, length in zip(ladder, counts, steps, strict=True):
            changes = {"num_envs": n, "num_steps": length, "num_minibatches": count}
            try:
                if recipe.env.capabilities.traceable:
                    rungs.append(kind.create(recipe.env.name, **own | changes))
                else:
                    kind.validate(own | changes)
                    rungs.append(recipe.replace(**changes, env=recipe.env.prefix(n)))
            except ConfigError as error:
                raise ConfigError("boost_ladder", n, f"is a rung the recipe cannot run at ({length} steps, {count} "
                                  f"minibatches, --boost-minibatches {minibatches}): {error}") from None
        return rungs

    @staticmethod
    def _batched_axes(recipe: Boostable) -> tuple[tuple[str, int], ...]:
        """The fields of ``recipe``'s state batched over its environments, with their axes,
        as its step traces them; sorted by name."""
        shape = jax.eval_shape(recipe.init, jax.ShapeDtypeStruct((2,), jnp.uint32))
        return tuple(sorted(tracing.batch_axes(jax.make_jaxpr(tracing.step)(recipe, shape)).items()))

    @staticmethod
    def _round_seconds(round_seconds: Any, rungs: int) -> jax.Array:
        """``round_seconds`` as float32, zeros where it is ``None``. ``ConfigError`` where its
        shape is not ``(rungs, 3)``."""
        seconds = np.zeros((rungs, 3), np.float32) if round_seconds is None else np.asarray(round_seconds)
        check(seconds.shape == (rungs, 3), "round_seconds", seconds.shape, f"must be ({rungs}, 3)")
        return jnp.asarray(seconds, jnp.float32)

    # -- sizes and costs -------------------------------------------------------------

    @property
    def round_steps(self) -> tuple[int, ...]:
        """Environment steps of one round at each rung."""
        return tuple(n * length for n, length in zip(self.ladder, self.rung_steps, strict=True))

    @property
    def steps_per_iteration(self) -> int:
        """Environment steps of a round at the bottom rung (rounds vary: the rows' env
        steps come from the metric ``env_steps_total``)."""
        return self.round_steps[0]

    @property
    def num_iterations(self) -> int:
        """The most rounds the budget allows (all at the bottom rung)."""
        return self.budget_steps // self.steps_per_iteration

    @property
    def iterations_vary(self) -> bool:
        return True

    @property
    def inner(self) -> Algorithm:
        return self.recipe

    def unwrap(self, state: BoostState, member: int | None = None) -> tuple[Algorithm, PyTree]:
        """The recipe over the whole pool, and its state."""
        return self.recipe, state.pool

    @property
    def round_cost(self) -> jax.Array:
        """The cost of one round at each rung: its actor's and learner's device-seconds, and
        its environment workers (``Env.host_workers``) held through the round, at their prices."""
        seconds = jnp.asarray(self.round_seconds)
        return (self.actor_price * seconds[..., 0] + self.learner_price * (seconds[..., 1] + seconds[..., 2])
                + self.worker_price * jnp.asarray(self.rung_workers, jnp.float32) * seconds.sum(-1))

    @property
    def rung_workers(self) -> tuple[int, ...]:
        """Each rung's environment workers outside the program (``Env.host_workers``; 0 in it)."""
        return tuple(env.host_workers for env in self.rung_envs)

    def rung(self, index: int, lr: jax.Array | float) -> Boostable:
        """The recipe at rung ``index`` with that rung's steps and minibatch count, its
        learning rate ``lr`` (annealing is the controller's)."""
        return self.recipe.replace(num_envs=self.ladder[index], num_steps=self.rung_steps[index],
                                   num_minibatches=self.rung_minibatches[index],
                                   env=self.rung_envs[index], anneal_lr=False, lr=lr)

    def progress(self, c: Controller) -> jax.Array:
        """The fraction of the budget spent (of the steps or of the cost, whichever is further)."""
        return jnp.maximum(c.env_steps / self.budget_steps, c.cost / self.budget_cost)

    def affordable(self, c: Controller) -> jax.Array:
        """For each rung, whether one more round at it fits in the budget."""
        steps = jnp.asarray(self.round_steps)
        return (c.env_steps + steps <= self.budget_steps) & (c.cost + self.round_cost <= self.budget_cost)

    def resumed(self, state: BoostState) -> BoostState:
        """The pool's restored state as the recipe resumes it (``Algorithm.resumed``); the
        controller's as it was saved."""
        return state.replace(pool=self.recipe.resumed(state.pool))

    def finished(self, state: BoostState) -> jax.Array:
        """Whether no rung fits in what is left of the budget."""
        return ~self.affordable(state.controller).any()

    # -- the algorithm -------------------------------------------------------------

    def init(self, key: jax.Array) -> BoostState:
        """The recipe's state over the whole pool, and a controller that has seen nothing."""
        pool = self.recipe.replace(anneal_lr=False).init(key)
        zero = jnp.zeros((), jnp.float32)
        controller = Controller(jnp.int32(0), jnp.int32(0), zero, zero, jnp.zeros(self.window), jnp.int32(0),
                                jnp.zeros(2), jax.random.fold_in(key, 1))
        return BoostState(pool, controller)

    def step(self, state: BoostState) -> tuple[BoostState, Metrics]:
        """One round: choose a rung, run the recipe's iteration at it, probe, update the controller."""
        c = state.controller
        key, k_choose, k_probe = jax.random.split(c.key, 3)
        boost, floor = self.boost(c, k_choose)
        rung = self.choose(c, boost, floor)
        lr = self.recipe.lr * (1.0 - self.progress(c)) if self.recipe.anneal_lr else self.recipe.lr
        k_sample, k_probe = jax.random.split(k_probe)
        rounds = [functools.partial(self._round, i, lr, k_sample) for i in range(len(self.ladder))]
        _, like, sample_like = jax.eval_shape(rounds[0], state.pool)

        def idle(pool: PyTree) -> tuple[PyTree, Metrics, PyTree]:
            return pool, *jax.tree.map(jnp.zeros_like, (like, sample_like))

        pool, metrics, sample = jax.lax.switch(rung, [*rounds, idle], state.pool)
        signal = jnp.zeros(4)
        if self.strategy in PROBING:
            signal = jnp.where(rung < len(self.ladder), self.probe(self.rung(0, lr), state.pool.params, sample, k_probe), 0)
        c = self.update(c, rung, signal, key)
        actors = jnp.append(jnp.asarray(self.ladder), 0)[rung]
        fleet = ({"env_workers": jnp.append(jnp.asarray(self.rung_workers), 0)[rung]} if any(self.rung_workers)
                 else {})
        lambda_min, lambda_max, true_norm, trace = signal
        probe = {"lambda_min": lambda_min, "lambda_max": lambda_max, "curvature_ratio": self.ratio(signal),
                 "noise_scale": jnp.where(true_norm > 0, trace / true_norm, 0.0)} if self.strategy in PROBING else {}
        return BoostState(pool, c), {
            **metrics, **probe, "actors": actors, **fleet, "boost": boost, "floor": floor,
            "env_steps_total": c.env_steps, "device_seconds_total": c.seconds, "cost_total": c.cost}

    def boost(self, c: Controller, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(boost_t, floor_t)``: the strategy's wish in [0, 1] and the floor in actors."""
        top, bottom = self.ladder[-1], self.ladder[0]
        floor = top * (bottom / top) ** self.progress(c)
        if self.strategy == "nitro":
            recent = jnp.arange(self.window) >= self.window - c.seen
            low = jnp.min(jnp.where(recent, c.ratios, jnp.inf))
            high = jnp.max(jnp.where(recent, c.ratios, -jnp.inf))
            boost = jnp.where(high > low, (c.ratios[-1] - low) / jnp.where(high > low, high - low, 1.0), 0.0)
        elif self.strategy == "gns":
            true_norm, trace = c.noise
            critical = trace / jnp.where(true_norm > 0, true_norm, 1.0)  # samples per batch worth the noise
            boost = jnp.where(c.seen == 0, 0.0,
                              jnp.where(true_norm > 0, jnp.clip(critical / max(self.round_steps), 0, 1), 1.0))
        elif self.strategy == "random":
            boost = jax.random.uniform(key)
        else:
            boost = jnp.float32(1.0)
        return boost, floor

    def choose(self, c: Controller, boost: jax.Array, floor: jax.Array) -> jax.Array:
        """The rung of the next round: index into ``ladder``, or ``len(ladder)`` to idle
        (the budget spent)."""
        ladder = jnp.asarray(self.ladder)
        top = self.ladder[-1]
        if self.strategy == "fixed":
            wanted = jnp.int32(self.ladder.index(self.fixed_actors or top))
        else:
            wanted = jnp.argmin(jnp.abs(ladder - jnp.clip(top * boost, floor, top)))
        index = jnp.arange(len(self.ladder))
        fitting = jnp.max(jnp.where(self.affordable(c) & (index <= wanted), index, -1))
        return jnp.where(fitting >= 0, fitting, len(self.ladder))

    def ratio(self, signal: jax.Array) -> jax.Array:
        """``-lambda_max / lambda_min``, the positive curvature over the most negative's
        magnitude; that magnitude counts as at least ``convexity_floor * lambda_max``."""
        lambda_min, lambda_max = signal[0], signal[1]
        tiny = jnp.finfo(jnp.float32).tiny
        return lambda_max / jnp.maximum(jnp.maximum(-lambda_min, self.convexity_floor * jnp.abs(lambda_max)), tiny)

    def update(self, c: Controller, rung: jax.Array, signal: jax.Array, key: jax.Array) -> Controller:
        """The controller after a round at ``rung`` that measured ``signal``."""
        ran = rung < len(self.ladder)
        index = jnp.minimum(rung, len(self.ladder) - 1)
        steps = jnp.where(ran, jnp.asarray(self.round_steps)[index], 0)
        seconds = jnp.where(ran, jnp.sum(jnp.asarray(self.round_seconds)[index]), 0.0)
        cost = jnp.where(ran, self.round_cost[index], 0.0)
        ratios, seen, noise = c.ratios, c.seen, c.noise
        if self.strategy in PROBING:  # an idle round measured nothing
            decayed = self.ratio(signal) * self.decay ** c.rounds.astype(jnp.float32)
            ratios = jnp.where(ran, jnp.append(c.ratios[1:], decayed), c.ratios)
            measured = signal[2:]
            mean = jnp.where(c.seen == 0, measured, self.noise_smoothing * c.noise + (1 - self.noise_smoothing) * measured)
            noise = jnp.where(ran, mean, c.noise)
            seen = jnp.where(ran, jnp.minimum(c.seen + 1, self.window), c.seen)
        return Controller(c.rounds + ran, c.env_steps + steps, c.seconds + seconds, c.cost + cost, ratios, seen, noise,
                          key)

    def probe(self, recipe: Boostable, params: PyTree, sample: PyTree, key: jax.Array) -> jax.Array:
        """``(lambda_min, lambda_max, |G|^2, tr Sigma)`` of ``recipe``'s loss at ``params`` on
        ``sample`` (a round's batch cut to the bottom rung's size, so that the signal means
        the same at every rung; ``recipe`` is the bottom rung's, whose minibatch count is
        the given one): the Hessian's extremes on one of its minibatches, the gradient
        noise terms over all of them (zero with one minibatch)."""
        k_split, k_start = jax.random.split(key)
        minibatches = primitives.minibatches(k_split, sample, recipe.num_minibatches)

        def loss(minibatch: Any) -> Any:
            return lambda params: recipe.loss(params, *minibatch)[0]

        first = jax.tree.map(lambda x: x[0], minibatches)
        lambda_min, lambda_max = curvature.extreme_eigenvalues(loss(first), params, k_start, self.probe_iterations)
        noise = jnp.zeros(2)
        if recipe.num_minibatches > 1:
            grads = jax.lax.map(lambda mb: jax.grad(loss(mb))(params), minibatches)
            noise = jnp.stack(curvature.gradient_noise(grads, jax.tree.leaves(first)[0].shape[0]))
        return jnp.stack([lambda_min, lambda_max, *noise])

    def _round(self, index: int, lr: jax.Array, key: jax.Array, pool: PyTree) -> tuple[PyTree, Metrics, PyTree]:
        """One round at rung ``index`` on the pool's first environments; the probe's
        sample of its batch: as many samples, drawn at random, as a bottom-rung batch has."""
        recipe = self.rung(index, lr)
        state, metrics, lesson = recipe.round(self.take(pool, self.ladder[index]))
        sample = self.sample(index, recipe.samples(*lesson), key) if self.strategy in PROBING else ()
        return self.put(pool, state), metrics, sample

    def sample(self, index: int, batch: PyTree, key: jax.Array) -> PyTree:
        """The probe's sample of a batch from rung ``index``: as many samples, drawn at
        random, as a bottom-rung batch has."""
        size = jax.tree.leaves(batch)[0].shape[0]
        chosen = jax.random.permutation(key, size)[: self.round_steps[0] * size // self.round_steps[index]]
        return jax.tree.map(lambda x: x[chosen], batch)

    def take(self, pool: PyTree, count: int) -> PyTree:
        """The recipe state of the pool's first ``count`` environments."""
        return self._map_batched(lambda x, axis: jax.lax.slice_in_dim(x, 0, count, axis=axis), lambda x: x, pool)

    def put(self, pool: PyTree, state: PyTree) -> PyTree:
        """``pool`` with its first environments' states replaced by ``state``'s (whose
        other fields, parameters and statistics over all environments, replace the pool's)."""
        return self._map_batched(lambda x, axis, new: jax.lax.dynamic_update_slice_in_dim(x, new, 0, axis),
                                 lambda _, new: new, pool, state)

    def _map_batched(self, batched: Any, other: Any, *trees: PyTree) -> PyTree:
        """``batched(leaf, axis, ...)`` on every environment-batched leaf (per environment
        along ``axis``), ``other(leaf, ...)`` on the rest (``primitives.Shared`` statistics too)."""
        axes = dict(self.batched)

        def apply(path: Any, leaf: Any, *rest: Any) -> Any:
            axis = axes.get(field_name(path[0]))
            if axis is None or isinstance(leaf, primitives.Shared) or leaf.ndim <= axis:
                return other(leaf, *rest)
            return batched(leaf, axis, *rest)

        return jax.tree_util.tree_map_with_path(apply, *trees, is_leaf=lambda x: isinstance(x, primitives.Shared))

    def config(self) -> dict[str, Any]:
        """The recipe's configuration, the boost settings and the calibrated round seconds."""
        own = {f.name: plain(getattr(self, f.name)) for f in self.settings()}
        return {**self.recipe.config(), **own, "round_seconds": plain(self.round_seconds)}


def calibrate(boosted: Boosted, repeats: int = 5, key: jax.Array | None = None) -> Boosted:
    """``boosted`` with its rounds' device-seconds measured on the default device: for
    each rung, the median of ``repeats`` timed calls of the recipe's actor fragment, of
    its learner fragment and of the probe, each compiled alone."""
    state = jax.jit(boosted.init)(jax.random.PRNGKey(0) if key is None else key)
    measured = []
    for index, count in enumerate(boosted.ladder):
        recipe = boosted.rung(index, boosted.recipe.lr)
        start = boosted.take(state.pool, count)
        rollout = jax.jit(recipe.rollout)
        acting = (start.params, start.env_state, start.obs, start.memory, start.key)
        traj, _, obs, _, _ = rollout(*acting)
        learn = jax.jit(recipe.learn)
        probe = jax.jit(functools.partial(boosted.probe, boosted.rung(0, boosted.recipe.lr)))  # as ``step`` probes
        sample = boosted.sample(index, recipe.samples(start.params, traj, obs), start.key)
        seconds = [_seconds(rollout, acting, repeats),
                   _seconds(learn, (start.params, start.opt_state, traj, obs, start.key), repeats),
                   _seconds(probe, (start.params, sample, start.key), repeats) if boosted.strategy in PROBING else 0.0]
        measured.append(seconds)
    return boosted.replace(round_seconds=jnp.asarray(measured, jnp.float32))


def _seconds(fn: Any, args: tuple[Any, ...], repeats: int) -> float:
    """The median wall time of ``fn(*args)`` over ``repeats`` calls, after one to compile."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))
