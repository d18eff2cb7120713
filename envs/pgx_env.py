"""Pgx's board games (Koyamada et al., 2023) behind the ``Env`` protocol, as ids
``pgx:<name>``: two players who move in turn, self-play with one policy for both.

``pgx:tic_tac_toe``, ``pgx:connect_four``, ``pgx:othello``, ``pgx:hex``, ``pgx:go_9x9``,
``pgx:go_19x19``, ``pgx:animal_shogi``, ``pgx:gardner_chess``, ``pgx:chess`` and
``pgx:shogi``: Pgx's games of perfect information without chance (``GAMES``). Pgx's
others are refused with the reason: 2048 and backgammon draw chance, the poker games and
mahjong and bridge bidding hide information, and MinAtar's games are gymnax's
(``Breakout-MinAtar``, ...). A game takes no options (``pgx.make`` has none).

Each step is one player's move. The observation is a ``MaskedObs``: Pgx's observation
of the player to move (a board of feature planes, float32) and the moves legal now. A
step's reward is the mover's (Pgx's ``rewards[current_player]``: 1 for a win, -1 for a
loss, 0 otherwise), and an episode ends in a termination where the game ends (in a
truncation where Pgx cuts one, which none of these games does: each ends at its move
limit as a termination). So the environment declares ``Capabilities.alternating``:
the state after a move is the opponent's to move, worth to the mover the negative of its
worth to the opponent; only a recipe that takes turns trains on it (``alphazero``). Its
``step`` is an exact model (``Capabilities.deterministic``): a planner searches with it.
In self-play an episode's return is the last mover's result: 1 or -1 for a decided game
(an Othello or Go game can end on a move that loses it), 0 for a draw.

The family reaches ``envs.make`` through this package's entry point (group
``jaxrl_frag.envs``, name ``pgx:``); the ``pgx`` package is an optional extra (``pip
install 'jaxrl-frag[pgx]'``), imported only when one of its games is made.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frag.envs import id_options
from jaxrl_frag.envs.core import Box, Capabilities, Discrete, Env, MaskedObs, PyTree, TimeStep
from jaxrl_frag.envs.family import package_module, unknown_id
from jaxrl_frag.errors import ConfigError, check

PREFIX = "pgx:"
INSTALL = "pip install 'jaxrl-frag[pgx]'"
GAMES = ("tic_tac_toe", "connect_four", "othello", "hex", "go_9x9", "go_19x19", "animal_shogi", "gardner_chess",
         "chess", "shogi")
REFUSED = {"2048": "draws a tile by chance after each move", "backgammon": "draws its dice by chance",
           "kuhn_poker": "hides the cards", "leduc_holdem": "hides the cards", "bridge_bidding": "hides the cards",
           "sparrow_mahjong": "hides the tiles and draws them by chance"}


def ids() -> list[str]:
    """The games of perfect information without chance (``GAMES``)."""
    return [PREFIX + name for name in GAMES]


def make(env_id: str, num_envs: int | None, **options: Any) -> Env:
    """The family's factory (its entry point): one ``PgxEnv.make(env_id, **options)``, which
    ``envs.make`` batches (``num_envs``) and wraps."""
    del num_envs
    return PgxEnv.make(env_id, **options)


@dataclasses.dataclass(frozen=True)
class PgxEnv(Env):
    """One Pgx game (module docstring); ``step`` starts a new game where one ended and keeps
    the observation that ended it in ``final_obs``. Its state is Pgx's. Equal to another
    made from the same id."""

    name: str
    env: Any = dataclasses.field(compare=False)
    num_envs: None = None

    @classmethod
    def make(cls, name: str, **options: Any) -> PgxEnv:
        """One game from id ``name`` (``pgx:<Pgx's id>``).

        Raises:
            ConfigError: For an unknown id (with the closest ones), a game of chance or of
                hidden information (with why), any option, or pgx not installed (with the
                command that installs it).
        """
        pgx = package_module("pgx", name, INSTALL)
        short = name.removeprefix(PREFIX)
        if short in REFUSED or short.startswith("minatar-"):
            why = REFUSED.get(short, "is MinAtar's, which gymnax serves: Breakout-MinAtar, ...")
            raise ConfigError("env", name, f"{why}; the pgx: family takes the games of perfect information without "
                                           f"chance: {', '.join(GAMES)}")
        if short not in GAMES:
            raise unknown_id(name, "Pgx", ids())
        check(not options, "env", id_options.named(name, options),
              f"Pgx's games take no options: drop @{', @'.join(options)}")
        return cls(name, pgx.make(short))

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(masks_actions=True, deterministic=True, alternating=True)

    @functools.cached_property
    def observation_space(self) -> Box:
        """Pgx's observation of the player to move, its planes in [0, 1] (booleans as 0 and 1)."""
        shape = tuple(self.env.observation_shape)
        return Box((0.0,) * int(np.prod(shape)), (1.0,) * int(np.prod(shape)), shape)

    @functools.cached_property
    def action_space(self) -> Discrete:
        return Discrete(int(self.env.num_actions))

    @staticmethod
    def _observe(state: Any) -> MaskedObs:
        return MaskedObs(state.observation.astype(jnp.float32), state.legal_action_mask)

    def reset(self, key: jax.Array) -> tuple[PyTree, MaskedObs]:
        state = self.env.init(key)
        return state, self._observe(state)

    def step(self, key: jax.Array, state: PyTree, action: jax.Array) -> tuple[PyTree, TimeStep]:
        mover = state.current_player
        stepped = self.env.step(state, action)
        fresh = self.env.init(key)
        last = stepped.terminated | stepped.truncated
        final_obs = self._observe(stepped)
        state = jax.tree.map(lambda new, old: jax.lax.select(last, new, old), fresh, stepped)
        return state, TimeStep(self._observe(state), stepped.rewards[mover].astype(jnp.float32), stepped.terminated,
                               stepped.truncated & ~stepped.terminated, final_obs, {})
