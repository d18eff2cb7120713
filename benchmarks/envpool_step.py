"""EnvPool stepping Atari games, for ``host_envs.py stepping``: run by the Python of an
environment with envpool installed (not this project's).

    python envpool_step.py --game Breakout --num-envs 8 --threads 2 --steps 2000

Prints one JSON line: environment steps per second of random actions (synchronous
``step`` calls, the same preprocessing as ``ale:<Game>``: EnvPool's Atari defaults).
"""

from __future__ import annotations

import argparse
import json
import time

import envpool
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--game", default="Breakout")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    envs = envpool.make(f"{args.game}-v5", env_type="gymnasium", num_envs=args.num_envs, num_threads=args.threads,
                        episodic_life=False, reward_clip=False, seed=0)
    envs.reset()
    actions = np.random.default_rng(0).integers(0, envs.action_space.n, (args.steps, args.num_envs))
    start = time.perf_counter()
    for step in actions:
        envs.step(step)
    print(json.dumps({"sps": args.steps * args.num_envs / (time.perf_counter() - start)}))


if __name__ == "__main__":
    main()
