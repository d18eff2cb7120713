"""A scaling model of data-parallel training across processes: per-component costs
measured here, a projection of throughput from them, and the projection checked
against what 1, 2 and 4 processes on this machine do.

    python benchmarks/scaling.py run [--num-envs 64] [--steps 4e5] [--processes 1 2 4]
    python benchmarks/scaling.py time --minibatches M ...     # under launch/local.sh P (run does this)
    python benchmarks/scaling.py allreduce --floats F ...     # under launch/local.sh P (run does this)

The workload: PPO on CartPole-v1 (a JAX environment) under ``DataParallel``, one device
per process, ``num_envs`` environments in all: each process steps ``num_envs / P`` of
them and learns from its share of every minibatch, the gradients (and the losses
reported) all-reduced over the processes (gloo on CPU). Measured in one process:

- ``act(n)``: one iteration's rollout of ``n`` environments (policy inference and
  environment steps, one compiled fragment), seconds;
- ``learn(n, m)``: one iteration's learner on their samples in ``m`` minibatches a
  epoch, seconds;
- ``K(m)``: the all-reduces one iteration runs (``Program.explain``: three per optimizer
  update and one for the episodes' statistics);

and under ``launch/local.sh P``: ``allreduce(P)``, one all-reduce of the gradient's bytes
alone (a loop of them in one program), and the training's seconds per iteration
``T_P(m)``. The latency of one all-reduce inside the training program is read off two
runs that differ only in their number of updates, ``r(P) = (T_P(4) - T_P(1)) / (K(4) -
K(1))``, and the model, on a machine of ``C`` cores (every process computes on one core,
so beyond ``C`` processes they share them), is

    T(P, m) = max(1, P / C) * (act(N / P) + learn(N / P, m)) + K(m) * r(P)

checked against a run it was not read from: ``m = 2`` minibatches, steps per second
``N * num_steps / T``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ENV = "CartPole-v1"


def _seconds(fn: Callable[[], Any], reps: int) -> float:
    """The median seconds of ``fn()`` over ``reps`` calls, after one to compile."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def components(num_envs: int, minibatches: int, reps: int = 20) -> dict[str, float]:
    """``act(n)`` and ``learn(n, m)`` of PPO on ``n`` environments (seconds) and the
    gradient's bytes."""
    import jaxrl_frag as jf

    algo = jf.recipes.PPO.create(ENV, num_envs=num_envs, num_minibatches=minibatches)
    state = jax.jit(algo.init)(jax.random.PRNGKey(0))
    rollout, learn = jax.jit(algo.rollout), jax.jit(algo.learn)
    traj, _, obs, _, _ = rollout(state.params, state.env_state, state.obs, state.memory, state.key)
    return {"act": _seconds(lambda: rollout(state.params, state.env_state, state.obs, state.memory, state.key), reps),
            "learn": _seconds(lambda: learn(state.params, state.opt_state, traj, obs, state.key), reps),
            "bytes": sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params)),
            "steps": num_envs * algo.num_steps}


def allreduce(floats: int, reps: int, loop: int = 50) -> None:
    """``loop`` all-reduces of ``floats`` float32 in one program over every process's
    device; process 0 prints the median seconds of one as JSON. Run under ``launch/local.sh``."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jaxrl_frag import distributed

    distributed.initialize()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    spec = PartitionSpec("data")
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, spec), np.ones((1, floats), np.float32))
    reduce = jax.jit(jax.shard_map(lambda x: jax.lax.fori_loop(0, loop, lambda _, y: jax.lax.psum(y, "data") * 0.5, x),
                                   mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
    seconds = _seconds(lambda: reduce(x), reps) / loop
    if jax.process_index() == 0:
        print(json.dumps({"seconds": seconds}), flush=True)


def timed(num_envs: int, minibatches: int, steps: int) -> None:
    """The data-parallel training over every process's device, timed from its first
    state (compiled before); process 0 prints seconds per iteration and all-reduces
    per iteration as JSON. Run under ``launch/local.sh``."""
    from jaxrl_frag import distributed

    distributed.initialize()
    import jaxrl_frag as jf
    from jaxrl_frag.sharding import DataParallel

    algo = jf.recipes.PPO.create(ENV, num_envs=num_envs, num_minibatches=minibatches, total_steps=steps)
    program = jf.compile(algo, DataParallel(jax.device_count()))
    state = program.init(jax.random.PRNGKey(0))
    start = time.perf_counter()
    jax.block_until_ready(program.run(state).state)
    seconds = (time.perf_counter() - start) / algo.num_iterations
    if jax.process_index() == 0:
        print(json.dumps({"seconds": seconds, "allreduces": sum(c.times for c in program.explain().collectives)}),
              flush=True)


def _launch(processes: int, *args: str) -> dict[str, float]:
    """``python scaling.py ARGS`` as ``processes`` processes; process 0's JSON line."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run([str(ROOT / "launch" / "local.sh"), str(processes), sys.executable, __file__, *args],
                          capture_output=True, text=True, env=env, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> None:
    cores, n = os.cpu_count() or 1, args.num_envs
    print(f"{cores} cores, {n} environments in all, PPO on {ENV}, {int(args.steps):,} steps a run\n")
    print("| processes | act(N/P) ms | learn(N/P, 2) ms | all-reduce alone ms | all-reduce in training r(P) ms | "
          "K(2) | projected steps/s | measured steps/s | measured / projected |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in args.processes:
        part = components(n // p, 2)
        runs = {m: _launch(p, "time", "--num-envs", str(n), "--minibatches", str(m), "--steps", str(int(args.steps)))
                for m in (4, 1, 2)}
        alone = _launch(p, "allreduce", "--floats", str(part["bytes"] // 4))["seconds"] if p > 1 else 0.0
        k = {m: r["allreduces"] for m, r in runs.items()}
        within = (runs[4]["seconds"] - runs[1]["seconds"]) / (k[4] - k[1]) if p > 1 else 0.0
        projected = max(1.0, p / cores) * (part["act"] + part["learn"]) + k[2] * within
        steps = part["steps"] * p  # per iteration, all processes
        print(f"| {p} | {part['act'] * 1e3:.2f} | {part['learn'] * 1e3:.2f} | {alone * 1e3:.2f} | {within * 1e3:.2f} | "
              f"{k[2]} | {steps / projected:,.0f} | {steps / runs[2]['seconds']:,.0f} | "
              f"{projected / runs[2]['seconds']:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    whole = commands.add_parser("run", help="measure, project and check")
    whole.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    training = commands.add_parser("time", help="time the training (under launch/local.sh)")
    training.add_argument("--minibatches", type=int, required=True)
    for command in (whole, training):
        command.add_argument("--num-envs", type=int, default=64)
        command.add_argument("--steps", type=float, default=4e5)
    one = commands.add_parser("allreduce", help="time one all-reduce (under launch/local.sh)")
    one.add_argument("--floats", type=int, required=True)
    one.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    if args.command == "run":
        run(args)
    elif args.command == "time":
        timed(args.num_envs, args.minibatches, int(args.steps))
    else:
        allreduce(args.floats, args.reps)


if __name__ == "__main__":
    main()
