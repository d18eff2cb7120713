"""Host environment pools: Gymnasium environments and Atari games in worker processes
and in this process, deterministic given the seeds, stepped by groups in any order,
the same steps either way, and failing loudly and cleanly."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import gymnasium
import numpy as np
import pytest

from jaxrl_frag.envs.host_pool import EnvPool, EnvWorkerError, HostEnvPool, InProcessPool
from jaxrl_frag.errors import ConfigError

ENV, NUM_ENVS, SEED = "CartPole-v1", 4, 3
HOST_ENV = f"gymnasium:{ENV}"
POOLS = {"worker processes": lambda env, n, **kw: HostEnvPool(env, n, num_workers=2, **kw),
         "in process": lambda env, n, **kw: InProcessPool(env, n, threads=2, **kw)}


def reference(actions: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """The same environments stepped in this process: seeded ``SEED + i``, reset within the step."""
    envs = [gymnasium.make(ENV) for _ in range(NUM_ENVS)]
    obs = [env.reset(seed=SEED + i)[0] for i, env in enumerate(envs)]
    out = [(np.stack(obs),)]
    score, length = np.zeros(NUM_ENVS), np.zeros(NUM_ENVS, np.int32)
    for step_actions in actions:
        rows = []
        for i, (env, action) in enumerate(zip(envs, step_actions, strict=True)):
            o, r, term, trunc, _ = env.step(action)
            score[i] += r
            length[i] += 1
            final = o
            if term or trunc:
                o, _ = env.reset()
            obs[i] = o
            rows.append((o, r, term, trunc, final, score[i], length[i]))
            if term or trunc:
                score[i], length[i] = 0, 0
        out.append(tuple(np.stack(c) for c in zip(*rows, strict=True)))
    return out


@pytest.mark.parametrize("kind", POOLS)
def test_a_pool_steps_as_the_environments_do_in_process(kind: str) -> None:
    """Two groups, 300 random steps (several episodes end): every observation, reward,
    flag, final observation and episode score and length equals Gymnasium's stepping;
    the groups (environments 0, 2 and 1, 3) sent together and received in reverse order
    give the same steps."""
    actions = np.random.default_rng(0).integers(0, 2, size=(300, NUM_ENVS))
    expected = reference(actions)
    with POOLS[kind](HOST_ENV, NUM_ENVS, groups=2) as pool:
        np.testing.assert_array_equal(pool.reset(SEED), expected[0][0])
        ended = 0
        for t, step_actions in enumerate(actions):
            if t % 2:
                step = pool.step(step_actions)
            else:
                pool.send(0, step_actions[0::2])
                pool.send(1, step_actions[1::2])
                second, first = pool.receive(1), pool.receive(0)
                step = type(first)(*(np.stack(pair, 1).reshape(NUM_ENVS, *pair[0].shape[1:])
                                     for pair in zip(first, second, strict=True)))
            for got, want in zip(step, expected[t + 1], strict=True):
                np.testing.assert_array_equal(got, want)
            ended += int((step.terminated | step.truncated).sum())
    assert ended >= 10


def test_atari_games_step_alike_in_worker_processes_and_on_ale_threads() -> None:
    """Breakout, 8 games in 2 groups, 400 random steps: the worker processes (sharing
    their observations with the pool) and ale-py's threads in this process give the
    same observations, rewards, flags, final observations and scores."""
    actions = np.random.default_rng(1).integers(0, 4, size=(400, 8))
    pools: list[EnvPool] = [HostEnvPool("ale:Breakout", 8, num_workers=4, groups=2),
                            InProcessPool("ale:Breakout", 8, threads=2, groups=2)]
    with pools[0], pools[1]:
        np.testing.assert_array_equal(pools[0].reset(5), pools[1].reset(5))
        points = 0.0
        for step_actions in actions:
            steps = [pool.step(step_actions) for pool in pools]
            for got, want in zip(*steps, strict=True):
                np.testing.assert_array_equal(got, want)
            points += float(steps[0].reward.sum())
    assert points > 0  # games were played, not only reset


def test_an_environment_that_raises_in_process_is_named_and_the_pool_shut() -> None:
    pool = InProcessPool(HOST_ENV, NUM_ENVS, threads=2, groups=2)
    pool.reset(SEED)
    with pytest.raises(EnvWorkerError, match=r"(?s)group 1 \(environments 1, 3 of gymnasium:CartPole-v1\) raised.*invalid"):
        pool.step(np.array([0, 0, 0, 7]))
    assert not pool.alive


def test_a_killed_worker_is_named_and_nothing_is_left_running() -> None:
    pool = HostEnvPool(HOST_ENV, NUM_ENVS, num_workers=2, groups=2)
    pool.reset(SEED)
    pids = [p.pid for p in pool._procs]
    os.kill(pids[1], signal.SIGKILL)
    pool._procs[1].wait(5)  # dead before the step: its pipe is closed when the pool writes to it
    start = time.monotonic()
    with pytest.raises(EnvWorkerError, match=r"worker 1 \(environments 1, 3 of gymnasium:CartPole-v1\) died"):
        pool.step(np.zeros(NUM_ENVS, np.int64))
    assert time.monotonic() - start < 5
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped, not a zombie


@pytest.mark.parametrize("kind", POOLS)
def test_an_environment_of_ones_own_module_steps_in_every_worker(kind: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``gymnasium:<module>:<id>``: a module on PYTHONPATH that registers CartPole's class under an id of its own,
    imported here and by every worker, steps as CartPole-v1 does; a module that cannot be imported and an id the
    module does not register are refused, naming them."""
    (tmp_path / "my_envs.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('MyCartPole-v0', entry_point='gymnasium.envs.classic_control.cartpole:CartPoleEnv', "
        "max_episode_steps=500)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(tmp_path))
    actions = np.random.default_rng(1).integers(0, 2, size=(100, NUM_ENVS))
    expected = reference(actions)
    with POOLS[kind]("gymnasium:my_envs:MyCartPole-v0", NUM_ENVS, groups=2) as pool:
        np.testing.assert_array_equal(pool.reset(SEED), expected[0][0])
        for step_actions, want in zip(actions, expected[1:], strict=True):
            for got, column in zip(pool.step(step_actions), want, strict=True):
                np.testing.assert_array_equal(got, column)
    with pytest.raises(ConfigError, match=r"cannot import 'no_such_module'.*PYTHONPATH"):
        HostEnvPool("gymnasium:no_such_module:MyCartPole-v0", 4)
    with pytest.raises(ConfigError, match="did you mean gymnasium:my_envs:MyCartPole-v0"):
        HostEnvPool("gymnasium:my_envs:MyCartPol-v0", 4)


def test_an_environment_that_raises_is_named_with_its_traceback() -> None:
    with HostEnvPool(HOST_ENV, NUM_ENVS, num_workers=2) as pool:
        pool.reset(SEED)
        with pytest.raises(EnvWorkerError, match=r"(?s)worker 0 \(environments 0, 1 of gymnasium:CartPole-v1\) raised.*invalid"):
            pool.step(np.array([7, 0, 0, 0]))  # CartPole has actions 0 and 1
        assert pool._procs == []


def test_bad_pool_settings_are_refused_before_any_process_starts() -> None:
    with pytest.raises(ConfigError, match="num_workers=3"):
        HostEnvPool(HOST_ENV, 4, num_workers=3)
    with pytest.raises(ConfigError, match="groups=3"):
        HostEnvPool(HOST_ENV, 4, num_workers=2, groups=3)
    with pytest.raises(ConfigError, match="did you mean gymnasium:CartPole-v1"):
        HostEnvPool("gymnasium:CartPol-v1", 4)
    with pytest.raises(ConfigError, match="did you mean ale:Breakout"):
        HostEnvPool("ale:Breakou", 4)
    with pytest.raises(ConfigError, match="threads=3"):
        InProcessPool(HOST_ENV, 4, threads=3, groups=2)
