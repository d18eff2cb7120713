"""``RayPool``: host environments stepped by Ray actors on a cluster's CPU nodes
(``--env-backend ray``), observations back to the trainer for batched inference.

A machine with accelerators and a rack of machines with CPUs only: the environments
step on the CPU machines, each worker a Ray actor holding an equal share of one group
of the environment ring (``WorkerPool``: the same environments as a worker process of
``HostEnvPool`` holds), and the trainer reaches them through the same host calls and
ring as the local pools. Environment ``i`` is seeded ``seeds[i]`` whichever node its
worker lands on, so a run computes what it computes with local worker processes.

The actor's code (``host_worker.Worker``) is sent by value: a CPU node needs Ray,
NumPy, Gymnasium and ale-py (for Atari), not this package nor JAX. ``worker_cpus``
CPUs a worker, and ``worker_resource``, a custom resource that the CPU nodes were
started with (``ray start --resources '{"envs": 16}'``), aims the workers at them
(each takes a trace of it, so their CPUs decide how many fit). ``address`` is the
cluster's (``host:port``; empty: ``$RAY_ADDRESS``, else a Ray started in this
process for the run and stopped after it). Ray is imported only once this backend
is chosen: without it, choosing it is a ``ConfigError`` with the install command.

A worker is lost when its actor or its node dies, or when it does not answer within
``timeout`` seconds (a new one, to be placed, started and reset, within ``STARTING``
seconds at least). With ``lost_workers="stop"`` the pool is shut down with an
``EnvWorkerError`` naming the worker, its environments and its node (a run stops with
exit status 4, its checkpoints kept). With ``"restart"`` a new actor takes the lost
one's environments wherever the cluster has room, resets them (seeded from their
seeds and the count of restarts) and the step in flight returns, for each of them,
the episode so far ended as a truncation (reward 0, its last observation as the
final one); ``counters`` counts the restarts and the episodes cut short. An
environment that raises stops the pool in either case: that is no lost worker.

The fleet is elastic (Nitro's serverless bursts, with Ray actors for cloud functions):
where sends step a prefix of a group (boosting's smaller rungs), the group's other
workers wait, and one that no send has needed for ``keep_alive`` seconds is released,
its CPUs back to the cluster (a serverless platform's keep-alive); a later send that
needs it starts a new actor, which resets its environments (seeded from their seeds and
the count of starts) and returns their episodes in flight ended as truncations, as a
restart does (a new actor that the cluster cannot place within ``STARTING`` seconds is
a lost worker, under ``lost_workers`` as any other). ``fleet`` reports the live
workers, the workers started again, the seconds the pool has been up and the
worker-seconds it held in them (the fleet's cost, by the wall clock).
"""

from __future__ import annotations

import math
import os
import socket
import sys
import tempfile
import time
from typing import Any, NamedTuple, NoReturn

import numpy as np

from jaxrl_frag.envs import host_worker
from jaxrl_frag.envs.host_pool import EnvWorkerError, HostStep, WorkerPool
from jaxrl_frag.envs.host_worker import Episodes
from jaxrl_frag.errors import ConfigError, check

INSTALL = "pip install 'jaxrl_frag[ray]'"
LOST_WORKERS = ("stop", "restart")
RESOURCE_SHARE = 0.001  # of worker_resource per worker: a placement constraint, the CPUs set how many fit
STARTING = 120.0  # seconds a new worker has, at least, to be placed, start and reset its environments
_STARTED: list[bool] = []  # [True] while this process runs a Ray it started itself (no address)


class Regrown(NamedTuple):
    """A released worker started again by a send: ``reset``, the reference to its
    environments' first observations, answered at the group's receive as a cut step."""

    reset: Any


def ray_module() -> Any:
    """``ray``, imported; ``ConfigError`` naming the install command without it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("env_backend", "ray", f"needs Ray, which is not installed: install it with {INSTALL}, or "
                                                "choose processes (worker processes on this machine)") from None
    return ray


def cluster_address(address: str) -> str:
    """The cluster to connect to: ``address``, else ``$RAY_ADDRESS``; empty for none."""
    return address or os.environ.get("RAY_ADDRESS", "")


def _check_address(address: str) -> None:
    """``ConfigError`` unless ``address`` is ``auto`` or ``[ray://]host:port`` with
    something listening there."""
    field = "env_address" if address else "RAY_ADDRESS"
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    check(bool(host) and port.isdigit(), field, address,
          "give the cluster's address as host:port (what ray start --head prints), ray://host:port or auto")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as error:
        raise ConfigError(field, address, f"no Ray cluster answers there ({error.strerror or error}): start one "
                                          "with ray start --head, or leave the address empty for a local Ray "
                                          "started for the run") from None


UNIX_SOCKET_PATH_MAX = 107  # bytes in an AF_UNIX socket's path (Linux's sun_path less its end)
RAY_SOCKET_SUFFIX = len("/ray/session_2026-12-06_05-45-09_605216_4194304/sockets/plasma_store")


def local_temp_dir() -> str | None:
    """The folder a local Ray keeps its sessions in: Ray's own (``$TMPDIR/ray``), or, where
    ``$TMPDIR`` is too deep for its sockets' paths to fit ``UNIX_SOCKET_PATH_MAX``, a
    folder of this user's under ``/tmp``."""
    if len(tempfile.gettempdir()) + RAY_SOCKET_SUFFIX <= UNIX_SOCKET_PATH_MAX:
        return None
    return f"/tmp/ray-{os.getuid()}"


def connect(address: str, cpus: float) -> None:
    """Connect this process to the cluster at ``cluster_address(address)``, or start a
    local Ray with at least ``cpus`` CPUs (stopped by ``disconnect``); nothing where
    it is connected already."""
    ray = ray_module()
    if ray.is_initialized():
        return
    import logging
    import warnings

    address = cluster_address(address)
    # Ray's notes on the thread it starts from (a host call's) and on its defaults stay out of the run's output
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)  # JAX's warning; Ray forks to exec its servers
        if address:
            try:
                ray.init(address=address, **quiet)
            except ConnectionError as error:
                raise ConfigError("env_address", address, f"Ray could not connect: {error}") from None
            return
        # "local": a Ray of this run's own, even where another runs on this machine (without it, ray.init
        # joins the cluster it finds recorded in Ray's temp dir, and refuses num_cpus there)
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(cpus)), include_dashboard=False,
                 _temp_dir=local_temp_dir(), **quiet)
    _STARTED.append(True)


def disconnect() -> None:
    """Stop the local Ray that ``connect`` started, if it did."""
    if _STARTED:
        _STARTED.clear()
        if ray_module().is_initialized():
            ray_module().shutdown()


class RayPool(WorkerPool):
    """``num_envs`` environments ``env_id`` (made with ``kwargs``) in ``num_workers`` Ray
    actors of ``worker_cpus`` CPUs each (on the nodes with ``worker_resource``, where
    given), split into ``groups`` groups of whole workers; a lost worker stops the pool
    or is restarted (``lost_workers``). See the module's docstring."""

    def __init__(self, env_id: str, num_envs: int, num_workers: int = 2, groups: int = 1, first_id: int = 0, *,
                 timeout: float = 60.0, address: str = "", worker_cpus: float = 1.0, worker_resource: str = "",
                 lost_workers: str = "stop", keep_alive: float = 10.0, **kwargs: Any):
        super().__init__(env_id, num_envs, num_workers, groups, first_id)
        self.check_options(env_id, num_workers, dict(timeout=timeout, address=address, worker_cpus=worker_cpus,
                                                     worker_resource=worker_resource, lost_workers=lost_workers,
                                                     keep_alive=keep_alive))
        self.timeout, self.lost_workers, self.keep_alive = timeout, lost_workers, keep_alive
        ray = ray_module()
        connect(address, num_workers * worker_cpus)
        if cluster_address(address):
            room = self.capacity(dict(address=address, worker_cpus=worker_cpus, worker_resource=worker_resource))
            if num_workers > room:  # Ray queues the rest until nodes join (an autoscaler's, or by hand)
                nodes = f" with the resource {worker_resource!r}" if worker_resource else ""
                print(f"jaxrl-frag: {num_workers} environment workers at {worker_cpus:g} CPU each asked, and the Ray "
                      f"cluster's live nodes{nodes} hold {room} in all: the others wait for nodes to join (each worker "
                      f"has {max(timeout, STARTING):g} s to start), or lower --env-workers or --env-worker-cpus",
                      file=sys.stderr, flush=True)
        ray.cloudpickle.register_pickle_by_value(host_worker)  # the workers need not import this package
        resources = {worker_resource: RESOURCE_SHARE} if worker_resource else {}
        self._remote = ray.remote(host_worker.Worker).options(num_cpus=worker_cpus, resources=resources,
                                                               max_restarts=0)
        self._kwargs = kwargs
        self._actors: list[Any] = [None] * num_workers
        self._nodes: list[Any] = [None] * num_workers  # each worker's node id, or a reference to it
        self._episodes = [Episodes(self.per_worker) for _ in range(num_workers)]
        self._last: list[np.ndarray | None] = [None] * num_workers  # each worker's latest observations
        self._pending: dict[int, Any] = {}  # worker -> its step in flight (or its reset, ``Regrown``)
        self._starting: set[int] = set()  # workers that have not answered yet: they get STARTING seconds
        self._row_seeds = np.zeros(num_envs, np.int64)  # each environment's seed at the last reset
        self.restarts = self.cut = self.regrown = self.launched = 0  # launched: actors started after the first ones
        self._held_seconds, self._since = 0.0, time.monotonic()  # worker-seconds held until _since
        self._idle_since: dict[int, float] = {}  # live workers that the last sends left out, since when
        for w in range(num_workers):
            self._start_worker(w)
        self._held_seconds, self._born = 0.0, self._since  # the fleet's seconds count from its last first start

    @classmethod
    def check_options(cls, env_id: str, workers: int, options: dict[str, Any]) -> None:
        """Ray installed, the settings sound, and the cluster's address (where one is
        given) answering, with a node that has ``worker_resource``."""
        ray = ray_module()
        lost, cpus, resource = options["lost_workers"], options["worker_cpus"], options["worker_resource"]
        check(lost in LOST_WORKERS, "env_lost_workers", lost,
              "choose stop (the run ends, exit status 4, resume continues it) or restart (elsewhere, training goes on)")
        check(isinstance(cpus, int | float) and 0 < cpus < math.inf, "env_worker_cpus", cpus,
              "give the CPUs each worker reserves, a positive number (0.5: two workers a CPU)")
        keep = options["keep_alive"]
        check(isinstance(keep, int | float) and 0 <= keep < math.inf, "env_keep_alive", keep,
              "give the seconds an idle worker is kept, zero (released at once) or more")
        address = cluster_address(options["address"])
        check(not resource or bool(address), "env_worker_resource", resource,
              "names a resource of a cluster's nodes; a local Ray has none: give the cluster's --env-address (or "
              "RAY_ADDRESS), or drop it")
        if not address:
            return
        if not ray.is_initialized():
            _check_address(address)
            connect(address, 0)
        if resource:
            held = ray.cluster_resources()
            custom = sorted(k for k in held if k not in ("CPU", "GPU", "memory", "object_store_memory")
                            and not k.startswith(("node:", "accelerator_type:")))
            check(resource in held, "env_worker_resource", resource,
                  f"no node of the Ray cluster at {address} has it (its nodes' own resources: "
                  f"{', '.join(custom) or 'none'}): start the CPU nodes with ray start --address {address} "
                  f"--resources '{{\"{resource}\": N}}'")

    @classmethod
    def capacity(cls, options: dict[str, Any]) -> int:
        """On a cluster (an address given), the actors its live nodes' CPUs hold at
        ``worker_cpus`` each, on the nodes with ``worker_resource`` where one is named;
        for a local Ray, this machine's CPUs."""
        if not cluster_address(options["address"]):
            return super().capacity(options)
        resource, cpus = options["worker_resource"], options["worker_cpus"]
        nodes = [node["Resources"] for node in ray_module().nodes() if node.get("Alive")]
        return sum(int(held.get("CPU", 0) // cpus) for held in nodes if not resource or held.get(resource, 0) > 0)

    @classmethod
    def start(cls, env_id: str, num_envs: int, workers: int, groups: int, first_id: int, options: dict[str, Any],
              kwargs: dict[str, Any]) -> RayPool:
        return cls(env_id, num_envs, workers, groups, first_id, **options, **kwargs)

    @property
    def alive(self) -> bool:
        return any(actor is not None for actor in self._actors)

    @property
    def live_workers(self) -> int:
        """The workers whose actors are up (the others were released)."""
        return sum(actor is not None for actor in self._actors)

    def counters(self) -> dict[str, float]:
        if self.lost_workers != "restart":
            return {}
        return {"env_workers_restarted": float(self.restarts), "env_episodes_cut": float(self.cut)}

    def fleet(self) -> dict[str, float]:
        """The live workers, the released ones started again, the seconds the pool has been
        up and the worker-seconds it held in them (wall-clock), and the episodes cut short
        (by restarts or regrowth)."""
        self._account()
        return {"env_workers_live": float(self.live_workers), "env_workers_regrown": float(self.regrown),
                "env_fleet_seconds": self._since - self._born, "env_worker_seconds": self._held_seconds,
                "env_episodes_cut": float(self.cut)}

    def nodes(self) -> list[str | None]:
        """Each worker's node id (waiting for a worker that has not said yet; None for a
        released one)."""
        ray = ray_module()
        self._nodes = [ray.get(n, timeout=self.timeout) if isinstance(n, ray.ObjectRef) else n for n in self._nodes]
        return list(self._nodes)

    def reset(self, seeds: int | np.ndarray) -> np.ndarray:
        seeds, workers = self._resetting(seeds)
        self._row_seeds[:len(seeds)] = seeds
        for w in workers:
            self._pending.pop(w, None)
            self._idle_since.pop(w, None)
            if self._actors[w] is None:  # released
                self._start_worker(w)
                self.regrown += 1
        refs = {w: self._actors[w].reset.remote(self._row_seeds[self.held(w)]) for w in workers}
        obs = {}
        for w, ref in refs.items():
            obs[w] = self._answer(w, ref)
            self._starting.discard(w)
            if obs[w] is None:  # lost, and restarted: reset afresh
                obs[w] = self._restart(w)
            self._episodes[w].reset()
            self._last[w] = obs[w]
        return self._interleave([np.concatenate([obs[w] for w in self._stepping[g]]) for g in range(self.groups)])

    def send(self, group: int, actions: np.ndarray) -> None:
        workers = self._sending(group, actions)
        now = time.monotonic()
        for w in self._group_workers(group)[len(workers):]:
            if self._actors[w] is not None and now - self._idle_since.setdefault(w, now) >= self.keep_alive:
                self._release(w)
        for i, w in enumerate(workers):
            self._idle_since.pop(w, None)
            if self._actors[w] is None:
                self._pending[w] = self._regrow(w)
                continue
            self._pending[w] = self._actors[w].step.remote(actions[i * self.per_worker:(i + 1) * self.per_worker])

    def receive(self, group: int) -> HostStep:
        ray = ray_module()
        workers = list(self._stepping[group])
        refs = [self._pending.pop(w) for w in workers]
        waiting = [ref for ref in refs if not isinstance(ref, Regrown)]  # a new worker gets STARTING seconds
        ray.wait(waiting, num_returns=len(waiting), timeout=self.timeout)  # then each is ready, or counts as lost
        parts = []
        for w, ref in zip(workers, refs, strict=True):
            if isinstance(ref, Regrown):
                obs = self._answer(w, ref.reset)
                parts.append(self._cut(w, self._restart(w) if obs is None else obs))
                continue
            answer = self._answer(w, ref, waited=True)
            if answer is None:
                parts.append(self._cut(w, self._restart(w)))
                continue
            obs, reward, points, terminated, truncated, ended_final = answer
            ended = terminated | truncated
            final = obs  # the final observations of the episodes that went on
            if ended.any():
                final = obs.copy()
                final[ended] = ended_final
            score, length = self._episodes[w].record(points, ended)
            self._last[w] = obs
            parts.append((obs, reward, terminated, truncated, final, score, length))
        return HostStep(*(np.concatenate(column) for column in zip(*parts, strict=True)))

    def close(self) -> None:
        """Kill every actor (and stop a local Ray this pool started)."""
        if not self.alive:
            return
        if ray_module().is_initialized():  # not at exit, after Ray's own shutdown: a call would start one
            for w in range(self.num_workers):
                self._release(w)
        self._account()
        self._actors = [None] * self.num_workers
        self._pending.clear()
        disconnect()

    # -- workers -------------------------------------------------------------------

    def _start_worker(self, w: int) -> None:
        self._account()
        self._actors[w] = self._remote.remote(self.target, self.per_worker, self._kwargs)
        self._nodes[w] = self._actors[w].node.remote()
        self._starting.add(w)

    def _account(self) -> None:
        """Add the worker-seconds held since the last change of the live workers."""
        now = time.monotonic()
        self._held_seconds += self.live_workers * (now - self._since)
        self._since = now

    def _launch(self, w: int) -> Any:
        """A new actor for worker ``w``, its environments reset with their seeds made new
        by the count of actors started after the first ones; the reference to its first
        observations."""
        self._start_worker(w)
        self.launched += 1
        reseeded = np.array([np.random.SeedSequence([int(s), self.launched]).generate_state(1)[0] & 0x7FFFFFFF
                             for s in self._row_seeds[self.held(w)]], np.int64)
        return self._actors[w].reset.remote(reseeded)

    def _release(self, w: int) -> None:
        """Give worker ``w``'s actor back to the cluster (its environments' state goes with it)."""
        if self._actors[w] is None:
            return
        self._account()
        try:
            ray_module().kill(self._actors[w])
        except Exception:  # gone already
            pass
        self._actors[w] = None
        self._nodes[w] = None
        self._pending.pop(w, None)
        self._starting.discard(w)
        self._idle_since.pop(w, None)

    def _regrow(self, w: int) -> Regrown:
        """Released worker ``w`` started again (its step answers as a cut step)."""
        self.regrown += 1
        return Regrown(self._launch(w))

    def _answer(self, w: int, ref: Any, waited: bool = False) -> Any:
        """Worker ``w``'s answer ``ref``; ``None`` if ``w`` was lost and is to be restarted
        (the pool stops, raising, where lost workers stop it or ``w`` raised)."""
        ray = ray_module()
        limit = max(self.timeout, STARTING) if w in self._starting else self.timeout
        try:
            return ray.get(ref, timeout=0 if waited else limit)
        except ray.exceptions.GetTimeoutError:
            lost = f"did not answer within {limit:g} s" + (" of starting" if w in self._starting else "")
        except ray.exceptions.RayTaskError as error:  # the environment raised: no loss
            self._fail(w, f"raised:\n{error}")
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError) as error:
            lost = f"was lost ({type(error).__name__}: {str(error).splitlines()[0]})"
        if self.lost_workers == "stop":
            self._fail(w, lost)
        self._lost = lost
        return None

    def _restart(self, w: int) -> np.ndarray:
        """A new actor for lost worker ``w``, wherever the cluster has room (``_launch``);
        its environments' first observations."""
        before, why = self._node_name(w), self._lost
        self._release(w)  # its node may be gone
        self.restarts += 1
        obs = self._answer(w, self._launch(w))
        self._starting.discard(w)
        if obs is None:
            self._fail(w, f"{why}, and its restart {self._lost}")
        print(f"jaxrl-frag: environment worker {w} ({self._listed(self.held(w))}) on Ray node {before} {why}; "
              f"restarted on node {self._node_name(w)}", file=sys.stderr, flush=True)
        return obs

    def _cut(self, w: int, obs: np.ndarray) -> tuple[np.ndarray, ...]:
        """The step of worker ``w``, started again (restarted, or regrown) with first
        observations ``obs``: its episodes in flight end as truncations (reward 0, the last
        observation as the final one, their scores and lengths so far), the next ones
        start from ``obs``."""
        self._starting.discard(w)
        score, length = self._episodes[w].score.copy(), self._episodes[w].length.copy()
        self._episodes[w].reset()
        n = self.per_worker
        self.cut += n
        final, self._last[w] = self._last[w], obs
        return obs, np.zeros(n), np.zeros(n, bool), np.ones(n, bool), final, score, length

    def _node_name(self, w: int) -> str:
        """Worker ``w``'s node, by address and id (``unknown`` before it said)."""
        ray = ray_module()
        node = self._nodes[w]
        if isinstance(node, ray.ObjectRef):
            try:
                node = self._nodes[w] = ray.get(node, timeout=5)
            except Exception:  # never placed, or gone before it said
                return "unknown (the worker never answered)"
        address = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node), "?")
        return f"{address} ({node[:8]})"

    def _fail(self, w: int, what: str) -> NoReturn:
        held, node = self._listed(self.held(w)), self._node_name(w)
        self.close()
        raise EnvWorkerError(f"environment worker {w} ({held}) on Ray node {node} {what}; the pool is shut down")
