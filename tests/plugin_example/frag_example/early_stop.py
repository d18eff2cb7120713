"""A transform of a user's own: training stops once the algorithm's moving average of
mean episode return reaches a target (Stable-Baselines3's
``StopTrainingOnRewardThreshold``), inside the compiled program: the run ends at the
first iteration whose state says it is solved (``Algorithm.finished``).

The state is the algorithm's, its top-level fields as they were (so a policy places them
as before), with one more, ``early_stop``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_frag.algorithms import Algorithm, Metrics, Wrapper, hyperparameter, static_field
from jaxrl_frag.errors import check

FIELD = "early_stop"


@struct.dataclass
class Smoothed:
    value: jax.Array  # moving average of the iterations' mean episode return
    episodes: jax.Array  # episodes ended so far


@struct.dataclass
class EarlyStop(Wrapper):
    """``algorithm`` trained until its smoothed mean episode return reaches ``target``."""

    name: ClassVar[str] = "early-stop"
    algorithm: Algorithm
    state_type: type = static_field()  # the algorithm's state class, rebuilt from its fields
    target: float = hyperparameter(math.inf, help="stop once the smoothed mean episode return reaches this")
    smoothing: float = hyperparameter(0.9, help="weight of the past in the moving average, in [0, 1)")
    min_episodes: int = static_field(100, help="episodes to see before stopping")

    @classmethod
    def create(cls, algorithm: Algorithm, **settings: Any) -> EarlyStop:
        """``algorithm`` stopped early; ``ConfigError`` for a setting that cannot work."""
        stop = cls(algorithm, type(jax.eval_shape(algorithm.init, jax.ShapeDtypeStruct((2,), jnp.uint32))), **settings)
        check(math.isfinite(stop.target), "early_stop_target", stop.target, "give the return to stop at")
        check(0 <= stop.smoothing < 1, "early_stop_smoothing", stop.smoothing, "must be in [0, 1)")
        check(dataclasses.is_dataclass(stop.state_type), "transforms", "early-stop",
              f"{type(algorithm).__name__}'s state must be a dataclass")
        return stop

    @property
    def inner(self) -> Algorithm:
        return self.algorithm

    def split(self, state: dict[str, Any]) -> tuple[Any, Smoothed]:
        fields = dict(state)
        smoothed = fields.pop(FIELD)
        return self.state_type(**fields), smoothed

    def unwrap(self, state: dict[str, Any], member: int | None = None) -> tuple[Algorithm, Any]:
        return self.algorithm, self.split(state)[0]

    def init(self, key: jax.Array) -> dict[str, Any]:
        inner = self.algorithm.init(key)
        return {**_fields(inner), FIELD: Smoothed(jnp.float32(0), jnp.float32(0))}

    def step(self, state: dict[str, Any]) -> tuple[dict[str, Any], Metrics]:
        inner, smoothed = self.split(state)
        inner, metrics = self.algorithm.step(inner)
        count = metrics["episode_count"]
        mean = metrics["episode_return_sum"] / jnp.maximum(count, 1.0)
        blended = jnp.where(smoothed.episodes > 0, self.smoothing * smoothed.value + (1 - self.smoothing) * mean, mean)
        smoothed = Smoothed(jnp.where(count > 0, blended, smoothed.value), smoothed.episodes + count)
        return {**_fields(inner), FIELD: smoothed}, metrics

    def finished(self, state: dict[str, Any]) -> jax.Array:
        inner, smoothed = self.split(state)
        solved = (smoothed.episodes >= self.min_episodes) & (smoothed.value >= self.target)
        return self.algorithm.finished(inner) | solved

    def resumed(self, state: dict[str, Any]) -> dict[str, Any]:
        inner, smoothed = self.split(state)
        return {**_fields(self.algorithm.resumed(inner)), FIELD: smoothed}


def _fields(state: Any) -> dict[str, Any]:
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
