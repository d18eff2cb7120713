"""Pools of environments that are not JAX: ``HostEnvPool`` steps them in worker
processes, ``InProcessPool`` in this process, and ``host_ray.RayPool`` in Ray actors on
a cluster's nodes; ``BACKENDS`` names them for ``--env-backend`` (a pool class each,
imported once chosen, and the backend options of ``OPTIONS`` it takes).

Most environments (Atari through ale-py, MuJoCo through its C library, anything
wrapped for Gymnasium) cannot be traced into XLA. A pool runs ``num_envs`` of them
split into ``groups`` groups: group ``g`` holds environments ``g, g + groups, g + 2 *
groups, ...``, so every group spans the whole batch evenly. ``send(group, actions)``
returns at once and ``receive(group)`` waits for that group's step, so the host steps
one group while the device computes actions for another (SRL's environment ring,
Sebulba's double buffering); ``step`` sends to every group, then receives.

``HostEnvPool`` runs the groups in worker processes (whole workers a group), which
write observations into memory shared with the pool and send only the rest: a crash
is isolated and named. ``InProcessPool`` runs each group in this process: Atari games
on ale-py's own threads, which step while the caller goes on, without any IPC.

Ids name a family and an environment: ``gymnasium:<id>`` is any Gymnasium id (its
wrappers and time limit included; ``gymnasium:<module>:<id>`` imports the module that
registers the id first, here and in every worker), ``ale:<Game>`` an Atari game with
the standard preprocessing (``AtariGames``). Episodes reset themselves within the
step: a step that ends an episode returns the next episode's first observation in
``obs`` and the one that ended it in ``final_obs``, ``terminated`` and ``truncated``
kept apart, and the episode's score and length. ``reset(seeds)`` seeds environment
``i`` with ``seeds[i]``, so a pool's steps depend only on the seeds and the actions. A worker that dies, raises
or stops answering is reported with the environments it held, and the whole pool is
shut down: no process is left behind. Both pools compute the same steps.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import mmap
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, NoReturn, TypeVar

import numpy as np

from jaxrl_frag.envs import host_worker
from jaxrl_frag.envs.host_worker import Envs, Episodes
from jaxrl_frag.errors import ConfigError, check, did_you_mean

T = TypeVar("T")

FAMILIES = ("gymnasium", "ale")
# the backends' own options (HostEnv.make's keywords, a recipe's env_<option>) and their defaults
OPTIONS = {"timeout": 60.0, "address": "", "worker_cpus": 1.0, "worker_resource": "", "lost_workers": "stop",
           "keep_alive": 10.0}


class EnvWorkerError(RuntimeError):
    """A worker of a ``HostEnvPool`` died, raised or stopped answering."""


class HostStep(NamedTuple):
    """One step of a group of environments, batched on the first axis. ``score`` and
    ``length`` are the episode's (its undiscounted game score, before any reward
    clipping), to be read where it ended."""

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    score: np.ndarray
    length: np.ndarray


def rom_id(game: str) -> str:
    """ale-py's ROM id of ``game`` (``SpaceInvaders`` -> ``space_invaders``); ``ConfigError``
    naming the games if there is no such ROM."""
    from ale_py import roms

    rom = re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()
    known = roms.get_all_rom_ids()
    if rom not in known:
        hint = did_you_mean(rom, known, lambda c: "ale:" + _game(c))
        raise ConfigError("env", f"ale:{game}", f"no such Atari game; {hint}games: {', '.join(map(_game, known))}")
    return rom


def _game(rom: str) -> str:
    return "".join(part.capitalize() for part in rom.split("_"))


def worker_id(env_id: str) -> str:
    """``env_id`` as a worker makes it (``ale:<Game>`` as ``ale:<rom id>``); ``ConfigError``
    if it names no environment."""
    family, _, name = env_id.partition(":")
    check(family in FAMILIES and name, "env", env_id,
          f"host environment ids are {' or '.join(f + ':<name>' for f in FAMILIES)}, e.g. gymnasium:CartPole-v1")
    if family == "ale":
        return f"ale:{rom_id(name)}"
    import gymnasium

    module, _, registered = name.rpartition(":")  # Gymnasium's module:id, the module registering the id
    if module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError("env", env_id, f"cannot import {module!r} ({error}), the module that registers "
                                             f"{registered!r}: install it, or put its folder on PYTHONPATH (every "
                                             "worker imports it too)") from None
    if registered not in gymnasium.registry:
        prefix = f"gymnasium:{module}:" if module else "gymnasium:"
        hint = did_you_mean(registered, gymnasium.registry, lambda c: prefix + c)
        raise ConfigError("env", env_id, f"no such Gymnasium environment; {hint}see gymnasium.registry")
    return env_id


def environments(env_id: str, count: int, kwargs: dict[str, Any]) -> Envs:
    """``count`` environments of ``env_id`` in this process (as a worker has them)."""
    return host_worker.make(worker_id(env_id), count, kwargs)


class EnvPool(abc.ABC):
    """``num_envs`` environments ``env_id`` in ``groups`` groups. ``first_id``: the batch
    index of environment 0 where the pool holds one process's share of a larger batch
    (the messages name environments by it)."""

    def __init__(self, env_id: str, num_envs: int, groups: int, first_id: int):
        check(groups > 0 and num_envs % groups == 0, "groups", groups,
              f"must divide num_envs = {num_envs} (each group steps an equal share)")
        self.target = worker_id(env_id)  # refuses a bad id before anything starts
        self.env_id, self.num_envs, self.groups, self.first_id = env_id, num_envs, groups, first_id

    @classmethod
    def check_options(cls, env_id: str, workers: int, options: dict[str, Any]) -> None:
        """Raise ``ConfigError`` where the backend cannot run with ``options`` (its entries
        of ``OPTIONS``), before anything is traced; nothing to check by default."""
        return None

    @classmethod
    def capacity(cls, options: dict[str, Any]) -> int:
        """How many workers fit where the backend runs them, for ``workers=0``: this
        machine's CPUs by default (after ``check_options``)."""
        return os.cpu_count() or 1

    @classmethod
    @abc.abstractmethod
    def start(cls, env_id: str, num_envs: int, workers: int, groups: int, first_id: int, options: dict[str, Any],
              kwargs: dict[str, Any]) -> EnvPool:
        """The pool of a ``HostEnv``: ``workers`` as the backend has them (processes,
        threads, actors), ``options`` its entries of ``OPTIONS``, ``kwargs`` the
        environments' own."""

    def counters(self) -> dict[str, float]:
        """Counts kept outside the program that a run adds to its rows (a pool that
        restarts lost workers counts them); none by default."""
        return {}

    def fleet(self) -> dict[str, float]:
        """The workers' counts that a run stepping prefixes of the batch adds to its rows (a
        pool that releases idle workers and starts them again counts them); none by default."""
        return {}

    @property
    def group_size(self) -> int:
        """Environments per group."""
        return self.num_envs // self.groups

    @property
    @abc.abstractmethod
    def alive(self) -> bool:
        """Whether the environments are up (``close`` not called, none failed)."""

    @abc.abstractmethod
    def reset(self, seeds: int | np.ndarray) -> np.ndarray:
        """Every environment's first observation, environment ``i`` seeded ``seeds[i]``
        (or ``seeds + i`` for an integer)."""

    @abc.abstractmethod
    def send(self, group: int, actions: np.ndarray) -> None:
        """Start a step of ``group``'s environments with ``actions`` (``[group_size, ...]``,
        in the order of their ids)."""

    @abc.abstractmethod
    def receive(self, group: int) -> HostStep:
        """Wait for ``group``'s step (started by ``send``), in the order of its ids."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the environments."""

    def step(self, actions: np.ndarray) -> HostStep:
        """Step every environment (``actions`` in the order of their ids): each group
        sent, then each received."""
        for g in range(self.groups):
            self.send(g, actions[g::self.groups])
        return HostStep(*(self._interleave(column) for column in zip(*(self.receive(g) for g in range(self.groups)),
                                                                      strict=True)))

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def _seeds(self, seeds: int | np.ndarray) -> np.ndarray:
        return np.arange(self.num_envs) + seeds if np.ndim(seeds) == 0 else np.asarray(seeds)

    def _check_send(self, group: int, actions: np.ndarray) -> None:
        check(0 <= group < self.groups, "group", group, f"choose a group in 0..{self.groups - 1}")
        check(len(actions) == self.group_size, "actions", np.shape(actions),
              f"give one action per environment of the group ({self.group_size})")

    def _interleave(self, parts: list[Any]) -> np.ndarray:
        """Per-group arrays to one in the order of environment ids."""
        if len(parts) == 1:
            return parts[0]
        return np.stack(parts, axis=1).reshape(-1, *np.shape(parts[0])[1:])

    def _listed(self, ids: np.ndarray) -> str:
        ids = ids + self.first_id
        listed = ", ".join(map(str, ids)) if len(ids) <= 8 else f"{', '.join(map(str, ids[:4]))}, ..., {ids[-1]}"
        return f"environment{'s' if len(ids) > 1 else ''} {listed} of {self.env_id}"


class WorkerPool(EnvPool):
    """A pool whose groups are whole workers, each stepping an equal share of its group:
    worker ``w`` of ``num_workers`` holds the environments ``held(w)``, whichever backend
    runs it, so the same seeds give the same steps.

    A prefix of the batch steps alone: ``send(group, actions)`` with fewer actions than
    the group has environments steps the group's first workers (the group's members that
    the batch's first environments are), and ``reset`` with fewer seeds resets the
    batch's first environments; the other workers wait, their environments as they were
    (boosting's rungs, ``HostEnv.prefix``)."""

    def __init__(self, env_id: str, num_envs: int, num_workers: int, groups: int, first_id: int):
        super().__init__(env_id, num_envs, groups, first_id)
        check(num_workers > 0 and num_workers % groups == 0 and num_envs % num_workers == 0, "num_workers",
              num_workers, f"must be a multiple of groups = {groups} that divides num_envs = {num_envs} "
              "(each worker steps an equal share of one group)")
        self.num_workers = num_workers
        self.per_worker = num_envs // num_workers
        self.workers_per_group = num_workers // groups
        self._stepping = [self._group_workers(g) for g in range(groups)]  # each group's workers in its last send

    def held(self, worker: int) -> np.ndarray:
        """The ids of the environments ``worker`` steps."""
        group, first = divmod(worker, self.workers_per_group)
        members = np.arange(first * self.per_worker, (first + 1) * self.per_worker)
        return members * self.groups + group

    def _group_workers(self, group: int, count: int | None = None) -> range:
        """``group``'s workers, or its first ``count``."""
        first = group * self.workers_per_group
        return range(first, first + (self.workers_per_group if count is None else count))

    def _sending(self, group: int, actions: np.ndarray) -> range:
        """The workers a send of ``actions`` to ``group`` steps (its first, one share of
        actions each), remembered for ``receive``; ``ConfigError`` for a bad group or count."""
        check(0 <= group < self.groups, "group", group, f"choose a group in 0..{self.groups - 1}")
        count, share = divmod(len(actions), self.per_worker)
        check(share == 0 and 0 < count <= self.workers_per_group, "actions", np.shape(actions),
              f"give one action per environment of the group's first workers ({self.per_worker} each, "
              f"{self.group_size} in all)")
        self._stepping[group] = self._group_workers(group, count)
        return self._stepping[group]

    def _resetting(self, seeds: int | np.ndarray) -> tuple[np.ndarray, list[int]]:
        """The seeds of the batch's first environments (all, for an integer) and the
        workers that hold them, group by group; each group's next receive reads those."""
        seeds = self._seeds(seeds)
        count = prefix_workers(len(seeds), self.num_envs, self.num_workers, self.groups)
        self._stepping = [self._group_workers(g, count) for g in range(self.groups)]
        return seeds, [w for workers in self._stepping for w in workers]


class HostEnvPool(WorkerPool):
    """``num_envs`` environments ``env_id`` (made with ``kwargs``) in ``num_workers``
    processes, split into ``groups`` groups of whole workers. A worker gets ``timeout``
    seconds to answer a request."""

    def __init__(self, env_id: str, num_envs: int, num_workers: int = 2, groups: int = 1, timeout: float = 60.0,
                 first_id: int = 0, **kwargs: Any):
        super().__init__(env_id, num_envs, num_workers, groups, first_id)
        self.timeout = timeout
        probe = host_worker.make(self.target, 1, kwargs)
        space = probe.observation_space
        probe.close()
        size = 2 * self.per_worker * int(np.prod(space.shape)) * np.dtype(space.dtype).itemsize
        self._conns: list[Connection] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._shared: list[np.ndarray] = []  # each worker's [observations, final observations]
        for _ in range(num_workers):  # a fresh interpreter each: never fork a process that runs XLA
            parent, child = socket.socketpair()
            memory = _shared_memory(size)
            # -P: the script's folder (this package's modules) stays off the worker's import path
            self._procs.append(subprocess.Popen([sys.executable, "-P", host_worker.__file__, str(child.fileno()),
                                                 str(memory)], pass_fds=(child.fileno(), memory)))
            child.close()
            self._shared.append(host_worker.observations(mmap.mmap(memory, size), self.per_worker, space))
            os.close(memory)
            self._conns.append(Connection(parent.detach()))
            self._send(len(self._conns) - 1, (self.target, self.per_worker, kwargs))

    @classmethod
    def start(cls, env_id: str, num_envs: int, workers: int, groups: int, first_id: int, options: dict[str, Any],
              kwargs: dict[str, Any]) -> HostEnvPool:
        return cls(env_id, num_envs, workers, groups, options["timeout"], first_id, **kwargs)

    @property
    def alive(self) -> bool:
        return bool(self._procs)

    def reset(self, seeds: int | np.ndarray) -> np.ndarray:
        seeds, workers = self._resetting(seeds)
        for w in workers:
            self._send(w, ("reset", seeds[self.held(w)]))
        return self._interleave([self._gather(g)[0] for g in range(self.groups)])

    def send(self, group: int, actions: np.ndarray) -> None:
        for i, w in enumerate(self._sending(group, actions)):
            self._send(w, ("step", actions[i * self.per_worker:(i + 1) * self.per_worker]))

    def receive(self, group: int) -> HostStep:
        obs, final, (reward, terminated, truncated, score, length) = self._gather(group)
        return HostStep(obs, reward, terminated, truncated, final, score, length)

    def close(self) -> None:
        """Stop every worker (asked, then terminated after a grace period) and reap it."""
        for conn, proc in zip(self._conns, self._procs, strict=True):
            if proc.poll() is None:
                try:
                    conn.send(("close", None))
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._shared = [], [], []

    def _gather(self, group: int) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
        """``group``'s observations and final observations (copied out of the shared
        memory) and the answers of the workers it last sent to, concatenated column by column."""
        workers = self._stepping[group]
        answers = [self._receive(w) for w in workers]
        obs, final = (np.concatenate([self._shared[w][slot] for w in workers]) for slot in (0, 1))
        columns = () if answers[0] is None else tuple(np.concatenate(c) for c in zip(*answers, strict=True))
        return obs, final, columns

    def _send(self, worker: int, message: tuple[str, Any]) -> None:
        try:
            self._conns[worker].send(message)
        except (BrokenPipeError, OSError):
            self._fail_dead(worker)

    def _receive(self, worker: int) -> Any:
        """Worker ``worker``'s answer; on death, an error or a timeout, close the pool and raise."""
        conn, proc = self._conns[worker], self._procs[worker]
        deadline = time.monotonic() + self.timeout
        while not conn.poll(0.05):
            if proc.poll() is not None:
                self._fail_dead(worker)
            if time.monotonic() > deadline:
                self._fail(worker, f"did not answer within {self.timeout:g} s")
        try:
            status, payload = conn.recv()
        except (EOFError, OSError):
            self._fail_dead(worker)
        if status == "error":
            self._fail(worker, f"raised:\n{payload}")
        return payload

    def _fail_dead(self, worker: int) -> NoReturn:
        """Its pipe is closed: the worker is dead or dying; report its exit code."""
        try:
            code = self._procs[worker].wait(1.0)
        except subprocess.TimeoutExpired:
            code = None
        self._fail(worker, f"died (exit code {code})")

    def _fail(self, worker: int, what: str) -> NoReturn:
        held = self._listed(self.held(worker))
        self.close()
        raise EnvWorkerError(f"environment worker {worker} ({held}) {what}; the pool is shut down")


class InProcessPool(EnvPool):
    """``num_envs`` environments ``env_id`` (made with ``kwargs``) in this process,
    split into ``groups`` groups, each one batch (``host_worker.Envs``): Atari games
    step on ``threads // groups`` threads of ale-py's own a group, between ``send`` and
    ``receive``, while the caller goes on; Gymnasium environments step in turn at
    ``receive``. An environment that raises is named and the pool shut down; one that
    crashes takes the process with it, and none is timed out (``HostEnvPool`` isolates)."""

    def __init__(self, env_id: str, num_envs: int, threads: int = 2, groups: int = 1, first_id: int = 0,
                 **kwargs: Any):
        super().__init__(env_id, num_envs, groups, first_id)
        check(threads > 0 and threads % groups == 0, "threads", threads,
              f"must be a multiple of groups = {groups} (each group steps on its own threads)")
        self._envs = [host_worker.make(self.target, self.group_size, kwargs, threads // groups)
                      for _ in range(groups)]
        self._episodes = [Episodes(self.group_size) for _ in range(groups)]

    @classmethod
    def start(cls, env_id: str, num_envs: int, workers: int, groups: int, first_id: int, options: dict[str, Any],
              kwargs: dict[str, Any]) -> InProcessPool:
        return cls(env_id, num_envs, workers, groups, first_id, **kwargs)

    @property
    def alive(self) -> bool:
        return bool(self._envs)

    def reset(self, seeds: int | np.ndarray) -> np.ndarray:
        seeds = self._seeds(seeds)
        for episodes in self._episodes:
            episodes.reset()
        return self._interleave([self._call(g, lambda envs, g=g: envs.reset(seeds[g::self.groups]))
                                 for g in range(self.groups)])

    def send(self, group: int, actions: np.ndarray) -> None:
        self._check_send(group, actions)
        self._call(group, lambda envs: envs.send(actions))

    def receive(self, group: int) -> HostStep:
        obs, reward, points, terminated, truncated, final = self._call(group, lambda envs: envs.recv())
        score, length = self._episodes[group].record(points, terminated | truncated)
        return HostStep(obs, reward, terminated, truncated, final, score, length)

    def close(self) -> None:
        for envs in self._envs:
            envs.close()
        self._envs = []

    def _call(self, group: int, request: Callable[[Envs], T]) -> T:
        """``request`` of ``group``'s environments; if it raises, close the pool and raise
        ``EnvWorkerError`` naming them, with the traceback."""
        try:
            return request(self._envs[group])
        except Exception as error:
            held = self._listed(np.arange(group, self.num_envs, self.groups))
            self.close()
            raise EnvWorkerError(f"environment group {group} ({held}) raised:\n{traceback.format_exc()}; the pool "
                                 "is shut down") from error


def prefix_workers(count: int, num_envs: int, workers: int, groups: int) -> int:
    """How many of each group's workers hold the first ``count`` of ``num_envs``
    environments in ``workers`` workers and ``groups`` groups (``WorkerPool.held``);
    ``ConfigError`` unless they are whole workers of every group."""
    whole = groups * (num_envs // workers)
    check(0 < count <= num_envs and count % whole == 0, "num_envs", count,
          f"a prefix of {num_envs} host environments in {workers} workers and {groups} groups steps whole workers of "
          f"every group: give a multiple of {whole}, or more workers (--env-workers), each holding fewer")
    return count // whole


@dataclasses.dataclass(frozen=True)
class Backend:
    """Where a ``HostEnv``'s pool steps: ``pool``, the ``EnvPool`` class as
    ``"module:Class"`` (imported only once the backend is chosen, so that a backend's
    own dependencies load only for it), and ``options``, the entries of ``OPTIONS`` it
    takes (the others must keep their defaults)."""

    pool: str
    options: tuple[str, ...] = ()

    def load(self) -> type[EnvPool]:
        module, _, name = self.pool.partition(":")
        return getattr(importlib.import_module(module), name)


# the backends by name (--env-backend): a new one is a module with an EnvPool and an entry here
BACKENDS: dict[str, Backend] = {
    "processes": Backend("jaxrl_frag.envs.host_pool:HostEnvPool", ("timeout",)),
    "in-process": Backend("jaxrl_frag.envs.host_pool:InProcessPool"),
    "ray": Backend("jaxrl_frag.envs.host_ray:RayPool", ("timeout", "address", "worker_cpus", "worker_resource",
                                                        "lost_workers", "keep_alive")),
}


def _shared_memory(size: int) -> int:
    """A file descriptor of ``size`` bytes of anonymous memory to share with a worker
    (freed when its last descriptor and mapping are gone)."""
    if hasattr(os, "memfd_create"):
        memory = os.memfd_create("jaxrl-frag-observations")
    else:
        memory, path = tempfile.mkstemp()
        os.unlink(path)
    os.ftruncate(memory, size)
    return memory
