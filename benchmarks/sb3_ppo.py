"""Stable-Baselines3 PPO on a Gymnasium environment, for ``host_envs.py sb3``: run by the
Python of an environment with stable-baselines3 and torch installed (not this project's).

    python sb3_ppo.py --env CartPole-v1 --num-envs 8 --steps 100000 --vec dummy|subproc

The settings are the framework's PPO CartPole settings (128 steps per environment, 4
epochs of 4 minibatches, Adam 2.5e-4, GAE 0.95, clip 0.2, entropy 0.01, value 0.5,
gradient norm 0.5, two tanh layers of 64), one torch thread. Prints one JSON line:
steps, seconds of ``learn`` alone, steps per second, and the mean return of the last
20 episodes.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--vec", choices=("dummy", "subproc"), default="dummy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    envs = make_vec_env(args.env, n_envs=args.num_envs, seed=args.seed,
                        vec_env_cls=SubprocVecEnv if args.vec == "subproc" else DummyVecEnv)
    model = PPO("MlpPolicy", envs, n_steps=128, batch_size=args.num_envs * 128 // 4, n_epochs=4, learning_rate=2.5e-4,
                gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
                policy_kwargs=dict(net_arch=[64, 64], activation_fn=torch.nn.Tanh), device="cpu", seed=args.seed)
    start = time.perf_counter()
    model.learn(total_timesteps=args.steps)
    seconds = time.perf_counter() - start
    returns = [episode["r"] for episode in list(model.ep_info_buffer)[-20:]]
    envs.close()
    print(json.dumps({"steps": int(model.num_timesteps), "seconds": seconds, "sps": model.num_timesteps / seconds,
                      "return": float(np.mean(returns)) if returns else float("nan")}))


if __name__ == "__main__":
    main()
