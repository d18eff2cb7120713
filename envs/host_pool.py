"""``HostEnvPool``: environments that are not JAX, stepped in worker processes.

Most environments (Atari through ale-py, MuJoCo through its C library, anything
wrapped for Gymnasium) cannot be traced into XLA. A pool runs ``num_envs`` Gymnasium
environments in ``num_workers`` processes, each stepping a contiguous share, and
splits them into ``groups`` groups of whole workers. ``send(group, actions)`` returns
at once and ``receive(group)`` waits for that group's step, so the host steps one
group while the device computes actions for another (SRL's environment ring,
Sebulba's double buffering); ``step`` sends to every group, then receives.

Episodes reset themselves within the step: a step that ends an episode returns the
next episode's first observation in ``obs`` and the one that ended it in
``final_obs``, ``terminated`` and ``truncated`` kept apart. Environment ``i`` is seeded
``seed + i`` at its first reset, so a pool's steps depend only on its seed and the
actions. A worker that dies, raises or stops answering is reported with the
environments it held, and the whole pool is shut down: no process is left behind.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, NoReturn

import numpy as np

from jaxrl_frag.errors import check


class EnvWorkerError(RuntimeError):
    """A worker of a ``HostEnvPool`` died, raised or stopped answering."""


class HostStep(NamedTuple):
    """One step of a group of environments, batched on the first axis."""

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray


def _serve(conn: Connection, env_id: str, kwargs: dict[str, Any], first: int, count: int, seed: int) -> None:
    """A worker: makes environments ``first .. first + count - 1`` and answers the pool's
    ``reset`` and ``step`` requests until ``close`` (or until the pool goes away)."""
    import gymnasium

    envs = []
    try:
        envs = [gymnasium.make(env_id, **kwargs) for _ in range(count)]
        while True:
            command, actions = conn.recv()
            if command == "close":
                return
            if command == "reset":
                conn.send(("ok", np.stack([env.reset(seed=seed + first + i)[0] for i, env in enumerate(envs)])))
                continue
            steps = []
            for env, action in zip(envs, actions, strict=True):
                obs, reward, terminated, truncated, _ = env.step(action)
                final = obs
                if terminated or truncated:
                    obs, _ = env.reset()
                steps.append((obs, reward, terminated, truncated, final))
            conn.send(("ok", HostStep(*(np.stack(column) for column in zip(*steps, strict=True)))))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # the pool is gone
    except Exception:  # reported to the pool, which names the environments
        try:
            conn.send(("error", traceback.format_exc()))
        except (BrokenPipeError, OSError):
            pass
    finally:
        for env in envs:
            env.close()


class HostEnvPool:
    """``num_envs`` Gymnasium environments ``env_id`` (made with ``kwargs``) in
    ``num_workers`` processes, split into ``groups`` groups. A worker gets ``timeout``
    seconds to answer a request."""

    def __init__(self, env_id: str, num_envs: int, num_workers: int = 2, groups: int = 1, seed: int = 0,
                 timeout: float = 60.0, **kwargs: Any):
        check(num_workers > 0 and num_envs % num_workers == 0, "num_workers", num_workers,
              f"must divide num_envs = {num_envs} (each worker steps an equal share)")
        check(groups > 0 and num_workers % groups == 0, "groups", groups,
              f"must divide num_workers = {num_workers} (each group is whole workers)")
        import gymnasium

        probe = gymnasium.make(env_id, **kwargs)  # the spaces; also refuses a bad id before any process starts
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        probe.close()
        self.env_id, self.num_envs, self.groups, self.timeout = env_id, num_envs, groups, timeout
        self.per_worker = num_envs // num_workers
        self.workers_per_group = num_workers // groups
        context = multiprocessing.get_context("spawn")  # never fork a process that runs XLA
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        for w in range(num_workers):
            parent, child = context.Pipe()
            proc = context.Process(target=_serve, args=(child, env_id, kwargs, w * self.per_worker, self.per_worker, seed),
                                   name=f"jaxrl-frag-env-worker-{w}", daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    @property
    def group_size(self) -> int:
        """Environments per group."""
        return self.per_worker * self.workers_per_group

    def reset(self) -> np.ndarray:
        """Every environment's first observation (environment ``i`` seeded ``seed + i``)."""
        for w in range(len(self._conns)):
            self._send(w, ("reset", None))
        return np.concatenate([self._receive(w) for w in range(len(self._conns))])

    def send(self, group: int, actions: np.ndarray) -> None:
        """Start a step of ``group``'s environments with ``actions`` (``[group_size, ...]``)."""
        check(0 <= group < self.groups, "group", group, f"choose a group in 0..{self.groups - 1}")
        check(len(actions) == self.group_size, "actions", np.shape(actions),
              f"give one action per environment of the group ({self.group_size})")
        for i, w in enumerate(self._group_workers(group)):
            self._send(w, ("step", actions[i * self.per_worker:(i + 1) * self.per_worker]))

    def receive(self, group: int) -> HostStep:
        """Wait for ``group``'s step (started by ``send``)."""
        parts = [self._receive(w) for w in self._group_workers(group)]
        return HostStep(*(np.concatenate(column) for column in zip(*parts, strict=True)))

    def step(self, actions: np.ndarray) -> HostStep:
        """Step every environment: each group sent, then each received."""
        for g in range(self.groups):
            self.send(g, actions[g * self.group_size:(g + 1) * self.group_size])
        steps = [self.receive(g) for g in range(self.groups)]
        return HostStep(*(np.concatenate(column) for column in zip(*steps, strict=True)))

    def close(self) -> None:
        """Stop every worker (asked, then terminated after a grace period) and reap it."""
        for conn, proc in zip(self._conns, self._procs, strict=True):
            if proc.is_alive():
                try:
                    conn.send(("close", None))
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def __enter__(self) -> HostEnvPool:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def _group_workers(self, group: int) -> range:
        return range(group * self.workers_per_group, (group + 1) * self.workers_per_group)

    def _held(self, worker: int) -> str:
        first = worker * self.per_worker
        return f"environments {first}-{first + self.per_worker - 1} of {self.env_id}"

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
            if not proc.is_alive():
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
        self._procs[worker].join(1.0)
        self._fail(worker, f"died (exit code {self._procs[worker].exitcode})")

    def _fail(self, worker: int, what: str) -> NoReturn:
        held = self._held(worker)
        self.close()
        raise EnvWorkerError(f"environment worker {worker} ({held}) {what}; the pool is shut down")
