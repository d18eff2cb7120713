"""The seams: a policy written outside the package compiles, runs and draws without an
edit to it; a state field that carries the environment batch undeclared is refused; the
XLA options the executors compile with."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec, Sharding

import jaxrl_frag as jf
from jaxrl_frag import primitives
from jaxrl_frag.policy import (
    QUICK_CPU_OPTIONS,
    RUN_ONCE_OPTIONS,
    BatchAxes,
    Executor,
    Policy,
    SpmdExecutor,
    compile_lowered,
    compile_options,
    compile_together,
)
from jaxrl_frag.sharding import SingleDevice
from jaxrl_frag.sharding.mesh import split_state

SMALL = dict(num_envs=8, num_steps=32, total_steps=8 * 32 * 4, num_minibatches=4)  # 4 iterations


class CountingExecutor(SpmdExecutor):
    """The default executor, counting the calls ``Program.run`` makes."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls = 0

    def call(self, *args: Any) -> Any:
        self.calls += 1
        return super().call(*args)


@dataclasses.dataclass(frozen=True)
class EvenDevices(Policy):
    """A user's policy: the environment batch split over the even-numbered devices, with
    exact shuffling, run by its own executor."""

    name: ClassVar[str] = "even-devices"
    count: int = 4

    @property
    def mesh(self) -> jax.sharding.Mesh:
        return jax.sharding.Mesh(np.array(jax.devices()[::2][: self.count]), ("data",))

    def shardings(self, state: Any, batch_axes: Callable[[], BatchAxes], named_axes: Any) -> tuple[Sharding, Any]:
        return NamedSharding(self.mesh, PartitionSpec()), split_state(state, batch_axes(), self.mesh, "data")

    def lowering(self) -> primitives.Lowering:
        return primitives.Lowering(self.mesh, "data", "exact")

    def executor(self, algorithm: jf.Algorithm, max_rows: int, check_finite: bool) -> Executor:
        return CountingExecutor(algorithm, self, max_rows, check_finite)

    @property
    def device_count(self) -> int:
        return self.count

    def describe(self) -> str:
        return f"EvenDevices: environment batch over devices {[d.id for d in self.mesh.devices.flat]}"


def test_a_policy_written_outside_the_package_compiles_runs_and_draws(tmp_path: Path) -> None:
    algo = jf.recipes.PPO.create("CartPole-v1", **SMALL)
    policy = EvenDevices()
    program = jf.compile(algo, policy, chunk_iterations=2)
    history = program.run(jax.random.PRNGKey(3))
    assert program._executor.calls >= 1 and history.iteration == 4
    obs = history.state.obs
    assert {d.id for d in obs.sharding.device_set} == {0, 2, 4, 6} and obs.sharding.spec[0] == "data"
    reference = jf.compile(algo, SingleDevice(), chunk_iterations=2).run(jax.random.PRNGKey(3))
    for x, y in zip(jax.tree.leaves(history.state.params), jax.tree.leaves(reference.state.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)  # exact shuffling
    explanation = program.explain()
    assert explanation.placement == ("EvenDevices: environment batch over devices [0, 2, 4, 6]\n  split over "
                                     "devices: env_state, obs (mesh axis data); whole on every device: key, opt_state, params")
    drawn = explanation.draw(tmp_path / "graph.txt").read_text()
    assert "EvenDevices: environment batch over devices [0, 2, 4, 6]" in drawn and "actor.rollout" in drawn


# -- a state field that carries the environment batch without saying so --------------------------

ENV = jf.envs.make("CartPole-v1", num_envs=8)


@jf.fragment("actor", batched={"env_state": 0, "obs": 0}, outputs=("env_state", "obs", "reward"))
def step_envs(env_state: Any, obs: Any, key: jax.Array) -> tuple[Any, Any, jax.Array]:
    action = (obs[:, 2] > 0).astype(np.int32)
    env_state, ts = ENV.step(key, env_state, action)
    return env_state, ts.obs, ts.reward.mean()


@jf.fragment("actor", batched={"env_state": 0}, outputs=("env_state", "obs", "reward"))
def step_envs_undeclared(env_state: Any, obs: Any, key: jax.Array) -> tuple[Any, Any, jax.Array]:
    """As ``step_envs``, saying nothing of the observations."""
    return step_envs.fn(env_state, obs, key)


@jf.fragment("actor", batched={"env_state": 0, "next_obs": 0}, outputs=("env_state", "next_obs", "reward"))
def step_envs_read_whole(env_state: Any, obs: Any, key: jax.Array) -> tuple[Any, Any, jax.Array]:
    """As ``step_envs``, its observations written batched and read whole."""
    return step_envs.fn(env_state, obs, key)


def _algorithm(fragment: Any) -> jf.Algorithm:
    def init(key: jax.Array) -> dict[str, Any]:
        env_state, obs = ENV.reset(key)
        return {"env_state": env_state, "obs": obs, "key": key}

    @jf.algorithm(init=init, steps_per_iteration=8)
    def act(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, jax.Array]]:
        key, k = jax.random.split(state["key"])
        env_state, obs, reward = fragment(state["env_state"], state["obs"], k)
        return {"env_state": env_state, "obs": obs, "key": key}, {"reward": reward}

    return act


@pytest.mark.parametrize("fragment, says", [
    (step_envs_undeclared, "leads with the environment batch (8) but no fragment declares it batched"),
    (step_envs_read_whole, "is written environment-batched (axis 0 of its output 'next_obs') but no fragment reads"),
])
def test_a_field_holding_the_batch_undeclared_is_refused_where_the_batch_is_split(fragment: Any, says: str) -> None:
    jf.compile(_algorithm(step_envs), jf.sharding.DataParallel(2))  # declared: fine
    with pytest.raises(jf.ConfigError) as refused:
        jf.compile(_algorithm(fragment), jf.sharding.DataParallel(2))
    assert refused.value.field == "state.obs" and says in str(refused.value), str(refused.value)
    assert "batched={'obs': 0}" in str(refused.value)
    jf.compile(_algorithm(fragment), SingleDevice())  # nothing is split: nothing to refuse


def test_programs_compile_for_compile_time_where_jax_is_asked_to() -> None:
    """XLA's defaults for a program, ``RUN_ONCE_OPTIONS`` for one that runs once; on CPU without the fusion emitters
    for that one, and for every one while ``jax_disable_most_optimizations`` is set (as for this test: conftest)."""
    assert jax.default_backend() == "cpu" and jax.config.read("jax_disable_most_optimizations")
    assert compile_options() == QUICK_CPU_OPTIONS == {"xla_cpu_use_fusion_emitters": False}
    assert compile_options(run_once=True) == {**RUN_ONCE_OPTIONS, **QUICK_CPU_OPTIONS}
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        assert compile_options() == {}
        assert compile_options(run_once=True) == {**RUN_ONCE_OPTIONS, **QUICK_CPU_OPTIONS}
    finally:
        jax.config.update("jax_disable_most_optimizations", True)


def test_programs_compiled_together_are_those_compiled_one_by_one() -> None:
    """``compile_together`` gives back each program in the order given, compiled with its own options, as
    ``compile_lowered`` compiles it alone (the first in the caller's thread, the rest on threads)."""
    lowered = [jax.jit(lambda x, n=n: jnp.sin(x) * n + jnp.cumsum(x)).lower(jnp.ones(8 + n)) for n in range(3)]
    run_once = (False, True, False)
    together = compile_together(*zip(lowered, run_once, strict=True))
    alone = [compile_lowered(program, once) for program, once in zip(lowered, run_once, strict=True)]
    assert [p.as_text() for p in together] == [p.as_text() for p in alone]
    assert [p.in_avals[0][0].shape for p in together] == [(8,), (9,), (10,)]
