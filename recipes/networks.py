"""Policy and value networks, and the action distributions they output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


class Categorical(NamedTuple):
    """A categorical distribution over discrete actions, from logits."""

    logits: jax.Array

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, self.logits)

    def log_prob(self, action: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(self.logits)
        return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), axis=-1)[..., 0]

    def entropy(self) -> jax.Array:
        logp = jax.nn.log_softmax(self.logits)
        return -(jnp.exp(logp) * logp).sum(-1)


class Gaussian(NamedTuple):
    """A diagonal Gaussian over continuous actions."""

    mean: jax.Array
    std: jax.Array

    def sample(self, key: jax.Array) -> jax.Array:
        return self.mean + self.std * jax.random.normal(key, self.mean.shape)

    def log_prob(self, action: jax.Array) -> jax.Array:
        z = (action - self.mean) / self.std
        return (-0.5 * z**2 - jnp.log(self.std) - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)

    def entropy(self) -> jax.Array:
        per_dim = 0.5 + 0.5 * jnp.log(2 * jnp.pi) + jnp.log(self.std)
        return jnp.broadcast_to(per_dim, self.mean.shape).sum(-1)


def patches(x: jax.Array) -> jax.Array:
    """The 3x3 neighbourhood of every interior pixel of images ``[N, H, W, C]``, as ``[N, H-2, W-2, 9C]``."""
    h, w = x.shape[1] - 2, x.shape[2] - 2
    return jnp.concatenate([x[:, i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=-1)


class MLP(nn.Module):
    """Tanh MLP with orthogonal initialisation; the last layer scaled by ``out_scale``.

    With ``conv``, the input is first an image batch ``[N, H, W, C]`` that goes through
    one 3x3 convolution with 16 channels (no padding) and a ReLU: the torso of the
    MinAtar network (Young & Tian 2019) and of purejaxql's PPO for MinAtar. The
    convolution is a matrix product on the image's 3x3 patches: XLA's CPU convolutions
    run about 10x slower inside a ``scan`` and stall under ``vmap`` (a population).
    """

    hidden: Sequence[int]
    out: int
    out_scale: float
    conv: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if self.conv:
            x = nn.relu(nn.Dense(16, kernel_init=nn.initializers.orthogonal(np.sqrt(2)), name="conv")(patches(x)))
        x = x.reshape(x.shape[0], -1)
        for width in self.hidden:
            x = jnp.tanh(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return nn.Dense(self.out, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


class ActorCritic(nn.Module):
    """Separate policy and value networks: ``obs -> (action distribution, value)``.

    Each is an MLP, behind its own convolutional torso when ``conv`` (for image
    observations ``[N, H, W, C]``). A continuous policy is a Gaussian with a learned,
    state-independent log standard deviation.
    """

    action_dim: int
    hidden: Sequence[int]
    continuous: bool
    conv: bool = False

    def setup(self) -> None:
        self.pi = MLP(self.hidden, self.action_dim, 0.01, self.conv)
        self.v = MLP(self.hidden, 1, 1.0, self.conv)
        if self.continuous:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))

    def __call__(self, obs: jax.Array) -> tuple[Categorical | Gaussian, jax.Array]:
        out = self.pi(obs)
        dist = Gaussian(out, jnp.exp(self.log_std)) if self.continuous else Categorical(out)
        return dist, self.value(obs)

    def value(self, obs: jax.Array) -> jax.Array:
        return self.v(obs)[:, 0]
