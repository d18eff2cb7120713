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
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from typing import Any, NoReturn

import jax

from jaxrl_frag.errors import ConfigError, check

STOP_KEY = "jaxrl_frag/stop"  # the key-value store's entry that ends the run in every process
_ENDING = threading.Event()  # set as the process ends: the watching thread returns

ENV_COORDINATOR = "JAXRL_FRAG_COORDINATOR"
ENV_NUM_PROCESSES = "JAXRL_FRAG_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXRL_FRAG_PROCESS_ID"


ENV_AUTO = "JAXRL_FRAG_DISTRIBUTED"  # "auto": let jax detect the cluster (TPU pods)


def _cluster_detected() -> bool:
    slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in os.environ
    return slurm or os.environ.get(ENV_AUTO) == "auto"


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    heartbeat_timeout_seconds: int = 30,
) -> bool:
    """Join a multi-process run if one is configured; returns whether it did.

    A process that loses its peers fails within about ``heartbeat_timeout_seconds``
    instead of waiting forever.
    """
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR)
    if num_processes is None and ENV_NUM_PROCESSES in os.environ:
        num_processes = int(os.environ[ENV_NUM_PROCESSES])
    if process_id is None and ENV_PROCESS_ID in os.environ:
        process_id = int(os.environ[ENV_PROCESS_ID])
    if coordinator is None:
        if num_processes not in (None, 1) or process_id not in (None, 0):
            raise ConfigError("coordinator", None, "a multi-process run needs --coordinator HOST:PORT")
        if not _cluster_detected():
            return False
    else:
        check(":" in coordinator, "coordinator", coordinator, "give HOST:PORT, e.g. 127.0.0.1:12345")
        check(num_processes is not None and num_processes > 0, "num_processes", num_processes,
              "give the number of processes with --num-processes")
        check(process_id is not None and 0 <= process_id < num_processes, "process_id", process_id,
              f"give this process's index, 0 to {num_processes - 1}, with --process-id")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id, initialization_timeout=120,
                               heartbeat_timeout_seconds=heartbeat_timeout_seconds)
    watcher = threading.Thread(target=_watch, args=(_client(),), name="jaxrl-frag-stop-watch", daemon=True)
    watcher.start()
    atexit.register(_end_watch, watcher)  # before jax's own shutdown (atexit runs the latest first)
    return True


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
