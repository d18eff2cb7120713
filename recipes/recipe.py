"""``Recipe``: what every shipped algorithm shares: the environment and the size of
the run, settings read from per-environment defaults and overrides, and their
validation before anything is traced."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from flax import struct

from jaxrl_frag import envs
from jaxrl_frag.algorithms import Algorithm, hyperparameter, static_field
from jaxrl_frag.errors import ConfigError, check


@struct.dataclass
class Recipe(Algorithm):
    """A configurable algorithm on a batch of ``num_envs`` environments that each take
    ``num_steps`` steps per iteration, for ``total_steps`` steps in all."""

    env: envs.Env = static_field(help="the batched environment (from --env)")
    num_envs: int = static_field(4, help="parallel environments")
    num_steps: int = static_field(128, help="environment steps per environment per iteration")
    total_steps: int = static_field(500_000, help="environment steps of the whole run")
    hidden: tuple[int, ...] = static_field((64, 64), help="hidden layer widths of the networks")
    lr: float = hyperparameter(2.5e-4, help="Adam learning rate")
    gamma: float = hyperparameter(0.99, help="discount factor")

    # the settings that must be positive integers, those that must be finite numbers, and those positive
    counts: ClassVar[tuple[str, ...]] = ("num_envs", "num_steps", "total_steps")
    reals: ClassVar[tuple[str, ...]] = ("lr", "gamma")
    positive: ClassVar[tuple[str, ...]] = ("lr",)

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        """Settings that work for ``env_id``'s family, over the dataclass defaults."""
        return {}

    @classmethod
    def create(cls, env: str, **overrides: Any) -> Recipe:
        """The recipe on environment id ``env``: family defaults, then ``overrides``; validated."""
        fields = cls.fields()
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ConfigError(unknown[0], overrides[unknown[0]],
                              f"not a {cls.__name__} setting; the settings are {', '.join(fields)}")
        settings = {**fields, **cls.defaults(env), **overrides}
        cls.validate(settings)
        batched = cls.make_env(env, settings)
        cls.check_env(batched)
        return cls(env=batched, **settings)

    @classmethod
    def make_env(cls, env_id: str, settings: dict[str, Any]) -> envs.Env:
        """The batched environment the recipe trains on."""
        return envs.make(env_id, num_envs=settings["num_envs"])

    @classmethod
    def fields(cls) -> dict[str, Any]:
        """Every setting but the environment, with its default."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name != "env"}

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        """Raise ``ConfigError`` for the first setting in ``s`` that cannot work."""
        for name in cls.counts:
            check(int(s[name]) == s[name] and s[name] > 0, name, s[name], "must be a positive integer")
        batch = s["num_envs"] * s["num_steps"]
        check(s["total_steps"] >= batch, "total_steps", s["total_steps"],
              f"must cover at least one iteration of num_envs * num_steps = {batch} steps; raise it")
        check(len(s["hidden"]) > 0 and all(w > 0 for w in s["hidden"]), "hidden", s["hidden"],
              "give one or more positive layer widths, e.g. 64,64")
        for name in cls.reals:
            check(math.isfinite(s[name]), name, s[name], "must be a finite number")
        for name in cls.positive:
            check(s[name] > 0, name, s[name], "must be positive")
        check(0 < s["gamma"] <= 1, "gamma", s["gamma"], "must lie in (0, 1]")

    @property
    def batch_size(self) -> int:
        """Environment steps collected per iteration."""
        return self.num_envs * self.num_steps

    @property
    def steps_per_iteration(self) -> int:
        return self.batch_size

    @property
    def num_iterations(self) -> int:
        return self.total_steps // self.batch_size
