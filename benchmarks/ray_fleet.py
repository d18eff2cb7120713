"""Environment workers as Ray actors on other nodes (``--env-backend ray``) against local
worker processes (``--env-backend processes``), the same count of each, side by side.

    python benchmarks/ray_fleet.py [--envs ale:Breakout gymnasium:Acrobot-v1 gymnasium:slow_env:SlowCartPole-v0]
                                   [--workers 1 2 4]
                                   [--num-envs 8] [--steps 300] [--pairs 3]
    python benchmarks/ray_fleet.py --train [--envs gymnasium:CartPole-v1] [--workers 2] [--train-steps 32768]
    ... --json benchmarks/results/host_envs.json: each row a record of RESULTS.md's host environments table

A local Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head with no CPUs
for workers and two nodes of 2 CPUs with the resource ``envs``, as tests/test_host_ray.py
starts one) stands in for a rack of CPU machines. For each environment and worker count,
both pools step ``--num-envs`` environments in 2 groups (the ring's layout; 1 for one
worker) with random
actions, each group sent and received in turn as the environment ring does, ``--steps``
steps a timing, alternating ray and local ``--pairs`` times from pools already up;
prints environment steps per second of each and the ratio ray / local (the median of the
pairs'). ``gymnasium:slow_env:SlowCartPole-v0`` is this folder's slow pure-Python
environment (``slow_env.py``, about 1 ms a step): the folder goes on ``PYTHONPATH`` for the
nodes and workers to import it. A remote worker's cost per step, over a local one's, is read off the same
timings: ``(1 / sps_ray - 1 / sps_local) * num_envs`` seconds a step of the batch.

``--train``: whole PPO runs instead (``--num-envs`` environments of 64 steps, the ring
on), each side compiled once and run ``--train-steps`` steps from a fresh state
``--pairs`` times, alternating; training steps per second and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import results
from host_envs import ratio_record


def steps_per_second(pool: object, num_envs: int, steps: int, actions: int, seed: int) -> float:
    """Environment steps per second of ``steps`` ring steps of ``pool`` (random actions)."""
    rng = np.random.default_rng(seed)
    groups = pool.groups
    pool.reset(seed)
    for g in range(groups - 1):
        pool.send(g, rng.integers(0, actions, pool.group_size))
    start = time.perf_counter()
    for _ in range(steps):
        for g in range(groups):
            pool.send((g + groups - 1) % groups, rng.integers(0, actions, pool.group_size))
            pool.receive(g)
    seconds = time.perf_counter() - start
    for g in range(groups - 1):  # the groups still out, as after the ring's last step
        pool.receive(g)
    return num_envs * steps / seconds


def row(env: str, workers: int, sps: dict[str, list[float]], what: str, more: str = "") -> dict[str, Any]:
    """Print the table's row of ``sps`` (steps/s of each side, pair by pair; ``more``: the row's further cells) and
    return its record."""
    ratios = [r / loc for r, loc in zip(sps["ray"], sps["local"], strict=True)]
    print(f"| {env} | {workers} | {statistics.median(sps['ray']):,.0f} | {statistics.median(sps['local']):,.0f} | "
          f"**{statistics.median(ratios):.2f}x** ({', '.join(f'{r:.2f}' for r in ratios)}) |{more}", flush=True)
    return ratio_record(f"Ray actors on CPU nodes, {workers}", f"local worker processes, {workers}", f"{env}: {what}",
                        ratios, (sps["ray"], sps["local"]))


def pools(address: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The pools alone: environment steps per second of Ray actors on the cluster's nodes and of local worker
    processes, and a remote worker's cost a step of the batch."""
    from jaxrl_frag.envs.host_pool import HostEnvPool, environments
    from jaxrl_frag.envs.host_ray import RayPool

    print("| environment | workers | ray steps/s | local steps/s | ray / local (pairs) | remote cost a batch step |")
    print("|---|---|---|---|---|---|")
    records = []
    for env in args.envs:
        for workers in args.workers:
            groups = 2 if workers % 2 == 0 else 1  # the ring's 2 groups where the workers divide into them
            ray_pool = RayPool(env, args.num_envs, workers, groups, address=address, worker_resource="envs")
            local = HostEnvPool(env, args.num_envs, workers, groups)
            probe = environments(env, 1, {})
            actions = int(probe.action_space.n)
            probe.close()
            sps: dict[str, list[float]] = {"ray": [], "local": []}
            steps_per_second(ray_pool, args.num_envs, 5, actions, 0)  # warm: actors up, games loaded
            steps_per_second(local, args.num_envs, 5, actions, 0)
            for pair in range(args.pairs):
                for name, pool in (("ray", ray_pool), ("local", local))[:: 1 if pair % 2 == 0 else -1]:
                    sps[name].append(steps_per_second(pool, args.num_envs, args.steps, actions, pair))
            cost = statistics.median([(1 / r - 1 / loc) * args.num_envs
                                      for r, loc in zip(sps["ray"], sps["local"], strict=True)])
            records.append(row(env, workers, sps, f"stepping {args.num_envs} envs (random actions)",
                               f" {cost * 1e3:+.2f} ms |"))
            ray_pool.close()
            local.close()
    return records


def train(address: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """PPO's training steps per second with the workers on the cluster's nodes and in local processes."""
    import jax

    import jaxrl_frag as jf

    print("| environment | workers | ray steps/s | local steps/s | ray / local (pairs) |")
    print("|---|---|---|---|---|")
    records = []
    for env in args.envs:
        for workers in args.workers:
            groups = 2 if workers % 2 == 0 else 1
            settings = dict(num_envs=args.num_envs, num_steps=64, total_steps=args.train_steps, env_workers=workers,
                            env_groups=groups)
            programs = {"ray": jf.compile(jf.recipes.PPO.create(env, env_backend="ray", env_address=address,
                                                                 env_worker_resource="envs", **settings)),
                        "local": jf.compile(jf.recipes.PPO.create(env, env_backend="processes", **settings))}
            for program in programs.values():  # pools up, programs loaded
                program.run(jax.random.PRNGKey(0), 1)
            sps: dict[str, list[float]] = {"ray": [], "local": []}
            for pair in range(args.pairs):
                for name in ("ray", "local")[:: 1 if pair % 2 == 0 else -1]:
                    start = time.perf_counter()
                    programs[name].run(jax.random.PRNGKey(pair))
                    sps[name].append(args.train_steps / (time.perf_counter() - start))
            records.append(row(env, workers, sps, f"PPO's training steps, {args.num_envs} envs"))
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+",
                        default=["ale:Breakout", "gymnasium:Acrobot-v1", "gymnasium:slow_env:SlowCartPole-v0"])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--train", action="store_true", help="time whole PPO runs instead of the pools alone")
    parser.add_argument("--train-steps", type=int, default=32768)
    parser.add_argument("--json", type=Path, help="put the figures into this records file "
                                                  "(benchmarks/results/host_envs.json: RESULTS.md's table)")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent)  # slow_env.py's folder (this script's: on sys.path), for every worker
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))

    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=2, resources={"envs": 1})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        records = (train if args.train else pools)(cluster.address, args)
    finally:
        ray.shutdown()
        cluster.shutdown()
    if args.json:
        results.save(args.json, records)


if __name__ == "__main__":
    main()
