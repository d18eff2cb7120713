"""Quantile regression DQN (QR-DQN; Dabney et al. 2018) with the Rainbow parts that DQN
lacks (Hessel et al. 2018): a dueling head (Wang et al. 2016) and, as an option, noisy
layers (factorised Gaussian NoisyNet; Fortunato et al. 2018), written once as
fragments on DQN's loop: its double Q-learning, n-step returns, target network,
epsilon schedule and uniform or prioritized replay.

The network outputs ``quantiles`` values per action, the return distribution's
quantiles at the midpoints ``(2i + 1) / (2 quantiles)``; Q-values are their means.
The learner regresses the quantiles of the action taken on the targets
``G + gamma^m theta_j(s_m, a*)`` (every target quantile ``j`` of the bootstrap action
``a*``, chosen as DQN chooses it) by the quantile Huber loss, summed over the
predicted quantiles and averaged over the targets; a prioritized buffer takes each
sample's loss as its priority. QR-DQN rather than C51 because it needs no support of
fixed returns (``v_min``, ``v_max``, set per game) nor the projection of the shifted
target onto it: the target is DQN's n-step target, computed per quantile, so the
DQN's code takes it as it is.

With ``noisy``, every fully connected layer is noisy: the actor draws one noise
sample per step for the whole batch, the learner one for each of its three passes
(the online network on the sampled observations and on the bootstrap ones, the
target network), and the greedy policy (evaluation) acts on the mean weights.
Rainbow explores by the noise alone: ``--epsilon-start 0 --epsilon-end 0``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrl_frag.algorithms import hyperparameter, static_field
from jaxrl_frag.errors import check
from jaxrl_frag.recipes.dqn import DQN
from jaxrl_frag.recipes.networks import DuelingQ

PyTree = Any


@struct.dataclass
class QRDQN(DQN):
    """QR-DQN with a dueling head and optional noisy layers, on DQN's double Q-learning,
    n-step returns, target network and uniform or prioritized replay."""

    quantiles: int = static_field(50, help="quantiles of each action's return distribution")
    kappa: float = hyperparameter(1.0, help="quantile Huber loss: quadratic within kappa of the target, then linear")
    dueling: bool = static_field(True, help="dueling head: a value stream and an advantage stream (mean zero over "
                                            "the actions), each a layer of the last hidden width")
    noisy: bool = static_field(False, help="noisy fully connected layers (factorised Gaussian NoisyNet)")
    noisy_sigma: float = hyperparameter(0.5, help="noisy layers: initial noise scale sigma_0 (sigma_0 / sqrt(inputs))")

    counts: ClassVar[tuple[str, ...]] = (*DQN.counts, "quantiles")
    reals: ClassVar[tuple[str, ...]] = (*DQN.reals, "kappa", "noisy_sigma")

    @classmethod
    def defaults(cls, env_id: str) -> dict[str, Any]:
        if env_id.endswith("-MinAtar"):
            # the MinAtar network (Young & Tian 2019: a 3x3 convolution of 16 channels, 128 units) and its DQN's
            # replay of 1e5 steps, 5e3 of them first, epsilon from 1 to 0.1 over 1e5 steps
            return dict(hidden=(128,), buffer_size=100_000, learning_starts=5_000, epsilon_end=0.1,
                        exploration_fraction=0.02, total_steps=5_000_000, target_every=125)
        return {}

    @classmethod
    def validate(cls, s: dict[str, Any]) -> None:
        super().validate(s)
        check(s["kappa"] > 0, "kappa", s["kappa"], "must be positive")
        check(s["noisy_sigma"] >= 0, "noisy_sigma", s["noisy_sigma"], "must be zero or positive")

    @property
    def network(self) -> DuelingQ:
        return DuelingQ(self.env.action_space.n, self.hidden, self.quantiles, self.dueling, self.noisy,
                        len(self.env.observation_space.shape) == 3)

    def init_policy(self, key: jax.Array, obs: jax.Array) -> PyTree:
        return self.network.init(key, obs, self.noisy_sigma)

    def values(self, params: PyTree, obs: jax.Array, key: jax.Array | None = None) -> jax.Array:
        """The quantiles ``[B, actions, quantiles]``, with a noise draw from ``key`` where
        the layers are noisy (and without one, the mean weights')."""
        rngs = {"noise": key} if self.noisy and key is not None else {}
        return self.network.apply(params, obs, self.noisy_sigma, rngs=rngs)

    def q_values(self, values: jax.Array) -> jax.Array:
        return values.mean(-1)

    def sample_loss(self, chosen: jax.Array, target: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The quantile Huber loss of the predicted quantiles ``chosen`` ``[B, N]`` against
        the target ones ``[B, N]``: summed over the predictions, averaged over the targets;
        the priority is the loss itself."""
        midpoints = (jnp.arange(self.quantiles, dtype=chosen.dtype) + 0.5) / self.quantiles
        error = target[:, None, :] - chosen[:, :, None]  # [B, predicted i, target j]
        weight = jnp.abs(midpoints[:, None] - (error < 0).astype(chosen.dtype))
        loss = (weight * optax.huber_loss(error, delta=self.kappa) / self.kappa).sum(1).mean(-1)
        return loss, jax.lax.stop_gradient(loss)
