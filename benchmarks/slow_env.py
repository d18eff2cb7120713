"""A slow pure-Python environment, for benchmarks of host environment pools: CartPole-v1's
dynamics (Barto, Sutton and Anderson, 1983, as Gymnasium writes them) integrated with
``substeps`` Euler steps of Python floats per step, about 1 ms a step at the default 2,000
on one core: a stand-in for the simulators that SRL and MSRL put on CPU nodes, whose step
costs far more than a worker's messages.

Importing it registers ``SlowCartPole-v0`` (episodes of at most 500 steps), so that with
this folder on ``PYTHONPATH`` (every worker imports it too) the run names it as
``gymnasium:slow_env:SlowCartPole-v0``, Gymnasium's ``module:id`` form.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium
import numpy as np

GRAVITY, CART_MASS, POLE_MASS, HALF_LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
THETA_LIMIT, X_LIMIT = 12 * 2 * math.pi / 360, 2.4


class SlowCartPole(gymnasium.Env):
    """CartPole-v1 with each 0.02 s step split into ``substeps`` Euler steps in Python."""

    def __init__(self, substeps: int = 2000):
        self.substeps = substeps
        high = np.array([X_LIMIT * 2, np.inf, THETA_LIMIT * 2, np.inf], np.float32)
        self.observation_space = gymnasium.spaces.Box(-high, high, dtype=np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.state = (0.0, 0.0, 0.0, 0.0)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.state = tuple(float(v) for v in self.np_random.uniform(-0.05, 0.05, 4))
        return np.array(self.state, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        x, x_dot, theta, theta_dot = self.state
        force = FORCE if action == 1 else -FORCE
        total_mass, pole_mass_length, dt = CART_MASS + POLE_MASS, POLE_MASS * HALF_LENGTH, TAU / self.substeps
        for _ in range(self.substeps):
            cos, sin = math.cos(theta), math.sin(theta)
            temp = (force + pole_mass_length * theta_dot * theta_dot * sin) / total_mass
            theta_acc = (GRAVITY * sin - cos * temp) / (HALF_LENGTH * (4 / 3 - POLE_MASS * cos * cos / total_mass))
            x_acc = temp - pole_mass_length * theta_acc * cos / total_mass
            x, x_dot = x + dt * x_dot, x_dot + dt * x_acc
            theta, theta_dot = theta + dt * theta_dot, theta_dot + dt * theta_acc
        self.state = (x, x_dot, theta, theta_dot)
        terminated = abs(x) > X_LIMIT or abs(theta) > THETA_LIMIT
        return np.array(self.state, np.float32), 1.0, terminated, False, {}


gymnasium.register("SlowCartPole-v0", entry_point=SlowCartPole, max_episode_steps=500)
