"""Craftax (Matthews et al., ICML 2024) behind the ``Env`` protocol, as ids ``craftax:<name>``.

``craftax:Craftax-Classic-Symbolic-v1`` is Crafter's game rewritten in JAX (22
achievements), ``craftax:Craftax-Symbolic-v1`` the full game (floors, enemies, 65
achievements); both observe the symbolic view, a vector in [0, 1] (1,345 and 8,268
entries: the map around the player one-hot per block and creature, the inventory and
the player's state). A step's reward is what Craftax gives: an achievement's worth the
first time it is unlocked (1 in Classic; 1, 3, 5 or 8 in the full game) and a tenth of
the change in health. An episode ends in a termination where the player dies (or, in
Classic, walks into lava; in the full game, beats the final boss) and in a truncation at
Craftax's time limit (``max_timesteps``: 10,000 steps in Classic, 100,000 in the full game), so value targets bootstrap from
its last observation. ``info["episode_achievements"]``: how many achievements the
episode unlocked (a metric per run, ``episode_achievements``). ``render`` draws the
player's view with Craftax's own textures, for ``evaluate --video``.

The family reaches ``envs.make`` through this package's entry point (group
``jaxrl_frag.envs``, name ``craftax:``); the ``craftax`` package is an optional extra
(``pip install 'jaxrl-frag[craftax]'``), imported only when one of its environments is
made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_frag.envs import id_options
from jaxrl_frag.envs.core import Box, Capabilities, Discrete, Env, PyTree, TimeStep
from jaxrl_frag.envs.family import check_parameters, package_module, unknown_id

PREFIX = "craftax:"
INSTALL = "pip install 'jaxrl-frag[craftax]'"
# id -> (Craftax's module of the game, its environment class without auto-reset)
GAMES = {
    "Craftax-Classic-Symbolic-v1": ("craftax.craftax_classic", "CraftaxClassicSymbolicEnvNoAutoReset"),
    "Craftax-Symbolic-v1": ("craftax.craftax", "CraftaxSymbolicEnvNoAutoReset"),
}
FRAME_SECONDS = 0.1  # a step of a video: Craftax has no clock of its own


def ids() -> list[str]:
    """Every id this family serves."""
    return [PREFIX + name for name in GAMES]


def make(env_id: str, num_envs: int | None, **options: Any) -> Env:
    """The family's factory (its entry point): one ``CraftaxEnv.make(env_id, **options)``, which
    ``envs.make`` batches (``num_envs``) and wraps."""
    del num_envs
    return CraftaxEnv.make(env_id, **options)


@struct.dataclass
class CraftaxState:
    inner: PyTree  # Craftax's EnvState


@dataclasses.dataclass(frozen=True)
class CraftaxEnv(Env):
    """One Craftax game (module docstring); ``step`` resets a finished episode itself and
    keeps the observation that ended it in ``final_obs``. Equal to another made from the
    same id and options."""

    name: str
    options: tuple[tuple[str, Any], ...]
    game: str = dataclasses.field(compare=False)  # Craftax's module of the game
    env: Any = dataclasses.field(compare=False)
    params: Any = dataclasses.field(compare=False)
    num_envs: None = None
    frame_seconds = FRAME_SECONDS

    @classmethod
    def make(cls, name: str, **options: Any) -> CraftaxEnv:
        """One environment from id ``name`` (``craftax:Craftax-Classic-Symbolic-v1``,
        ``craftax:Craftax-Symbolic-v1``); ``options`` replace fields of Craftax's
        ``EnvParams`` (``max_timesteps``, ``day_length``, ...).

        Raises:
            ConfigError: For an unknown id (with the closest ones and every id), an option
                that Craftax's parameters do not have, or craftax not installed (with the
                command that installs it).
        """
        short = name.removeprefix(PREFIX)
        if short not in GAMES:
            raise unknown_id(name, "Craftax", ids(), f" (symbolic observations; the craftax package: {INSTALL})")
        game, class_name = GAMES[short]
        module = package_module(f"{game}.envs.craftax_symbolic_env", name, INSTALL)
        env = getattr(module, class_name)()
        params = env.default_params
        check_parameters(name, "Craftax", options, [f.name for f in dataclasses.fields(params)])
        return cls(id_options.named(name, options), tuple(sorted(options.items())), game, env,
                   params.replace(**options))

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(renders=True)

    @property
    def max_steps(self) -> int:
        """The time limit in steps (Craftax's ``max_timesteps``)."""
        return int(self.params.max_timesteps)

    @property
    def observation_space(self) -> Box:
        with jax.ensure_compile_time_eval():
            (size,) = self.env.observation_space(self.params).shape
        return Box((0.0,) * size, (1.0,) * size, (size,))

    @property
    def action_space(self) -> Discrete:
        return Discrete(int(self.env.num_actions))

    def reset(self, key: jax.Array) -> tuple[CraftaxState, jax.Array]:
        obs, inner = self.env.reset_env(key, self.params)
        return CraftaxState(inner), obs

    def step(self, key: jax.Array, state: CraftaxState, action: jax.Array) -> tuple[CraftaxState, TimeStep]:
        key, k_reset = jax.random.split(key)
        final_obs, stepped, reward, done, _ = self.env.step_env(key, state.inner, action, self.params)
        truncated = done & (stepped.timestep >= self.params.max_timesteps) & (stepped.player_health > 0)
        terminated = done & ~truncated
        fresh_obs, fresh = self.env.reset_env(k_reset, self.params)
        inner = jax.tree.map(lambda new, old: jax.lax.select(done, new, old), fresh, stepped)
        obs = jnp.where(done, fresh_obs, final_obs)
        info = {"episode_achievements": stepped.achievements.sum().astype(jnp.float32)}
        return CraftaxState(inner), TimeStep(obs, jnp.asarray(reward, jnp.float32), terminated, truncated,
                                             final_obs, info)

    def render(self, states: CraftaxState) -> np.ndarray:
        """The player's view (the map around it, its inventory and state) of each of
        ``states`` (one environment's, stacked ``[T, ...]``), with Craftax's textures at
        16 pixels a block: ``uint8 [T, H, W, 3]``."""
        with contextlib.redirect_stdout(io.StringIO()):  # Craftax prints where its textures come from
            renderer = package_module(f"{self.game}.renderer", self.name, INSTALL)
            size = package_module(f"{self.game}.constants", self.name, INSTALL).BLOCK_PIXEL_SIZE_IMG
            draw = renderer.make_craftax_pixel_renderer(size)
        pixels = jax.jit(jax.vmap(draw))(states.inner)
        return np.asarray(jnp.clip(pixels, 0, 255)).astype(np.uint8)
