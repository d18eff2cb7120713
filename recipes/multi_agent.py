"""IPPO, MAPPO and PQN-VDN: PPO and PQN for a team of agents on an array axis, written once.

The agents' observations (``envs.AgentObs``), actions, rewards, terminations and
truncations carry an agents axis after the environment batch, and everything of PPO
(the rollout, GAE, the clipped losses, the minibatch epochs) runs unchanged on it:
advantages per agent, minibatches of environment steps with every agent's sample of
that step, losses averaged over agents; with ``memory`` the learner's minibatches are
sets of environments with all their agents' sequences. Only the network differs
(``AgentsActorCritic``, or ``AgentsRecurrentActorCritic`` with a memory per agent):
parameters shared by every agent (with the agent's one-hot id appended to its inputs)
or one set per agent, and for MAPPO a centralised critic on the global state (with a
memory of its own where the policy has one). PQN-VDN
is PQN's rollout and learner unchanged but for how a team's values are read: the
team's value is the sum of its agents' (value decomposition).
Like every recipe, no distribution code: each distribution policy splits the
environment batch as it does for one agent.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_frag.algorithms import static_field
from jaxrl_frag.envs.core import AGENT_AXIS
from jaxrl_frag.envs.jaxmarl_env import is_mabrax
from jaxrl_frag.errors import check
from jaxrl_frag.recipes.actor_critic import Transition
from jaxrl_frag.recipes.networks import AgentsActorCritic, AgentsQ, AgentsRecurrentActorCritic
from jaxrl_frag.recipes.ppo import PPO
from jaxrl_frag.recipes.pqn import PQN, QTransition

# JaxMARL's IPPO for MPE (baselines/IPPO/config/ippo_ff_mpe.yaml: 16 environments x 128 steps, 4 epochs of 4
# minibatches, Adam 2.5e-4 annealed, 64x64 tanh networks), over 2e6 of its 1e7 steps: the return has levelled by then
MPE_DEFAULTS = dict(num_envs=16, num_steps=128, total_steps=2_000_000)
# SMAX at the settings of JaxMARL's MAPPO (baselines/MAPPO/config/mappo_homogenous_rnn_smax.yaml): recurrent (a GRU
# of 128 units between 128-unit ReLU layers), 128 environments x 128 steps, Adam 2e-3, clip 0.2, gradient norm 0.25,
# and for IPPO an entropy bonus of 0.01 (MAPPO none). The memory was MAPPO's gap: on 3m at 1e6 steps it won 18% of its
# battles feed-forward, 63% with the GRU. JaxMARL's IPPO settings (Adam 4e-3, clip 0.05) won 11% with the GRU here,
# MAPPO's 82% (benchmarks/HISTORY.md, measured while a fallen unit's return still ended where it fell).
SMAX_DEFAULTS = dict(num_envs=128, num_steps=128, total_steps=10_000_000, lr=2e-3, clip_eps=0.2, ent_coef=0.01,
                     max_grad_norm=0.25, hidden=(128, 128), activation="relu", memory="gru")
MAPPO_SMAX_DEFAULTS = dict(SMAX_DEFAULTS, ent_coef=0.0)
# MABrax (continuous actions) at JaxMARL's IPPO settings (baselines/IPPO/config/ippo_ff_mabrax.yaml): 64 environments x
# 300 steps, Adam 1e-3 annealed, value coefficient 4.5, entropy bonus 2e-6, 64x64 tanh networks
MABRAX_DEFAULTS = dict(num_envs=64, num_steps=300, total_steps=10_000_000, lr=1e-3, ent_coef=2e-6, vf_coef=4.5)


@struct.dataclass
class IPPO(PPO):
    """Independent PPO (de Witt et al. 2020): each agent acts and is valued on its own
    observation; parameters shared by default, as in JaxMARL's baselines."""

    shared_params: bool = static_field(True, help="one network for every agent, the agent's one-hot id appended to "
                                                  "its inputs; off: a network per agent, parameters stacked on an "
                                                  "agents axis")

    multi_agent: ClassVar[bool] = True
    centralised_critic: ClassVar[bool] = False  # the value network reads the global state (MAPPO)

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        if env_id.startswith("jaxmarl:MPE_"):
            return MPE_DEFAULTS
        if env_id.startswith("jaxmarl:SMAX_"):
            return SMAX_DEFAULTS
        if is_mabrax(env_id):
            return MABRAX_DEFAULTS
        return {}

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        check(s["action_dist"] == "gaussian", "action_dist", s["action_dist"],
              f"{cls.__name__}'s agents act with a Gaussian of a learned scale per dimension: choose gaussian")
        check(s["value_hidden"] is None, "value_hidden", s["value_hidden"],
              f"{cls.__name__}'s value networks take hidden's widths: leave value_hidden out")

    def returns_end(self, traj: Transition) -> tuple[jax.Array, jax.Array]:
        """The team's episode for every agent: an agent's return runs on until the team's
        episode ends, so a unit that fell shares the team's later rewards (SMAX gives its
        fallen units the team's reward, "to allow for noble sacrifice"; JaxMARL's
        baselines learn so too); its memory is still forgotten where it fell."""
        team = (jnp.all(traj.terminated, -1, keepdims=True), jnp.any(traj.truncated, -1, keepdims=True))
        return tuple(jnp.broadcast_to(x, traj.terminated.shape) for x in team)

    @property
    def named_axes(self) -> dict[str, dict[str, int]]:
        """Parameters per agent (and their optimizer state) carry the agents axis first."""
        return {} if self.shared_params else {AGENT_AXIS: {"params": 0, "opt_state": 0}}

    @property
    def network(self) -> AgentsActorCritic | AgentsRecurrentActorCritic:
        space = self.env.action_space
        action_dim = int(np.prod(space.shape)) if self.continuous else space.n
        settings = (action_dim, self.hidden, self.continuous, self.env.num_agents, self.shared_params,
                    self.centralised_critic, self.activation)
        if self.recurrent:
            return AgentsRecurrentActorCritic(*settings, self.memory)
        return AgentsActorCritic(*settings)


@struct.dataclass
class MAPPO(IPPO):
    """Multi-agent PPO (Yu et al. 2022): decentralised actors on each agent's
    observation, a centralised critic on the environment's global state."""

    centralised_critic: ClassVar[bool] = True

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        return MAPPO_SMAX_DEFAULTS if env_id.startswith("jaxmarl:SMAX_") else super().defaults(env_id)


@struct.dataclass
class PQNVDN(PQN):
    """PQN with value decomposition (VDN; Sunehag et al. 2018), JaxMARL's strongest
    Q-learning baseline: each agent's Q-values from one LayerNorm network shared by the
    team (the agent's one-hot id appended, unavailable actions never chosen), the team's
    value the sum of its agents' values, learnt from the team's reward (the mean of its
    agents') until the episode ends (every agent terminated, or the time limit)."""

    multi_agent: ClassVar[bool] = True

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        if env_id.startswith("jaxmarl:MPE_"):  # JaxMARL's config/alg/pqn_vdn_ff_mpe.yaml
            return dict(num_envs=256, num_steps=16, hidden=(256, 256), gamma=0.9, q_lambda=0.3, lr=5e-4,
                        anneal_lr=False, epsilon_end=0.1, exploration_fraction=0.1, reward_scale=1.0,
                        max_grad_norm=1.0, total_steps=2_000_000)
        if env_id.startswith("jaxmarl:SMAX_"):  # JaxMARL's config/alg/pqn_vdn_rnn_smax.yaml, feed-forward
            return dict(num_envs=128, num_steps=128, hidden=(512, 512), lr=2.5e-4, q_lambda=0.85, reward_scale=10.0,
                        epsilon_end=0.01, exploration_fraction=0.1, max_grad_norm=1.0, total_steps=10_000_000)
        return {}

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        check(s["memory"] == "none", "memory", s["memory"],
              "PQNVDN's Q-networks are feed-forward (IPPO and MAPPO take a memory): choose --memory none")

    @property
    def network(self) -> AgentsQ:
        return AgentsQ(self.env.action_space.n, self.hidden)

    def chosen(self, q: jax.Array, action: jax.Array) -> jax.Array:
        """The team's value of the actions taken: the sum of the agents'."""
        return super().chosen(q, action).sum(-1)

    def greedy_value(self, q: jax.Array) -> jax.Array:
        """The team's greedy value: the sum of the agents' (each over its available actions)."""
        return q.max(-1).sum(-1)

    def learning_signal(self, traj: QTransition) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The team's reward (the agents' mean), its termination (every agent's) and truncation."""
        reward, terminated, truncated = team_signal(traj.reward, traj.terminated, traj.truncated)
        return reward * self.reward_scale, terminated, truncated


def team_signal(reward: jax.Array, terminated: jax.Array,
                truncated: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A team's reward (its agents' mean), termination (every agent's) and truncation (any
    agent's), from its agents' ``[..., agents]``."""
    return reward.mean(-1), jnp.all(terminated, -1), jnp.any(truncated, -1)
