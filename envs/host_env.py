"""``HostEnv``: environments that are not JAX, as an ``Env`` batch inside the compiled program.

The environments run in a pool (``host_pool.BACKENDS``, by ``backend``: worker
processes, this process, or Ray actors on a cluster's nodes, ``host_ray``); the program
reaches them through host callbacks (``primitives.on_host``), so policy inference,
learning and everything else stay one compiled device program under any distribution
policy, and only observations, actions and rewards cross to the host.

``rollout`` runs the pool as an environment ring: the batch is split into ``groups``
groups (group ``g`` is environments ``g, g + groups, ...``, so every group spans every
device's share of the batch), and while the workers step one group the device infers
the actions of the next (SRL's ring, Sebulba's double buffering). Each host call sends
one group's actions and receives the next group's step; a chain of tokens fixes their
order, so the schedule, and with it every result, is the same on every run. With
``ring=False`` the same groups are inferred in turn and then all stepped at once
(strict alternation): the same numbers, without the overlap.

The environments' state lives in the workers, not in the program's state (which holds an
empty placeholder): a checkpoint cannot hold it, and a run resumed from one starts its
environments from fresh resets (``Recipe.resumed``). A worker that dies or raises stops
the run with an ``EnvWorkerError`` that names its environments (``Program.run``); so does
an environment that raises in this process.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frag import distributed, primitives
from jaxrl_frag.bounds import divisors
from jaxrl_frag.envs.core import Act, Box, Capabilities, Discrete, Ended, Env, PyTree, Space, Steps, TimeStep
from jaxrl_frag.envs.host_pool import BACKENDS, FAMILIES, OPTIONS, EnvPool, EnvWorkerError, HostStep, environments, prefix_workers
from jaxrl_frag.errors import ENV_WORKER_FAILED, ConfigError, check

PREFIXES = tuple(f"{family}:" for family in FAMILIES)
AUTO = "auto"  # in this process for ale:, worker processes for the rest
_LIVE: set[HostEnv] = set()  # environments whose pools are up, closed at exit
_TOKEN = jax.ShapeDtypeStruct((), jnp.int32)  # passed from host call to host call: their order


def is_host(env_id: str) -> bool:
    """Whether ``env_id`` names host environments (``gymnasium:<id>``, ``ale:<Game>``)."""
    return env_id.startswith(PREFIXES)


class _ReraisedFailures(logging.Filter):
    """Drops JAX's log (with traceback) of a host callback that raised ``EnvWorkerError``:
    ``Program.run`` raises that error itself, with its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], EnvWorkerError))


logging.getLogger("jax._src.callback").addFilter(_ReraisedFailures())


def _probe(env_id: str, kwargs: dict[str, Any]) -> Any:
    """One environment ``env_id`` made in this process, to read its spaces; ``ConfigError``
    naming the missing module and how to install it where the id needs an optional
    dependency that is not installed (gymnasium's Box2D or MuJoCo environments)."""
    try:
        return environments(env_id, 1, kwargs)
    except ConfigError:  # the id refused with its own reason (a module of one's own that does not import, a typo)
        raise
    except Exception as error:
        missing = _missing_dependency(error)
        if missing is None:
            raise
        module, install = missing
        raise ConfigError("env", env_id, f"needs the module {module!r}, which is not installed: install it with "
                                         f"{install}, or choose another environment") from None


def _missing_dependency(error: BaseException) -> tuple[str, str] | None:
    """The module that ``error`` (raised making an environment) says is missing and the
    command that installs it, or ``None`` for an error of another kind."""
    import re

    chain = []
    while error is not None and len(chain) < 8:
        chain.append(error)
        error = error.__cause__ or error.__context__
    not_installed = [e for e in chain if type(e).__name__ == "DependencyNotInstalled"]
    imports = [e for e in chain if isinstance(e, ModuleNotFoundError) and e.name]
    if not (not_installed or imports):
        return None
    module = imports[0].name.split(".")[0] if imports else None
    text = str(not_installed[0]) if not_installed else ""
    commands = re.findall(r"`([^`]*pip install[^`]*)`", text)
    if module is None:  # gymnasium's own words: "Box2D is not installed, ..."
        module = text.split(" is not installed")[0].strip() or "?"
    install = " && ".join(commands) if commands else f"pip install {module}"
    return module, install


def _space(space: Any, env_id: str) -> Space:
    import gymnasium

    if isinstance(space, gymnasium.spaces.Discrete) and int(space.start) == 0:
        return Discrete(int(space.n))
    if isinstance(space, gymnasium.spaces.Box):
        return Box(tuple(np.asarray(space.low, np.float64).ravel().tolist()),
                   tuple(np.asarray(space.high, np.float64).ravel().tolist()), tuple(space.shape),
                   np.uint8 if space.dtype == np.uint8 else np.float32)
    raise ConfigError("env", env_id, f"has a {type(space).__name__} space ({space}); host environments need "
                                     "Discrete (from 0) actions or Box actions, and Box observations")


@dataclasses.dataclass(frozen=True, eq=False)  # each one owns its pool: equal only to itself
class HostEnv(Env):
    """``num_envs`` environments ``name`` in ``groups`` groups, stepped as a ring (or,
    with ``ring=False``, in strict alternation), by the pool of ``backend``
    (``host_pool.BACKENDS``): ``workers`` worker processes (``"processes"``:
    ``HostEnvPool``), this process (``"in-process"``: ``InProcessPool``, Atari games on
    ``workers`` threads of ale-py's) or ``workers`` Ray actors on a cluster's nodes
    (``"ray"``: ``host_ray.RayPool``), the same steps in each. ``options``: the
    backend's own (``host_pool.OPTIONS``). Make one with ``make``; its pool starts at
    the first reset. In a run of several processes each process's pool holds that
    process's share of the environments, with ``workers`` and ``groups`` of its own
    (``primitives.on_host``)."""

    name: str
    num_envs: int
    workers: int
    groups: int
    ring: bool
    backend: str
    kwargs: tuple[tuple[str, Any], ...]
    spaces: tuple[Box, Space]
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def make(cls, name: str, num_envs: int, *, workers: int = 0, groups: int = 2, ring: bool = True,
             backend: str = AUTO, **kwargs: Any) -> HostEnv:
        """Checks the settings and reads the spaces (one environment made in this process);
        ``workers=0`` takes as many as the CPUs allow (``EnvPool.capacity``: this
        machine's, or a Ray cluster's; a multiple of ``groups`` that divides
        ``num_envs``); ``backend="auto"`` steps Atari games in this process and
        other environments in worker processes. The keywords named in
        ``host_pool.OPTIONS`` (``timeout``, ``address``, ``worker_cpus``,
        ``worker_resource``, ``lost_workers``, ``keep_alive``) are the backend's, each refused by a
        backend that does not take it; the rest go to the environments."""
        choices = (AUTO, *BACKENDS)
        check(backend in choices, "env_backend", backend, f"choose one of {', '.join(choices)}")
        if backend == AUTO:
            backend = "in-process" if name.startswith("ale:") else "processes"
        options = {option: kwargs.pop(option, default) for option, default in OPTIONS.items()}
        for option, value in options.items():
            check(option in BACKENDS[backend].options or value == OPTIONS[option], f"env_{option}", value,
                  lambda option=option: f"is not an option of --env-backend {backend}; backends that take it: "
                                        f"{', '.join(b for b, spec in BACKENDS.items() if option in spec.options)}")
        check(isinstance(options["timeout"], int | float) and options["timeout"] > 0, "env_timeout", options["timeout"],
              "give the seconds a worker has to answer, a positive number")
        processes = jax.process_count()
        check(num_envs % processes == 0, "num_envs", num_envs,
              f"must divide among the {processes} processes (each steps an equal share): use a multiple of {processes}")
        own = num_envs // processes  # each process's pool holds its own rows of the batch
        share = f"each process's {own} of num_envs = {num_envs}" if processes > 1 else f"num_envs = {num_envs}"
        check(isinstance(groups, int) and groups > 0 and own % groups == 0, "env_groups", groups,
              lambda: f"must divide {share}; choose one of {divisors(own, 8)}")
        pool = BACKENDS[backend].load()  # a backend's own dependencies are imported only here
        own_options = {option: options[option] for option in BACKENDS[backend].options}
        pool.check_options(name, workers, own_options)
        if workers == 0:
            most = max(groups, pool.capacity(own_options) // processes)
            workers = max(w for w in range(groups, min(own, most) + 1, groups) if own % w == 0)
        check(isinstance(workers, int) and workers > 0 and workers % groups == 0 and own % workers == 0,
              "env_workers", workers, f"must be a multiple of env_groups = {groups} that divides {share}, "
                                      "or 0 (as many as the CPUs allow)")
        probe = _probe(name, kwargs)
        spaces = (_space(probe.observation_space, name), _space(probe.action_space, name))
        probe.close()
        check(isinstance(spaces[0], Box), "env", name, "host environments need Box observations")
        return cls(name, num_envs, workers, groups, ring, backend, tuple(sorted(kwargs.items())), spaces,
                   tuple(sorted(own_options.items())))

    @property
    def observation_space(self) -> Box:
        return self.spaces[0]

    @property
    def action_space(self) -> Space:
        return self.spaces[1]

    @property
    def capabilities(self) -> Capabilities:
        """Stepped by worker processes: not traceable, and no state in a checkpoint; elastic
        where its pool's groups are whole workers (worker processes, Ray actors)."""
        return Capabilities(traceable=False, restorable=False, elastic=self.backend != "in-process")

    @property
    def host_workers(self) -> int:
        return self.workers

    @property
    def _batch(self) -> HostEnv:
        """The batch whose pool this one steps: itself, or a prefix's source."""
        return getattr(self, "_source", self)

    def prefix(self, count: int) -> HostEnv:
        """The first ``count`` environments, stepped by this batch's pool: each group's first
        workers (``WorkerPool``), the others waiting, or on Ray released until a batch that
        needs them steps (``host_ray``). ``ConfigError`` unless they are whole workers of
        every group, in one process."""
        if count == self.num_envs:
            return self
        check(self.capabilities.elastic, "env_backend", self.backend,
              "steps each group as one batch: a prefix of it cannot step alone; choose processes or ray")
        check(jax.process_count() == 1, "num_envs", count,
              "a prefix of a host batch is cut in one process; each of several steps its own share")
        workers = self.groups * prefix_workers(count, self.num_envs, self.workers, self.groups)
        view = dataclasses.replace(self, num_envs=count, workers=workers)
        object.__setattr__(view, "_source", self._batch)
        object.__setattr__(self._batch, "_cut", True)
        return view

    def failure(self) -> EnvWorkerError | None:
        """The ``EnvWorkerError`` a host call of this environment raised since the last
        call, if one did (XLA reports it as a runtime error of the program)."""
        failure = getattr(self._batch, "_failure", None)  # a prefix's failures are its source batch's
        object.__setattr__(self._batch, "_failure", None)
        return failure

    @property
    def group_size(self) -> int:
        return self.num_envs // self.groups

    # -- the device side -----------------------------------------------------------

    def reset(self, key: jax.Array) -> tuple[PyTree, jax.Array]:
        """Every environment reset with a seed drawn from ``key``."""
        seeds = jax.random.randint(key, (self.num_envs,), 0, np.iinfo(np.int32).max)
        obs = primitives.on_host(self._host_reset, self._obs(self.num_envs), seeds)
        return (), obs

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        """Every environment stepped (one host call)."""
        step = primitives.on_host(self._host_step, self._step(self.num_envs), action)
        info = {"episode_return": step.score, "episode_length": step.length}
        return state, TimeStep(step.obs, step.reward, step.terminated, step.truncated, step.final_obs, info)

    def rollout(self, act: Act, state: PyTree, obs: jax.Array, key: jax.Array,
                num_steps: int) -> tuple[Steps, PyTree, PyTree, jax.Array, Ended]:
        """``num_steps`` steps by groups, as a ring or in strict alternation (the same
        results): group ``g`` at step ``t`` acts with ``fold_in(key_t, g)``."""
        keys = jax.random.split(key, num_steps)
        by_group = [obs[g::self.groups] for g in range(self.groups)]
        if self.ring:
            acted, stepped, by_group = self._ring(act, by_group, keys)
        else:
            acted, stepped, by_group = self._alternate(act, by_group, keys)
        observed, action, _, extra = (self._join(part, 2) for part in zip(*acted, strict=True))
        step = HostStep(*(self._join(part, 2) for part in zip(*stepped, strict=True)))
        steps = Steps(observed, action, step.reward, step.terminated, step.truncated, step.final_obs)
        return steps, extra, state, self._join(by_group, 1), Ended(step.terminated | step.truncated, step.score,
                                                                   step.length)

    def _act(self, act: Act, key: jax.Array, group: int, obs: jax.Array) -> tuple[Any, ...]:
        return (obs, *act(obs, jax.random.fold_in(key, group)))

    def _alternate(self, act: Act, by_group: list[jax.Array], keys: jax.Array) -> tuple[list[Any], list[Any], list[Any]]:
        """Each step: every group's actions inferred, then every environment stepped."""

        def one_step(by_group: list[jax.Array], key: jax.Array) -> tuple[list[jax.Array], Any]:
            acted = [self._act(act, key, g, o) for g, o in enumerate(by_group)]
            env_action = self._join([a[2] for a in acted], 1)
            step = primitives.on_host(self._host_step, self._step(self.num_envs), env_action)
            stepped = [HostStep(*(x[g::self.groups] for x in step)) for g in range(self.groups)]
            return [s.obs for s in stepped], (acted, stepped)

        by_group, (acted, stepped) = jax.lax.scan(one_step, by_group, keys)
        return acted, stepped, by_group

    def _ring(self, act: Act, by_group: list[jax.Array], keys: jax.Array) -> tuple[list[Any], list[Any], list[Any]]:
        """Group ``g`` acts, its actions go to the workers, and the next group's step comes
        back, in one host call: the workers step ``g`` while the device infers for the
        next group. Step 0 only sends until the last group; after the last step the
        groups still out are received."""
        groups, token = self.groups, jnp.int32(0)
        first = []
        for g in range(groups):
            first.append(self._act(act, keys[0], g, by_group[g]))
            if g < groups - 1:
                token = primitives.on_host(functools.partial(self._host_send, g), _TOKEN, first[g][2], token)
        head, token = self._exchange(groups - 1, first[-1][2], 0, token)
        by_group = [head.obs, *by_group[1:]]

        def one_step(carry: tuple[list[jax.Array], jax.Array], key: jax.Array) -> tuple[Any, Any]:
            by_group, token = carry
            by_group, acted, received = list(by_group), [], []
            for g in range(groups):
                acted.append(self._act(act, key, g, by_group[g]))
                step, token = self._exchange(g, acted[g][2], (g + 1) % groups, token)
                by_group[(g + 1) % groups] = step.obs
                received.append(step)
            return (by_group, token), (acted, received)

        (by_group, token), (acted, received) = jax.lax.scan(one_step, (by_group, token), keys[1:])
        tails = []
        for g in range(1, groups):
            step, token = primitives.on_host(functools.partial(self._host_receive, g), (self._step(self.group_size), _TOKEN),
                                             token)
            by_group[g] = step.obs
            tails.append(step)
        # group 0's steps came back after the last group acted; group g's after group g - 1 did, a step later
        stepped = [_cat(head, received[groups - 1])] + [_cat_after(received[g - 1], tails[g - 1])
                                                         for g in range(1, groups)]
        return [_cat(f, a) for f, a in zip(first, acted, strict=True)], stepped, by_group

    def _exchange(self, send: int, actions: jax.Array, receive: int, token: jax.Array) -> tuple[HostStep, jax.Array]:
        return primitives.on_host(functools.partial(self._host_exchange, send, receive), (self._step(self.group_size), _TOKEN),
                                  actions, token)

    def _join(self, parts: list[Any], axis: int) -> Any:
        """Per-group pytrees (batch on ``axis - 1``) to one in the order of environment ids."""
        return jax.tree.map(lambda *xs: jnp.stack(xs, axis).reshape(*xs[0].shape[:axis - 1], self.num_envs,
                                                                     *xs[0].shape[axis:]), *parts)

    def _obs(self, n: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((n, *self.observation_space.shape), self.observation_space.dtype)

    def _step(self, n: int) -> HostStep:
        flag = jax.ShapeDtypeStruct((n,), jnp.bool_)
        return HostStep(self._obs(n), jax.ShapeDtypeStruct((n,), jnp.float32), flag, flag, self._obs(n),
                        jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.int32))

    # -- the host side -------------------------------------------------------------

    def pool(self) -> EnvPool:
        """The pool, started if it is not up (a prefix's: its source batch's)."""
        if self._batch is not self:
            return self._batch.pool()
        live = getattr(self, "_pool", None)
        if live is None or not live.alive:
            own = self.num_envs // jax.process_count()
            live = BACKENDS[self.backend].load().start(self.name, own, self.workers, self.groups,
                                                       jax.process_index() * own, dict(self.options), dict(self.kwargs))
            object.__setattr__(self, "_pool", live)
            _LIVE.add(self)
        return live

    def counters(self) -> dict[str, float]:
        """The pool's counts kept outside the program (``EnvPool.counters``), where it is up,
        and its fleet's (``EnvPool.fleet``) where prefixes of the batch are cut."""
        live = getattr(self._batch, "_pool", None)
        if live is None:
            return {}
        return live.counters() | (live.fleet() if getattr(self._batch, "_cut", False) else {})

    def close(self) -> None:
        """Stop the pool (a later reset starts it again; a prefix's: its source batch's)."""
        if self._batch is not self:
            return self._batch.close()
        live = getattr(self, "_pool", None)
        if live is not None:
            live.close()
        _LIVE.discard(self)

    def _host(self, request: Any) -> Any:
        try:
            return request(self.pool())
        except EnvWorkerError as error:
            _LIVE.discard(self._batch)  # the run looks for the failure there
            if jax.process_count() > 1:
                _exit_every_process(error)
            object.__setattr__(self._batch, "_failure", error)
            raise

    def _converted(self, step: HostStep) -> HostStep:
        dtype = self.observation_space.dtype
        return HostStep(*(np.asarray(x, dtype) for x, dtype in zip(step, (dtype, np.float32, bool, bool, dtype,
                                                                           np.float32, np.int32), strict=True)))

    def _host_reset(self, seeds: np.ndarray) -> np.ndarray:
        return self._host(lambda pool: pool.reset(np.asarray(seeds))).astype(self.observation_space.dtype)

    def _host_step(self, actions: np.ndarray) -> HostStep:
        return self._converted(self._host(lambda pool: pool.step(np.asarray(actions))))

    def _host_send(self, group: int, actions: np.ndarray, token: np.ndarray) -> np.ndarray:
        self._host(lambda pool: pool.send(group, np.asarray(actions)))
        return np.int32(token + 1)

    def _host_receive(self, group: int, token: np.ndarray) -> tuple[HostStep, np.ndarray]:
        return self._converted(self._host(lambda pool: pool.receive(group))), np.int32(token + 1)

    def _host_exchange(self, send: int, receive: int, actions: np.ndarray, token: np.ndarray) -> tuple[HostStep, np.ndarray]:
        self._host_send(send, actions, token)
        return self._host_receive(receive, token)


def _exit_every_process(error: EnvWorkerError) -> NoReturn:
    """A worker failed in a run of several processes: the others wait for this one inside
    the program's collectives, so no process can end its program cleanly. Every process
    names the worker and exits with status 4 at once (``ENV_WORKER_FAILED``), as if
    killed: the checkpoints already written are kept."""
    distributed.stop_everywhere(f"{error}; the run stopped in every process: resume it from its last checkpoint with "
                                "jaxrl-frag resume RUN_DIR (the environments start afresh)", ENV_WORKER_FAILED)


def _cat(first: Any, rest: Any) -> Any:
    """``first`` (one step) before ``rest`` (stacked steps)."""
    return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, rest)


def _cat_after(rest: Any, last: Any) -> Any:
    """``rest`` (stacked steps) before ``last`` (one step)."""
    return jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), rest, last)


@atexit.register
def _close_all() -> None:
    for env in list(_LIVE):
        env.close()
