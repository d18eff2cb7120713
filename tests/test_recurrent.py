"""Recurrent policies (``memory`` gru or lstm) and the tasks that need them: the learner
replays the memory the actor acted with, episodes forget it, a partially observed
environment observes only what its id keeps, and MemoryChain is a task that no
feed-forward policy can do better than chance at."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_frag as jf
from jaxrl_frag import envs
from jaxrl_frag.errors import ConfigError

MASKED = "CartPole-v1@obs=0,2"  # CartPole without its velocities


@pytest.mark.parametrize(("recipe", "env", "settings"), [
    ("PPO", MASKED, {}), ("IMPALA", MASKED, {}),
    # a memory per agent, forgotten where that agent is done (SMAX: a unit died), and one torso per agent; the
    # multi-agent rows cost the most to compile (a minute of make test-fast's share on 2 cores): make test runs them
    pytest.param("MAPPO", "jaxmarl:SMAX_3m", {}, marks=pytest.mark.slow),
    pytest.param("IPPO", "jaxmarl:MPE_simple_spread_v3", {"shared_params": False}, marks=pytest.mark.slow)])
@pytest.mark.parametrize("memory", ["gru", "lstm"])
def test_the_learner_replays_the_memory_the_actor_acted_with(recipe: str, env: str, settings: dict,
                                                            memory: str) -> None:
    algo = getattr(jf.recipes, recipe).create(env, memory=memory, num_envs=4, num_steps=64, total_steps=4 * 64 * 2,
                                              num_minibatches=2, **settings)
    state = jax.jit(algo.init)(jax.random.PRNGKey(1))
    state, _ = jax.jit(algo.step)(state)  # the second rollout starts from a memory that is not zeros
    traj, _, _, _, _ = jax.jit(algo.rollout)(state.params, state.env_state, state.obs, state.memory, state.key)
    done = traj.terminated | traj.truncated
    assert done[:-1].any(), "no episode ended within the rollout: nothing to forget"
    recurrence = jax.jit(algo.recurrence)(traj)
    assert np.abs(jax.tree.leaves(recurrence.start)[0]).sum() > 0
    obs, action, log_prob, value = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1),
                                                (traj.obs, traj.action, traj.log_prob, traj.value))

    @jax.jit
    def replay(first: jax.Array) -> tuple[jax.Array, jax.Array]:  # log-probabilities and values, ``first`` as given
        dist, values = algo.policy_value(state.params, recurrence._replace(first=first), obs)
        return dist.log_prob(action), values

    replayed_log_prob, replayed = replay(recurrence.first)
    np.testing.assert_allclose(replayed_log_prob, log_prob, atol=1e-5)
    np.testing.assert_allclose(replayed, value, atol=1e-5)
    # without forgetting where episodes began the replay would not be the actor's: neither the policy's nor the
    # value's (MAPPO's centralised critic has a memory of its own)
    unforgetting, value_unforgetting = replay(jnp.zeros_like(recurrence.first))
    assert np.abs(unforgetting - log_prob).max() > 1e-3
    assert np.abs(value_unforgetting - value).max() > 1e-3


@pytest.mark.parametrize("memory", ["gru", "lstm"])
def test_pqn_replays_the_memory_it_acted_with(memory: str) -> None:
    """The learner's Q-values, unrolled over each environment's sequence, are the actor's:
    where no episode ended at a step, the greedy value of the next step's Q-values is the
    ``next_value`` the rollout read with the memory after that step."""
    algo = jf.recipes.PQN.create(MASKED, memory=memory, num_envs=4, num_steps=64, total_steps=4 * 64 * 2,
                                 num_minibatches=2)
    state = jax.jit(algo.init)(jax.random.PRNGKey(1))
    state, _ = jax.jit(algo.step)(state)
    rollout, q_values = jax.jit(algo.rollout), jax.jit(algo.q_values)
    traj, _, _, _, _ = rollout(state.params, state.env_state, state.obs, state.memory, state.key, 0.5)
    done = np.asarray(traj.terminated | traj.truncated).T
    assert done[:, :-1].any() and not done[:, :-1].all()
    recurrence = memory_of(traj)
    q = np.asarray(q_values(state.params, recurrence, jnp.swapaxes(traj.obs, 0, 1)))
    going_on = ~done[:, :-1]
    np.testing.assert_allclose(q[:, 1:].max(-1)[going_on], np.asarray(traj.next_value).T[:, :-1][going_on], atol=1e-5)
    # the actions were drawn from these Q-values: epsilon 0 gives the greedy ones
    greedy, _, _, _, _ = rollout(state.params, state.env_state, state.obs, state.memory, state.key, 0.0)
    np.testing.assert_array_equal(np.asarray(q_values(state.params, memory_of(greedy),
                                                      jnp.swapaxes(greedy.obs, 0, 1))).argmax(-1),
                                  np.asarray(greedy.action).T)


def memory_of(traj: jf.recipes.pqn.QTransition) -> jf.recipes.memory.Recurrence:
    return jf.recipes.memory.recurrence(traj.memory, traj.terminated, traj.truncated)


def test_a_recurrent_memory_is_forgotten_where_an_episode_ended() -> None:
    env = envs.make("CartPole-v1", num_envs=8)

    def count(obs: jax.Array, memory: jax.Array, key: jax.Array) -> tuple[jax.Array, ...]:
        action = jax.random.bernoulli(key, shape=obs.shape[:1]).astype(jnp.int32)
        return action, action, memory, memory + 1  # the memory counts the steps it has seen

    state, obs = env.reset(jax.random.PRNGKey(0))
    steps, seen, _, _, memory, _ = env.recurrent_rollout(count, state, obs, jnp.zeros(8), jax.random.PRNGKey(1), 100)
    done = np.asarray(steps.terminated | steps.truncated)
    assert done.any()
    # each step sees as many steps as its episode has had before it within the rollout
    expected, since = np.zeros((100, 8)), np.zeros(8)
    for t in range(100):
        expected[t] = since
        since = np.where(done[t], 0, since + 1)
    np.testing.assert_array_equal(seen, expected)
    np.testing.assert_array_equal(memory, since)


def test_a_masked_environment_observes_only_the_entries_its_id_keeps() -> None:
    full, masked = envs.make("CartPole-v1", num_envs=4), envs.make(MASKED, num_envs=4)
    assert masked.name == MASKED and envs.make(masked.name, num_envs=4) == masked  # made again from its name
    assert masked.observation_space.shape == (2,)
    assert masked.observation_space.low == tuple(np.asarray(full.observation_space.low)[[0, 2]].tolist())
    key = jax.random.PRNGKey(0)
    (state, obs), (masked_state, masked_obs) = full.reset(key), masked.reset(key)
    np.testing.assert_array_equal(masked_obs, obs[:, [0, 2]])
    action = jnp.ones(4, jnp.int32)
    (_, ts), (_, masked_ts) = full.step(key, state, action), masked.step(key, masked_state, action)
    np.testing.assert_array_equal(masked_ts.obs, ts.obs[:, [0, 2]])
    np.testing.assert_array_equal(masked_ts.final_obs, ts.final_obs[:, [0, 2]])


def test_no_feed_forward_policy_beats_chance_at_memory_chain() -> None:
    """At MemoryChain's rewarded step the observation is the same whichever context the
    episode began with, and the same action is rewarded +1 under one context and -1
    under the other: a policy of the observation alone scores 0 in expectation, one
    that remembers the first observation scores 1."""
    env = envs.make("MemoryChain-bsuite", num_envs=256)
    state, obs = env.reset(jax.random.PRNGKey(0))
    first = obs
    acted_on, rewards = [], []
    for t in range(6):  # memory length 5: the sixth action is rewarded, then the episode ends
        acted_on.append(obs)
        state, ts = env.step(jax.random.PRNGKey(t), state, jnp.ones(256, jnp.int32))
        rewards.append(ts.reward)
        obs = ts.obs
    assert bool(ts.terminated.all()) and not np.any(rewards[:5])
    context = np.asarray(first[:, 2]) > 0
    assert 0 < context.sum() < 256
    assert np.all(np.asarray(acted_on[5]) == np.asarray(acted_on[5][0]))  # one observation for every episode
    np.testing.assert_array_equal(np.asarray(rewards[5]), np.where(context, 1.0, -1.0))  # action 1: right iff context


def test_a_recurrent_policy_acts_step_by_step_as_the_learner_unrolls_it() -> None:
    """``acting`` carries the memory from step to step, forgotten where an episode ended:
    its greedy actions over a rollout are the modes of the network unrolled over the
    same sequences (``policy_value``). ``policy_fn``, which has no memory, refuses."""
    algo = jf.recipes.PPO.create(MASKED, memory="gru", num_envs=4, num_steps=64, total_steps=4 * 64 * 2,
                                 num_minibatches=2)
    state = jax.jit(algo.init)(jax.random.PRNGKey(1))
    traj, _, _, _, _ = jax.jit(algo.rollout)(state.params, state.env_state, state.obs, state.memory, state.key)
    recurrence = algo.recurrence(traj)
    assert recurrence.first.any()
    dist, _ = algo.policy_value(state.params, recurrence, jnp.swapaxes(traj.obs, 0, 1))
    acting = algo.acting(state, greedy=True)
    memory, actions = acting.blank(4), []
    for t in range(64):
        action, memory = acting.act(traj.obs[t], envs.forget(memory, recurrence.first[:, t]), jax.random.PRNGKey(t))
        actions.append(action)
    np.testing.assert_array_equal(np.stack(actions, 1), dist.mode())
    with pytest.raises(ConfigError, match="memory='gru'"):
        algo.policy_fn(state, greedy=True)


@pytest.mark.slow  # three runs of the command line
def test_a_recurrent_run_resumes_exactly_with_its_memory(tmp_path: Path) -> None:
    from saved_state import read_state

    from jaxrl_frag.app.cli import main

    train = ["train", "ppo", "--env", MASKED, "--memory", "gru", "--num-envs", "4", "--num-steps", "16", "--no-anneal-lr",
             "--chunk-iterations", "2", "--checkpoint-every", "2"]
    assert main([*train, "--total-steps", "512", "--run-dir", str(tmp_path / "whole")]) == 0
    assert main([*train, "--total-steps", "256", "--run-dir", str(tmp_path / "resumed")]) == 0
    assert main(["resume", str(tmp_path / "resumed"), "--override", "total_steps=512"]) == 0
    whole, resumed = (read_state(tmp_path / run / "checkpoints" / "8") for run in ("whole", "resumed"))
    assert np.shape(whole["memory"]) == (4, 64) and np.abs(whole["memory"]).sum() > 0
    assert jax.tree.structure(resumed) == jax.tree.structure(whole)
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(whole), strict=True):
        np.testing.assert_array_equal(a, b)
    # the run evaluates, loads and exports with its memory
    assert main(["evaluate", str(tmp_path / "whole"), "--episodes", "4"]) == 0
    acting = jf.load_policy(tmp_path / "whole", greedy=False)
    exported = jax.export.deserialize(bytearray(jf.export_policy(tmp_path / "whole", tmp_path / "policy.jax",
                                                                  greedy=False).read_bytes()))
    obs, memory = np.random.default_rng(0).normal(size=(3, 2)).astype(np.float32), acting.blank(3)
    for t in range(3):
        key = jax.random.PRNGKey(t)
        (action, after), (exported_action, exported_after) = acting.act(obs, memory, key), exported.call(obs, memory, key)
        np.testing.assert_array_equal(action, exported_action)
        np.testing.assert_allclose(after, exported_after, rtol=1e-6)
        memory = after
    assert np.abs(memory).sum() > 0
