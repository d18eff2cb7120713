"""A worker process of a ``HostEnvPool``: run as a script (``python -P host_worker.py FD``),
it imports only NumPy, Gymnasium and ale-py, never the parent's main module or JAX.

It reads its environments from the connection on file descriptor ``FD``, then answers
``reset`` and ``step`` requests until ``close``, or until the pool goes away (end of
file). Its answers are ``("ok", value)`` or ``("error", traceback)``.
"""

from __future__ import annotations

import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

import numpy as np


class GymnasiumEnvs:
    """``count`` environments ``gymnasium.make(name, **kwargs)``, stepped in turn."""

    def __init__(self, name: str, count: int, kwargs: dict[str, Any]):
        import gymnasium

        self.envs = [gymnasium.make(name, **kwargs) for _ in range(count)]
        self.observation_space, self.action_space = self.envs[0].observation_space, self.envs[0].action_space

    def reset(self, seeds: np.ndarray) -> np.ndarray:
        return np.stack([env.reset(seed=int(seed))[0] for env, seed in zip(self.envs, seeds, strict=True)])

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(obs, reward, score, terminated, truncated, final_obs)``, reset within the step."""
        rows = []
        for env, action in zip(self.envs, actions, strict=True):
            obs, reward, terminated, truncated, _ = env.step(action)
            final = obs
            if terminated or truncated:
                obs, _ = env.reset()
            rows.append((obs, reward, reward, terminated, truncated, final))
        return tuple(np.stack(column) for column in zip(*rows, strict=True))

    def close(self) -> None:
        for env in self.envs:
            env.close()


class AtariGames:
    """``count`` Atari games in ale-py's vector environment (one thread) with the standard
    preprocessing of Mnih et al. (2015), as EnvPool has it: up to 30 no-op starts, fire
    on reset, 4 frames skipped and the last two max-pooled, 84x84 grayscale, the last 4
    frames stacked as channels ``(84, 84, 4)``; an episode is a whole game (a lost life
    is not its end), at most 108,000 frames. The reward learned from is the game reward's
    sign; the score kept for statistics is the game's. ``kwargs`` go to
    ``ale_py.vector_env.AtariVectorEnv``: ``repeat_action_probability=0.25`` gives
    Machado et al.'s (2018) sticky actions, for instance."""

    def __init__(self, name: str, count: int, kwargs: dict[str, Any]):
        import gymnasium
        from ale_py.vector_env import AtariVectorEnv

        self.games = AtariVectorEnv(name, num_envs=count, num_threads=1, autoreset_mode="SameStep",
                                    reward_clipping=False, **kwargs)
        stacked = self.games.single_observation_space  # (frames, height, width)
        self.observation_space = gymnasium.spaces.Box(0, 255, (*stacked.shape[1:], stacked.shape[0]), np.uint8)
        self.action_space = self.games.single_action_space

    def reset(self, seeds: np.ndarray) -> np.ndarray:
        return self.games.reset(seed=np.asarray(seeds, np.int64))[0].transpose(0, 2, 3, 1)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(obs, reward, score, terminated, truncated, final_obs)``, reset within the step."""
        obs, score, terminated, truncated, info = self.games.step(np.asarray(actions, np.int32))
        final = np.where((terminated | truncated)[:, None, None, None], info.get("final_obs", obs), obs)
        return (obs.transpose(0, 2, 3, 1), np.sign(score), score, terminated, truncated, final.transpose(0, 2, 3, 1))

    def close(self) -> None:
        self.games.close()


def make(env_id: str, count: int, kwargs: dict[str, Any]) -> GymnasiumEnvs | AtariGames:
    """``count`` environments of ``env_id`` (``gymnasium:<id>`` or ``ale:<rom id>``)."""
    family, _, name = env_id.partition(":")
    return (AtariGames if family == "ale" else GymnasiumEnvs)(name, count, kwargs)


def serve(conn: Connection) -> None:
    """Make the environments the first message asks for, then answer requests: each
    step's observations, rewards, termination and truncation flags, final observations,
    and each environment's episode score and length so far (zeroed after an end)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the pool's to handle: it stops the workers
    envs = None
    try:
        env_id, count, kwargs = conn.recv()
        envs = make(env_id, count, kwargs)
        score, length = np.zeros(count), np.zeros(count, np.int32)
        while True:
            command, payload = conn.recv()
            if command == "close":
                return
            if command == "reset":
                score[:], length[:] = 0, 0
                conn.send(("ok", envs.reset(payload)))
                continue
            obs, reward, points, terminated, truncated, final = envs.step(payload)
            score += points
            length += 1
            conn.send(("ok", (obs, reward, terminated, truncated, final, score.copy(), length.copy())))
            done = terminated | truncated
            score[done], length[done] = 0, 0
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # the pool is gone
    except Exception:  # reported to the pool, which names the environments
        try:
            conn.send(("error", traceback.format_exc()))
        except (BrokenPipeError, OSError):
            pass
    finally:
        if envs is not None:
            envs.close()


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
