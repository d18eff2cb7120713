"""``HostEnvPool``: environments that are not JAX, stepped in worker processes.

Most environments (Atari through ale-py, MuJoCo through its C library, anything
wrapped for Gymnasium) cannot be traced into XLA. A pool runs ``num_envs`` of them in
``num_workers`` processes and splits them into ``groups`` groups of whole workers:
group ``g`` holds environments ``g, g + groups, g + 2 * groups, ...``, so every group
spans the whole batch evenly. ``send(group, actions)`` returns at once and
``receive(group)`` waits for that group's step, so the host steps one group while the
device computes actions for another (SRL's environment ring, Sebulba's double
buffering); ``step`` sends to every group, then receives.

Ids name a family and an environment: ``gymnasium:<id>`` is any Gymnasium id (its
wrappers and time limit included), ``ale:<Game>`` an Atari game with the standard
preprocessing (``AtariGames``). Episodes reset themselves within the step: a step that
ends an episode returns the next episode's first observation in ``obs`` and the one
that ended it in ``final_obs``, ``terminated`` and ``truncated`` kept apart, and the
episode's score and length. ``reset(seeds)`` seeds environment ``i`` with ``seeds[i]``,
so a pool's steps depend only on the seeds and the actions. A worker that dies, raises
or stops answering is reported with the environments it held, and the whole pool is
shut down: no process is left behind.
"""

from __future__ import annotations

import difflib
import re
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, NoReturn

import numpy as np

from jaxrl_frag.envs import host_worker
from jaxrl_frag.envs.host_worker import AtariGames, GymnasiumEnvs
from jaxrl_frag.errors import ConfigError, check

FAMILIES = ("gymnasium", "ale")


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
        close = difflib.get_close_matches(rom, known, n=3)
        hint = f"did you mean {', '.join('ale:' + _game(c) for c in close)}? " if close else ""
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

    if name not in gymnasium.registry:
        close = difflib.get_close_matches(name, list(gymnasium.registry), n=3)
        hint = f"did you mean {', '.join('gymnasium:' + c for c in close)}? " if close else ""
        raise ConfigError("env", env_id, f"no such Gymnasium environment; {hint}see gymnasium.registry")
    return env_id


def environments(env_id: str, count: int, kwargs: dict[str, Any]) -> GymnasiumEnvs | AtariGames:
    """``count`` environments of ``env_id`` in this process (as a worker has them)."""
    return host_worker.make(worker_id(env_id), count, kwargs)


class HostEnvPool:
    """``num_envs`` environments ``env_id`` (made with ``kwargs``) in ``num_workers``
    processes, split into ``groups`` groups. A worker gets ``timeout`` seconds to answer
    a request. ``first_id``: the batch index of environment 0 where the pool holds one
    process's share of a larger batch (the messages name environments by it)."""

    def __init__(self, env_id: str, num_envs: int, num_workers: int = 2, groups: int = 1, timeout: float = 60.0,
                 first_id: int = 0, **kwargs: Any):
        check(groups > 0 and num_envs % groups == 0, "groups", groups,
              f"must divide num_envs = {num_envs} (each group steps an equal share)")
        check(num_workers > 0 and num_workers % groups == 0 and num_envs % num_workers == 0, "num_workers",
              num_workers, f"must be a multiple of groups = {groups} that divides num_envs = {num_envs} "
              "(each worker steps an equal share of one group)")
        target = worker_id(env_id)  # refuses a bad id before any process starts
        self.env_id, self.num_envs, self.groups, self.timeout, self.first_id = env_id, num_envs, groups, timeout, first_id
        self.per_worker = num_envs // num_workers
        self.workers_per_group = num_workers // groups
        self._conns: list[Connection] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        for _ in range(num_workers):  # a fresh interpreter each: never fork a process that runs XLA
            parent, child = socket.socketpair()
            # -P: the script's folder (this package's modules) stays off the worker's import path
            self._procs.append(subprocess.Popen([sys.executable, "-P", host_worker.__file__, str(child.fileno())],
                                                pass_fds=(child.fileno(),)))
            child.close()
            self._conns.append(Connection(parent.detach()))
            self._send(len(self._conns) - 1, (target, self.per_worker, kwargs))

    @property
    def group_size(self) -> int:
        """Environments per group."""
        return self.num_envs // self.groups

    @property
    def alive(self) -> bool:
        """Whether the workers are up (``close`` not called, no worker failed)."""
        return bool(self._procs)

    def held(self, worker: int) -> np.ndarray:
        """The ids of the environments ``worker`` steps."""
        group, first = divmod(worker, self.workers_per_group)
        members = np.arange(first * self.per_worker, (first + 1) * self.per_worker)
        return members * self.groups + group

    def reset(self, seeds: int | np.ndarray) -> np.ndarray:
        """Every environment's first observation, environment ``i`` seeded ``seeds[i]``
        (or ``seeds + i`` for an integer)."""
        seeds = np.arange(self.num_envs) + seeds if np.ndim(seeds) == 0 else np.asarray(seeds)
        for w in range(len(self._conns)):
            self._send(w, ("reset", seeds[self.held(w)]))
        return self._interleave([self._gather(g) for g in range(self.groups)])

    def send(self, group: int, actions: np.ndarray) -> None:
        """Start a step of ``group``'s environments with ``actions`` (``[group_size, ...]``,
        in the order of their ids)."""
        check(0 <= group < self.groups, "group", group, f"choose a group in 0..{self.groups - 1}")
        check(len(actions) == self.group_size, "actions", np.shape(actions),
              f"give one action per environment of the group ({self.group_size})")
        for i, w in enumerate(self._group_workers(group)):
            self._send(w, ("step", actions[i * self.per_worker:(i + 1) * self.per_worker]))

    def receive(self, group: int) -> HostStep:
        """Wait for ``group``'s step (started by ``send``), in the order of its ids."""
        return HostStep(*self._gather(group))

    def step(self, actions: np.ndarray) -> HostStep:
        """Step every environment (``actions`` in the order of their ids): each group
        sent, then each received."""
        for g in range(self.groups):
            self.send(g, actions[g::self.groups])
        return HostStep(*(self._interleave(column) for column in zip(*(self.receive(g) for g in range(self.groups)),
                                                                      strict=True)))

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
        self._procs, self._conns = [], []

    def __enter__(self) -> HostEnvPool:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def _interleave(self, parts: list[Any]) -> np.ndarray:
        """Per-group arrays to one in the order of environment ids."""
        return np.stack(parts, axis=1).reshape(self.num_envs, *np.shape(parts[0])[1:])

    def _gather(self, group: int) -> Any:
        """The answers of ``group``'s workers, concatenated (each a tuple or an array)."""
        parts = [self._receive(w) for w in self._group_workers(group)]
        if isinstance(parts[0], tuple):
            return tuple(np.concatenate(column) for column in zip(*parts, strict=True))
        return np.concatenate(parts)

    def _group_workers(self, group: int) -> range:
        return range(group * self.workers_per_group, (group + 1) * self.workers_per_group)

    def _describe(self, worker: int) -> str:
        ids = self.held(worker) + self.first_id
        listed = ", ".join(map(str, ids)) if len(ids) <= 8 else f"{', '.join(map(str, ids[:4]))}, ..., {ids[-1]}"
        return f"environment{'s' if len(ids) > 1 else ''} {listed} of {self.env_id}"

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
        return HostStep(*payload) if isinstance(payload, tuple) else payload

    def _fail_dead(self, worker: int) -> NoReturn:
        """Its pipe is closed: the worker is dead or dying; report its exit code."""
        try:
            code = self._procs[worker].wait(1.0)
        except subprocess.TimeoutExpired:
            code = None
        self._fail(worker, f"died (exit code {code})")

    def _fail(self, worker: int, what: str) -> NoReturn:
        held = self._describe(worker)
        self.close()
        raise EnvWorkerError(f"environment worker {worker} ({held}) {what}; the pool is shut down")
