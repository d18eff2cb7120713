"""Environments as a pool steps them, and the worker process that runs them for a
``HostEnvPool``.

Run as a script (``python -P host_worker.py FD MEMORY``) it is a worker: it imports only
NumPy, Gymnasium and ale-py, never the parent's main module or JAX. It reads its
environments from the connection on file descriptor ``FD``, then answers ``reset`` and
``step`` requests until ``close``, or until the pool goes away (end of file). It writes
observations and final observations into the shared memory on file descriptor
``MEMORY`` (``[2, count, *observation shape]``: slot 0 the observations, slot 1 the final
ones) and sends the rest: its answers are ``("ok", value)`` or ``("error", traceback)``.
"""

from __future__ import annotations

import abc
import mmap
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

import numpy as np


class Envs(abc.ABC):
    """A batch of environments stepped as a pool steps them: ``send`` starts a step,
    ``recv`` returns it as ``(obs, reward, points, terminated, truncated, final_obs)``
    (``points``: the game's reward, before any clipping), reset within the step."""

    observation_space: Any
    action_space: Any

    @abc.abstractmethod
    def reset(self, seeds: np.ndarray) -> np.ndarray:
        """Every environment's first observation, environment ``i`` seeded ``seeds[i]``."""

    @abc.abstractmethod
    def send(self, actions: np.ndarray) -> None:
        """Start a step with ``actions``."""

    @abc.abstractmethod
    def recv(self) -> tuple[np.ndarray, ...]:
        """The step ``send`` started."""

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """``send``, then ``recv``."""
        self.send(actions)
        return self.recv()

    @abc.abstractmethod
    def close(self) -> None:
        """Release the environments."""


class Episodes:
    """Each environment's episode score and length so far, zeroed after an episode ends."""

    def __init__(self, count: int):
        self.score, self.length = np.zeros(count), np.zeros(count, np.int32)

    def reset(self) -> None:
        self.score[:], self.length[:] = 0, 0

    def record(self, points: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The scores and lengths after a step that earned ``points``; those of episodes
        that ``done`` ended are zeroed for the next."""
        self.score += points
        self.length += 1
        out = self.score.copy(), self.length.copy()
        self.score[done], self.length[done] = 0, 0
        return out


class GymnasiumEnvs(Envs):
    """``count`` environments ``gymnasium.make(name, **kwargs)``, stepped in turn at ``recv``."""

    def __init__(self, name: str, count: int, kwargs: dict[str, Any], threads: int = 1):
        import gymnasium

        self.envs = [gymnasium.make(name, **kwargs) for _ in range(count)]
        self.observation_space, self.action_space = self.envs[0].observation_space, self.envs[0].action_space
        self._actions: np.ndarray | None = None

    def reset(self, seeds: np.ndarray) -> np.ndarray:
        return np.stack([env.reset(seed=int(seed))[0] for env, seed in zip(self.envs, seeds, strict=True)])

    def send(self, actions: np.ndarray) -> None:
        self._actions = actions

    def recv(self) -> tuple[np.ndarray, ...]:
        rows, actions, self._actions = [], self._actions, None
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


class AtariGames(Envs):
    """``count`` Atari games in ale-py's vector environment (``threads`` threads of its
    own, stepping between ``send`` and ``recv``) with the standard
    preprocessing of Mnih et al. (2015), as EnvPool has it: up to 30 no-op starts, fire
    on reset, 4 frames skipped and the last two max-pooled, 84x84 grayscale, the last 4
    frames stacked as channels ``(84, 84, 4)``; an episode is a whole game (a lost life
    is not its end), at most 108,000 frames. The reward learned from is the game reward's
    sign; the score kept for statistics is the game's. ``kwargs`` go to
    ``ale_py.vector_env.AtariVectorEnv``: ``repeat_action_probability=0.25`` gives
    Machado et al.'s (2018) sticky actions, for instance."""

    def __init__(self, name: str, count: int, kwargs: dict[str, Any], threads: int = 1):
        import gymnasium
        from ale_py.vector_env import AtariVectorEnv

        self.games = AtariVectorEnv(name, num_envs=count, num_threads=threads, autoreset_mode="SameStep",
                                    reward_clipping=False, **kwargs)
        stacked = self.games.single_observation_space  # (frames, height, width)
        self.observation_space = gymnasium.spaces.Box(0, 255, (*stacked.shape[1:], stacked.shape[0]), np.uint8)
        self.action_space = self.games.single_action_space

    def reset(self, seeds: np.ndarray) -> np.ndarray:
        return self.games.reset(seed=np.asarray(seeds, np.int64))[0].transpose(0, 2, 3, 1)

    def send(self, actions: np.ndarray) -> None:
        self.games.send(np.asarray(actions, np.int32))

    def recv(self) -> tuple[np.ndarray, ...]:
        obs, score, terminated, truncated, info = self.games.recv()
        final = obs
        if "final_obs" in info:  # some game ended: its last observation, the next game's first in obs
            ended = terminated | truncated
            final = obs.copy()
            final[ended] = info["final_obs"][ended]
        return (obs.transpose(0, 2, 3, 1), np.sign(score), score, terminated, truncated, final.transpose(0, 2, 3, 1))

    def close(self) -> None:
        self.games.close()


def make(env_id: str, count: int, kwargs: dict[str, Any], threads: int = 1) -> Envs:
    """``count`` environments of ``env_id`` (``gymnasium:<id>`` or ``ale:<rom id>``);
    Atari games step on ``threads`` threads of ale-py's own."""
    family, _, name = env_id.partition(":")
    return (AtariGames if family == "ale" else GymnasiumEnvs)(name, count, kwargs, threads)


class Worker:
    """``count`` environments ``env_id`` as a Ray actor holds them (``host_ray.RayPool``,
    which sends this class by value: a Ray worker imports NumPy, Gymnasium and ale-py,
    never this package or JAX). The pool keeps the episodes' scores, so that it knows
    them when a worker is lost."""

    def __init__(self, env_id: str, count: int, kwargs: dict[str, Any]):
        self.envs = make(env_id, count, kwargs)

    def node(self) -> str:
        """The id of the Ray node this worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        """The id of the process this worker runs in."""
        import os

        return os.getpid()

    def reset(self, seeds: np.ndarray) -> np.ndarray:
        return self.envs.reset(seeds)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """``Envs.recv``'s tuple, but the final observations of the episodes that ended
        alone: the others' are their observations (half the bytes to send, or less)."""
        obs, reward, points, terminated, truncated, final = self.envs.step(actions)
        return obs, reward, points, terminated, truncated, final[terminated | truncated]

    def close(self) -> None:
        self.envs.close()


def observations(memory: mmap.mmap, count: int, space: Any) -> np.ndarray:
    """The shared memory's slots for ``count`` observations and final observations of ``space``."""
    return np.ndarray((2, count, *space.shape), space.dtype, buffer=memory)


def serve(conn: Connection, memory: mmap.mmap) -> None:
    """Make the environments the first message asks for, then answer requests: each
    step's observations and final observations into ``memory``, and its rewards,
    termination and truncation flags and each environment's episode score and length so
    far (zeroed after an end) as the answer."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the pool's to handle: it stops the workers
    envs = None
    try:
        env_id, count, kwargs = conn.recv()
        envs = make(env_id, count, kwargs)
        shared, episodes = observations(memory, count, envs.observation_space), Episodes(count)
        while True:
            command, payload = conn.recv()
            if command == "close":
                return
            if command == "reset":
                episodes.reset()
                shared[0] = envs.reset(payload)
                conn.send(("ok", None))
                continue
            shared[0], reward, points, terminated, truncated, shared[1] = envs.step(payload)
            conn.send(("ok", (reward, terminated, truncated, *episodes.record(points, terminated | truncated))))
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
    serve(Connection(int(sys.argv[1])), mmap.mmap(int(sys.argv[2]), 0))
