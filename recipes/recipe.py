"""``Recipe``: what every shipped algorithm shares: the environment and the size of
the run, settings read from per-environment defaults and overrides, and their
validation before anything is traced."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import jax
from flax import struct

from jaxrl_frag import envs
from jaxrl_frag.algorithms import Algorithm, hyperparameter, static_field
from jaxrl_frag.bounds import EXACT_STEPS, INT32, INT32_MAX, check_count, is_whole
from jaxrl_frag.errors import ConfigError, check

_RESUMED = 0x7E5  # folded into the state's key for the seeds of environments started afresh on resume
# HostEnv.make's options, the recipe's env_<option>: the ring's, then the backends' (envs.host_pool.OPTIONS)
HOST_OPTIONS = ("workers", "groups", "ring", "backend", "timeout", "address", "worker_cpus", "worker_resource",
                "lost_workers", "keep_alive")
# act(obs, key) -> action: a batch of observations [N, ...] as the bare environment gives them (no normalisation) and
# one key, to the actions sent to the environment [N, ...]
PolicyFn = Callable[[jax.Array, jax.Array], jax.Array]


def check_widths(name: str, widths: tuple[int, ...]) -> None:
    """Refuse the setting ``name`` unless its layer ``widths`` are one or more positive int32 counts."""
    check(len(widths) > 0 and all(is_whole(w) and w > 0 for w in widths), name, widths,
          "give one or more positive layer widths, e.g. 64,64")
    check(max(widths) <= INT32_MAX, name, widths, f"a layer's width must be at most {INT32_MAX:,} ({INT32})")


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
    env_workers: int = static_field(0, help="host environments (gymnasium:, ale:): worker processes (in process: "
                                            "ale-py's threads), a multiple of env_groups that divides num_envs (0: as "
                                            "many as the CPUs allow)")
    env_groups: int = static_field(2, help="host environments: groups of the environment ring (the workers step one "
                                           "while the policy acts for the next)")
    env_ring: bool = static_field(True, help="host environments: overlap inference and stepping as a ring (off: "
                                             "strict alternation, the same results)")
    env_backend: str = static_field("auto", help="host environments: where they step, with the same results: "
                                                 "processes (isolated workers), in-process (Atari on ale-py's threads, "
                                                 "no IPC), ray (actors on a Ray cluster's nodes: pip install "
                                                 "'jaxrl_frag[ray]'), auto (in-process for ale:, processes otherwise)")
    env_timeout: float = static_field(60.0, help="host environments in worker processes or Ray actors: seconds a "
                                                 "worker has to answer a step before it counts as lost")
    env_address: str = static_field("", help="ray: the cluster's address (host:port, as ray start --head prints "
                                             "it); empty: $RAY_ADDRESS, else a local Ray started for the run")
    env_worker_cpus: float = static_field(1.0, help="ray: CPUs each environment worker (actor) reserves")
    env_worker_resource: str = static_field("", help="ray: a custom resource of the nodes the workers go to (a node "
                                                     "started with ray start --resources '{\"envs\": 16}'); empty: "
                                                     "any node with free CPUs")
    env_lost_workers: str = static_field("stop", help="ray: a lost worker (its node gone, or no answer within "
                                                      "env_timeout): stop (exit 4 naming it and its node, checkpoints "
                                                      "kept, resume continues) or restart (elsewhere, its environments "
                                                      "reset and their episodes in flight ended as truncations)")
    env_keep_alive: float = static_field(10.0, help="ray: seconds a worker that no step needs (boosting's smaller "
                                                    "rungs) is kept before it is released to the cluster; one needed "
                                                    "again after that starts afresh, its episodes in flight ended as "
                                                    "truncations")

    action_spaces: ClassVar[tuple[type, ...]] = (envs.Discrete, envs.Box)  # the kinds of action space it acts in
    multi_agent: ClassVar[bool] = False  # whether it acts for agents on an axis (AgentObs), or for one
    takes_action_masks: ClassVar[bool] = False  # whether it acts only on the allowed actions of a MaskedObs
    takes_turns: ClassVar[bool] = False  # whether it learns both sides of a game whose players alternate (self-play)

    # the settings that must be positive integers, those that must be finite numbers, and those positive
    counts: ClassVar[tuple[str, ...]] = ("num_envs", "num_steps", "total_steps", "env_groups")
    reals: ClassVar[tuple[str, ...]] = ("lr", "gamma")
    positive: ClassVar[tuple[str, ...]] = ("lr",)
    # the most environment steps a run may take, and why
    max_total_steps: ClassVar[tuple[int, str]] = (EXACT_STEPS, "2**53: the host sums environment steps in float64")

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        """Settings that work for ``env_id``'s family, over the dataclass defaults."""
        return {}

    @classmethod
    def create(cls, env: str, **overrides: Any) -> Recipe:
        """The recipe on environment id ``env``: the defaults of its family (chosen by the id
        without its options, ``envs.id_options``), then ``overrides``; validated."""
        fields = cls.fields()
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ConfigError(unknown[0], overrides[unknown[0]],
                              f"not a {cls.__name__} setting; the settings are {', '.join(fields)}")
        settings = {**fields, **cls.defaults(envs.base_id(env)), **overrides}
        cls.validate(settings)
        batched = cls.make_env(env, settings)
        cls.check_env(batched)
        return cls(env=batched, **settings)

    @classmethod
    def check_env(cls, env: envs.Env) -> None:
        """Raise ``ConfigError`` if ``env``'s action space is of a kind this recipe cannot act
        in, ``env`` has agents on an axis and the recipe acts for one agent (or the reverse),
        ``env`` masks its actions and the recipe takes no masks, or ``env``'s players
        alternate and the recipe does not take turns."""
        agents = env.num_agents
        if (agents is not None) != cls.multi_agent:
            why = (f"is a multi-agent environment ({agents} agents); {cls.__name__} acts for one agent: choose a "
                   "multi-agent recipe (ippo, mappo, pqn-vdn, qmix)" if agents is not None else
                   f"has one agent; {cls.__name__} is a multi-agent recipe: choose a jaxmarl: environment, or a "
                   "single-agent recipe (ppo)")
            raise ConfigError("env", env.name, why)
        check(not env.capabilities.masks_actions or cls.takes_action_masks, "env", env.name,
              f"masks its actions (those allowed change from step to step); {cls.__name__} takes no action masks: "
              "choose a recipe that does (ppo, a2c, impala, dqn, qrdqn, pqn)")
        check(not env.capabilities.alternating or cls.takes_turns, "env", env.name,
              f"is a game of two players who move in turn, each step's reward the mover's and the next state the "
              f"opponent's to move; {cls.__name__} learns for one player whose states follow one another: choose a "
              f"recipe that plays both sides (alphazero), or play against random moves ({env.name}@opponent=random)")
        space = env.action_space
        if not isinstance(space, cls.action_spaces):
            kinds = {envs.Discrete: "discrete", envs.Box: "continuous"}
            supported = " or ".join(kinds[k] for k in cls.action_spaces)
            raise ConfigError(
                "env", env.name,
                f"has {kinds[type(space)]} actions ({space}); {cls.__name__} supports {supported} actions only: "
                f"choose an environment with {supported} actions or a recipe for {kinds[type(space)]} ones",
            )

    @classmethod
    def make_env(cls, env_id: str, settings: dict[str, Any]) -> envs.Env:
        """The batched environment the recipe trains on."""
        return envs.make(env_id, num_envs=settings["num_envs"], **cls.host_options(env_id, settings))

    @classmethod
    def host_options(cls, env_id: str, settings: dict[str, Any]) -> dict[str, Any]:
        """``envs.make``'s options for host environments, from the ``env_*`` settings;
        ``ConfigError`` if one is set for a JAX environment."""
        options = {option: settings[f"env_{option}"] for option in HOST_OPTIONS}
        if envs.is_host(env_id):
            return options
        defaults = cls.fields()
        for name in (f"env_{option}" for option in HOST_OPTIONS):
            check(settings[name] == defaults[name], name, settings[name],
                  f"is for host environments (gymnasium:, ale:); {env_id} is a JAX environment: drop it")
        return {}

    def resumed(self, state: Any) -> Any:
        """A restored state to continue from: ``state`` itself, unless the environments'
        state is not in it (not ``restorable``): those start afresh, seeded from the
        state's key (which is left as it was)."""
        if self.env.capabilities.restorable:
            return state
        env_state, obs = self.env.reset(jax.random.fold_in(state.key, _RESUMED))
        return state.replace(env_state=env_state, obs=obs)

    def failure(self) -> Exception | None:
        """The environments' failure outside the program, if any."""
        return self.env.failure()

    def counters(self) -> dict[str, float]:
        """The environments' counts kept outside the program (``Env.counters``)."""
        return self.env.counters()

    def policy_fn(self, state: Any, greedy: bool) -> PolicyFn:
        """The policy of training state ``state``, to act with after training.

        Args:
            state: A training state of this recipe (``init``'s structure): its acting
                parameters, and any observation statistics its environment keeps
                (held fixed from here on).
            greedy: The deterministic action (the most likely one, the Gaussian's mean,
                the greedy Q-value's) rather than a draw from the policy (epsilon-greedy
                at ``epsilon_end`` for Q-learning recipes).

        Returns:
            ``act(obs, key) -> action``: observations ``[N, ...]`` as the environment
            gives them without normalisation, one PRNG key, the actions ``[N, ...]``
            to send to the environment (within its bounds).
        """
        raise NotImplementedError

    def acting(self, state: Any, greedy: bool) -> envs.Acting:
        """``policy_fn`` as an ``envs.Acting``, carrying a memory where the policy has one
        (what evaluation plays)."""
        return envs.Acting.without_memory(self.policy_fn(state, greedy))

    @classmethod
    def fields(cls) -> dict[str, Any]:
        """Every setting but the environment, with its default."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name != "env"}

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        """Raise ``ConfigError`` for the first setting in ``s`` that cannot work."""
        for name in cls.counts:
            high, why = cls.max_total_steps if name == "total_steps" else (INT32_MAX, INT32)
            check_count(name, s[name], high, why)
        batch = s["num_envs"] * s["num_steps"]
        check(batch <= INT32_MAX, "num_envs", s["num_envs"],
              f"num_envs * num_steps = {batch:,} samples per iteration must be at most {INT32_MAX:,} (their indices "
              "are int32): lower --num-envs or --num-steps")
        check(s["total_steps"] >= batch, "total_steps", s["total_steps"],
              f"must cover at least one iteration of num_envs * num_steps = {batch} steps; raise it")
        iterations = s["total_steps"] // batch
        check(iterations <= INT32_MAX, "total_steps", s["total_steps"],
              f"makes {iterations:,} iterations of num_envs * num_steps = {batch:,} steps, and the compiled program "
              f"counts at most {INT32_MAX:,} (int32): lower --total-steps or raise --num-envs or --num-steps")
        check_widths("hidden", s["hidden"])
        for name in cls.reals:
            check(math.isfinite(s[name]), name, s[name], "must be a finite number")
        for name in cls.positive:
            check(s[name] > 0, name, s[name], "must be positive")
        check(0 < s["gamma"] <= 1, "gamma", s["gamma"], "must lie in (0, 1]")

    @classmethod
    def check_updates(cls, s: dict[str, Any], per_iteration: int) -> None:
        """Refuse settings ``s`` whose run of ``per_iteration`` optimizer updates an
        iteration takes more updates than their int32 count holds."""
        iterations = s["total_steps"] // (s["num_envs"] * s["num_steps"])
        updates = iterations * per_iteration
        check(updates <= INT32_MAX, "total_steps", s["total_steps"],
              f"makes {updates:,} optimizer updates ({iterations:,} iterations of {per_iteration}), and the run "
              f"counts at most {INT32_MAX:,} (int32): lower --total-steps or raise --num-envs or --num-steps")

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
