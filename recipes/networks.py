"""Policy and value networks, and the action distributions they output."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frag.envs.core import AgentObs, MaskedObs, PyTree, forget, random_legal, unmasked
from jaxrl_frag.errors import check


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

    def mode(self) -> jax.Array:
        """The most likely action."""
        return self.logits.argmax(-1)

    def reshaped(self, shape: tuple[int, ...]) -> Categorical:
        """The distributions of samples ``[B]`` arranged as ``shape``."""
        return Categorical(self.logits.reshape(*shape, -1))


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

    def mode(self) -> jax.Array:
        """The most likely action: the mean."""
        return self.mean

    def reshaped(self, shape: tuple[int, ...]) -> Gaussian:
        """The distributions of samples ``[B]`` arranged as ``shape``."""
        return Gaussian(self.mean.reshape(*shape, -1), self.std)


def tanh_log_det(u: jax.Array) -> jax.Array:
    """``log(1 - tanh(u)**2)``, the log-derivative of ``tanh`` at ``u``, per dimension, without cancellation."""
    return 2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u))


class TanhGaussian(NamedTuple):
    """A diagonal Gaussian whose samples ``u`` are squashed by ``tanh`` on their way to the
    environment (Brax's PPO policy): samples, modes and log-probabilities are of ``u``, the
    log-probability that of ``tanh(u)`` (the Gaussian's less ``tanh_log_det``), the entropy
    the Gaussian's plus ``tanh_log_det`` at the mean (Brax's estimate takes it at a sample)."""

    mean: jax.Array
    std: jax.Array

    def sample(self, key: jax.Array) -> jax.Array:
        return Gaussian(self.mean, self.std).sample(key)

    def log_prob(self, action: jax.Array) -> jax.Array:
        return Gaussian(self.mean, self.std).log_prob(action) - tanh_log_det(action).sum(-1)

    def entropy(self) -> jax.Array:
        return Gaussian(self.mean, self.std).entropy() + tanh_log_det(self.mean).sum(-1)

    def mode(self) -> jax.Array:
        """The mean of ``u``: squashed, the deterministic action (Brax's)."""
        return self.mean

    def reshaped(self, shape: tuple[int, ...]) -> TanhGaussian:
        """The distributions of samples ``[B]`` arranged as ``shape``."""
        return TanhGaussian(self.mean.reshape(*shape, -1), self.std.reshape(*shape, -1))


MIN_STD = 1e-3  # the least standard deviation of a state-dependent scale, as Brax's NormalTanhDistribution


def patches(x: jax.Array, kernel: int = 3, stride: int = 1) -> jax.Array:
    """The ``kernel x kernel`` windows, ``stride`` apart, of images ``[N, H, W, C]``, as
    ``[N, H', W', kernel * kernel * C]`` (a valid convolution is a matrix product on
    them). The stride must divide the kernel; the rows and columns past the last
    window are dropped. Cut as whole ``stride x stride`` blocks (space to depth), then
    neighbouring blocks side by side: no gathers, and fast on XLA's CPU backend."""
    if kernel % stride:
        raise ValueError(f"patches: the stride {stride} must divide the kernel {kernel}")
    n, h, w, c = x.shape
    out_h, out_w, k = (h - kernel) // stride + 1, (w - kernel) // stride + 1, kernel // stride
    blocks_h, blocks_w = out_h + k - 1, out_w + k - 1
    x = x[:, :blocks_h * stride, :blocks_w * stride]
    x = x.reshape(n, blocks_h, stride, blocks_w, stride, c).transpose(0, 1, 3, 2, 4, 5)
    x = x.reshape(n, blocks_h, blocks_w, stride * stride * c)
    return jnp.concatenate([x[:, i:i + out_h, j:j + out_w] for i in range(k) for j in range(k)], axis=-1)


def orthogonal(scale: float) -> Callable[..., jax.Array]:
    """flax's orthogonal initialiser, but under ``vmap`` (a population's members, a network
    per agent) one QR factorisation per matrix, in a loop, rather than one batched call:
    jaxlib 0.10's CPU LAPACK kernels spread a batch over the thread pool that also runs
    the compiled programs, and wait for it, so a batched call in as many programs running
    at once as the pool has threads waits forever. The values are the same."""
    init = nn.initializers.orthogonal(scale)

    def initializer(key: jax.Array, shape: Sequence[int], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.custom_batching.sequential_vmap(lambda k: init(k, shape, dtype))(key)

    return initializer


def _dense(features: int, scale: float = np.sqrt(2), **kwargs: str) -> nn.Dense:
    return nn.Dense(features, kernel_init=orthogonal(scale), **kwargs)


MASKED_LOGIT = -1e9  # the logit of an action that is not available: probability 0, and no NaN in the entropy


def allowed_values(q: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Action values ``q`` ``[..., actions]`` with the actions outside ``mask`` (true where
    allowed) at ``-inf``, unless the mask rules out every action (then none is ruled out,
    so that a greedy value stays finite); as they are without a mask."""
    if mask is None:
        return q
    return jnp.where(mask | ~mask.any(-1, keepdims=True), q, -jnp.inf)


def uniform_allowed(key: jax.Array, q: jax.Array) -> jax.Array:
    """An action ``[...]`` drawn uniformly from those with a finite value in ``q`` ``[..., actions]``."""
    return random_legal(key, jnp.isfinite(q))


def masked(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
    """``logits`` with the actions outside ``mask`` (true where allowed) at ``MASKED_LOGIT``; as they are without one."""
    return logits if mask is None else jnp.where(mask, logits, MASKED_LOGIT)


CONVOLUTIONAL = ("cnn", "atari")  # the torsos that read images (H, W, C)


def check_torso(env_id: str, shape: tuple[int, ...], torso: str, others: str = "mlp or auto") -> None:
    """Refuse the setting ``torso`` where it is convolutional and ``env_id``'s observations
    (of ``shape``) are not images, naming the ``others`` to choose."""
    check(torso not in CONVOLUTIONAL or len(shape) == 3, "torso", torso,
          f"needs image observations (H, W, C); {env_id} observes shape {shape}: choose {others}")


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {"tanh": jnp.tanh, "relu": nn.relu, "swish": nn.swish}


class MLP(nn.Module):
    """MLP (tanh by default) with orthogonal initialisation; the last layer scaled by ``out_scale``.

    With ``conv``, the input is first an image batch ``[N, H, W, C]`` that goes through
    one 3x3 convolution with 16 channels (no padding) and a ReLU: the torso of the
    MinAtar network (Young & Tian 2019) and of purejaxql's PPO for MinAtar. The
    convolution is a matrix product on the image's 3x3 patches: XLA's CPU convolutions
    run about 10x slower inside a ``scan`` and stall under ``vmap`` (a population).
    """

    hidden: Sequence[int]
    out: int
    out_scale: float
    activation: Callable[[jax.Array], jax.Array] = jnp.tanh
    conv: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if self.conv:
            x = nn.relu(_dense(16, name="conv")(patches(x)))
        x = x.reshape(x.shape[0], -1)
        for width in self.hidden:
            x = self.activation(_dense(width)(x))
        return _dense(self.out, self.out_scale)(x)


class AtariTorso(nn.Module):
    """The network of Mnih et al. (2015) up to its last hidden layer: pixels ``[N, 84, 84,
    C]`` in ``[0, 255]`` scaled to ``[0, 1]``, convolutions of 32 8x8 filters (stride 4),
    64 4x4 (stride 2) and 64 3x3 (stride 1), then 512 units, all ReLU; each convolution
    a matrix product on ``patches``."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32) / 255.0
        for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(_dense(features)(patches(x, kernel, stride)))
        return nn.relu(_dense(512)(x.reshape(x.shape[0], -1)))


class ActorCritic(nn.Module):
    """Policy and value networks: ``obs -> (action distribution, value)``.

    With ``torso`` ``mlp`` or ``cnn``, separate MLPs, each behind its own 3x3
    convolution for ``cnn`` (image observations ``[N, H, W, C]``); with ``atari``, one
    ``AtariTorso`` shared by a linear policy head and a linear value head (``hidden``
    unused), as in PPO's Atari networks; ``value_hidden`` gives the value MLP widths of
    its own. A continuous policy is a Gaussian with a learned, state-independent log
    standard deviation, or with ``squashed`` a ``TanhGaussian`` whose standard deviation
    the policy network outputs beside the mean (``softplus`` plus ``MIN_STD``). On a
    ``MaskedObs`` the networks read its ``obs``, and the actions outside its
    ``action_mask`` have probability 0.
    """

    action_dim: int
    hidden: Sequence[int]
    continuous: bool
    torso: str = "mlp"
    activation: str = "tanh"  # of the MLPs' hidden layers: a name in ACTIVATIONS
    value_hidden: Sequence[int] | None = None  # the value MLP's widths; None: hidden's
    squashed: bool = False

    def setup(self) -> None:
        outputs = self.action_dim * (2 if self.squashed else 1)
        if self.torso == "atari":
            self.shared = AtariTorso()
            self.pi, self.v = _dense(outputs, 0.01), _dense(1, 1.0)
        else:
            activation, conv = ACTIVATIONS[self.activation], self.torso == "cnn"
            self.pi = MLP(self.hidden, outputs, 0.01, activation, conv)
            self.v = MLP(self.value_hidden or self.hidden, 1, 1.0, activation, conv)
        if self.continuous and not self.squashed:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))

    def __call__(self, obs: jax.Array | MaskedObs) -> tuple[Categorical | Gaussian | TanhGaussian, jax.Array]:
        x, mask = unmasked(obs)
        if self.torso == "atari":
            features = self.shared(x)
            out, value = self.pi(features), self.v(features)[:, 0]
        else:
            out, value = self.pi(x), self.value(x)
        if self.squashed:
            mean, scale = jnp.split(out, 2, axis=-1)
            return TanhGaussian(mean, jax.nn.softplus(scale) + MIN_STD), value
        if self.continuous:
            return Gaussian(out, jnp.exp(self.log_std)), value
        return Categorical(masked(out, mask)), value

    def value(self, obs: jax.Array | MaskedObs) -> jax.Array:
        x, _ = unmasked(obs)
        return self.v(self.shared(x) if self.torso == "atari" else x)[:, 0]


CELLS: dict[str, type[nn.RNNCellBase]] = {"gru": nn.GRUCell, "lstm": nn.OptimizedLSTMCell}


def blank_memory(cell: str, features: int, batch: tuple[int, ...]) -> PyTree:
    """A ``cell``'s state before any step, for a batch of shape ``batch``: zeros."""
    return CELLS[cell](features).initialize_carry(jax.random.PRNGKey(0), (*batch, features))


class RecurrentTorso(nn.Module):
    """A memory over sequences of vector observations: ``(memory, obs, first) -> (memory,
    outputs)``. Each observation goes through a dense layer of ``features`` units
    (``activation``), then a recurrent ``cell`` (``CELLS``: ``gru`` or ``lstm``) of
    ``features`` units. Environment-major: ``obs [N, T, ...]``, ``first [N, T]`` (the
    memory is forgotten, set to zeros, before a step where it holds: an episode begins),
    ``memory`` the cell's state ``[N, ...]`` before the first step, and after the last;
    the outputs ``[N, T, features]``."""

    cell: str = "gru"
    features: int = 64
    activation: str = "tanh"

    def setup(self) -> None:
        self.embed = _dense(self.features)
        self.memory = CELLS[self.cell](self.features)

    def __call__(self, memory: PyTree, obs: jax.Array, first: jax.Array) -> tuple[PyTree, jax.Array]:
        n, steps = first.shape
        x = self._embed(obs.reshape(n * steps, *obs.shape[2:])).reshape(n, steps, -1)

        def step(cell: nn.Module, memory: PyTree, inputs: tuple[jax.Array, jax.Array]) -> tuple[PyTree, jax.Array]:
            x, first = inputs
            return cell(forget(memory, first), x)

        scan = nn.scan(step, variable_broadcast="params", split_rngs={"params": False}, in_axes=1, out_axes=1)
        return scan(self.memory, memory, (x, first))

    def step(self, memory: PyTree, obs: jax.Array) -> tuple[PyTree, jax.Array]:
        """One step of ``N`` environments, observations ``[N, ...]``, from ``memory`` as it is."""
        return self.memory(memory, self._embed(obs))

    def _embed(self, obs: jax.Array) -> jax.Array:
        return ACTIVATIONS[self.activation](self.embed(obs.reshape(obs.shape[0], -1)))


class RecurrentActorCritic(nn.Module):
    """Policy and value networks with a memory, on sequences of vector observations:
    ``(memory, obs, first) -> (memory, action distribution, value)``: a
    ``RecurrentTorso`` of ``features`` units (the heads' activation) whose outputs feed
    ``heads`` (a policy MLP and a value MLP), a ``MaskedObs``'s mask passed on to them.
    Inputs and outputs are environment-major, as the torso's; the distribution and value
    ``[N, T]``.
    """

    heads: ActorCritic
    cell: str = "gru"
    features: int = 64

    def setup(self) -> None:
        self.torso = RecurrentTorso(self.cell, self.features, self.heads.activation)

    @nn.nowrap
    def blank(self, batch: int) -> PyTree:
        """The memory before any step, for ``batch`` environments: zeros."""
        return blank_memory(self.cell, self.features, (batch,))

    def __call__(self, memory: PyTree, obs: jax.Array | MaskedObs, first: jax.Array) -> tuple[
            PyTree, Categorical | Gaussian, jax.Array]:
        n, steps = first.shape
        x, mask = unmasked(obs)
        memory, y = self.torso(memory, x, first)
        features = y.reshape(n * steps, -1)
        dist, value = self.heads(features if mask is None else MaskedObs(features, mask.reshape(n * steps, -1)))
        return memory, dist.reshaped((n, steps)), value.reshape(n, steps)

    def step(self, memory: PyTree, obs: jax.Array | MaskedObs) -> tuple[PyTree, Categorical | Gaussian, jax.Array]:
        """One step of ``N`` environments, observations ``[N, ...]``, from ``memory`` as it is."""
        x, mask = unmasked(obs)
        memory, y = self.torso.step(memory, x)
        return memory, *self.heads(y if mask is None else MaskedObs(y, mask))


def per_agent(net: Callable[[jax.Array], jax.Array], x: jax.Array, shared: bool) -> jax.Array:
    """``net`` on inputs ``[..., agents, D]``, giving ``[..., agents, out]``. ``shared``: one
    network for every agent, each agent's rows with its one-hot id appended; otherwise a
    network vmapped over the agents axis of ``[B, agents, D]`` (its parameters stacked on
    a leading agents axis)."""
    lead, agents = x.shape[:-2], x.shape[-2]
    x = x.reshape(-1, agents, x.shape[-1])
    if shared:
        ids = jnp.broadcast_to(jnp.eye(agents, dtype=x.dtype), (x.shape[0], agents, agents))
        x = jnp.concatenate([x, ids], axis=-1).reshape(-1, x.shape[-1] + agents)
    out = net(x)
    return out.reshape(*lead, agents, out.shape[-1])


class AgentsNetwork(nn.Module):
    """What the agents' actor-critic networks share: their settings, and the action
    distribution from the policy's outputs ``[..., agents, A]``: logits with the actions
    outside ``action_mask`` masked out, or a Gaussian with a learned, state-independent
    log standard deviation per agent (``log_std``, which a continuous network defines)."""

    action_dim: int
    hidden: Sequence[int]
    continuous: bool
    num_agents: int
    shared: bool = True
    centralised: bool = False
    activation: str = "tanh"  # of the MLPs' hidden layers: a name in ACTIVATIONS

    def distribution(self, out: jax.Array, obs: AgentObs) -> Categorical | Gaussian:
        if self.continuous:
            return Gaussian(out, jnp.exp(self.log_std))
        return Categorical(masked(out, obs.action_mask))


class AgentsActorCritic(AgentsNetwork):
    """Policy and value networks for agents on an array axis: ``AgentObs -> (action
    distribution, value)``, both per agent (``[..., agents]``).

    Separate MLPs for the policy and the value. With ``shared``, one pair for every
    agent, each agent's one-hot id appended to its inputs; otherwise one pair per
    agent, their parameters stacked on a leading agents axis. The policy reads each
    agent's own observation; the value reads the same, or with ``centralised`` the
    global state (MAPPO's critic).
    """

    def setup(self) -> None:
        mlp, activation = agents_mlp(self.shared, self.num_agents), ACTIVATIONS[self.activation]
        self.pi = mlp(self.hidden, self.action_dim, 0.01, activation)
        self.v = mlp(self.hidden, 1, 1.0, activation)
        if self.continuous:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.num_agents, self.action_dim))

    def __call__(self, obs: AgentObs) -> tuple[Categorical | Gaussian, jax.Array]:
        out = per_agent(self.pi, obs.obs, self.shared)
        return self.distribution(out, obs), self.value(obs)

    def value(self, obs: AgentObs) -> jax.Array:
        x = every_agents(obs.state, self.num_agents) if self.centralised else obs.obs
        return per_agent(self.v, x, self.shared)[..., 0]


def every_agents(state: jax.Array, agents: int) -> jax.Array:
    """The global state ``[..., S]`` as each agent's input ``[..., agents, S]`` (a centralised critic's)."""
    return jnp.broadcast_to(state[..., None, :], (*state.shape[:-1], agents, state.shape[-1]))


def agents_mlp(shared: bool, agents: int) -> type[nn.Module] | Callable[..., nn.Module]:
    """``MLP``, or with per-agent parameters ``MLP`` vmapped over the agents axis 1 of its
    inputs ``[B, agents, D]`` (parameters stacked on a leading agents axis)."""
    return MLP if shared else nn.vmap(MLP, in_axes=1, out_axes=1, variable_axes={"params": 0},
                                      split_rngs={"params": True}, axis_size=agents)


class AgentsRecurrentActorCritic(AgentsNetwork):
    """``AgentsActorCritic`` with a memory per agent: ``(memory, obs, first) -> (memory,
    action distribution, value)`` on sequences (``AgentObs`` leaves ``[N, T, ...]``,
    ``first`` and the value ``[N, T, agents]``, the memory's leaves ``[N, agents, ...]``),
    and ``step`` on one step (``[N, ...]``).

    Each agent's observation goes through a ``RecurrentTorso`` of ``hidden[0]`` units,
    whose outputs feed a policy MLP and a value MLP of the remaining widths. With
    ``centralised`` the value MLP reads a torso of its own instead, over the global
    state (MAPPO's critic, recurrent as JaxMARL's: its outputs are bounded by the cell
    however large the state's features, as SMAX's raw positions are); the memory is then
    the pair ``(policy's, critic's)``. With ``shared``, one network for every agent,
    each agent's one-hot id appended to its inputs; otherwise one per agent, parameters
    stacked on a leading agents axis. An agent's memory is forgotten where it is done (a
    unit that died, or the episode's end).
    """

    cell: str = "gru"

    def setup(self) -> None:
        torso = RecurrentTorso if self.shared else nn.vmap(
            RecurrentTorso, in_axes=(1, 2, 2), out_axes=(1, 2), variable_axes={"params": 0},
            split_rngs={"params": True}, axis_size=self.num_agents)
        self.torso = torso(self.cell, self.hidden[0], self.activation)
        if self.centralised:
            self.critic_torso = torso(self.cell, self.hidden[0], self.activation)
        mlp, activation = agents_mlp(self.shared, self.num_agents), ACTIVATIONS[self.activation]
        self.pi = mlp(self.hidden[1:], self.action_dim, 0.01, activation)
        self.v = mlp(self.hidden[1:], 1, 1.0, activation)
        if self.continuous:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.num_agents, self.action_dim))

    @nn.nowrap
    def blank(self, batch: int) -> PyTree:
        """The memory before any step, for ``batch`` environments: zeros ``[batch, agents, ...]``
        (a pair of them with ``centralised``)."""
        memory = blank_memory(self.cell, self.hidden[0], (batch, self.num_agents))
        return (memory, memory) if self.centralised else memory

    def __call__(self, memory: PyTree, obs: AgentObs, first: jax.Array) -> tuple[
            PyTree, Categorical | Gaussian, jax.Array]:
        if self.centralised:
            (policy_memory, critic_memory), state = memory, every_agents(obs.state, self.num_agents)
            policy_memory, y = self._unroll(self.torso, policy_memory, obs.obs, first)
            critic_memory, z = self._unroll(self.critic_torso, critic_memory, state, first)
            memory = (policy_memory, critic_memory)
        else:
            memory, y = self._unroll(self.torso, memory, obs.obs, first)
            z = y
        value = per_agent(self.v, z, self.shared)[..., 0]
        return memory, self.distribution(per_agent(self.pi, y, self.shared), obs), value

    def step(self, memory: PyTree, obs: AgentObs) -> tuple[PyTree, Categorical | Gaussian, jax.Array]:
        """One step of ``N`` environments (``AgentObs`` leaves ``[N, ...]``), from ``memory`` as it is."""
        one = jax.tree.map(lambda x: x[:, None], obs)
        memory, dist, value = self(memory, one, jnp.zeros(one.obs.shape[:3], bool))
        return memory, dist.reshaped((value.shape[0], self.num_agents)), value[:, 0]

    def _unroll(self, torso: nn.Module, memory: PyTree, x: jax.Array, first: jax.Array) -> tuple[PyTree, jax.Array]:
        """``torso`` over ``x [N, T, agents, D]``: outputs ``[N, T, agents, features]``.
        Shared, the agents go into the batch, their ids appended to their inputs."""
        if not self.shared:
            return torso(memory, x, first)
        n, steps, agents = first.shape
        ids = jnp.broadcast_to(jnp.eye(agents, dtype=x.dtype), (n, steps, agents, agents))
        x = jnp.concatenate([x, ids], -1).swapaxes(1, 2).reshape(n * agents, steps, -1)
        fold = lambda m: m.reshape(n * agents, *m.shape[2:])  # noqa: E731
        memory, y = torso(jax.tree.map(fold, memory), x, first.swapaxes(1, 2).reshape(n * agents, steps))
        return (jax.tree.map(lambda m: m.reshape(n, agents, *m.shape[1:]), memory),
                y.reshape(n, agents, steps, -1).swapaxes(1, 2))


class QValues(nn.Module):
    """ReLU MLP ``obs -> [B, actions]``: the value of each discrete action."""

    action_dim: int
    hidden: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return MLP(self.hidden, self.action_dim, 1.0, nn.relu)(obs)


class LayerNormQ(nn.Module):
    """PQN's Q-network ``obs -> [B, actions]``: per hidden layer Dense, LayerNorm, ReLU, then
    a linear head (flax's default initialisation, as purejaxql's). With ``conv``, images
    ``[N, H, W, C]`` first go through a 3x3 convolution (16 channels, He-initialised, as
    a matrix product on ``patches``), LayerNorm and ReLU, and the hidden layers after
    it are He-initialised too (purejaxql's MinAtar network)."""

    action_dim: int
    hidden: Sequence[int]
    conv: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.he_normal() if self.conv else nn.initializers.lecun_normal()
        if self.conv:
            x = nn.relu(nn.LayerNorm()(nn.Dense(16, kernel_init=init, name="conv")(patches(x))))
        x = x.reshape(x.shape[0], -1)
        for width in self.hidden:
            x = nn.relu(nn.LayerNorm()(nn.Dense(width, kernel_init=init)(x)))
        return nn.Dense(self.action_dim)(x)


class RecurrentQ(nn.Module):
    """``LayerNormQ`` with a memory, on sequences of vector observations: ``(memory, obs,
    first) -> (memory, Q-values [N, T, actions])``: a ``RecurrentTorso`` of ``hidden[0]``
    units (ReLU), then ``LayerNormQ`` of the remaining widths on its outputs. Inputs and
    outputs are environment-major, as the torso's; ``step`` is one step ``[N, ...]``."""

    action_dim: int
    hidden: Sequence[int]
    cell: str = "gru"

    def setup(self) -> None:
        self.torso = RecurrentTorso(self.cell, self.hidden[0], "relu")
        self.q = LayerNormQ(self.action_dim, self.hidden[1:])

    @nn.nowrap
    def blank(self, batch: int) -> PyTree:
        """The memory before any step, for ``batch`` environments: zeros."""
        return blank_memory(self.cell, self.hidden[0], (batch,))

    def __call__(self, memory: PyTree, obs: jax.Array, first: jax.Array) -> tuple[PyTree, jax.Array]:
        n, steps = first.shape
        memory, y = self.torso(memory, obs, first)
        return memory, self.q(y.reshape(n * steps, -1)).reshape(n, steps, -1)

    def step(self, memory: PyTree, obs: jax.Array) -> tuple[PyTree, jax.Array]:
        """One step of ``N`` environments, observations ``[N, ...]``, from ``memory`` as it is."""
        memory, y = self.torso.step(memory, obs)
        return memory, self.q(y)


class AgentsQ(nn.Module):
    """``LayerNormQ`` for agents on an array axis: ``AgentObs -> [..., agents, actions]``,
    one network for every agent (its one-hot id appended to its observation), the
    actions outside ``action_mask`` at ``-inf`` (unless the mask rules out every action
    of an agent: then none is ruled out, so that a greedy value stays finite)."""

    action_dim: int
    hidden: Sequence[int]

    @nn.compact
    def __call__(self, obs: AgentObs) -> jax.Array:
        return allowed_values(per_agent(LayerNormQ(self.action_dim, self.hidden), obs.obs, shared=True),
                              obs.action_mask)


class TwinCritic(nn.Module):
    """Two independent ReLU MLPs ``(obs, action) -> [2, B]``: twin Q estimates of a
    continuous action."""

    hidden: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs.reshape(obs.shape[0], -1), action], axis=-1)
        return jnp.stack([MLP(self.hidden, 1, 1.0, nn.relu)(x)[:, 0] for _ in range(2)])


class SquashedGaussian(NamedTuple):
    """A diagonal Gaussian pushed through ``tanh`` and scaled to ``[low, high]``."""

    mean: jax.Array
    log_std: jax.Array
    low: jax.Array
    high: jax.Array

    def sample_and_log_prob(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """An action, reparameterised (differentiable in the parameters), and its log-density."""
        std = jnp.exp(self.log_std)
        z = self.mean + std * jax.random.normal(key, self.mean.shape)
        log_prob = TanhGaussian(self.mean, std).log_prob(z) - jnp.log((self.high - self.low) / 2.0).sum()
        return squash(z, self.low, self.high), log_prob

    def mode(self) -> jax.Array:
        """The squashed mean: the deterministic action."""
        return squash(self.mean, self.low, self.high)


def squash(x: jax.Array, low: jax.Array, high: jax.Array) -> jax.Array:
    """``x`` through ``tanh``, scaled from ``[-1, 1]`` to ``[low, high]``."""
    return low + (high - low) / 2.0 * (jnp.tanh(x) + 1.0)


class SquashedGaussianPolicy(nn.Module):
    """ReLU MLP ``obs -> SquashedGaussian`` over actions in ``[low, high]``, with a
    state-dependent standard deviation."""

    action_dim: int
    hidden: Sequence[int]
    low: Sequence[float]
    high: Sequence[float]

    @nn.compact
    def __call__(self, obs: jax.Array) -> SquashedGaussian:
        out = MLP(self.hidden, 2 * self.action_dim, 1.0, nn.relu)(obs)
        mean, log_std = jnp.split(out, 2, axis=-1)
        log_std = -5.0 + 3.5 * (jnp.tanh(log_std) + 1.0)  # in [-5, 2]
        return SquashedGaussian(mean, log_std, jnp.asarray(self.low), jnp.asarray(self.high))


class DeterministicPolicy(nn.Module):
    """ReLU MLP ``obs -> action`` in ``[low, high]`` (``tanh``, scaled): the actor of
    TD3 and DDPG."""

    action_dim: int
    hidden: Sequence[int]
    low: Sequence[float]
    high: Sequence[float]

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        out = MLP(self.hidden, self.action_dim, 1.0, nn.relu)(obs)
        return squash(out, jnp.asarray(self.low), jnp.asarray(self.high))


def _uniform(bound: float) -> Callable[..., jax.Array]:
    """An initialiser uniform in ``[-bound, bound)``."""
    def initializer(key: jax.Array, shape: Sequence[int], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return initializer


class NoisyDense(nn.Module):
    """A dense layer with factorised Gaussian noise on its weights (NoisyNet; Fortunato et
    al. 2018): ``y = x (mu_w + sigma_w * f(e_in) f(e_out)^T) + mu_b + sigma_b * f(e_out)``,
    ``f(e) = sign(e) sqrt(|e|)``, ``e_in`` and ``e_out`` the two parts of ``noise`` (one
    standard normal draw of ``inputs + features`` values for the whole batch); without
    ``noise``, the mean weights (``mu``). The means start uniform in ``+-1/sqrt(inputs)``,
    the scales at ``sigma0 / sqrt(inputs)`` (``sigma0`` given at initialisation; a traced
    hyperparameter)."""

    features: int

    @nn.compact
    def __call__(self, x: jax.Array, sigma0: jax.Array | float = 0.5, noise: jax.Array | None = None) -> jax.Array:
        inputs = x.shape[-1]
        bound = 1.0 / np.sqrt(inputs)
        mu_w = self.param("mu_kernel", _uniform(bound), (inputs, self.features))
        mu_b = self.param("mu_bias", _uniform(bound), (self.features,))
        scale = lambda key, shape: jnp.full(shape, sigma0 * bound, jnp.float32)  # noqa: E731
        sigma_w = self.param("sigma_kernel", scale, (inputs, self.features))
        sigma_b = self.param("sigma_bias", scale, (self.features,))
        if noise is None:
            return x @ mu_w + mu_b
        assert noise.shape == (inputs + self.features,), (noise.shape, inputs, self.features)
        e = jnp.sign(noise) * jnp.sqrt(jnp.abs(noise))
        e_in, e_out = e[:inputs], e[inputs:]
        return x @ (mu_w + sigma_w * jnp.outer(e_in, e_out)) + mu_b + sigma_b * e_out


class DuelingQ(nn.Module):
    """ReLU network ``obs -> [B, actions, atoms]``: ``atoms`` outputs per action (a
    distribution's quantiles or atoms; 1 for plain Q-values). With ``dueling`` (Wang et
    al. 2016), the hidden layers but the last are a shared torso, and a value stream and
    an advantage stream, each a layer of the last width, give ``V + A - mean_a A``; with
    ``noisy``, every fully connected layer is a ``NoisyDense``, whose noise is one draw
    from the ``noise`` RNG stream for the whole network (without that stream, the mean
    weights); with ``conv``, image observations ``[N, H, W, C]`` first go through a 3x3
    convolution of 16 channels and a ReLU (the MinAtar network's, as ``MLP``'s ``conv``),
    never noisy. ``sigma0`` is the noisy layers' initial noise scale."""

    action_dim: int
    hidden: Sequence[int]
    atoms: int = 1
    dueling: bool = True
    noisy: bool = False
    conv: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, sigma0: jax.Array | float = 0.5) -> jax.Array:
        if self.conv:
            x = nn.relu(_dense(16, name="conv")(patches(x)))
        x = x.reshape(x.shape[0], -1)
        torso = tuple(self.hidden[:-1] if self.dueling else self.hidden)
        outputs = self.action_dim * self.atoms
        inputs = (x.shape[-1], *torso)
        last = inputs[-1]
        heads = ((last, self.hidden[-1]), (self.hidden[-1], self.atoms), (last, self.hidden[-1]),
                 (self.hidden[-1], outputs)) if self.dueling else ((last, outputs),)
        # the layers' (inputs, features) in the order they are called: their noise, one draw (each draw is a threefry
        # hash that XLA compiles on its own: on CPU about 65 ms a draw in a program compiled for compile time)
        layers = (*zip(inputs[:-1], torso, strict=True), *heads)
        noise = None
        if self.noisy and self.has_rng("noise"):
            draw = jax.random.normal(self.make_rng("noise"), (sum(i + f for i, f in layers),))
            noise = iter(jnp.split(draw, np.cumsum([i + f for i, f in layers])[:-1]))

        def dense(features: int, scale: float = np.sqrt(2)) -> Callable[[jax.Array], jax.Array]:
            if self.noisy:
                return lambda y: NoisyDense(features)(y, sigma0, None if noise is None else next(noise))
            return _dense(features, scale)

        for width in torso:
            x = nn.relu(dense(width)(x))
        if not self.dueling:
            return dense(outputs, 1.0)(x).reshape(-1, self.action_dim, self.atoms)
        value = dense(self.atoms, 1.0)(nn.relu(dense(self.hidden[-1])(x)))
        advantage = dense(outputs, 1.0)(nn.relu(dense(self.hidden[-1])(x)))
        advantage = advantage.reshape(-1, self.action_dim, self.atoms)
        return value[:, None] + advantage - advantage.mean(1, keepdims=True)
