"""Stable-Baselines3 PPO on a Gymnasium environment or an Atari game, for ``host_envs.py
sb3``: run by the Python of an environment with stable-baselines3, torch, ale-py and
opencv installed (not this project's).

    python sb3_ppo.py --env gymnasium:CartPole-v1 --num-envs 8 --steps 100000 --vec dummy|subproc
    python sb3_ppo.py --env ale:Breakout ...

The settings are the framework's PPO CartPole settings (128 steps per environment, 4
epochs of 4 minibatches, Adam 2.5e-4, GAE 0.95, clip 0.2, entropy 0.01, value 0.5,
gradient norm 0.5, two tanh layers of 64), one torch thread. An ``ale:<Game>`` runs
``<Game>NoFrameskip-v4`` with Stable-Baselines3's Atari preprocessing (its
``AtariWrapper``: 30 no-op starts, 4 frames skipped and max-pooled, 84x84 grayscale,
a lost life ends an episode for learning, rewards clipped) and 4 frames stacked, the
``CnnPolicy`` (Mnih et al.'s network) and clip 0.1 (CleanRL's ``ppo_atari.py``).
Prints one JSON line: steps, seconds of ``learn`` alone, steps per second, and the
mean return of the last 20 episodes (whole games for Atari: its ``Monitor`` sits
under the wrapper).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="gymnasium:CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--vec", choices=("dummy", "subproc"), default="dummy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    vec_env_cls = SubprocVecEnv if args.vec == "subproc" else DummyVecEnv
    family, _, name = args.env.partition(":")
    if family == "ale":  # "ale_py:" has every worker import ale_py, which registers the games
        envs = VecFrameStack(make_atari_env(f"ale_py:{name}NoFrameskip-v4", n_envs=args.num_envs, seed=args.seed,
                                            vec_env_cls=vec_env_cls), n_stack=4)
        policy, clip, policy_kwargs = "CnnPolicy", 0.1, {}
    else:
        envs = make_vec_env(name, n_envs=args.num_envs, seed=args.seed, vec_env_cls=vec_env_cls)
        policy, clip, policy_kwargs = "MlpPolicy", 0.2, dict(net_arch=[64, 64], activation_fn=torch.nn.Tanh)
    model = PPO(policy, envs, n_steps=128, batch_size=args.num_envs * 128 // 4, n_epochs=4, learning_rate=2.5e-4,
                gamma=0.99, gae_lambda=0.95, clip_range=clip, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
                policy_kwargs=policy_kwargs, device="cpu", seed=args.seed)
    start = time.perf_counter()
    model.learn(total_timesteps=args.steps)
    seconds = time.perf_counter() - start
    returns = [episode["r"] for episode in list(model.ep_info_buffer)[-20:]]
    envs.close()
    print(json.dumps({"steps": int(model.num_timesteps), "seconds": seconds, "sps": model.num_timesteps / seconds,
                      "return": float(np.mean(returns)) if returns else float("nan")}))


if __name__ == "__main__":
    main()
