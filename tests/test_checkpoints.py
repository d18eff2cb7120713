"""Checkpoints through the Python API: restore onto another mesh, fall back past damaged
steps, and stop at the first non-finite iteration with the fragment named."""

from __future__ import annotations

import errno
import shutil
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from poisoned_env import PoisonedRewards

import jaxrl_frag as jf
from jaxrl_frag import envs
from jaxrl_frag.checkpoints import Checkpoints
from jaxrl_frag.errors import NonFiniteError
from jaxrl_frag.sharding import DataParallel
from jaxrl_frag.writes import WriteError

SMALL = dict(num_envs=8, num_steps=16, total_steps=8 * 16 * 12)  # 12 iterations


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[jf.Program, Path]:
    """A single-device program, and its checkpoints at iterations 4 and 8 (stopped there)."""
    program = jf.compile(jf.recipes.PPO.create("CartPole-v1", **SMALL), chunk_iterations=2)
    directory = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    program.run(jax.random.PRNGKey(0), iterations=8, checkpoints=Checkpoints(directory, every=4))
    return program, directory


def test_restore_on_2_devices_continues_as_on_4(tmp_path: Path) -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", **SMALL)
    on4 = jf.compile(algo, DataParallel(4, shuffle="exact"), chunk_iterations=2)
    on4.run(jax.random.PRNGKey(1), iterations=6, checkpoints=Checkpoints(tmp_path, every=6))
    on2 = jf.compile(algo, DataParallel(2, shuffle="exact"), chunk_iterations=2)
    from_4, from_2 = on4.restore(tmp_path), on2.restore(tmp_path)
    assert from_4.iteration == from_2.iteration == 6
    assert {d.id for d in jax.tree.leaves(from_2.state)[0].sharding.device_set} == {0, 1}
    ended_on_4, ended_on_2 = on4.run(from_4), on2.run(from_2)
    assert ended_on_2.iteration == ended_on_4.iteration == 12
    for a, b in zip(jax.tree.leaves(ended_on_2.state.params), jax.tree.leaves(ended_on_4.state.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(ended_on_2["loss"], ended_on_4["loss"], rtol=2e-4)


class _SlowCommits(Checkpoints):
    """Checkpoints whose saves reach the disk only when waited for, as an async commit
    still running on a loaded machine would."""

    def __init__(self, directory: Path, every: int):
        super().__init__(directory, every)
        self.started: list[int] = []
        self.on_disk: list[int] = []

    def save(self, iteration: int, state: object, meta: dict) -> None:
        super().save(iteration, state, meta)
        self.started.append(iteration)

    def wait(self) -> None:
        super().wait()
        self.on_disk = list(self.started)


def test_no_row_passes_a_checkpoint_before_it_is_on_disk(saved: tuple[jf.Program, Path], tmp_path: Path) -> None:
    """What metrics.csv holds is what ``on_chunk`` gets: had a kill come after any row, every
    checkpoint that row is past would be there for the resume (cli/train.py relies on it)."""
    program, _ = saved
    checkpoints = _SlowCommits(tmp_path, every=4)
    seen: list[tuple[float, list[int], list[int]]] = []
    program.run(jax.random.PRNGKey(0), iterations=12, checkpoints=checkpoints,
                on_chunk=lambda row: seen.append((row["iteration"], list(checkpoints.started), list(checkpoints.on_disk))))
    assert [row for row, _, _ in seen] == [2, 4, 6, 8, 10, 12]
    for row, started, on_disk in seen:
        assert [step for step in started if step < row] == [step for step in on_disk if step < row], (row, seen)
    assert seen[2][1:] == ([4], [4]) and seen[1][1:] == ([], [])  # row 4 before its save, row 6 after its commit


def _truncate_largest_file(step: Path) -> None:
    largest = max((p for p in step.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])


def _flip_bytes_of_largest_file(step: Path) -> None:
    largest = max((p for p in step.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 64):
        data[i] ^= 0xFF
    largest.write_bytes(bytes(data))


DAMAGE = {
    "array data truncated": _truncate_largest_file,
    "array data overwritten": _flip_bytes_of_largest_file,
    "state item deleted": lambda step: shutil.rmtree(step / "state"),
    "metadata garbled": lambda step: (step / "meta" / "metadata").write_text("{not json"),
    "step left empty": lambda step: [shutil.rmtree(p) if p.is_dir() else p.unlink() for p in step.iterdir()],
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_newest_step_falls_back_to_the_previous(saved: tuple[jf.Program, Path], tmp_path: Path,
                                                       damage: str) -> None:
    program, pristine = saved
    directory = tmp_path / "checkpoints"
    shutil.copytree(pristine, directory)
    assert sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) == [4, 8]
    DAMAGE[damage](directory / "8")
    with pytest.warns(UserWarning, match="checkpoint step 8 .* is unusable"):
        checkpoint = program.restore(directory)
    assert checkpoint.iteration == 4
    intact = program.restore(pristine)  # the undamaged copy gives step 8
    assert intact.iteration == 8
    # resuming from the fallback reproduces step 8 exactly
    again = program.run(checkpoint, iterations=8)
    for a, b in zip(jax.tree.leaves(again.state), jax.tree.leaves(intact.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_an_array_of_no_elements_is_left_out_of_a_step_and_made_again(tmp_path: Path) -> None:
    """orbax refuses to write an array with no elements (continuous agents' action mask,
    ``[N, agents, 0]``, is one): a step leaves it out and a restore makes it again."""
    state = {"mask": jnp.zeros((4, 3, 0), bool), "x": jnp.arange(6.0)}
    manager = Checkpoints(tmp_path / "checkpoints")
    manager.save(1, state, {})
    restored = manager.restore(state)
    manager.close()
    assert restored.iteration == 1
    assert restored.state["mask"].shape == (4, 3, 0) and restored.state["mask"].dtype == bool
    np.testing.assert_array_equal(np.asarray(restored.state["x"]), np.arange(6.0))


@pytest.mark.parametrize("transform", ["population", "boost", "evaluated"])
def test_a_setting_a_wrapped_recipes_saved_configuration_lacks_counts_as_its_default(transform: str) -> None:
    """A transform's configuration holds its recipe's settings (``--seeds``, ``--boost``,
    ``--eval-every`` runs): one added to the recipe since the run was saved (PPO's
    ``clip_value``) reads as its default there too, and only there."""
    from jaxrl_frag.algorithms import setting_defaults
    from jaxrl_frag.checkpoints import changed_settings
    from jaxrl_frag.transforms import Population
    from jaxrl_frag.transforms.boost import Boosted
    from jaxrl_frag.transforms.evaluated import Evaluated

    ppo = jf.recipes.PPO.create("CartPole-v1", num_envs=4, num_steps=8, total_steps=64)
    algorithm = {"population": lambda: Population.of([ppo, ppo], [0, 1]),
                 "boost": lambda: Boosted.create(ppo, ladder=(4, 8)),
                 "evaluated": lambda: Evaluated.create(ppo, 1, 2)}[transform]()
    now = algorithm.config()
    saved = {name: value for name, value in now.items() if name != "clip_value"}
    assert now["clip_value"] is True
    assert changed_settings(saved, now, (), setting_defaults(algorithm)) == {}
    assert changed_settings(saved, {**now, "clip_value": False}, (), setting_defaults(algorithm)) == {
        "clip_value": "clip_value: True -> False"}


envs.register("PoisonedCartPole-v1", lambda after=16 * 5: PoisonedRewards(envs.GymnaxEnv.make("CartPole-v1"), after))


def test_nan_from_the_environment_names_the_iteration_and_the_actor(tmp_path: Path) -> None:
    program = jf.compile(jf.recipes.PPO.create("PoisonedCartPole-v1", **SMALL), chunk_iterations=2)
    rows = []
    checkpoints = Checkpoints(tmp_path, every=2)
    with pytest.raises(NonFiniteError) as error:
        program.run(jax.random.PRNGKey(0), on_chunk=rows.append, checkpoints=checkpoints)
    # steps 0..79 are fine; step 80 (the 6th iteration of 16 steps) carries the first NaN
    assert error.value.iteration == 6 and error.value.fragment == "actor.rollout"
    assert {"state.env_state", "state.params", "metrics.loss"} <= set(error.value.outputs)
    assert [row["iteration"] for row in rows] == [2, 4]
    assert checkpoints.steps() == [2, 4]
    assert all(np.isfinite(v).all() for v in jax.tree.leaves(program.restore(tmp_path).state))


def test_nan_written_to_the_replay_buffer_stops_the_run_at_its_iteration() -> None:
    # DQN learning from iteration 8 on: until then the NaN rewards of steps 80.. live in the buffer alone (and in
    # episode returns once an episode ends), which its finiteness check reads in the rows each iteration adds
    dqn = jf.recipes.DQN.create("PoisonedCartPole-v1", **SMALL, learning_starts=8 * 16 * 8, buffer_size=8 * 64)
    with pytest.raises(NonFiniteError) as error:
        jf.compile(dqn, chunk_iterations=2).run(jax.random.PRNGKey(0))
    assert error.value.iteration == 6 and error.value.fragment == "actor.rollout"
    assert "state.buffer" in error.value.outputs and "state.policy" not in error.value.outputs


def test_diverging_learning_rate_names_the_learner() -> None:
    program = jf.compile(jf.recipes.PPO.create("CartPole-v1", lr=1e30, **SMALL), chunk_iterations=4)
    with pytest.raises(NonFiniteError, match="non-finite values at iteration") as error:
        program.run(jax.random.PRNGKey(0))
    assert error.value.fragment == "learner.learn" and "state.params" in error.value.outputs


def test_cli_exits_3_on_nan_keeping_the_last_good_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jaxrl_frag.app.cli import main

    run_dir = tmp_path / "run"
    status = main(["train", "ppo", "--env", "PoisonedCartPole-v1", "--num-envs", "8", "--num-steps", "16",
                   "--total-steps", str(SMALL["total_steps"]), "--chunk-iterations", "2", "--checkpoint-every", "2",
                   "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert status == 3, err
    assert "non-finite values at iteration 6" in err and "actor.rollout" in err
    assert f"the last good checkpoint is iteration 4 in {run_dir.absolute() / 'checkpoints'}" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["2", "4"]
    assert [float(r.split(",")[0]) for r in (run_dir / "metrics.csv").read_text().splitlines()[1:]] == [2.0, 4.0]


def test_population_with_its_hyperparameters_resumes_exactly(tmp_path: Path) -> None:
    from jaxrl_frag.transforms import Population

    members = [jf.recipes.PPO.create("CartPole-v1", lr=lr, **SMALL) for lr in (1e-4, 1e-3)]
    program = jf.compile(Population.of(members, [0, 1]), chunk_iterations=2)
    whole = program.run(jax.random.PRNGKey(0))
    program.run(jax.random.PRNGKey(0), iterations=6, checkpoints=Checkpoints(tmp_path, every=2))
    checkpoint = program.restore(tmp_path)
    assert checkpoint.iteration == 6 and checkpoint.meta["config"]["lr"] == pytest.approx([1e-4, 1e-3])
    resumed = program.run(checkpoint)
    assert [r["iteration"] for r in resumed.rows] == [8, 10, 12]
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(resumed["loss"], whole["loss"][3:])


def test_dqn_with_its_prioritized_replay_buffer_resumes_exactly(tmp_path: Path) -> None:
    # the buffer (items, sum tree, largest priority) is part of the checkpointed state
    algo = jf.recipes.DQN.create("CartPole-v1", num_envs=4, num_steps=8, num_updates=2, minibatch_size=32,
                                 buffer_size=128, learning_starts=64, total_steps=4 * 8 * 12, prioritized=True)
    program = jf.compile(algo, chunk_iterations=2)
    whole = program.run(jax.random.PRNGKey(0))
    program.run(jax.random.PRNGKey(0), iterations=6, checkpoints=Checkpoints(tmp_path, every=2))
    resumed = program.run(program.restore(tmp_path))
    assert int(resumed.state.buffer.added) == 12 * 8 > algo.buffer_size // algo.num_envs  # wrapped around
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(resumed["loss"], whole["loss"][3:])


def test_a_save_where_no_step_can_be_made_raises_naming_the_directory_and_leaves_no_thread(tmp_path: Path) -> None:
    """orbax makes a step's folder in a thread of its own; where that fails, its other
    threads wait for the folder forever and the process cannot end."""
    (tmp_path / "checkpoints").write_text("a user's file\n")
    checkpoints = Checkpoints(tmp_path / "checkpoints", every=1)
    before = {t for t in threading.enumerate() if not t.daemon}
    with pytest.raises(WriteError) as raised:
        checkpoints.save(1, {"w": jnp.ones(3)}, {})
    checkpoints.close()
    assert raised.value.filename == str(tmp_path / "checkpoints") and raised.value.errno == errno.ENOTDIR
    assert {t for t in threading.enumerate() if not t.daemon} <= before
    assert (tmp_path / "checkpoints").read_text() == "a user's file\n"
