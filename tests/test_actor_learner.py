"""ActorLearner: actor and learner fragments on disjoint device groups, pipelined with
bounded staleness, with reduced-precision transfers between them; and IMPALA."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_frag as jf
from jaxrl_frag import ConfigError
from jaxrl_frag.checkpoints import Checkpoints
from jaxrl_frag.errors import NonFiniteError
from jaxrl_frag.sharding import ActorLearner, DataParallel, SingleDevice
from jaxrl_frag.transforms import packing, precision

SMALL = dict(num_envs=8, num_steps=32, total_steps=8 * 32 * 4)  # 4 iterations
RECIPES = Path(__file__).parent.parent / "recipes"


def leaves(tree: object) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def without_sps(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "sps"} for row in rows]


def run(algo: jf.Algorithm, policy: jf.sharding.Policy, seed: int = 3) -> tuple[jf.Program, jf.History]:
    program = jf.compile(algo, policy, chunk_iterations=2)
    return program, program.run(jax.random.PRNGKey(seed))


@pytest.mark.parametrize("recipe", ["PPO", "IMPALA"])
def test_synchronous_equals_single_device(recipe: str) -> None:
    # 2 actor devices + 2 learner devices of the 8; exact shuffling on the learner group
    algo = getattr(jf.recipes, recipe).create("CartPole-v1", num_minibatches=4, **SMALL)
    _, single = run(algo, SingleDevice())
    program, split = run(algo, ActorLearner(2, 2, staleness=0, shuffle="exact"))
    for x, y in zip(leaves(program.algorithm_state(split.state).params), leaves(single.state.params), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    for name in ("episode_return", "episode_count", "loss", "entropy"):
        np.testing.assert_allclose(split[name], single[name], rtol=1e-5, atol=1e-6)


def test_impala_exact_data_parallel_equals_single_device() -> None:
    algo = jf.recipes.IMPALA.create("CartPole-v1", num_minibatches=2, **SMALL)
    _, single = run(algo, SingleDevice())
    _, parallel = run(algo, DataParallel(4, shuffle="exact"))
    for x, y in zip(leaves(parallel.state.params), leaves(single.state.params), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def lagged_program() -> jf.Program:
    algo = jf.recipes.PPO.create("CartPole-v1", **{**SMALL, "total_steps": 8 * 32 * 6})
    return jf.compile(algo, ActorLearner(2, 2, staleness=1), chunk_iterations=2)


def test_one_step_lag_is_deterministic_and_not_synchronous(lagged_program: jf.Program) -> None:
    first = lagged_program.run(jax.random.PRNGKey(5))
    second = lagged_program.run(jax.random.PRNGKey(5))
    assert without_sps(first.rows) == without_sps(second.rows)
    for x, y in zip(leaves(first.state), leaves(second.state), strict=True):
        np.testing.assert_array_equal(x, y)
    synchronous = jf.compile(lagged_program.algorithm, ActorLearner(2, 2, staleness=0), chunk_iterations=2)
    params = synchronous.algorithm_state(synchronous.run(jax.random.PRNGKey(5)).state).params
    lagged = lagged_program.algorithm_state(first.state).params
    assert max(np.abs(x - y).max() for x, y in zip(leaves(params), leaves(lagged), strict=True)) > 1e-4


def test_lagged_run_resumes_exactly(lagged_program: jf.Program, tmp_path: Path) -> None:
    whole = lagged_program.run(jax.random.PRNGKey(7))
    manager = Checkpoints(tmp_path / "ckpt", every=2)
    lagged_program.run(jax.random.PRNGKey(7), iterations=2, checkpoints=manager)
    manager.close()
    resumed = lagged_program.run(lagged_program.restore(tmp_path / "ckpt"))
    assert without_sps(resumed.rows) == without_sps(whole.rows[1:])
    for x, y in zip(leaves(resumed.state), leaves(whole.state), strict=True):
        np.testing.assert_array_equal(x, y)


def test_state_lives_on_the_two_groups(lagged_program: jf.Program) -> None:
    state = lagged_program.init(jax.random.PRNGKey(0))
    devices = jax.devices()
    actor, learner = set(devices[:2]), set(devices[2:4])
    algo_state = lagged_program.algorithm_state(state)
    assert algo_state.obs.sharding.device_set == actor
    assert algo_state.obs.addressable_shards[0].data.shape == (4, 4)  # 8 environments over 2 actor devices
    assert all(x.sharding.device_set == learner for x in jax.tree.leaves(algo_state.params))
    assert all(x.sharding.device_set == actor for x in jax.tree.leaves(state.lagged))
    batched, replicated = state.in_flight  # the trajectory and the actor's metrics, packed as bytes
    assert batched.sharding.device_set == replicated.sharding.device_set == learner
    assert batched.shape[0] == 8 and batched.addressable_shards[0].data.shape[0] == 4


@pytest.mark.learning
@pytest.mark.parametrize("recipe, steps, threshold", [("PPO", 500_000, 450), ("IMPALA", 1_000_000, 400)])
def test_learns_cartpole_with_one_step_lag(recipe: str, steps: int, threshold: float) -> None:
    # random play scores about 22; the recipes reach 500 under SingleDevice
    algo = getattr(jf.recipes, recipe).create("CartPole-v1", total_steps=steps)
    history = jf.compile(algo, ActorLearner(1, 1, staleness=1), chunk_iterations=16).run(jax.random.PRNGKey(0))
    # the last five rows (a short last row may see no episode end)
    assert np.nanmean(history["episode_return"][-5:]) >= threshold, history["episode_return"][-10:]


def test_explain_shows_groups_transfers_and_their_bytes_per_precision() -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", **SMALL)
    program = jf.compile(algo, ActorLearner(2, 2, staleness=1, transfer_dtype="bfloat16"), chunk_iterations=2)
    explanation = program.explain()
    text = str(explanation)
    assert "actor fragments on 2 cpu device(s) [0,1], learner fragments on 2 [2,3]" in text
    assert re.search(r"actor -> learner\s+actor.rollout.traj", text) and "learner -> actor   state.params" in text
    names = {(t.direction, t.name) for t in explanation.transfers}
    assert names == {("actor -> learner", "actor.rollout.traj"), ("actor -> learner", "actor.rollout.obs"),
                     ("actor -> learner", "actor metrics, flags"), ("learner -> actor", "state.params")}
    f32, bf16, int8 = (explanation.transfer_bytes(d) for d in precision.TRANSFER_DTYPES)
    params = sum(x.size for x in jax.tree.leaves(jax.eval_shape(algo.init, jax.random.PRNGKey(0)).params))
    assert f32 >= 4 * (params + algo.batch_size * 4)  # at least the parameters and the observations
    assert 0.5 * f32 <= bf16 <= 0.6 * f32 and 0.25 * f32 <= int8 <= 0.4 * f32, (f32, bf16, int8)
    # the figures are the bytes of the arrays that actually cross
    state = program.init(jax.random.PRNGKey(0))
    assert sum(x.nbytes for x in jax.tree.leaves((state.in_flight, state.lagged[-1]))) == bf16
    # the learner's gradient all-reduce is inside its group; nothing else is collective
    assert {c.kind for c in explanation.collectives} == {"all-reduce"}


@pytest.mark.parametrize("dtype, tolerance", [("bfloat16", 2.0**-8), ("int8", 0.5 / 127)])
def test_encodings_round_trip_within_their_precision(dtype: str, tolerance: float) -> None:
    x = jax.random.normal(jax.random.PRNGKey(0), (64, 16)) * 3.0
    tree = {"x": x, "count": jnp.arange(5), "flag": jnp.ones(3, bool)}
    back = precision.decode(precision.encode(tree, dtype), tree)
    assert back["x"].dtype == jnp.float32
    np.testing.assert_array_equal(back["count"], tree["count"])
    np.testing.assert_array_equal(back["flag"], tree["flag"])
    scale = np.abs(np.asarray(x)).max() if dtype == "int8" else np.abs(np.asarray(x))
    assert np.all(np.abs(np.asarray(back["x"]) - np.asarray(x)) <= tolerance * scale + 1e-7)
    assert precision.encode(tree, "float32") is not None
    np.testing.assert_array_equal(precision.decode(precision.encode(tree, "float32"), tree)["x"], x)


def _identifiers(source: str) -> set[str]:
    """The names a module's code uses: variables, attributes, arguments and what it imports
    (its prose, docstrings and messages, aside)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names |= set(node.name.split("."))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= set(node.module.split("."))
    return names


def test_recipes_hold_no_placement_or_transfer_code() -> None:
    """No recipe module (nor a piece the recipes share, such as the replay buffer, which
    lowers through ``primitives.current()``) names a mesh, a sharding, a collective or a
    transfer encoding in its code."""
    forbidden = re.compile(r"(sharding|Sharding|Mesh|PartitionSpec|shard_map|pmap|device_put|devices?|psum|pmean|"
                           r"axis_name|with_sharding_constraint|transfer|precision|bfloat16|int8)")
    sources = {path.name: path.read_text() for path in RECIPES.glob("*.py")}
    assert {"ppo.py", "a2c.py", "impala.py", "dqn.py", "sac.py", "off_policy.py", "replay.py"} <= set(sources)
    found = {name: sorted(n for n in _identifiers(text) if forbidden.fullmatch(n)) for name, text in sources.items()}
    assert not {name: names for name, names in found.items() if names}, found
    assert _identifiers("from jax.sharding import Mesh\nx.devices()") >= {"sharding", "Mesh", "devices"}


def test_an_actor_that_needs_this_iterations_learner_output_is_refused() -> None:
    @jf.fragment("learner")
    def learn(params: jax.Array) -> jax.Array:
        return params + 1.0

    @jf.fragment("actor")
    def act(params: jax.Array) -> jax.Array:
        return params * 2.0

    @jf.algorithm(init=lambda key: {"params": jnp.zeros(3)}, steps_per_iteration=1)
    def step(state: dict) -> tuple[dict, dict]:
        params = learn(state["params"])
        return {"params": act(params)}, {"norm": jnp.abs(params).sum()}

    with pytest.raises(ConfigError) as err:
        jf.compile(step, ActorLearner(1, 1))
    assert "actor.act" in str(err.value) and "same iteration" in str(err.value)


@pytest.mark.parametrize("kwargs, field", [
    (dict(actor_devices=6, learner_devices=4), "devices"),
    (dict(actor_devices=0), "actor_devices"),
    (dict(staleness=-1), "staleness"),
    (dict(transfer_dtype="float8"), "transfer_dtype"),
])
def test_bad_settings_are_named(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        ActorLearner(**kwargs)
    assert err.value.field == field


def test_a_diverging_learner_stops_the_pipeline_naming_it() -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", lr=1e30, **SMALL)
    single, split = (jf.compile(algo, policy, chunk_iterations=2) for policy in (SingleDevice(), ActorLearner(1, 1)))
    errors = []
    for program in (single, split):
        with pytest.raises(NonFiniteError) as error:
            program.run(jax.random.PRNGKey(0))
        errors.append(error.value)
    assert errors[1].fragment == "learner.learn" and "state.params" in errors[1].outputs
    assert errors[1].iteration == errors[0].iteration


def test_packing_round_trips_mixed_leaves_keeping_the_batch_split() -> None:
    mesh = jf.sharding.make_mesh(data=4)
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "data"))
    values = [jax.device_put(jnp.arange(3 * 8 * 2, dtype=jnp.float32).reshape(3, 8, 2), split),  # [T, N, F]
              jnp.arange(8) % 3 == 0, jnp.arange(8, dtype=jnp.int8), jnp.ones((5,), jnp.bfloat16),
              jnp.float32(2.5), precision.encode(jnp.linspace(-1, 1, 8), "int8").values]
    layout = packing.Layout.of(values, [1, 0, 0, None, None, 0])
    batched, replicated = jax.jit(layout.pack)(values)
    assert batched.shape == (8, 3 * 2 * 4 + 1 + 1 + 1) and replicated.shape == (5 * 2 + 4,)
    assert batched.sharding.spec[0] == "data"  # each device packs its own environments
    assert layout.nbytes() == batched.nbytes + replicated.nbytes
    for got, want in zip(jax.jit(layout.unpack)((batched, replicated)), values, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_drawn_graph_marks_groups_and_transfers(lagged_program: jf.Program, tmp_path: Path) -> None:
    dot = lagged_program.explain().draw(tmp_path / "g.dot").read_text()
    assert "actor group: cpu devices [0,1]" in dot and "learner group: cpu devices [2,3]" in dot
    transfers = [line for line in dot.splitlines() if "color=red" in line]
    assert any('"actor.rollout" -> "learner.learn"' in line and "transfer in float32" in line for line in transfers)
    assert any('"learner.learn" -> "actor.rollout"' in line and "params for the next iteration" in line
               for line in transfers)
