"""Multi-process runs: one JAX runtime across processes and hosts.

``initialize`` joins the processes with ``jax.distributed`` from explicit
arguments, from ``JAXRL_FRAG_COORDINATOR`` / ``JAXRL_FRAG_NUM_PROCESSES`` /
``JAXRL_FRAG_PROCESS_ID`` (set by ``launch/local.sh``), or from the cluster's own
environment, where jax detects everything: under SLURM with several tasks, or
anywhere with ``JAXRL_FRAG_DISTRIBUTED=auto`` (``launch/tpu_pod.sh`` sets it). On CPU the
collectives run over gloo. It must run before jax's first operation. After it,
``jax.devices()`` lists every process's devices, so a policy's mesh spans hosts;
programs are global SPMD programs, so each process computes its own share of the
environments from the same key, and only process 0 writes files.

A process that must end the whole run (``stop_everywhere``: a host environment's worker
died, say) publishes why in the runtime's key-value store; every process watches it
from a thread (started by ``initialize``), so one waiting inside a collective for the
failed process, where nothing else reaches it, still prints the reason and exits with
the same status.

Joining is checked and bounded. The coordinator's address, the process count and the
process id are checked before anything starts (``ConfigError``: exit status 2 from the
command line). With a coordinator given, the processes first meet at it in a small
rendezvous of this module's (process 0 listens on the coordinator's port, each other
process says who it is), so each knows which processes have joined and which are
missing; only then does process 0 hand the port to ``jax.distributed``'s service. A
process still waiting after a short while says once, on stderr, what it waits for; one
still waiting after ``join_timeout`` seconds (``--join-timeout``, or
``JAXRL_FRAG_JOIN_TIMEOUT``; default 300) gives up with a ``JoinError`` (a
``ConfigError``) naming the processes that never joined.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import selectors
import socket
import sys
import threading
import time
from typing import Any, NoReturn

import jax

from jaxrl_frag.errors import ConfigError, check

STOP_KEY = "jaxrl_frag/stop"  # the key-value store's entry that ends the run in every process
_ENDING = threading.Event()  # set as the process ends: the watching thread returns

ENV_COORDINATOR = "JAXRL_FRAG_COORDINATOR"
ENV_NUM_PROCESSES = "JAXRL_FRAG_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXRL_FRAG_PROCESS_ID"
ENV_JOIN_TIMEOUT = "JAXRL_FRAG_JOIN_TIMEOUT"
JOIN_TIMEOUT = 300.0  # seconds a process waits for all the others to join, unless told otherwise
NOTICE_AFTER = 10.0  # seconds of waiting (at most half the join timeout) before a process says what it waits for
_HELLO = "jaxrl-frag join"  # the rendezvous's greeting: "jaxrl-frag join I N"
_VERDICT_GRACE = 5.0  # seconds a joined process waits past its own deadline for process 0's word to give up


ENV_AUTO = "JAXRL_FRAG_DISTRIBUTED"  # "auto": let jax detect the cluster (TPU pods)


def _cluster_detected() -> bool:
    slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in os.environ
    return slurm or os.environ.get(ENV_AUTO) == "auto"


class JoinError(ConfigError):
    """The processes of a run did not all join within the join timeout; the message names
    the missing ones."""

    def __init__(self, message: str, timeout: float):
        super().__init__("join_timeout", timeout, message)
        self.args = (message,)

    def __str__(self) -> str:
        return self.fix


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    heartbeat_timeout_seconds: int = 30,
    join_timeout: float | None = None,
) -> bool:
    """Join a multi-process run if one is configured; returns whether it did.

    ``ConfigError`` for a coordinator address, process count or process id that cannot
    work, before anything starts; ``JoinError`` when the other processes have not all
    joined within ``join_timeout`` seconds (default ``$JAXRL_FRAG_JOIN_TIMEOUT``, else
    300). A process that loses its peers later fails within about
    ``heartbeat_timeout_seconds`` instead of waiting forever.
    """
    given = coordinator is not None
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR)
    where = "--coordinator" if given or coordinator is None else f"${ENV_COORDINATOR}"
    if num_processes is None and ENV_NUM_PROCESSES in os.environ:
        num_processes = _env_int(ENV_NUM_PROCESSES, "--num-processes")
    if process_id is None and ENV_PROCESS_ID in os.environ:
        process_id = _env_int(ENV_PROCESS_ID, "--process-id")
    timeout = _join_timeout(join_timeout)
    if coordinator is None:
        if num_processes not in (None, 1) or process_id not in (None, 0):
            raise ConfigError("coordinator", None, "a multi-process run needs --coordinator HOST:PORT")
        if not _cluster_detected():
            return False
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        with _Watchdog("the cluster's processes (found by jax in its environment) to join", timeout):
            jax.distributed.initialize(initialization_timeout=math.ceil(timeout) + 60,
                                       heartbeat_timeout_seconds=heartbeat_timeout_seconds)
    else:
        host, port = parse_coordinator(coordinator, where)
        check(isinstance(num_processes, int) and num_processes > 0, "num_processes", num_processes,
              "give the number of processes, a positive integer, with --num-processes")
        assert isinstance(num_processes, int)
        check(isinstance(process_id, int) and 0 <= process_id < num_processes, "process_id", process_id,
              f"give this process's index, 0 to {num_processes - 1} (--num-processes {num_processes}), "
              "with --process-id")
        assert isinstance(process_id, int)
        deadline = time.monotonic() + timeout
        if num_processes > 1:
            _rendezvous(_Join(coordinator, host, port, num_processes, process_id, timeout, deadline))
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        # every process has met at the coordinator: jax's own join should take seconds; the
        # watchdog says so and ends the process before jax's timeout aborts it (with a C++ trace)
        left = max(deadline - time.monotonic(), min(timeout, 30.0))
        with _Watchdog(f"jax's distributed runtime at {coordinator} to connect all {num_processes} processes "
                       f"(this is process {process_id})", left, timeout):
            jax.distributed.initialize(coordinator, num_processes, process_id,
                                       initialization_timeout=math.ceil(left) + 60,
                                       heartbeat_timeout_seconds=heartbeat_timeout_seconds)
    watcher = threading.Thread(target=_watch, args=(_client(),), name="jaxrl-frag-stop-watch", daemon=True)
    watcher.start()
    atexit.register(_end_watch, watcher)  # before jax's own shutdown (atexit runs the latest first)
    return True


def parse_coordinator(address: str, where: str = "--coordinator") -> tuple[str, int]:
    """``HOST:PORT`` (``[V6ADDRESS]:PORT`` for an IPv6 address) as its host and port,
    the port in 1-65535 and the host resolvable; ``ConfigError`` naming ``where`` (the
    flag or variable it came from) otherwise."""
    field = where.lstrip("-$").lower().replace("-", "_") if where.startswith("--") else where.lstrip("$")
    example = "e.g. 127.0.0.1:12345 on one machine, or process 0's host name and a free port"
    host, colon, port_text = address.rpartition(":")
    check(bool(colon) and bool(host), field, address, f"{where} takes HOST:PORT, the address of process 0, {example}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    check(port_text.isdigit() and 1 <= int(port_text) <= 65535, field, address,
          f"the port {port_text!r} of {where} is not a port number: give one from 1 to 65535 (above 1023 needs no "
          f"privileges), {example}")
    port = int(port_text)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ConfigError(field, address, f"the host {host!r} of {where} does not resolve ({reason}): give process "
                                          f"0's host name or IP address as this machine knows it, {example}") from None
    return host, port


def _env_int(name: str, flag: str) -> int:
    text = os.environ[name]
    try:
        return int(text)
    except ValueError:
        raise ConfigError(name, text, f"must be a whole number (it stands for {flag}); set it so, or unset it "
                                      f"and give {flag}") from None


def _join_timeout(timeout: float | None) -> float:
    """The join timeout: ``timeout``, else ``$JAXRL_FRAG_JOIN_TIMEOUT``, else 300 seconds."""
    field = "join_timeout"
    if timeout is None and ENV_JOIN_TIMEOUT in os.environ:
        field, text = ENV_JOIN_TIMEOUT, os.environ[ENV_JOIN_TIMEOUT]
        try:
            timeout = float(text)
        except ValueError:
            raise ConfigError(field, text, "must be a number of seconds, e.g. 300") from None
    timeout = JOIN_TIMEOUT if timeout is None else timeout
    check(math.isfinite(timeout) and timeout > 0, field, timeout,
          "must be a positive number of seconds to wait for the other processes to join, e.g. 300")
    return float(timeout)


class _Join:
    """One process's wait for the others at the coordinator: what it knows, and what it
    says while it waits and when it gives up."""

    def __init__(self, coordinator: str, host: str, port: int, n: int, me: int, timeout: float, deadline: float):
        self.coordinator, self.host, self.port, self.n, self.me = coordinator, host, port, n, me
        self.timeout, self.deadline = timeout, deadline
        self.notice_at = time.monotonic() + min(NOTICE_AFTER, timeout / 2)
        self.joined: set[int] | None = {0} if me == 0 else None  # None: process 0 not reached yet
        self.gone: set[int] = set()  # processes that joined, then went away (process 0 knows)
        self.said = False

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def waiting(self) -> str:
        if self.joined is None:
            return (f"process 0's coordinator at {self.coordinator}, which does not answer (is process 0 started, "
                    f"there, with --coordinator {self.coordinator}?)")
        return (f"the other processes at the coordinator {self.coordinator}: {len(self.joined)} of {self.n} joined, "
                f"missing {self.missing()}")

    def missing(self) -> str:
        assert self.joined is not None
        missing = sorted(set(range(self.n)) - self.joined)
        gone = sorted(self.gone & set(missing))
        went = f" ({_ids(gone)} joined, then went away)" if gone else ""
        return f"process{'es' if len(missing) > 1 else ''} {_ids(missing)}{went}"

    def tick(self) -> float:
        """Say once what this process waits for, if it has waited long enough; the seconds to
        the next thing to do (say it, or give up)."""
        now = time.monotonic()
        if not self.said and now >= self.notice_at:
            self.said = True
            print(f"jaxrl-frag: process {self.me}: waiting for {self.waiting()}; giving up after "
                  f"{self.timeout:g} s (--join-timeout, or ${ENV_JOIN_TIMEOUT})", file=sys.stderr, flush=True)
        ahead = self.deadline if self.said else min(self.notice_at, self.deadline)
        return max(ahead - now, 0.0)

    def give_up(self) -> NoReturn:
        if self.joined is None:
            what = (f"process 0's coordinator at {self.coordinator} never answered: start process 0 on that host with "
                    f"--process-id 0, check the address (the same --coordinator in every process)")
        else:
            missing = sorted(set(range(self.n)) - self.joined)
            what = (f"missing {self.missing()} at {self.coordinator} ({len(self.joined)} of {self.n} joined): start "
                    f"{'it' if len(missing) == 1 else 'each'} with --coordinator {self.coordinator} "
                    f"--num-processes {self.n} --process-id {_ids(missing, 'or')}")
        raise JoinError(f"process {self.me}: gave up waiting after {self.timeout:g} s: {what}; or allow longer with "
                        f"--join-timeout SECONDS (or ${ENV_JOIN_TIMEOUT})", self.timeout)


def _ids(ids: list[int], last: str = "and") -> str:
    return str(ids[0]) if len(ids) == 1 else f"{', '.join(map(str, ids[:-1]))} {last} {ids[-1]}"


def _rendezvous(join: _Join) -> None:
    """Meet the other processes at the coordinator's address before jax's runtime starts:
    process 0 listens there, the others connect and say who they are; returns once all
    ``join.n`` have, after which process 0 has closed the port for jax's service."""
    if join.me == 0:
        _host_rendezvous(join)
    else:
        _attend_rendezvous(join)


def _listen(join: _Join) -> socket.socket:
    """Process 0's listening socket on the coordinator's port, on every address (as jax's
    service binds it)."""
    errors = []
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            listener = socket.socket(family, socket.SOCK_STREAM)
        except OSError as error:
            errors.append(error)
            continue
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            listener.bind((address, join.port))
            listener.listen(max(join.n, 8))
            return listener
        except OSError as error:
            listener.close()
            errors.append(error)
    reason = errors[-1].strerror or str(errors[-1])
    raise ConfigError("coordinator", join.coordinator,
                      f"process 0 cannot listen on port {join.port} ({reason}): is another run using it? give "
                      "--coordinator a free port (on one machine, launch/local.sh picks one)")


def _host_rendezvous(join: _Join) -> None:
    assert join.joined is not None
    listener = _listen(join)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    peers: dict[socket.socket, int | None] = {}  # each connection, and the process it said it is
    heard: dict[socket.socket, bytes] = {}
    try:
        while len(join.joined) < join.n:
            if join.left() <= 0:  # every joined process gives up naming the same missing ones
                _tell(peers, "stop")
                join.give_up()
            for key, _ in selector.select(timeout=join.tick()):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is listener:
                    try:
                        peer, _ = listener.accept()
                    except OSError:
                        continue
                    peers[peer], heard[peer] = None, b""
                    selector.register(peer, selectors.EVENT_READ)
                    continue
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data:  # gone: a process that left is missing again
                    who = peers.get(sock)
                    if who is not None:
                        join.joined.discard(who)
                        join.gone.add(who)
                        _tell(peers, f"joined {_list(join.joined)}")
                    _drop(selector, peers, heard, sock)
                    continue
                heard[sock] += data
                if b"\n" not in heard[sock] or peers[sock] is not None:
                    continue
                refusal = _admit(join, heard[sock].split(b"\n", 1)[0].decode(errors="replace"))
                if isinstance(refusal, str):
                    _send(sock, f"refuse {refusal}")
                    _drop(selector, peers, heard, sock)
                    continue
                peers[sock] = refusal
                join.joined.add(refusal)
                join.gone.discard(refusal)
                _tell(peers, f"joined {_list(join.joined)}")
        _tell(peers, "go")
    finally:
        for sock in list(peers):
            _drop(selector, peers, heard, sock)
        selector.close()
        listener.close()


def _admit(join: _Join, hello: str) -> int | str:
    """The process id a greeting names, or why it is refused."""
    assert join.joined is not None
    words = hello.split()
    if " ".join(words[:2]) != _HELLO or len(words) != 4 or not all(w.isdigit() for w in words[2:]):
        return f"{hello[:80]!r} is not a jaxrl-frag process's greeting"
    me, n = int(words[2]), int(words[3])
    if n != join.n:
        return (f"process {me} was started with --num-processes {n}, process 0 at {join.coordinator} with {join.n}: "
                "give every process the same --num-processes")
    if me in join.joined:
        return (f"process {me} has already joined at {join.coordinator}: give each process its own --process-id, "
                f"0 to {join.n - 1}")
    return me


def _list(ids: set[int]) -> str:
    return ",".join(map(str, sorted(ids)))


def _send(sock: socket.socket, line: str) -> None:
    try:
        sock.sendall(f"{line}\n".encode())
    except OSError:
        pass


def _tell(peers: dict[socket.socket, int | None], line: str) -> None:
    for sock, who in peers.items():
        if who is not None:
            _send(sock, line)


def _drop(selector: selectors.BaseSelector, peers: dict, heard: dict, sock: socket.socket) -> None:
    selector.unregister(sock)
    peers.pop(sock, None)
    heard.pop(sock, None)
    sock.close()


def _attend_rendezvous(join: _Join) -> None:
    while True:
        if join.left() <= 0:
            join.give_up()
        try:
            sock = socket.create_connection((join.host, join.port), timeout=max(min(join.left(), 2.0), 0.1))
        except OSError:  # process 0 not listening yet (or not reachable): try again shortly
            time.sleep(min(0.25, join.tick()))
            continue
        with sock:
            _send(sock, f"{_HELLO} {join.me} {join.n}")
            if _follow(join, sock):
                return
        time.sleep(min(0.25, join.tick()))


def _follow(join: _Join, sock: socket.socket) -> bool:
    """Read process 0's news until it says go (True) or the connection ends (False); give
    up when it says stop, or ``_VERDICT_GRACE`` seconds past this process's own deadline
    (process 0's word, when it comes, names what process 0 saw last)."""
    buffer = b""
    while True:
        if join.left() <= -_VERDICT_GRACE:
            join.give_up()
        sock.settimeout(max(join.tick() if join.left() > 0 else join.left() + _VERDICT_GRACE, 0.05))
        try:
            data = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return False
        if not data:
            return False
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            word, _, rest = line.decode(errors="replace").partition(" ")
            if word == "go":
                return True
            if word == "stop":
                join.give_up()
            if word == "joined":
                join.joined = {int(i) for i in rest.split(",") if i.isdigit()}
            elif word == "refuse":
                raise ConfigError("process_id", join.me, rest)
            else:  # not a jaxrl-frag coordinator: something else holds the port
                return False


class _Watchdog:
    """While jax's runtime joins (a call that blocks in C++ and, past its own timeout,
    aborts the process with a C++ trace): say once after a short while what it waits
    for, and past ``seconds`` end the process with status 2 and a message."""

    def __init__(self, what: str, seconds: float, timeout: float | None = None):
        self.what, self.seconds, self.timeout = what, seconds, seconds if timeout is None else timeout
        self.done = threading.Event()

    def __enter__(self) -> _Watchdog:
        threading.Thread(target=self._watch, name="jaxrl-frag-join-watch", daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()

    def _watch(self) -> None:
        notice = min(NOTICE_AFTER, self.seconds / 2)
        if self.done.wait(notice):
            return
        print(f"jaxrl-frag: waiting for {self.what}; giving up after {self.timeout:g} s (--join-timeout, or "
              f"${ENV_JOIN_TIMEOUT})", file=sys.stderr, flush=True)
        if self.done.wait(self.seconds - notice):
            return
        print(f"jaxrl-frag: error: gave up after {self.timeout:g} s waiting for {self.what}: start every process of "
              f"the run, or allow longer with --join-timeout SECONDS (or ${ENV_JOIN_TIMEOUT})", file=sys.stderr,
              flush=True)
        os._exit(2)


def stop_everywhere(message: str, status: int) -> NoReturn:
    """End a run of several processes from this one at once: every process (this one
    too) prints ``jaxrl-frag: error: process I: ...`` with ``message`` to stderr and
    exits with ``status``, however far each has got. Checkpoints already written are
    kept; nothing else is cleaned up (the others may be inside a collective)."""
    # print first: the store's watchers may end the others (process 0's coordinator with
    # them) before the store's answer reaches this process
    print(f"jaxrl-frag: error: process {jax.process_index()}: {message}", file=sys.stderr, flush=True)
    try:
        _client().key_value_set(STOP_KEY, json.dumps({"process": jax.process_index(), "message": message,
                                                      "status": status}))
    finally:
        os._exit(status)


def _client() -> Any:
    """The runtime's coordination client (its key-value store)."""
    from jax._src.distributed import global_state

    return global_state.client


def _watch(client: Any) -> None:
    """Wait for ``stop_everywhere`` in any process, then print its message and exit with its
    status; return when the process ends (``_end_watch``) or the runtime is gone."""
    while not _ENDING.is_set():
        try:
            stop = json.loads(client.blocking_key_value_get(STOP_KEY, 500))
        except Exception as error:  # the wait timed out: wait again; anything else: the runtime is gone
            if "DEADLINE_EXCEEDED" in str(error):
                continue
            return
        if stop["process"] != jax.process_index():
            print(f"jaxrl-frag: error: process {jax.process_index()}: stopped by process {stop['process']}: "
                  f"{stop['message']}", file=sys.stderr, flush=True)
            os._exit(stop["status"])
        return


def _end_watch(watcher: threading.Thread) -> None:
    """Let the watching thread return before the runtime shuts down: a thread still
    waiting inside the runtime's client when the process ends aborts it."""
    _ENDING.set()
    watcher.join()


def is_main_process() -> bool:
    """Whether this process writes files and prints progress (process 0)."""
    return jax.process_index() == 0
