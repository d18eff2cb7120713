"""Fragments, the graph recovered from the traced step, and a user-written algorithm."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxrl_frag as jf
from jaxrl_frag import envs
from jaxrl_frag.recipes.networks import ActorCritic


def nbytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def test_ppo_graph_has_actor_and_learner_and_the_trajectory_between_them(cartpole_program: jf.Program) -> None:
    explanation = cartpole_program.explain()
    graph = explanation.graph
    assert [(n.role, n.name) for n in graph.nodes] == [("actor", "actor.rollout"), ("learner", "learner.learn")]
    (traj,) = [e for e in graph.edges_between("actor", "learner") if e.dst_port == "traj"]
    algo = cartpole_program.algorithm
    state = jax.eval_shape(algo.init, jax.random.PRNGKey(0))
    expected, *_ = jax.eval_shape(algo.rollout, state.params, state.env_state, state.obs, state.memory, state.key)
    assert traj.nbytes == nbytes(expected) == 128 * 4 * (4 * 4 + 4 + 4 * 4 + 2 * 1)
    assert traj.batch_axis == 1
    params_in = [e for e in graph.edges if e.dst == "learner.learn" and e.dst_port == "params"]
    assert params_in and params_in[0].batch_axis is None and params_in[0].nbytes == nbytes(state.params)
    assert explanation.cost["flops"] > 0
    text = str(explanation)
    assert "actor.rollout.traj -> learner.learn.traj" in text and "flops" in text


# -- an algorithm written from scratch with the decorators --------------------------------------

ENV = envs.make("CartPole-v1", num_envs=8)
NET = ActorCritic(2, (32,), continuous=False)
TX = optax.adam(1e-2)
T = 32


@jf.fragment("actor", batched={"env_state": 0, "obs": 0, "batch": 1}, outputs=("batch", "env_state", "obs"))
def collect(params, env_state, obs, key):
    def one(carry, key):
        env_state, obs = carry
        k_act, k_env = jax.random.split(key)
        dist, _ = NET.apply(params, obs)
        action = dist.sample(k_act)
        env_state, ts = ENV.step(k_env, env_state, action)
        return (env_state, ts.obs), (obs, action, ts.reward, ts.done)

    (env_state, obs), batch = jax.lax.scan(one, (env_state, obs), jax.random.split(key, T))
    return batch, env_state, obs


@jf.fragment("learner", batched={"batch": 1}, outputs=("params", "opt_state", "metrics"))
def reinforce(params, opt_state, batch):
    obs, action, reward, done = batch

    def discounted(carry, x):
        r, d = x
        carry = r + 0.99 * carry * (1 - d)
        return carry, carry

    _, returns = jax.lax.scan(discounted, jnp.zeros(reward.shape[1]), (reward, done.astype(jnp.float32)), reverse=True)

    def loss(params):
        dist, _ = NET.apply(params, obs.reshape(-1, 4))
        return -(dist.log_prob(action.reshape(-1)) * jf.standardize(returns.reshape(-1))).mean()

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = TX.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, {"loss": value}


def init(key):
    k_net, k_env, key = jax.random.split(key, 3)
    env_state, obs = ENV.reset(k_env)
    params = NET.init(k_net, obs)
    return {"params": params, "opt_state": TX.init(params), "env_state": env_state, "obs": obs, "key": key}


@jf.algorithm(init=init, steps_per_iteration=8 * T)
def reinforce_step(state):
    key, k = jax.random.split(state["key"])
    batch, env_state, obs = collect(state["params"], state["env_state"], state["obs"], k)
    params, opt_state, metrics = reinforce(state["params"], state["opt_state"], batch)
    return {"params": params, "opt_state": opt_state, "env_state": env_state, "obs": obs, "key": key}, metrics


def test_a_decorated_step_function_is_an_algorithm_that_compiles_runs_and_explains() -> None:
    program = jf.compile(reinforce_step, chunk_iterations=5)
    history = program.run(jax.random.PRNGKey(0), iterations=12)
    assert history["iteration"].tolist() == [5, 10, 12]
    assert history["env_steps"][-1] == 12 * 8 * T
    assert np.all(np.isfinite(history["loss"]))
    graph = program.explain().graph
    assert [n.role for n in graph.nodes] == ["actor", "learner"]
    (edge,) = graph.edges_between("actor", "learner")
    assert edge.label == "actor.collect.batch -> learner.reinforce.batch"
    assert edge.nbytes == T * 8 * (4 * 4 + 4 + 4 + 1)


def test_explain_alone_shows_the_compiled_programs_explanation_having_compiled_one_iteration(
        cartpole_program: jf.Program) -> None:
    alone = jf.explain(cartpole_program.algorithm, cartpole_program.policy)
    compiled = cartpole_program.explain()
    assert list(alone.compile_seconds) == ["single step"]  # not the training programs
    assert list(compiled.compile_seconds) == ["program", "single step"]
    assert str(dataclasses.replace(alone, compile_seconds={})) == str(dataclasses.replace(compiled, compile_seconds={}))


def test_the_graph_draws_as_dot_source_picture_and_text(cartpole_program: jf.Program, tmp_path: Path) -> None:
    import matplotlib

    explanation = cartpole_program.explain()
    dot = explanation.draw(tmp_path / "g.dot").read_text()
    assert '"actor.rollout" -> "learner.learn"' in dot and "traj: 19.0 KiB (env-batched)" in dot
    assert "subgraph cluster_0" in dot and "SingleDevice" in dot and "no collectives" in dot
    backend = matplotlib.get_backend()
    png = explanation.draw(tmp_path / "g.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert matplotlib.get_backend() == backend  # drawing leaves the caller's plotting alone
    assert explanation.draw(tmp_path / "g.txt").read_text() == str(explanation) + "\n"
    with pytest.raises(jf.ConfigError) as err:
        explanation.draw(tmp_path / "g.gif")
    assert err.value.field == "draw" and ".png" in str(err.value)
    # whole or not at all: a picture that cannot be written (a folder there) leaves what was there, and no temporary
    (tmp_path / "taken.png").mkdir()
    with pytest.raises(OSError) as failed:
        explanation.draw(tmp_path / "taken.png")
    assert failed.value.filename == str(tmp_path / "taken.png")
    assert (tmp_path / "taken.png").is_dir() and not list(tmp_path.glob("*.tmp*"))


def test_a_populations_graph_names_each_fragments_results_as_its_members_does(cartpole_program: jf.Program) -> None:
    """jax.vmap drops the results' names from the fragment calls it batches; the graph names them still,
    as one member's, and carries every member's bytes."""
    from jaxrl_frag.transforms import Population

    member = cartpole_program.algorithm
    population = jf.compile(Population.of([member] * 3, [0, 1, 2]), chunk_iterations=16).explain().graph
    single = cartpole_program.explain().graph
    assert [(n.name, n.outputs) for n in population.nodes] == [(n.name, n.outputs) for n in single.nodes]
    assert population.nodes[0].outputs == ("traj", "env_state", "obs", "episodes")
    (traj,) = [e for e in population.edges_between("actor", "learner") if e.dst_port == "traj"]
    (one,) = [e for e in single.edges_between("actor", "learner") if e.dst_port == "traj"]
    assert (traj.src_port, traj.nbytes) == ("traj", 3 * one.nbytes)
