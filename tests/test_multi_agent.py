"""Multi-agent environments (JaxMARL's, agents on an array axis) and the recipes IPPO and
MAPPO: observations padded with a mask, action masks, truncation per episode and
termination per agent, the networks' inputs and parameters, episode statistics per team
and per agent, exact resume, refusals, and learning. Every distribution policy on these
recipes, and the exactness of those that claim it, are in test_matrix.py."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_frag as jf
from jaxrl_frag import ConfigError, envs
from jaxrl_frag.checkpoints import Checkpoints
from jaxrl_frag.recipes.actor_critic import Transition
from jaxrl_frag.recipes.advantages import gae

MPE = "jaxmarl:MPE_simple_spread_v3"
SMAX = "jaxmarl:SMAX_3m"
SWITCH_RIDDLE = "jaxmarl:switch_riddle"  # JaxMARL's quickest environment to compile: 3 agents
CONTINUOUS = "jaxmarl:MPE_simple_facmac_3a_v1"  # 4 agents, each acting in [0, 1]^5: MABrax's kind of action, cheaply
TINY = dict(num_envs=4, num_steps=8, total_steps=4 * 8 * 2, num_minibatches=2)
SMAX_SMALL = dict(num_envs=8, num_steps=32, total_steps=8 * 32 * 8, num_minibatches=4)  # 8 iterations


def first_layer(params: dict, net: str) -> np.ndarray:
    return np.asarray(params["params"][net]["Dense_0"]["kernel"])


def random_steps(env: envs.Env, steps: int, seed: int = 0) -> tuple[envs.AgentObs, envs.TimeStep]:
    """``steps`` steps of ``env`` with uniformly random available actions: the observations
    acted on and the time steps, time-major."""
    state, obs = env.reset(jax.random.PRNGKey(seed))

    def step(carry: tuple, key: jax.Array) -> tuple:
        state, obs = carry
        k_act, k_env = jax.random.split(key)
        action = jax.random.categorical(k_act, jnp.where(obs.action_mask, 0.0, -jnp.inf))
        state, ts = env.step(k_env, state, action)
        return (state, ts.obs), (obs, ts)

    keys = jax.random.split(jax.random.PRNGKey(seed + 1), steps)
    return jax.jit(lambda s, o: jax.lax.scan(step, (s, o), keys)[1])(state, obs)


def test_observations_are_padded_under_a_mask_and_padded_actions_are_never_available() -> None:
    env = envs.make("jaxmarl:MPE_simple_speaker_listener_v4", num_envs=4)  # the speaker sees 3, acts 3 of 5
    assert env.num_agents == 2 and env.observation_space.shape == (2, 11) and env.action_space == envs.Discrete(5)
    np.testing.assert_array_equal(env.observation_mask.sum(axis=1), [3, 11])
    obs, _ = random_steps(env, 60)
    assert (np.asarray(obs.obs)[..., 0, 3:] == 0).all() and (np.asarray(obs.obs)[..., 0, :3] != 0).any()
    mask = np.asarray(obs.action_mask)
    assert not mask[..., 0, 3:].any() and mask[..., 0, :3].all() and mask[..., 1, :].all()
    assert obs.state.shape[-1] == 2 * 11  # MPE has no world state: every agent's observation side by side


@pytest.mark.slow  # SMAX's step compiled: make test runs it, make test-fast the cheaper unit tests
def test_the_time_limit_truncates_every_agent_and_a_dead_unit_terminates_alone() -> None:
    mpe = envs.make(MPE, num_envs=4)
    _, ts = random_steps(mpe, 3 * mpe.max_steps)
    done = np.asarray(ts.info["episode_done"])
    lengths = np.asarray(ts.info["episode_length"])[done]
    assert done.sum() == 2 * 4 and (lengths == mpe.max_steps + 1).all()  # JaxMARL's MPE ends after step 25 + 1
    assert np.asarray(ts.truncated)[done].all() and not np.asarray(ts.terminated).any()
    assert not np.asarray(ts.truncated)[~done].any()
    smax = envs.make(SMAX, num_envs=16)
    _, ts = random_steps(smax, 100)
    terminated, truncated = np.asarray(ts.terminated), np.asarray(ts.truncated)
    done, won = np.asarray(ts.info["episode_done"]), np.asarray(ts.info["episode_won"])
    alone = terminated.any(axis=-1) & ~terminated.all(axis=-1) & ~done  # some units dead, the battle going on
    assert alone.any() and not truncated[~done].any()
    # a decided battle terminates every agent, survivors too (random play loses each one within the time limit;
    # the win flag is what test_mappo_wins_smax_3m's learner reaches)
    assert done.sum() > 16 and terminated[done].all() and not truncated[done].any() and not won.any()


def test_the_team_return_is_the_mean_of_the_agents_returns() -> None:
    _, ts = random_steps(envs.make(MPE, num_envs=8), 60)
    done, info = np.asarray(ts.info["episode_done"]), jax.device_get(ts.info)
    agents = np.stack([info[f"episode_return_agent{i}"][done] for i in range(3)])
    assert np.ptp(agents, axis=0).max() > 0.1  # the agents' returns differ (their own collisions)
    np.testing.assert_allclose(info["episode_return"][done], agents.mean(axis=0), rtol=1e-5)


def test_shared_parameters_read_agent_ids_and_per_agent_ones_stack_on_an_agents_axis() -> None:
    shared = jf.recipes.IPPO.create(MPE, **TINY)
    apart = jf.recipes.IPPO.create(MPE, shared_params=False, **TINY)
    agents, (_, obs_dim) = shared.env.num_agents, shared.env.observation_space.shape
    assert agents == 3
    p_shared, p_apart = (jax.jit(algo.init)(jax.random.PRNGKey(0)).params for algo in (shared, apart))
    assert first_layer(p_shared, "pi").shape == (obs_dim + agents, 64)  # the one-hot id appended
    assert first_layer(p_apart, "pi").shape == (agents, obs_dim, 64)
    assert all(x.shape[0] == agents for x in jax.tree.leaves(p_apart))
    kernels = first_layer(p_apart, "pi")
    assert not np.allclose(kernels[0], kernels[1])  # each agent initialised on its own


@pytest.mark.slow  # SMAX's rollout compiled
def test_the_mappo_critic_reads_the_global_state_and_actions_outside_the_mask_are_never_taken() -> None:
    mappo = jf.recipes.MAPPO.create(SMAX, memory="none", **TINY)  # its layers as they read their inputs
    state_dim = mappo.env.state_space.shape[0]
    state = jax.jit(mappo.init)(jax.random.PRNGKey(0))
    params, agents = state.params, mappo.env.num_agents
    width = mappo.hidden[0]
    assert first_layer(params, "v").shape == (state_dim + agents, width)
    assert first_layer(params, "pi").shape == (mappo.env.observation_space.shape[1] + agents, width)
    traj, *_ = jax.jit(mappo.rollout)(params, state.env_state, state.obs, state.memory, jax.random.PRNGKey(1))
    mask = np.asarray(traj.obs.action_mask)
    action = np.asarray(traj.action)
    assert action.shape == (TINY["num_steps"], TINY["num_envs"], agents)
    assert np.take_along_axis(mask, action[..., None], -1).all()
    assert (~mask).any()  # the mask did rule something out
    # with a memory, the critic's recurrent torso reads the global state and the policy's the agent's observation
    recurrent = jax.eval_shape(jf.recipes.MAPPO.create(SMAX, memory="gru", **TINY).init,
                               jax.random.PRNGKey(0)).params["params"]
    assert recurrent["critic_torso"]["embed"]["kernel"].shape == (state_dim + agents, width)
    assert recurrent["torso"]["embed"]["kernel"].shape == (mappo.env.observation_space.shape[1] + agents, width)


@pytest.mark.parametrize(("recipe", "env", "expected"), [
    ("PPO", MPE, "is a multi-agent environment (3 agents); PPO acts for one agent"),
    ("DQN", SMAX, "is a multi-agent environment (3 agents); DQN acts for one agent"),
    ("IPPO", "CartPole-v1", "has one agent; IPPO is a multi-agent recipe"),
    ("MAPPO", "Pendulum-v1", "has one agent; MAPPO is a multi-agent recipe"),
])
def test_a_recipe_for_the_other_kind_of_environment_is_refused(recipe: str, env: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        getattr(jf.recipes, recipe).create(env, num_envs=4)
    assert err.value.field == "env" and expected in str(err.value)


@pytest.fixture(scope="module")
def smax_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[jf.Program, jf.History, Path]:
    """MAPPO on SMAX 3m: a whole run, and checkpoints of the same run stopped at iteration 4."""
    program = jf.compile(jf.recipes.MAPPO.create(SMAX, **SMAX_SMALL), chunk_iterations=2)
    whole = program.run(jax.random.PRNGKey(0))
    directory = tmp_path_factory.mktemp("smax") / "checkpoints"
    program.run(jax.random.PRNGKey(0), iterations=4, checkpoints=Checkpoints(directory, every=2))
    return program, whole, directory


@pytest.mark.slow  # a whole MAPPO run on SMAX compiled
def test_a_run_reports_the_team_each_agent_and_the_win_rate(smax_run) -> None:
    _, whole, _ = smax_run
    assert {"episode_return", "episode_won", *(f"episode_return_agent{i}" for i in range(3))} <= set(whole.final)
    won, count = whole["episode_won"], whole["episode_count"]
    assert (count > 0).all() and ((won >= 0) & (won <= 1)).all()


@pytest.mark.slow  # the SMAX run's
def test_a_multi_agent_run_resumes_exactly(smax_run) -> None:
    program, whole, directory = smax_run
    resumed = program.run(program.restore(directory))
    assert [r["iteration"] for r in resumed.rows] == [6, 8]
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(resumed["episode_won"], whole["episode_won"][2:])


@pytest.mark.slow  # a run, its evaluation and its export compiled
def test_a_multi_agent_run_evaluates_loads_and_exports(tmp_path: Path) -> None:
    """``evaluate`` plays complete team episodes (MPE's end at its time limit: JaxMARL's
    ends an episode at the step taken once 25 were, its 26th); ``load_policy`` acts on
    one ``AgentObs`` or a batch, an action per agent; the exported policy (the
    observation's fields as a tuple) gives the same actions; ``--eval-every`` reports
    the team's greedy return."""
    from jaxrl_frag.app.cli import main

    run_dir = tmp_path / "ippo"
    assert main(["train", "ippo", "--env", MPE, "--num-envs", "4", "--num-steps", "8", "--total-steps", "64",
                 "--num-minibatches", "2", "--eval-every", "1", "--eval-episodes", "2", "--run-dir", str(run_dir)]) == 0
    metrics = (run_dir / "metrics.csv").read_text().splitlines()
    eval_return = metrics[0].split(",").index("eval_return")
    assert all(np.isfinite(float(row.split(",")[eval_return])) for row in metrics[1:])
    assert main(["evaluate", str(run_dir), "--episodes", "4"]) == 0
    rows = (run_dir / "eval.csv").read_text().splitlines()[1:]
    assert len(rows) == 4 and all(row.endswith(",26") for row in rows), rows
    obs = random_steps(envs.make(MPE, num_envs=5), 1)[0]
    batch = jax.tree.map(lambda x: x[0], obs)  # the 5 environments' first observations
    act, key = jf.load_policy(run_dir), jax.random.PRNGKey(0)
    actions = np.asarray(act(batch, key))
    assert actions.shape == (5, 3)
    np.testing.assert_array_equal(act(jax.tree.map(lambda x: x[2], batch), key), actions[2])
    exported = jax.export.deserialize(bytearray(jf.export_policy(run_dir, tmp_path / "policy.jax").read_bytes()))
    np.testing.assert_array_equal(exported.call(tuple(batch), key), actions)


def test_samples_with_an_action_mask_of_no_actions_merge_into_one_batch() -> None:
    """Continuous agents' action masks have no entries (``[T, N, agents, 0]``); the
    learner merges the time and environment axes of every field, those masks included."""
    from jaxrl_frag.primitives import flatten_batch

    fields = {"mask": jnp.zeros((8, 4, 3, 0), bool), "action": jnp.zeros((8, 4, 3, 5))}
    flat = flatten_batch(fields, 1)
    assert flat["mask"].shape == (32, 3, 0) and flat["action"].shape == (32, 3, 5)


@pytest.mark.slow  # compiles two recipes: make test runs it, make test-fast has the unit tests of its two fixes
@pytest.mark.parametrize(("recipe", "settings"), [("IPPO", {}), ("MAPPO", dict(shared_params=False))])
def test_continuous_actions_train_and_resume_exactly(recipe: str, settings: dict, tmp_path: Path) -> None:
    """Agents acting in a box (MABrax's kind, here on a cheap MPE task): a Gaussian per
    agent; the learner's samples and the checkpointed state carry an action mask of no
    actions (``[..., agents, 0]``), which orbax cannot write and a restore makes again."""
    algo = getattr(jf.recipes, recipe).create(CONTINUOUS, **TINY, **settings)
    agents, (dim,) = algo.env.num_agents, algo.env.action_space.shape
    assert algo.continuous and agents == 4
    program = jf.compile(algo, chunk_iterations=1)
    whole = program.run(jax.random.PRNGKey(0))
    assert whole.iteration == 2
    for name in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl"):
        assert np.isfinite(whole[name]).all(), name
    assert whole.state.obs.action_mask.shape == (TINY["num_envs"], agents, 0)
    assert whole.state.params["params"]["log_std"].shape == (agents, dim)
    program.run(jax.random.PRNGKey(0), iterations=1, checkpoints=Checkpoints(tmp_path, every=1))
    resumed = program.run(program.restore(tmp_path))
    assert [row["iteration"] for row in resumed.rows] == [2]
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    start = jax.jit(algo.init)(jax.random.PRNGKey(1))
    traj, *_ = jax.jit(algo.rollout)(start.params, start.env_state, start.obs, start.memory, jax.random.PRNGKey(2))
    assert traj.action.shape == (TINY["num_steps"], TINY["num_envs"], agents, dim)
    assert traj.action.dtype == jnp.float32


@pytest.mark.learning
def test_ippo_learns_simple_spread() -> None:
    """Uniformly random actions score -27.8 on MPE_simple_spread_v3 (960 episodes); at
    JaxMARL's IPPO settings with a constant learning rate, seeds 0-2 reach -21.2, -21.4
    and -21.7 in 3e5 steps."""
    algo = jf.recipes.IPPO.create(MPE, total_steps=300_000, anneal_lr=False)
    history = jf.compile(algo).run(jax.random.PRNGKey(0))
    assert history["episode_return"][-5:].mean() >= -23.0, history["episode_return"]


@pytest.mark.learning
@pytest.mark.long
def test_mappo_wins_smax_3m() -> None:
    """Uniformly random available actions win none of 1,423 battles of SMAX 3m against
    JaxMARL's heuristic enemy; MAPPO at its SMAX defaults (recurrent policy and critic,
    JaxMARL's settings) wins 79%, 77% and 77% of its battles over the last tenth of 1e6
    steps (seeds 0-2; with a feed-forward critic 62%, 69% and 66%; feed-forward throughout,
    before fallen units shared the team's return, 27%, 13% and 14%), and seed 0 64% to 67%
    over the last five rows of 5e5 steps, the run this test makes."""
    algo = jf.recipes.MAPPO.create(SMAX, total_steps=500_000)
    history = jf.compile(algo).run(jax.random.PRNGKey(0))
    assert history["episode_won"][-5:].mean() >= 0.4, history["episode_won"]


@pytest.mark.learning
@pytest.mark.long
def test_ippo_learns_mabrax_hopper() -> None:
    """Continuous actions: the same run with a learning rate of 1e-12 returns 79 over the
    last five rows of 5e5 steps of MABrax's hopper_3x1; IPPO at its MABrax defaults
    (JaxMARL's settings) 428 (seed 0; seeds 0-2 as a population: 475, 448, 504)."""
    algo = jf.recipes.IPPO.create("jaxmarl:hopper_3x1", total_steps=500_000)
    history = jf.compile(algo).run(jax.random.PRNGKey(0))
    assert np.nanmean(history["episode_return"][-5:]) >= 300.0, history["episode_return"]


@pytest.mark.slow  # two placements compiled
def test_parameters_per_agent_split_over_an_agents_mesh_axis_and_the_run_is_the_same(tmp_path: Path) -> None:
    from jaxrl_frag.sharding import DataParallel

    algo = jf.recipes.IPPO.create(SWITCH_RIDDLE, shared_params=False, **{**TINY, "total_steps": 4 * 8 * 4})
    policy = DataParallel(6, shuffle="exact", agent_shards=3)  # 2 (environments) x 3 (agents)
    program = jf.compile(algo, policy, chunk_iterations=2)
    history = program.run(jax.random.PRNGKey(0))
    kernel = history.state.params["params"]["pi"]["Dense_0"]["kernel"]  # [agents, D, 64]
    assert kernel.sharding.spec[0] == "agents" and kernel.addressable_shards[0].data.shape[0] == 1
    alone = jf.compile(algo, chunk_iterations=2).run(jax.random.PRNGKey(0))
    for a, b in zip(jax.tree.leaves(history.state), jax.tree.leaves(alone.state), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    explanation = program.explain()
    assert "opt_state, params (mesh axis agents)" in explanation.placement
    assert "env_state, obs (mesh axis data)" in explanation.placement
    assert "opt_state, params (mesh axis agents)" in explanation.draw(tmp_path / "graph.dot").read_text()
    with pytest.raises(ConfigError, match="declares no state with an 'agents' axis"):
        jf.compile(jf.recipes.IPPO.create(SWITCH_RIDDLE, **TINY), policy)
    with pytest.raises(ConfigError) as err:  # three agents on two devices
        jf.compile(jf.recipes.IPPO.create(SWITCH_RIDDLE, shared_params=False, **TINY), DataParallel(2, agent_shards=2))
    assert err.value.field == "agent_shards" and "'agents' axis of 3" in str(err.value)


@pytest.mark.learning
def test_pqn_vdn_learns_simple_spread() -> None:
    """PQN-VDN at JaxMARL's MPE settings: -21.4, -21.5 and -21.1 over the last 5 rows after
    1e5 steps (seeds 0-2) and -18.3 after 3e5 (seed 0), against -27.8 for uniformly random
    actions."""
    history = jf.compile(jf.recipes.PQNVDN.create(MPE, total_steps=100_000)).run(jax.random.PRNGKey(0))
    returns = history["episode_return"]
    assert np.mean(returns[np.isfinite(returns)][-5:]) >= -22.5, returns


def test_qmix_mixes_monotonically_and_explores_within_each_agents_mask() -> None:
    """The team's value rises with every agent's value (the mixer's weights from the state
    are non-negative), and exploring agents act among the actions each may take (the
    speaker of speaker_listener takes 3 of 5)."""
    algo = jf.recipes.QMIX.create("jaxmarl:MPE_simple_speaker_listener_v4", num_envs=64, num_steps=4,
                                  total_steps=64 * 4 * 2, learning_starts=0, buffer_size=64 * 8)
    state = algo.init(jax.random.PRNGKey(0))
    q = jax.random.normal(jax.random.PRNGKey(1), (64, 2)) * 10
    slope = jax.grad(lambda q: algo.network.apply(state.policy, q, state.obs.state, method="mix").sum())(q)
    assert (slope >= 0).all() and (slope > 0).any()
    action, _ = algo.act(state.policy, state.obs, jax.random.PRNGKey(2), jnp.int32(0))  # epsilon 1: every action random
    assert action.shape == (64, 2)
    assert np.take_along_axis(np.asarray(state.obs.action_mask), np.asarray(action)[..., None], -1).all()


@pytest.mark.learning
def test_qmix_learns_simple_spread() -> None:
    """QMIX at its MPE defaults (2e5 steps): -17.4, -17.2 and -17.4 over the last 5 rows
    (seeds 0-2), against -27.8 for uniformly random actions and -41.4 for the same run
    with a learning rate of 1e-12."""
    history = jf.compile(jf.recipes.QMIX.create(MPE)).run(jax.random.PRNGKey(0))
    returns = history["episode_return"]
    assert np.mean(returns[np.isfinite(returns)][-5:]) >= -20.0, returns


def test_a_named_axis_on_the_environment_batch_axis_is_refused() -> None:
    from jaxrl_frag.sharding.mesh import make_mesh, split_state

    mesh = make_mesh(data=2, agents=2)
    state = {"obs": jax.ShapeDtypeStruct((4, 2, 5), jnp.float32)}  # [environments, agents, features]
    with pytest.raises(ConfigError, match="where its environment batch is"):
        split_state(state, {"obs": 0}, mesh, "data", named_axes={"agents": {"obs": 0}})
    placed = split_state(state, {"obs": 0}, mesh, "data", named_axes={"agents": {"obs": 1}})
    assert tuple(placed["obs"].spec) == ("data", "agents", None)


def test_a_fallen_unit_shares_the_teams_later_rewards() -> None:
    """SMAX gives a fallen unit the team's reward: its return runs on to the team's
    episode end (GAE's cut), though it terminated at its fall (its memory's reset)."""
    ippo = jf.recipes.IPPO.create(MPE, **TINY)
    # 3 agents, one environment, 4 steps: agent 0 falls at step 1, the battle is won at step 3
    terminated = np.zeros((4, 1, 3), bool)
    terminated[1:, 0, 0] = True
    terminated[3] = True
    truncated = np.zeros_like(terminated)
    traj = Transition(*(None,) * 5, jnp.asarray(terminated), jnp.asarray(truncated), None)
    ends, cut = ippo.returns_end(traj)
    np.testing.assert_array_equal(ends, np.broadcast_to(np.arange(4)[:, None, None] == 3, (4, 1, 3)))
    assert not np.asarray(cut).any()
    reward = np.zeros((4, 1, 3), np.float32)
    reward[3] = 1.0  # the win, to every agent alive or fallen
    zeros = jnp.zeros((4, 1, 3))
    _, targets = gae(jnp.asarray(reward), zeros, ends, cut, zeros, jnp.zeros((1, 3)), 0.9, 1.0)
    np.testing.assert_allclose(targets[0, 0], [0.9**3] * 3, rtol=1e-6)  # the fallen agent 0 as the others
