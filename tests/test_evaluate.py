"""Running a trained policy: ``jaxrl-frag evaluate`` (complete episodes in one program,
eval.csv, a GIF), ``load_policy`` and ``export_policy`` (StableHLO that runs with jax
alone), and every recipe's ``policy_fn``."""

from __future__ import annotations

import csv
import subprocess
import sys
import textwrap
from pathlib import Path

import av
import jax
import numpy as np
import pytest
from PIL import Image

import jaxrl_frag as jf
from jaxrl_frag import envs
from jaxrl_frag.app import evaluation
from jaxrl_frag.app.cli import main

TINY = ["--num-envs", "4", "--num-steps", "16", "--total-steps", "512", "--chunk-iterations", "2"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A briefly trained PPO run on CartPole-v1, with its checkpoints."""
    path = tmp_path_factory.mktemp("evaluate") / "ppo"
    assert main(["train", "ppo", "--env", "CartPole-v1", *TINY, "--run-dir", str(path)]) == 0
    return path


def test_a_masked_cartpole_run_draws_cartpole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An id with options (``CartPole-v1@obs=0,2``) is drawn by its environment's renderer: the mask
    changes what the policy observes, not the state the frames are drawn from."""
    run = tmp_path / "masked"
    assert main(["train", "ppo", "--env", "CartPole-v1@obs=0,2", *TINY, "--run-dir", str(run)]) == 0
    gif = tmp_path / "episode.gif"
    assert main(["evaluate", str(run), "--episodes", "1", "--video", str(gif)]) == 0
    out = capsys.readouterr().out
    with Image.open(gif) as image:
        frames, size = image.n_frames, image.size
    assert size == (400, 240) and f"one episode, {frames} steps, return {frames:.2f}" in out, out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_evaluate_writes_eval_csv_a_gif_and_an_mp4_and_changes_nothing_else(
        tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _files(tiny_run)
    gif = tmp_path / "episode.gif"
    assert main(["evaluate", str(tiny_run), "--episodes", "5", "--video", str(gif)]) == 0
    out = capsys.readouterr().out
    assert "greedy policy" in out and "over 5 episodes" in out and "95% interval" in out, out
    with open(tiny_run / "eval.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [list(row) for row in rows] == [["episode", "return", "length"]] * 5
    assert [int(row["episode"]) for row in rows] == list(range(5))
    # CartPole pays 1 a step: a complete episode's return is its length
    assert all(float(row["return"]) == int(row["length"]) >= 8 for row in rows), rows
    mean = np.mean([float(row["return"]) for row in rows])
    assert f"mean return {mean:.2f}" in out, out
    after = _files(tiny_run)
    assert after.pop("eval.csv") and after == before  # checkpoints, metrics.csv, config.json: as they were
    with Image.open(gif) as image:
        frames, size = image.n_frames, image.size
    assert size == (400, 240) and f"one episode, {frames} steps, return {frames:.2f}" in out, out
    # the same episode as an H.264 MP4, a frame a step at CartPole's 50 steps a second
    mp4 = tmp_path / "episode.mp4"
    assert main(["evaluate", str(tiny_run), "--episodes", "5", "--video", str(mp4)]) == 0
    with av.open(str(mp4)) as video:
        stream = video.streams.video[0]
        assert (stream.codec_context.name, stream.width, stream.height, stream.average_rate) == ("h264", 400, 240, 50)
        assert sum(1 for _ in video.decode(stream)) == frames
    # a second evaluation replaces its own eval.csv
    assert main(["evaluate", str(tiny_run), "--episodes", "3", "--sample", "--seed", "1"]) == 0
    assert len((tiny_run / "eval.csv").read_text().splitlines()) == 4
    assert "sampled policy" in capsys.readouterr().out


def test_episodes_are_each_environments_first_ones(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With fewer environments than episodes, each plays several in a row and every one is
    complete; episode i of environment e comes at i * environments + e."""
    trained = evaluation.restore(tiny_run)
    monkeypatch.setattr(evaluation, "ENVS_MAX", 3)
    many = evaluation.evaluate(trained, 7, seed=2)
    assert many.returns.shape == many.lengths.shape == (7,)
    assert np.array_equal(many.returns, many.lengths) and (many.lengths >= 8).all(), many
    monkeypatch.setattr(evaluation, "ENVS_MAX", 256)
    first = evaluation.evaluate(trained, 3, seed=2)  # the same three environments, each's first episode
    assert np.array_equal(first.returns, many.returns[:3])


def test_a_population_members_policy_restores_onto_one_device(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A population trained over two devices (each member on its own) restores member by member."""
    path = tmp_path / "population"
    assert main(["train", "ppo", "--env", "CartPole-v1", *TINY, "--seeds", "2", "--policy", "population",
                 "--devices", "2", "--run-dir", str(path)]) == 0
    members = [evaluation.restore(path, member) for member in (0, 1)]
    assert all(len(m.state.params["params"]["pi"]["Dense_0"]["kernel"].devices()) == 1 for m in members)
    assert not np.array_equal(*(m.state.params["params"]["pi"]["Dense_0"]["kernel"] for m in members))
    capsys.readouterr()
    assert main(["evaluate", str(path), "--member", "1", "--episodes", "2"]) == 0
    assert "member 1)" in capsys.readouterr().out
    assert main(["evaluate", str(path), "--member", "2"]) == 2
    assert "member=2: the population has members 0 to 1" in capsys.readouterr().err


@pytest.mark.parametrize("staleness", [0, 1])
def test_an_actor_learner_run_restores_onto_one_device(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], staleness: int) -> None:
    """An actor-learner checkpoint holds the pipeline (what was in flight between the
    groups too): it restores onto one device, its fingerprint checked, and the
    algorithm's state is the run's own."""
    path = tmp_path / "actor-learner"
    assert main(["train", "impala", "--env", "CartPole-v1", *TINY, "--policy", "actor-learner", "--actor-devices", "1",
                 "--learner-devices", "1", "--staleness", str(staleness), "--run-dir", str(path)]) == 0
    trained = evaluation.restore(path)
    assert {d for x in jax.tree.leaves(trained.state) for d in x.devices()} == {jax.devices()[0]}
    algo = jf.recipes.IMPALA.create("CartPole-v1", num_envs=4, num_steps=16, total_steps=512)
    program = jf.compile(algo, jf.sharding.ActorLearner(1, 1, staleness=staleness))
    run = program.algorithm_state(program.run(jax.random.PRNGKey(0)).state)
    assert trained.iteration == algo.num_iterations
    jax.tree.map(np.testing.assert_array_equal, trained.state.params, run.params)
    capsys.readouterr()
    assert main(["evaluate", str(path), "--episodes", "2"]) == 0
    assert f"(iteration {algo.num_iterations})" in capsys.readouterr().out


@pytest.mark.learning
def test_the_trained_cartpole_policy_balances_the_pole_for_every_step(
        cartpole_program: jf.Program, cartpole_run: jf.History) -> None:
    """Issue 22's yardstick: PPO's 5e5-step CartPole run, greedy, returns 500 in each of 10 episodes."""
    trained = evaluation.Trained(cartpole_program.algorithm, cartpole_run.state, cartpole_run.iteration, None)
    episodes = evaluation.evaluate(trained, 10)
    assert (episodes.returns == 500).all(), episodes


def test_load_policy_acts_on_one_observation_or_a_batch(tiny_run: Path) -> None:
    act = jf.load_policy(tiny_run)
    obs = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    key = jax.random.PRNGKey(0)
    batch = np.asarray(act(obs, key))
    assert batch.shape == (6,) and set(batch.tolist()) <= {0, 1}
    assert [int(act(o, key)) for o in obs] == batch.tolist()  # greedy: the key does not matter


@pytest.mark.parametrize("shape", [(3,), (6, 5), (2, 3, 4), ()])
def test_load_policy_names_the_observation_shape_it_takes(tiny_run: Path, shape: tuple[int, ...]) -> None:
    act = jf.load_policy(tiny_run)
    with pytest.raises(ValueError) as error:
        act(np.zeros(shape, np.float32), jax.random.PRNGKey(0))
    message = str(error.value)
    assert f"obs has shape {shape}" in message and "one observation of shape (4,)" in message, message
    assert "a batch of shape [N, *(4,)]" in message and "CartPole-v1" in message, message


@pytest.mark.slow
def test_an_exported_policy_runs_with_jax_alone(tiny_run: Path, tmp_path: Path) -> None:
    path = jf.export_policy(tiny_run, tmp_path / "policy.jax", greedy=False)
    obs = np.random.default_rng(1).normal(size=(9, 4)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    script = textwrap.dedent(f"""
        import sys
        import jax, numpy as np
        exported = jax.export.deserialize(bytearray(open({str(path)!r}, "rb").read()))
        actions = exported.call(np.load({str(tmp_path / "obs.npy")!r}), jax.random.PRNGKey(7))
        print(" ".join(str(int(a)) for a in np.asarray(actions)))
        print(sorted(m.split(".")[0] for m in sys.modules if m.startswith(("jaxrl_frag", "flax", "gymnax", "optax"))))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    actions, modules = done.stdout.splitlines()
    expected = np.asarray(jf.load_policy(tiny_run, greedy=False)(obs, jax.random.PRNGKey(7)))
    assert actions.split() == [str(a) for a in expected.tolist()]
    assert modules == "[]"


@pytest.mark.parametrize("recipe", ["ppo", "a2c", "impala", "dqn", "sac", "pqn", "td3", "qrdqn"])
def test_every_recipe_acts_from_its_state(recipe: str) -> None:
    """Greedy actions ignore the key, sampled ones vary with it, and both are actions of the environment."""
    env_id = "Pendulum-v1" if recipe in ("sac", "td3") else "CartPole-v1"
    algo = jf.recipes.get(recipe).create(env_id, num_envs=4, hidden=(8,))
    state = algo.init(jax.random.PRNGKey(0))
    obs = np.random.default_rng(0).normal(size=(64, *algo.env.observation_space.shape)).astype(np.float32)
    greedy, sample = jax.jit(algo.policy_fn(state, True)), jax.jit(algo.policy_fn(state, False))
    keys = jax.random.split(jax.random.PRNGKey(1), 2)
    assert np.array_equal(greedy(obs, keys[0]), greedy(obs, keys[1]))
    space = algo.env.action_space
    for act in (greedy, sample):
        action = np.asarray(act(obs, keys[0]))
        if isinstance(space, envs.Box):
            assert action.shape == (64, *space.shape) and (action >= space.low).all() and (action <= space.high).all()
        else:
            assert action.shape == (64,) and ((action >= 0) & (action < space.n)).all()
    if recipe not in ("dqn", "pqn", "qrdqn"):  # epsilon-greedy at epsilon_end rarely explores 64 observations at all
        assert not np.array_equal(sample(obs, keys[0]), sample(obs, keys[1]))


def test_a_policy_sees_observations_standardised_as_in_training() -> None:
    key = jax.random.PRNGKey(3)
    normalizing = envs.make("Pendulum-v1", num_envs=4, normalize_obs=True, scale_reward=True)
    state, seen = normalizing.reset(key)
    _, raw = envs.make("Pendulum-v1", num_envs=4).reset(key)
    assert not np.allclose(raw, seen)
    np.testing.assert_allclose(normalizing.observation_fn(state)(raw), seen, rtol=1e-6)
