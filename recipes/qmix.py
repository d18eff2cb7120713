"""QMIX (Rashid et al. 2018): DQN for a team of agents whose value is a monotonic mix of
its agents' values, written once as fragments on DQN's loop (its replay buffer, n-step
returns, double Q-learning, target network and epsilon schedule).

Each agent reads its own observation with one LayerNorm Q-network shared by the team
(its one-hot id appended; PQN-VDN's ``AgentsQ``) and acts epsilon-greedily among the
actions it may take now. The team's value ``Q_tot(s, a) = mix(Q_1(o_1, a_1), ...,
Q_n(o_n, a_n); s)`` comes from a mixing network whose weights are produced from the
global state ``s`` by hypernetworks and kept non-negative, so ``Q_tot`` rises with every
agent's value and the team's greedy action is every agent's own greedy action. The
learner regresses ``Q_tot`` of the actions taken on ``G + gamma^m Q_tot^target(s_m, a*)``:
``G`` the n-step return of the team's reward (its agents' mean) cut where the team's
episode ends, ``a*`` each agent's greedy action at the bootstrap observation (the online
network's, double), valued by the target agents and mixed by the target mixer.

The agents are feed-forward, where JaxMARL's QMIX (``baselines/QLearning/qmix_rnn.py``)
gives them a GRU and replays whole rollouts; the replay here is of n-step windows, as
DQN's. Like every recipe, no distribution code.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.envs.core import AgentObs, Steps
from jaxrl_frag.recipes.dqn import DQN
from jaxrl_frag.recipes.multi_agent import team_signal
from jaxrl_frag.recipes.networks import AgentsQ

PyTree = Any


class MonotonicMixer(nn.Module):
    """QMIX's mixing network: the team's value ``[B]`` from its agents' values ``[B, agents]``
    and the global state ``[B, S]``: ``elu(q W_1 + b_1) w_2 + b_2``, with ``W_1`` ``[agents,
    embed]`` and ``w_2`` ``[embed]`` the absolute values of hypernetworks of the state (a
    hidden layer of ``hypernet_hidden`` ReLU units each), ``b_1`` a linear function of it
    and ``b_2`` a hypernetwork of ``embed`` hidden units; every layer's weights orthogonal
    at ``init_scale``, so that the first mixes are near zero (with flax's default
    initialisation the team's value diverged on SMAX)."""

    embed: int
    hypernet_hidden: int
    init_scale: float

    @nn.compact
    def __call__(self, q: jax.Array, state: jax.Array) -> jax.Array:
        agents = q.shape[-1]
        dense = functools.partial(nn.Dense, kernel_init=nn.initializers.orthogonal(self.init_scale))

        def hyper(hidden: int, out: int) -> jax.Array:
            return dense(out)(nn.relu(dense(hidden)(state)))

        w_1 = jnp.abs(hyper(self.hypernet_hidden, agents * self.embed)).reshape(-1, agents, self.embed)
        w_2 = jnp.abs(hyper(self.hypernet_hidden, self.embed))
        hidden = nn.elu(jnp.einsum("ba,bae->be", q, w_1) + dense(self.embed)(state))
        return jnp.einsum("be,be->b", hidden, w_2) + hyper(self.embed, 1)[:, 0]


class QMixNetwork(nn.Module):
    """The agents' Q-network (``AgentObs -> [B, agents, actions]``, ``agent_values``) and
    the mixer of their values (``mix``); calling it values the team's greedy action, which
    initialises both."""

    action_dim: int
    hidden: tuple[int, ...]
    embed: int
    hypernet_hidden: int
    init_scale: float

    def setup(self) -> None:
        self.agents = AgentsQ(self.action_dim, self.hidden)
        self.mixer = MonotonicMixer(self.embed, self.hypernet_hidden, self.init_scale)

    def __call__(self, obs: AgentObs) -> jax.Array:
        return self.mix(self.agent_values(obs).max(-1), obs.state)

    def agent_values(self, obs: AgentObs) -> jax.Array:
        return self.agents(obs)

    def mix(self, q: jax.Array, state: jax.Array) -> jax.Array:
        return self.mixer(q, state)


@struct.dataclass
class QMIX(DQN):
    """QMIX: a team's DQN (double Q-learning, n-step returns, a target network, epsilon-
    greedy agents, uniform or prioritized replay) whose team value is a monotonic mix of
    its agents' values, conditioned on the global state."""

    hidden: tuple[int, ...] = static_field((64, 64), help="hidden layer widths of the agents' Q network (each Dense, "
                                                          "LayerNorm, ReLU)")
    mixer_embed: int = static_field(32, help="units of the mixing network's hidden layer")
    hypernet_hidden: int = static_field(64, help="hidden units of the hypernetworks that give the mixer its weights")
    mixer_init_scale: float = static_field(1e-3, help="scale of the mixing network's orthogonal initial weights")
    reward_scale: float = hyperparameter(1.0, help="factor on the team's reward the learner sees (not the episode "
                                                   "returns)")

    multi_agent: ClassVar[bool] = True
    counts: ClassVar[tuple[str, ...]] = (*DQN.counts, "mixer_embed", "hypernet_hidden")
    reals: ClassVar[tuple[str, ...]] = (*DQN.reals, "reward_scale", "mixer_init_scale")
    positive: ClassVar[tuple[str, ...]] = (*DQN.positive, "reward_scale", "mixer_init_scale")

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        if env_id.startswith("jaxmarl:MPE_"):
            # JaxMARL's config/alg/qmix_mpe.yaml's discount and target period; 3-step returns, and a tenth of the run
            # to explore (simple_spread at 2e5 steps, seeds 0-2: -17.4, -17.2, -17.4; benchmarks/HISTORY.md)
            return dict(gamma=0.9, num_envs=16, num_steps=8, n_step=3, learning_starts=5_000, target_every=200,
                        exploration_fraction=0.1, total_steps=200_000)
        if env_id.startswith("jaxmarl:SMAX_"):
            # JaxMARL's config/alg/ql_rnn_smax.yaml (qmix_rnn.py's) but for its GRU (a second hidden layer of 512 units
            # here) and its replay of 5,000 whole rollouts (here 2e5 steps of n-step windows): 16 environments x 128
            # steps, 8 gradient steps per iteration on 32 x 128 samples, Adam 5e-5, the target every 10 iterations,
            # epsilon to 0.05 over a tenth of the run, rewards x 10
            return dict(num_envs=16, num_steps=128, num_updates=8, minibatch_size=32 * 128, buffer_size=200_000,
                        hidden=(512, 512), mixer_embed=64, hypernet_hidden=256, lr=5e-5, gamma=0.99, target_every=80,
                        epsilon_end=0.05, exploration_fraction=0.1, learning_starts=10_000, reward_scale=10.0,
                        total_steps=10_000_000)
        return {}

    @property
    def network(self) -> QMixNetwork:
        return QMixNetwork(self.env.action_space.n, self.hidden, self.mixer_embed, self.hypernet_hidden,
                           self.mixer_init_scale)

    def values(self, params: PyTree, obs: AgentObs, key: jax.Array | None = None) -> jax.Array:
        """Every agent's Q-values ``[B, agents, actions]``, those of the actions it may not
        take at ``-inf``."""
        return self.network.apply(params, obs, method="agent_values")

    def of_actions(self, params: PyTree, values: jax.Array, action: jax.Array, obs: AgentObs) -> jax.Array:
        """The team's value ``[B]`` of its agents' actions ``[B, agents]``: their values mixed
        at the global state by the mixer of ``params``."""
        q = jnp.take_along_axis(values, action[..., None].astype(jnp.int32), axis=-1)[..., 0]
        return self.network.apply(params, q, obs.state, method="mix")

    def n_step_targets(self, steps: Steps) -> tuple[jax.Array, jax.Array, jax.Array]:
        """DQN's, of the team's reward (times ``reward_scale``), termination and truncation
        (``team_signal``)."""
        reward, terminated, truncated = team_signal(steps.reward, steps.terminated, steps.truncated)
        return super().n_step_targets(steps._replace(reward=reward * self.reward_scale, terminated=terminated,
                                                     truncated=truncated))
