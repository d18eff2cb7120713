"""Acting with a trained policy: a run's newest checkpoint restored onto one device
(whatever policy trained it), evaluated over complete
episodes in one compiled program, loaded as a jitted acting function, or exported as
StableHLO that runs without this package.

The acting function is the recipe's ``Recipe.acting``: the deterministic action with
``greedy`` (the most likely action, the Gaussian's mean, the greedy Q-value's), else a
draw from the policy (epsilon-greedy at the run's ``epsilon_end`` for DQN and PQN, as
they act when training ends); a recurrent policy carries its memory from step to step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frag.algorithms import innermost
from jaxrl_frag.bounds import check_count
from jaxrl_frag.envs import Acting
from jaxrl_frag.errors import check
from jaxrl_frag.recipes.recipe import PolicyFn, Recipe
from jaxrl_frag.transforms.evaluated import ENVS_MAX, EPISODES_MAX, STEPS_MAX, evaluation_env, first, layout, play

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Trained:
    """A run's trained recipe on one device: the recipe (a population's member), its
    training state at ``iteration``, and the member's index (``None`` outside a population)."""

    recipe: Recipe
    state: PyTree
    iteration: int
    member: int | None

    @property
    def evaluation_env(self) -> str:
        """The id of the environment that ``evaluate`` plays (``transforms.evaluated.evaluation_env``)."""
        return evaluation_env(self.recipe.env)

    def acting(self, greedy: bool) -> Acting:
        """``Recipe.acting`` of the state."""
        return self.recipe.acting(self.state, greedy)

    @property
    def recurrent(self) -> bool:
        """Whether the policy carries a memory."""
        return bool(jax.tree.leaves(jax.eval_shape(lambda: self.acting(True).blank(1))))


class Episodes(NamedTuple):
    """Complete episodes' undiscounted returns and lengths, ``[episodes]`` each."""

    returns: np.ndarray
    lengths: np.ndarray


def restore(run_dir: str | Path, member: int | None = None) -> Trained:
    """The run in ``run_dir`` at its newest usable checkpoint, on one device; its
    checkpoints are left as they are (an unusable step is skipped with a warning).

    Args:
        run_dir: A run directory that ``jaxrl-frag train`` wrote.
        member: A population's member (default 0); ``None`` or 0 for other runs.

    Raises:
        ConfigError: Where ``run_dir`` holds no run or no usable checkpoint, or a run
            this cannot act for (the actor-learner policy's),
            or ``member`` is not one of the run's.
    """
    from jaxrl_frag import sharding
    from jaxrl_frag.app.build import make_algorithm
    from jaxrl_frag.app.rundir import RunDir
    from jaxrl_frag.app.training import saved_spec
    from jaxrl_frag.checkpoints import Checkpoints

    run = RunDir(run_dir)
    config = run.read_config()
    settings = config["settings"]
    policy = sharding.get(settings.get("policy", "single"))
    size = config.get("members")
    if size is None:
        check(member in (None, 0), "member", member, "the run is not a population (it has one member): drop --member")
        member = None
    else:
        member = 0 if member is None else member
        check(isinstance(member, int) and 0 <= member < size, "member", member,
              f"the population has members 0 to {size - 1}: choose one of them")
    steps = sorted(int(p.name) for p in run.checkpoints.glob("*") if p.name.isdigit()) if run.checkpoints.is_dir() else []
    check(bool(steps), "run_dir", str(run.path),
          f"holds no checkpoint in {run.checkpoints}: a run saves one every --checkpoint-every iterations and at its "
          f"end; let it save one (or continue it: jaxrl-frag resume {run.path})")
    algo, _ = make_algorithm(saved_spec(run, config, {}), round_seconds=config.get("round_seconds"))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shapes = jax.eval_shape(algo.init, jax.ShapeDtypeStruct((2,), jnp.uint32))
    like = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), shapes)
    checkpoints = Checkpoints(run.checkpoints)
    try:
        checkpoint = checkpoints.restore(policy.saved_like(like, checkpoints.saved_tree), read_only=True)
    finally:
        checkpoints.close()
    check(checkpoint is not None, "run_dir", str(run.path),
          f"holds no usable checkpoint in {run.checkpoints} (the warnings above say why); continue the run to save "
          f"one: jaxrl-frag resume {run.path}")
    recipe, state = innermost(algo, policy.algorithm_part(checkpoint.state), member)
    return Trained(recipe, state, checkpoint.iteration, member)


def check_episodes(episodes: int) -> None:
    """Raise ``ConfigError`` unless ``episodes`` is a count in ``[1, EPISODES_MAX]``."""
    check_count("episodes", episodes, EPISODES_MAX, "each is a row of eval.csv; evaluate in several runs for more")


def evaluate(trained: Trained, episodes: int, greedy: bool = True, seed: int = 0) -> Episodes:
    """``episodes`` complete episodes of ``trained``'s policy on fresh environments
    (``Trained.evaluation_env``: a game of two players against random moves), in one
    compiled program.

    Up to ``ENVS_MAX`` environments step at once, each for its first ``k`` episodes
    (``k`` the fewest that make ``episodes``); the loop runs until every environment has
    ended ``k``, and the episodes kept are chosen by their index alone (every
    environment's first ones, then the first environments' ``k``-th), never by when they
    ended, so short episodes are not favoured: the mean is unbiased.

    Args:
        trained: What ``restore`` gives.
        episodes: How many episodes.
        greedy: The deterministic action, or a draw from the policy (``Recipe.acting``).
        seed: The seed of the environments' resets and of the policy's draws.

    Returns:
        The episodes' returns and lengths, in the order above.

    Raises:
        ConfigError: For ``episodes`` outside ``[1, EPISODES_MAX]``, or episodes that do
            not end within ``STEPS_MAX`` steps of an environment.
    """
    from jaxrl_frag import envs

    check_episodes(episodes)
    num_envs, each = layout(episodes, ENVS_MAX)
    env = envs.make(trained.evaluation_env, num_envs=num_envs)
    acting = trained.acting(greedy)

    def kept(key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        return first(play(env, acting, key, each, STEPS_MAX), episodes)

    returns, lengths, complete = jax.device_get(jax.jit(kept)(jax.random.PRNGKey(seed)))
    check(bool(complete.all()), "episodes", episodes,
          f"not every episode of {env.name} ended within {STEPS_MAX:,} steps of each environment (does it have a time "
          "limit?); ask for fewer episodes")
    return Episodes(returns, lengths)


def record_episode(trained: Trained, greedy: bool, seed: int, limit: int) -> tuple[PyTree, np.ndarray]:
    """One episode of the policy on the bare (unbatched) environment, up to ``limit``
    steps: the environment's state before each step (stacked ``[T, ...]``) and each
    step's reward."""
    from jaxrl_frag import envs

    env = envs.make(trained.recipe.env.name)
    acting = trained.acting(greedy)

    def play(key: jax.Array) -> tuple[PyTree, jax.Array, jax.Array]:
        key, k_reset = jax.random.split(key)
        state, obs = env.reset(k_reset)

        def one_step(carry: tuple[Any, ...], key: jax.Array) -> tuple[Any, Any]:
            state, obs, memory = carry
            k_act, k_env = jax.random.split(key)
            action, memory = acting.act(obs[None], memory, k_act)
            after, ts = env.step(k_env, state, action[0])
            return (after, ts.obs, memory), (state, ts.reward, ts.terminated | ts.truncated)

        _, (states, rewards, done) = jax.lax.scan(one_step, (state, obs, acting.blank(1)), jax.random.split(key, limit))
        return states, rewards, done

    states, rewards, done = jax.device_get(jax.jit(play)(jax.random.PRNGKey(seed)))
    end = int(np.argmax(done)) + 1 if done.any() else limit
    return jax.tree.map(lambda x: x[:end], states), rewards[:end]


def _observation(trained: Trained) -> PyTree:
    """The shapes and dtypes of one observation of the run's environment (a pytree for
    agents on an axis: ``envs.AgentObs``)."""
    from jaxrl_frag import envs

    env = envs.make(trained.recipe.env.name, num_envs=1)
    obs = jax.eval_shape(env.reset, jax.ShapeDtypeStruct((2,), jnp.uint32))[1]
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), obs)


def load_policy(run_dir: str | Path, greedy: bool = True, member: int | None = None) -> PolicyFn | Acting:
    """The trained policy of the run in ``run_dir`` (its newest checkpoint), jitted.

    Args:
        run_dir: A run directory that ``jaxrl-frag train`` wrote.
        greedy: The deterministic action, or a draw from the policy (module docstring).
        member: A population's member (default 0).

    Returns:
        ``act(obs, key) -> action``: one observation (the environment's observation
        shape, as the environment gives it) and a key give one action; a batch
        ``[N, ...]`` of them and one key give ``[N, ...]`` actions. Keys are raw
        ``uint32[2]`` (``jax.random.PRNGKey``). Agents on an axis observe an
        ``envs.AgentObs`` (one, or a batch) and get an action per agent. A recurrent
        policy's run gives an
        ``Acting`` instead: ``blank(N)``, the memory of ``N`` environments before their
        first step, and the jitted ``act(obs [N, ...], memory, key) -> (actions, memory
        after)``, whose memory the caller carries from step to step (zeroed with
        ``jaxrl_frag.envs.forget`` where an episode ends).
    """
    trained = restore(run_dir, member)
    acting, one = trained.acting(greedy), _observation(trained)
    if trained.recurrent:
        def act_batch(obs: PyTree, memory: PyTree, key: jax.Array) -> tuple[jax.Array, PyTree]:
            _check_observation(obs, one, trained.recipe.env.name, single=False)
            return acting.act(obs, memory, key)

        return Acting(acting.blank, jax.jit(act_batch))

    def act_any(obs: PyTree, key: jax.Array) -> jax.Array:
        obs = jax.tree.map(jnp.asarray, obs)
        batched = _check_observation(obs, one, trained.recipe.env.name)
        actions = acting.act(obs if batched else jax.tree.map(lambda x: x[None], obs), (), key)[0]
        return actions if batched else actions[0]

    return jax.jit(act_any)


def _check_observation(obs: PyTree, one: PyTree, env_name: str, single: bool = True) -> bool:
    """Whether ``obs`` is a batch ``[N, *shape]`` of observations shaped as ``one`` (the
    environment's), rather than one observation (where ``single`` allows it); ``ValueError``
    naming the shape expected and the shape given for anything else."""
    expected = jax.tree.leaves(one)
    got = jax.tree.leaves(obs) if jax.tree.structure(obs) == jax.tree.structure(one) else None
    if got is not None:
        shapes = [(tuple(np.shape(g)), tuple(e.shape)) for g, e in zip(got, expected, strict=True)]
        if single and all(g == e for g, e in shapes):
            return False
        if all(len(g) == len(e) + 1 and g[1:] == e for g, e in shapes) and len({g[0] for g, _ in shapes}) == 1:
            return True
    given = [tuple(np.shape(g)) for g in jax.tree.leaves(obs)]
    want = [tuple(e.shape) for e in expected]
    shape, shown = (want[0], given[0] if len(given) == 1 else given) if len(want) == 1 else (want, given)
    forms = f"one observation of shape {shape} or a batch of shape [N, *{shape}]" if single else (
        f"a batch of observations of shape [N, *{shape}] (with the memory of those N)")
    raise ValueError(f"obs has shape {shown}; this policy ({env_name}) takes {forms}")


def export_policy(run_dir: str | Path, path: str | Path, greedy: bool = True, member: int | None = None) -> Path:
    """Write the trained policy of the run in ``run_dir`` to ``path`` as a serialized
    ``jax.export`` (StableHLO, the parameters inside), for the platform it runs on here.

    Loading it needs jax alone::

        exported = jax.export.deserialize(bytearray(open(path, "rb").read()))
        actions = exported.call(obs, jax.random.PRNGKey(0))

    Args:
        run_dir: A run directory that ``jaxrl-frag train`` wrote.
        path: The file to write, whole (``writes.write_atomically``): an existing one is
            replaced, or kept as it was where the write fails (``writes.WriteError``,
            naming ``path`` and the cause).
        greedy: The deterministic action, or a draw from the policy (module docstring).
        member: A population's member (default 0).

    Returns:
        ``path``. The exported function takes a batch of observations ``[N, ...]`` (any
        ``N``, the environment's dtype; agents on an axis: the tuple of an
        ``envs.AgentObs``'s fields) and one raw ``uint32[2]`` key, and returns the
        ``[N, ...]`` actions that ``load_policy``'s gives. A recurrent policy's takes
        ``(obs, memory, key)`` and returns ``(actions, memory after)``, as
        ``load_policy``'s ``act`` (the memory before the first step: zeros, of the
        shapes ``exported.in_avals[1:-1]`` give).
    """
    trained = restore(run_dir, member)
    acting, one = trained.acting(greedy), _observation(trained)
    (batch,) = jax.export.symbolic_shape("batch")
    # an observation of several arrays (AgentObs) goes in as the tuple of its leaves: jax alone can load that
    leaves, tree = jax.tree.flatten(jax.tree.map(lambda x: jax.ShapeDtypeStruct((batch, *x.shape), x.dtype), one))
    obs = leaves[0] if len(leaves) == 1 else tuple(leaves)

    def observation(obs: Any) -> PyTree:
        return tree.unflatten([obs] if len(leaves) == 1 else list(obs))

    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    if trained.recurrent:
        memory = jax.tree.map(lambda m: jax.ShapeDtypeStruct((batch, *m.shape[1:]), m.dtype),
                              jax.eval_shape(lambda: acting.blank(1)))
        exported = jax.export.export(jax.jit(lambda obs, memory, key: acting.act(observation(obs), memory, key)))(
            obs, memory, key)
    else:
        exported = jax.export.export(jax.jit(lambda obs, key: acting.act(observation(obs), (), key)[0]))(obs, key)
    from jaxrl_frag.writes import write_atomically

    return write_atomically(path, exported.serialize())
