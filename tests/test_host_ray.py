"""Host environments on a Ray cluster (``--env-backend ray``), on a real local cluster:
a head without CPUs for workers and a CPU-only node with a custom resource that the
workers are pinned to (``ray.cluster_utils.Cluster``, as Ray's own tests start one).
The workers step there and the run equals the local worker pool's; PPO learns on them;
a node removed mid-run stops the run (exit 4, resume continues it) or, under
``--env-lost-workers restart``, its workers start again on another node and training
goes on."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
import pytest
import ray
from processes import free_port, wait_for
from ray.cluster_utils import Cluster

import jaxrl_frag as jf
from jaxrl_frag.envs.host_ray import RAY_SOCKET_SUFFIX, UNIX_SOCKET_PATH_MAX, RayPool

CARTPOLE = "gymnasium:CartPole-v1"
SMALL = dict(num_envs=8, num_steps=16, total_steps=8 * 16 * 4, num_minibatches=4)  # 4 iterations, as test_host_envs'
RESOURCE = "envs"  # the CPU nodes' custom resource: the workers go only where it is


def without_sps(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "sps"} for row in rows]


def cluster_of(*nodes: int) -> Cluster:
    """A head (this machine's Ray, no CPUs to give workers) and a node with ``n`` CPUs
    and the resource ``RESOURCE`` for each ``n`` of ``nodes``."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for cpus in nodes:
        cluster.add_node(num_cpus=cpus, resources={RESOURCE: 1})
    return cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cluster = cluster_of(2)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def on_ray(cluster: Cluster, **settings: object) -> jf.Algorithm:
    return jf.recipes.PPO.create(CARTPOLE, env_backend="ray", env_address=cluster.address,
                                 env_worker_resource=RESOURCE, **settings)


def cpu_node(cluster: Cluster) -> str:
    (node,) = cluster.worker_nodes
    return node.node_id


def test_workers_on_a_cpu_node_compute_what_the_local_pool_does(cluster: Cluster) -> None:
    """PPO on CartPole, 8 environments in 2 workers, pinned to the CPU node: rows (but
    steps/s) and parameters bitwise those of local worker processes at the same seed."""
    algo = on_ray(cluster, env_workers=2, **SMALL)
    ray_run = jf.compile(algo, chunk_iterations=2).run(jax.random.PRNGKey(3))
    pool = algo.env.pool()
    assert isinstance(pool, RayPool) and pool.nodes() == [cpu_node(cluster)] * 2
    local = jf.compile(jf.recipes.PPO.create(CARTPOLE, env_workers=2, **SMALL), chunk_iterations=2)
    local_run = local.run(jax.random.PRNGKey(3))
    assert without_sps(ray_run.rows) == without_sps(local_run.rows)
    for x, y in zip(jax.tree.leaves(ray_run.state.params), jax.tree.leaves(local_run.state.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert ray_run.final["episode_count"] > 0
    algo.env.close()


def test_a_worker_that_does_not_answer_is_lost(cluster: Cluster) -> None:
    """A worker stopped (SIGSTOP) answers no step: after ``timeout`` it is lost. Under
    ``restart`` a new worker takes its environments: in that step they end as truncations
    (reward 0, their last observations as the final ones, the episodes' scores and lengths
    so far), their next observations fresh resets, counted; the other worker's are
    stepped as ever. Under ``stop`` the pool shuts down naming the worker and its node."""
    import os
    import signal

    from jaxrl_frag.envs.host_pool import EnvWorkerError, HostEnvPool

    options = dict(address=cluster.address, worker_resource=RESOURCE, timeout=3.0)
    with RayPool(CARTPOLE, 4, 2, 1, lost_workers="restart", **options) as pool, HostEnvPool(CARTPOLE, 4, 2) as local:
        np.testing.assert_array_equal(pool.reset(7), local.reset(7))
        for _ in range(3):
            last = pool.step(np.ones(4, np.int64))
            local.step(np.ones(4, np.int64))
        os.kill(ray.get(pool._actors[0].pid.remote()), signal.SIGSTOP)
        step = pool.step(np.ones(4, np.int64))
        expected = local.step(np.ones(4, np.int64))
        lost, kept = pool.held(0), pool.held(1)
        assert step.truncated[lost].all() and not step.terminated[lost].any() and (step.reward[lost] == 0).all()
        np.testing.assert_array_equal(step.final_obs[lost], last.obs[lost])
        np.testing.assert_array_equal(step.length[lost], last.length[lost])
        for x, y in zip(step, expected, strict=True):
            np.testing.assert_array_equal(x[kept], y[kept])
        assert pool.counters() == {"env_workers_restarted": 1.0, "env_episodes_cut": 2.0}
        assert pool.nodes() == [cpu_node(cluster)] * 2
        assert pool.step(np.ones(4, np.int64)).length[lost].tolist() == [1, 1]  # new episodes
    with RayPool(CARTPOLE, 4, 2, 1, **options) as pool:
        pool.reset(7)
        os.kill(ray.get(pool._actors[1].pid.remote()), signal.SIGSTOP)
        with pytest.raises(EnvWorkerError, match=rf"environment worker 1 \(environments 2, 3 of {CARTPOLE}\) on Ray "
                                                 rf"node .* \({cpu_node(cluster)[:8]}\) did not answer within 3 s"):
            pool.step(np.ones(4, np.int64))
        assert not pool.alive


@pytest.mark.long
def test_boosting_grows_and_shrinks_the_fleet(cluster: Cluster) -> None:
    """PPO boosted at random on a ladder of 4 and 8 CartPole environments in 4 actors on
    the CPU node, a round a call. Workers kept alive (``env_keep_alive`` 60 s, longer
    than the run) compute what local worker processes do, rows and parameters, and hold
    4 workers all the time the pool is up. Released at once (0 s), the actors live after
    each round are that round's (``env_workers``): the fleet shrinks to 2 and grows back
    to 4, each worker started again counted, its 2 episodes in flight cut short, and the
    worker-seconds it held fewer than 4 a second."""
    from jaxrl_frag.transforms.boost import Boosted

    def boosted(**settings: object) -> Boosted:
        recipe = jf.recipes.PPO.create(CARTPOLE, num_envs=8, env_workers=4, num_steps=16, num_minibatches=2,
                                       total_steps=8 * 16 * 10, **settings)
        return Boosted.create(recipe, strategy="random", ladder=(4, 8), minibatches="size")

    def run(algo: Boosted) -> jf.History:
        history = jf.compile(algo, chunk_iterations=1, seconds_per_call=1e-6).run(jax.random.PRNGKey(3))
        algo.recipe.env.close()
        return history

    on_cluster = dict(env_backend="ray", env_address=cluster.address, env_worker_resource=RESOURCE,
                      env_worker_cpus=0.5)
    local, kept = run(boosted()), run(boosted(**on_cluster, env_keep_alive=60))
    drop = ("sps", "env_workers_live", "env_workers_regrown", "env_fleet_seconds", "env_worker_seconds",
            "env_episodes_cut")
    assert [{k: v for k, v in r.items() if k not in drop} for r in kept.rows] == without_sps(local.rows)
    for x, y in zip(jax.tree.leaves(kept.state), jax.tree.leaves(local.state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert set(kept["env_workers_live"]) == {4} and kept.final["env_workers_regrown"] == 0
    assert kept.final["env_worker_seconds"] == pytest.approx(4 * kept.final["env_fleet_seconds"])
    elastic = run(boosted(**on_cluster, env_keep_alive=0))
    workers = elastic["env_workers"]
    assert set(workers) == {2, 4}
    np.testing.assert_array_equal(elastic["env_workers_live"], workers)
    regrown = 2 * int(np.sum((workers[:-1] == 2) & (workers[1:] == 4)))
    assert regrown > 0 and elastic.final["env_workers_regrown"] == regrown
    assert elastic.final["env_episodes_cut"] == 2 * regrown
    assert 0 < elastic.final["env_worker_seconds"] < 4 * elastic.final["env_fleet_seconds"]


@pytest.mark.long
def test_a_reset_starts_released_workers_again(cluster: Cluster) -> None:
    """A pool of 8 environments in 4 actors, released at once (``keep_alive`` 0): a send
    of each group's first worker releases the second; a whole reset then starts those 2
    again (counted) and gives, seeded alike, the first observations local worker
    processes give, and the whole pool steps as theirs does."""
    from jaxrl_frag.envs.host_pool import HostEnvPool

    options = dict(address=cluster.address, worker_resource=RESOURCE, worker_cpus=0.5, keep_alive=0.0)
    with RayPool(CARTPOLE, 8, 4, 2, **options) as pool, HostEnvPool(CARTPOLE, 8, 4, 2) as local:
        pool.reset(5)
        for g in range(2):
            pool.send(g, np.ones(2, np.int64))
        for g in range(2):
            pool.receive(g)
        assert pool.live_workers == 2 and pool.nodes()[1] is None and pool.nodes()[3] is None
        np.testing.assert_array_equal(pool.reset(11), local.reset(11))
        assert pool.live_workers == 4 and pool.fleet()["env_workers_regrown"] == 2
        actions = np.arange(8) % 2
        for x, y in zip(pool.step(actions), local.step(actions), strict=True):
            np.testing.assert_array_equal(x, y)


def test_a_missing_resource_is_refused_before_tracing(cluster: Cluster) -> None:
    """Aiming the workers at a resource no node has: exit status 2, one line naming the
    setting, the value and the resources the nodes have."""
    from jaxrl_frag.errors import ConfigError

    with pytest.raises(ConfigError, match=r"env_worker_resource='gpu-free'.*no node of the Ray cluster.*envs"):
        jf.recipes.PPO.create(CARTPOLE, env_backend="ray", env_address=cluster.address, env_worker_resource="gpu-free")


def test_workers_left_at_0_are_as_many_as_the_clusters_cpus_hold(cluster: Cluster) -> None:
    """``--env-workers 0`` on a cluster counts its CPUs, not this machine's: the CPU node's
    2 hold 4 workers of half a CPU and 8 of a quarter (this machine's count would give the
    same number for both)."""
    for cpus, workers in ((0.5, 4), (0.25, 8)):
        assert on_ray(cluster, env_worker_cpus=cpus, num_envs=16).env.workers == workers


def test_more_workers_than_the_cluster_holds_are_told_to_wait(cluster: Cluster,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Four workers of a CPU on a cluster whose CPU node has 2: Ray queues two until a
    node joins, and the run says so rather than wait in silence."""
    with RayPool(CARTPOLE, 8, 4, 2, address=cluster.address, worker_resource=RESOURCE):
        err = capsys.readouterr().err
    assert ("4 environment workers at 1 CPU each asked, and the Ray cluster's live nodes with the resource 'envs' hold 2 "
            "in all: the others wait for nodes to join") in err, err
    with RayPool(CARTPOLE, 8, 2, 2, address=cluster.address, worker_resource=RESOURCE):
        assert "wait for nodes" not in capsys.readouterr().err


def test_without_ray_the_backend_is_refused_with_the_install_command(tmp_path: Path) -> None:
    """Ray is an optional extra: where it cannot be imported, ``--env-backend ray`` exits
    with status 2 and one line naming the setting and the install command, writing nothing."""
    hide_ray = ("import sys; sys.modules['ray'] = None; from jaxrl_frag.app.cli import main; "
                f"sys.exit(main(['train', 'ppo', '--env', '{CARTPOLE}', '--env-backend', 'ray', '--run-dir', "
                f"'{tmp_path / 'run'}']))")
    done = subprocess.run([sys.executable, "-c", hide_ray], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "jaxrl-frag: error: env_backend='ray': needs Ray, which is not installed: install it with pip install "
        "'jaxrl_frag[ray]', or choose processes (worker processes on this machine)")
    assert not (tmp_path / "run").exists()


@pytest.mark.long  # two Ray clusters started: half a minute on 2 cores
def test_a_local_ray_starts_where_tmpdir_is_too_deep_for_its_sockets(tmp_path: Path) -> None:
    """Without an address the run starts its own Ray, whose socket paths live under
    ``$TMPDIR``: a ``$TMPDIR`` deeper than a Unix socket's path allows (as under
    pytest's ``tmp_path`` on CI) still trains, its sessions kept under ``/tmp``, and
    its Ray is its own even while another cluster, started by ``ray start`` with the
    same temp dir, runs on this machine (Ray would otherwise join that one)."""
    deep = tmp_path / ("d" * 60) / "tmp"
    deep.mkdir(parents=True)
    assert len(str(deep)) + RAY_SOCKET_SUFFIX > UNIX_SOCKET_PATH_MAX
    env = {**os.environ, "TMPDIR": str(deep), "JAXRL_FRAG_MAX_STEPS": "1024"}
    env.pop("RAY_ADDRESS", None)
    other = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--port",
                              str(free_port()), "--num-cpus", "1", "--include-dashboard=false", "--disable-usage-stats",
                              "--temp-dir", f"/tmp/ray-{os.getuid()}"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert other.stdout is not None
        for line in other.stdout:  # until it is up
            if "Ray runtime started" in line:
                break
        done = subprocess.run([sys.executable, "-m", "jaxrl_frag", "train", "ppo", "--env", CARTPOLE,
                               "--num-envs", "8", "--env-workers", "2", "--env-backend", "ray",
                               "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=300)
    finally:
        other.terminate()  # `ray start --block` stops the processes of its node
        other.communicate(timeout=60)
    assert done.returncode == 0, done.stderr
    assert "trained to 1,024 steps" in done.stdout


@pytest.mark.learning
@pytest.mark.long
def test_ppo_learns_cartpole_on_a_cpu_node(cluster: Cluster) -> None:
    """test_host_envs.py's Gymnasium CartPole run (8 environments of 64 steps, 5e5 steps),
    its 2 workers on the CPU node: it learns as the local pool's does (the same rows, as
    the test above shows for a short run)."""
    algo = on_ray(cluster, num_envs=8, num_steps=64, total_steps=500_000)
    history = jf.compile(algo).run(jax.random.PRNGKey(0))
    assert algo.env.pool().nodes() == [cpu_node(cluster)] * 2
    assert history.last("episode_return") >= 475
    algo.env.close()


def train(cluster: Cluster, run_dir: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "jaxrl_frag", "train", "ppo", "--env", CARTPOLE, "--num-envs", "8",
                             "--env-workers", "2", "--num-steps", "16", "--chunk-iterations", "4", "--checkpoint-every",
                             "4", "--env-backend", "ray", "--env-address", cluster.address, "--env-worker-resource",
                             RESOURCE, "--run-dir", str(run_dir), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.long
def test_a_node_removed_mid_run(tmp_path: Path) -> None:
    """Two runs, their workers on CPU node A; once each has checkpointed, node B joins
    and A is removed. Under ``--env-lost-workers stop`` the run exits with status 4
    naming a worker, its environments and node A, its checkpoints kept, and ``resume``
    finishes it on node B. Under ``restart`` both workers start again on node B, their 8
    episodes in flight end as truncations (counted in the rows), and the run trains to
    its end, its checkpoints whole."""
    for strict in (True, False):
        cluster = cluster_of(2)
        try:
            (node_a,) = cluster.worker_nodes
            run_dir = tmp_path / ("stop" if strict else "restart")
            total = "1e7" if strict else "40960"
            proc = train(cluster, run_dir, "--total-steps", total, "--env-lost-workers", "stop" if strict else "restart")
            try:
                wait_for(run_dir / "checkpoints" / "8", proc, 240)
                node_b = cluster.add_node(num_cpus=2, resources={RESOURCE: 1})
                cluster.remove_node(node_a)
                _, err = proc.communicate(timeout=240)
            finally:
                proc.kill()
            if strict:
                assert proc.returncode == 4, err
                assert "Traceback" not in err, err
                assert f"({node_a.node_id[:8]}) was lost" in err, err
                assert "environments 0, 2, 4, 6 of gymnasium:CartPole-v1" in err or "environments 1, 3, 5, 7" in err, err
                assert "was lost" in err and "resume with jaxrl-frag resume" in err, err
                kept = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
                assert kept and kept[-1] >= 8
                resumed = subprocess.run([sys.executable, "-m", "jaxrl_frag", "resume", str(run_dir), "--override",
                                          f"total_steps={(kept[-1] + 8) * 128}"], capture_output=True, text=True,
                                         timeout=240)
                assert resumed.returncode == 0, resumed.stderr
                assert float(rows(run_dir)[-1]["iteration"]) == kept[-1] + 8
            else:
                assert proc.returncode == 0, err
                assert err.count("restarted on node") == 2 and node_b.node_id[:8] in err, err
                last = rows(run_dir)[-1]
                assert float(last["env_steps"]) == 40_960
                assert float(last["env_workers_restarted"]) == 2 and float(last["env_episodes_cut"]) == 8
                program = jf.compile(jf.recipes.PPO.create(CARTPOLE, num_envs=8, num_steps=16), chunk_iterations=4)
                saved = program.restore(run_dir / "checkpoints", allow_changes=("total_steps", "env_workers",
                                                                                  "env_backend", "env_address",
                                                                                  "env_worker_resource",
                                                                                  "env_lost_workers"))
                assert saved.iteration == int(float(last["iteration"])) and saved.meta["rows"][-1]["env_workers_restarted"] == 2
        finally:
            cluster.shutdown()


@pytest.mark.long
def test_launch_local_sh_starts_a_ray_head_that_the_processes_share(tmp_path: Path) -> None:
    """``RAY=1 launch/local.sh 2 ...``: the script starts a Ray head, both processes put
    their workers on it (``RAY_ADDRESS``), and the rows equal the same two processes'
    local worker pools'; once the processes end, the head's processes are gone."""
    launch = str(Path(__file__).resolve().parent.parent / "launch" / "local.sh")
    port = free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "JAXRL_FRAG_MAX_STEPS": "2048", "RAY_PORT": str(port)}
    env.pop("RAY_ADDRESS", None)
    runs, said = {}, {}
    for backend in ("ray", "processes"):
        run_dir = tmp_path / backend
        done = subprocess.run([launch, "2", sys.executable, "-m", "jaxrl_frag", "train", "ppo", "--env", CARTPOLE,
                               "--num-envs", "8", "--num-steps", "16", "--env-workers", "2", "--env-backend", backend,
                               "--policy", "data-parallel", "--devices", "1", "--run-dir", str(run_dir),
                               *(["--env-worker-cpus", "0.5"] if backend == "ray" else [])],
                              capture_output=True, text=True, timeout=600,
                              env={**env, "RAY": "1"} if backend == "ray" else env)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[backend], said[backend] = rows(run_dir), done.stderr
    assert re.search(rf"^launch/local.sh: Ray head at [\d.]+:{port}; CPU-only machines join it with: ray start "
                     rf"--address [\d.]+:{port}$", said["ray"], re.M), said["ray"]
    assert "Ray head" not in said["processes"]
    assert len(runs["ray"]) == 2048 // (8 * 16)
    assert without_sps(runs["ray"]) == without_sps(runs["processes"])
    head = subprocess.run(["pgrep", "-f", f"gcs_server_port={port}"], capture_output=True, text=True)
    assert head.returncode == 1, head.stdout
