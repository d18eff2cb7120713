"""Host environments: the environment ring against strict alternation, and the framework
against Stable-Baselines3, side by side.

    python benchmarks/host_envs.py ring [--env gymnasium:CartPole-v1] [--steps 65536] [--pairs 3]
    python benchmarks/host_envs.py sb3 --sb3-python VENV/bin/python [--env gymnasium:CartPole-v1] [--steps 100000] [--pairs 3]
    python benchmarks/host_envs.py stepping [--env ale:Breakout] [--envpool-python VENV/bin/python] [--pairs 3]

``ring``: PPO with ``env_ring`` on and off (the same groups, the same numbers:
``tests/test_host_envs.py``), each compiled once, timed in alternating runs from
freshly reset pools (workers already up). It times the actor fragment alone (the
rollout: inference and stepping, where the ring acts) and whole training runs, and
prints steps per second and the ring's speedup, the median of the pairs' ratios.

``sb3``: PPO at the same settings (``sb3_ppo.py``'s, the learning rate constant; on
``ale:`` games CleanRL's Atari settings) on the same environment and environment
count: the framework with its environments in worker processes and in this process
(``--env-backend``; ring as by default) against Stable-Baselines3 (``sb3_ppo.py``, run
by ``--sb3-python``) with its in-process ``DummyVecEnv`` and its worker-process
``SubprocVecEnv``, alternating; steps per second of training (SB3's ``learn``; the
framework's run after compiling), their ratios and the final returns.

``stepping``: Atari games stepped with random actions, no learning: the framework's two
pools, worker processes (``HostEnvPool``, each worker one ale-py vector environment,
observations in shared memory) and this process (``InProcessPool``, ale-py's threads),
against one ale-py vector environment with as many threads in this process, and
against EnvPool (``envpool_step.py``, run by ``--envpool-python``) likewise;
environment steps per second, alternating.

``--json benchmarks/results/host_envs.json`` (any of the three) puts each ratio into
RESULTS.md's records, replacing the record of the same two sides and environment.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import results

import jaxrl_frag as jf
from jaxrl_frag.recipes import PPO

SB3_SCRIPT = Path(__file__).with_name("sb3_ppo.py")


def ratio_record(a: str, b: str, env: str, ratios: list[float], sps: tuple[list[float], list[float]]) -> dict[str, Any]:
    """The record of A / B: the median of the pairs' ratios, the pairs and each side's steps/s."""
    return results.record({"a": a, "b": b, "env": env},
                          {"ratio": statistics.median(ratios), "pairs": ratios, "steps_per_s_pairs": list(sps)},
                          f"{jax.devices()[0].device_kind}; jax {jax.__version__}")


def _timed_rollouts(algo: PPO, key: jax.Array, rounds: int) -> float:
    """Seconds of ``rounds`` calls of the actor fragment (compiled once, warmed up once)."""
    act = jax.jit(algo.rollout)
    state = jax.jit(algo.init)(key)
    out = act(state.params, state.env_state, state.obs, state.memory, state.key)
    jax.block_until_ready(out)
    start = time.perf_counter()
    obs = out[2]
    for i in range(rounds):
        out = act(state.params, state.env_state, obs, state.memory, jax.random.fold_in(state.key, i))
        obs = out[2]
    jax.block_until_ready(out)
    return time.perf_counter() - start


def ring(args: argparse.Namespace) -> list[dict[str, Any]]:
    settings = dict(num_envs=args.num_envs, num_steps=args.num_steps, total_steps=int(args.steps))
    algos = {name: PPO.create(args.env, env_ring=name == "ring", **settings) for name in ("ring", "alternation")}
    programs = {name: jf.compile(algo) for name, algo in algos.items()}
    rollouts = args.steps // (args.num_envs * args.num_steps) // 4
    acting: dict[str, list[float]] = {name: [] for name in algos}
    training: dict[str, list[float]] = {name: [] for name in algos}
    for pair in range(args.pairs):
        for name in (("ring", "alternation") if pair % 2 == 0 else ("alternation", "ring")):
            seconds = _timed_rollouts(algos[name], jax.random.PRNGKey(pair), rollouts)
            acting[name].append(rollouts * args.num_envs * args.num_steps / seconds)
            state = programs[name].init(jax.random.PRNGKey(pair))  # pools up and reset before the clock starts
            start = time.perf_counter()
            history = programs[name].run(state)
            training[name].append(float(history.final["env_steps"]) / (time.perf_counter() - start))
            print(f"pair {pair} {name:11s} acting {acting[name][-1]:8.0f} steps/s  training {training[name][-1]:8.0f} "
                  f"steps/s  return {history.last('episode_return'):.1f}", flush=True)
    for algo in algos.values():
        algo.env.close()
    records = []
    for what, sps in (("acting", acting), ("training", training)):
        ratios = [r / a for r, a in zip(sps["ring"], sps["alternation"], strict=True)]
        print(f"{what}: ring {statistics.median(sps['ring']):.0f} steps/s, alternation "
              f"{statistics.median(sps['alternation']):.0f} steps/s; ring speedup {statistics.median(ratios):.2f}x "
              f"(pairs {', '.join(f'{r:.2f}' for r in ratios)})")
        records.append(ratio_record("ring", "alternation", f"{args.env}: {what}", ratios,
                                    (sps["ring"], sps["alternation"])))
    return records


# CleanRL's ppo_atari.py settings for ale: (the rest as the CartPole ones), on both sides
ATARI = dict(num_minibatches=4, num_epochs=4, clip_eps=0.1)


def sb3(args: argparse.Namespace) -> list[dict[str, Any]]:
    atari = args.env.startswith("ale:")
    # a constant learning rate, as Stable-Baselines3's
    settings = dict(num_envs=args.num_envs, total_steps=int(args.steps), anneal_lr=False, **(ATARI if atari else {}))
    algos = {f"jaxrl_frag {backend}": PPO.create(args.env, env_backend=backend, **settings)
             for backend in ("processes", "in-process")}
    programs = {name: jf.compile(algo) for name, algo in algos.items()}
    sps: dict[str, list[float]] = {name: [] for name in (*algos, "sb3 dummy", "sb3 subproc")}
    returns: dict[str, list[float]] = {name: [] for name in sps}
    for pair in range(args.pairs):
        for name, program in programs.items():
            state = program.init(jax.random.PRNGKey(pair))  # pools up and reset before the clock starts
            start = time.perf_counter()
            history = program.run(state)
            sps[name].append(float(history.final["env_steps"]) / (time.perf_counter() - start))
            returns[name].append(float(history.last("episode_return")))
        for vec in ("dummy", "subproc"):
            out = subprocess.run([args.sb3_python, str(SB3_SCRIPT), "--env", args.env, "--num-envs", str(args.num_envs),
                                  "--steps", str(int(args.steps)), "--vec", vec, "--seed", str(pair)],
                                 capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            sps[f"sb3 {vec}"].append(result["sps"])
            returns[f"sb3 {vec}"].append(result["return"])
        print(f"pair {pair}: " + ", ".join(f"{name} {values[-1]:.0f} steps/s (return {returns[name][-1]:.1f})"
                                         for name, values in sps.items()), flush=True)
    for algo in algos.values():
        algo.env.close()
    records = []
    for ours in algos:
        for name in [n for n in sps if n != ours and not (n in algos and ours.endswith("processes"))]:
            ratios = [a / b for a, b in zip(sps[ours], sps[name], strict=True)]
            print(f"{ours} / {name}: {statistics.median(ratios):.2f}x (pairs {', '.join(f'{r:.2f}' for r in ratios)}); "
                  f"steps/s {statistics.median(sps[ours]):.0f} vs {statistics.median(sps[name]):.0f}; final return "
                  f"{np.mean(returns[ours]):.1f} vs {np.mean(returns[name]):.1f}")
            records.append(ratio_record(ours, name, f"{args.env}: training", ratios, (sps[ours], sps[name])))
    return records


def _pool_sps(kind: type, env: str, num_envs: int, workers: int, steps: int) -> float:
    from jaxrl_frag.envs.host_pool import environments

    probe = environments(env, 1, {})
    choices = probe.action_space.n
    probe.close()
    with kind(env, num_envs, workers) as pool:
        pool.reset(0)
        actions = np.random.default_rng(0).integers(0, choices, (steps, num_envs))
        start = time.perf_counter()
        for step in actions:
            pool.step(step)
        return steps * num_envs / (time.perf_counter() - start)


def _vector_sps(env: str, num_envs: int, threads: int, steps: int) -> float:
    from ale_py.vector_env import AtariVectorEnv

    from jaxrl_frag.envs.host_pool import rom_id

    games = AtariVectorEnv(rom_id(env.removeprefix("ale:")), num_envs=num_envs, num_threads=threads,
                           autoreset_mode="SameStep", reward_clipping=False)
    games.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, games.single_action_space.n, (steps, num_envs)).astype(np.int32)
    start = time.perf_counter()
    for step in actions:
        games.step(step)
    games.close()
    return steps * num_envs / (time.perf_counter() - start)


def stepping(args: argparse.Namespace) -> list[dict[str, Any]]:
    from jaxrl_frag.envs.host_pool import HostEnvPool, InProcessPool

    pools = {"worker pool": HostEnvPool, "in-process pool": InProcessPool}
    sps: dict[str, list[float]] = {name: [] for name in (*pools, "ale-py in process")}
    if args.envpool_python:
        sps["EnvPool in process"] = []
    for pair in range(args.pairs):
        for name, kind in pools.items():
            sps[name].append(_pool_sps(kind, args.env, args.num_envs, args.workers, args.steps))
        sps["ale-py in process"].append(_vector_sps(args.env, args.num_envs, args.workers, args.steps))
        if args.envpool_python:
            out = subprocess.run([args.envpool_python, str(Path(__file__).with_name("envpool_step.py")), "--game",
                                  args.env.removeprefix("ale:"), "--num-envs", str(args.num_envs), "--threads",
                                  str(args.workers), "--steps", str(args.steps)], capture_output=True, text=True, check=True)
            sps["EnvPool in process"].append(json.loads(out.stdout.strip().splitlines()[-1])["sps"])
        print(f"pair {pair}: " + ", ".join(f"{name} {values[-1]:.0f} steps/s" for name, values in sps.items()), flush=True)
    records = []
    for ours in pools:
        for name in list(sps)[2:]:
            ratios = [a / b for a, b in zip(sps[ours], sps[name], strict=True)]
            print(f"{ours} / {name}: {statistics.median(ratios):.2f}x (pairs {', '.join(f'{r:.2f}' for r in ratios)})")
            records.append(ratio_record(ours, name, f"{args.env}: stepping", ratios, (sps[ours], sps[name])))
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    for name, steps, env in (("ring", 65_536, "gymnasium:CartPole-v1"), ("sb3", 100_000, "gymnasium:CartPole-v1"),
                             ("stepping", 2_000, "ale:Breakout")):
        p = sub.add_parser(name)
        p.add_argument("--env", default=env)
        p.add_argument("--num-envs", type=int, default=8)
        p.add_argument("--steps", type=float, default=steps)
        p.add_argument("--pairs", type=int, default=3)
        p.add_argument("--json", help="put the ratios into this records file (benchmarks/results/host_envs.json)")
    sub.choices["ring"].add_argument("--num-steps", type=int, default=128)
    sub.choices["sb3"].add_argument("--sb3-python", required=True, help="the Python of an environment with "
                                                                        "stable-baselines3 and torch")
    sub.choices["stepping"].add_argument("--workers", type=int, default=2, help="worker processes, and threads of "
                                                                               "the in-process pool and vector "
                                                                               "environments")
    sub.choices["stepping"].add_argument("--envpool-python", help="the Python of an environment with envpool")
    args = parser.parse_args()
    args.steps = int(args.steps)
    records = {"ring": ring, "sb3": sb3, "stepping": stepping}[args.what](args)
    if args.json:
        results.save(args.json, records)


if __name__ == "__main__":
    sys.exit(main())
