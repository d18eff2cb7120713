"""Every way to mis-configure a run: exit status 2, one message naming the setting, the
value and the fix, no traceback, and nothing on disk touched or created."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxrl_frag.cli import main

TRAIN = ["train", "ppo", "--env", "CartPole-v1"]
TINY = ["--num-envs", "4", "--num-steps", "8", "--total-steps", "64", "--chunk-iterations", "1"]

CASES = [
    # recipe and environment
    (["train", "a3c", "--env", "CartPole-v1"], ["invalid choice: 'a3c'", "ppo"]),
    (["train", "ppo", "--env", "CartPol-v1"], ["env='CartPol-v1'", "unknown environment", "did you mean CartPole-v1"]),
    (["train", "ppo"], ["--env"]),
    ([*TRAIN, "--learning-rate", "1e-3"], ["unrecognized arguments: --learning-rate"]),
    # recipe settings
    ([*TRAIN, "--num-envs", "0"], ["num_envs=0", "positive"]),
    ([*TRAIN, "--num-envs", "four"], ["--num-envs", "four"]),
    ([*TRAIN, "--num-steps", "-5"], ["num_steps=-5", "positive"]),
    ([*TRAIN, "--total-steps", "1.5"], ["--total-steps", "not a whole number"]),
    ([*TRAIN, "--total-steps", "100"], ["total_steps=100", "at least one iteration"]),
    ([*TRAIN, "--num-minibatches", "3"], ["num_minibatches=3", "4 * 128 = 512", "choose one of"]),
    ([*TRAIN, "--hidden", "0,64"], ["hidden=(0, 64)", "positive layer widths"]),
    ([*TRAIN, "--hidden", "wide"], ["--hidden", "comma-separated list of widths"]),
    ([*TRAIN, "--lr=-1e-3"], ["lr=-0.001", "positive"]),
    ([*TRAIN, "--lr", "inf"], ["lr=inf", "finite"]),
    ([*TRAIN, "--gamma", "1.5"], ["gamma=1.5", "(0, 1]"]),
    ([*TRAIN, "--gae-lambda", "nan"], ["gae_lambda=nan", "finite"]),
    ([*TRAIN, "--ent-coef", "-0.1"], ["ent_coef=-0.1", "zero or positive"]),
    # off-policy recipes
    (["train", "dqn", "--env", "Pendulum-v1"], ["env='Pendulum-v1'", "DQN supports discrete actions only"]),
    (["train", "sac", "--env", "CartPole-v1"], ["env='CartPole-v1'", "SAC supports continuous actions only"]),
    (["train", "dqn", "--env", "CartPole-v1", "--buffer-size", "16"], ["buffer_size=16", "raise it"]),
    (["train", "dqn", "--env", "CartPole-v1", "--tau", "0"], ["tau=0", "(0, 1]"]),
    (["train", "dqn", "--env", "CartPole-v1", "--td-loss", "l1"], ["td_loss='l1'", "mse, huber"]),
    (["train", "dqn", "--env", "CartPole-v1", "--epsilon-end", "2"], ["epsilon_end=2", "[0, 1]"]),
    (["train", "dqn", "--env", "CartPole-v1", "--learning-starts", "-1"], ["learning_starts=-1", "between 0"]),
    (["train", "sac", "--env", "Pendulum-v1", "--init-temperature", "0"], ["init_temperature=0", "positive"]),
    (["train", "a2c", "--env", "CartPole-v1", "--num-minibatches", "3"], ["num_minibatches=3", "choose one of"]),
    # actor boosting
    ([*TRAIN, "--boost", "turbo"], ["--boost", "invalid choice: 'turbo'", "nitro"]),
    ([*TRAIN, "--boost", "nitro", "--boost-ladder", "64,8"], ["boost_ladder='64,8'", "ascending"]),
    ([*TRAIN, "--boost", "nitro", "--num-minibatches", "3", "--boost-ladder", "3,7,9"],
     ["boost_ladder=7", "num_minibatches=3", "choose one of"]),
    ([*TRAIN, "--boost", "nitro", "--num-envs", "8"], ["num_envs=8", "--boost-ladder", "drop --num-envs"]),
    ([*TRAIN, "--boost", "fixed", "--boost-fixed-actors", "24"], ["boost_fixed_actors=24", "rung of the ladder"]),
    ([*TRAIN, "--boost", "nitro", "--budget-steps", "100"], ["budget_steps=100", "one round at the bottom rung"]),
    ([*TRAIN, "--boost", "nitro", "--boost-decay", "1.5"], ["boost_decay=1.5", "(0, 1]"]),
    ([*TRAIN, "--boost", "nitro", "--boost-window", "1"], ["boost_window=1", ">= 2"]),
    ([*TRAIN, "--boost", "nitro", "--budget-cost=-1"], ["budget_cost=-1", "must be positive"]),
    ([*TRAIN, "--boost", "nitro", "--policy", "data-parallel"], ["policy='data-parallel'", "single or population"]),
    (["train", "dqn", "--env", "CartPole-v1", "--boost", "nitro"], ["recipe='DQN'", "on-policy recipes"]),
    (["train", "a2c", "--env", "CartPole-v1", "--boost", "gns"], ["num_minibatches=1", "at least 2 minibatches"]),
    # host environments
    (["train", "ppo", "--env", "gymnasium:CartPol-v1"], ["env='gymnasium:CartPol-v1'", "did you mean gymnasium:CartPole-v1"]),
    (["train", "ppo", "--env", "ale:Breakot"], ["env='ale:Breakot'", "no such Atari game", "did you mean ale:Breakout"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-groups", "3"], ["env_groups=3", "divide num_envs = 4"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--env-workers", "3"], ["env_workers=3", "multiple of env_groups"]),
    ([*TRAIN, "--env-groups", "4"], ["env_groups=4", "host environments", "CartPole-v1 is a JAX environment"]),
    (["train", "ppo", "--env", "gymnasium:Pendulum-v1", "--normalize-obs"], ["normalize_obs=True", "turn it off"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--seeds", "2"], ["env='gymnasium:CartPole-v1'", "population"]),
    (["train", "ppo", "--env", "gymnasium:CartPole-v1", "--boost", "nitro"], ["boost='nitro'", "turn boosting off"]),
    # distribution policy
    ([*TRAIN, "--policy", "anakin"], ["--policy", "invalid choice: 'anakin'"]),
    ([*TRAIN, "--devices", "0"], ["devices=0", "positive"]),
    ([*TRAIN, "--policy", "data-parallel", "--devices", "3"], ["devices=3", "does not divide across 3 devices"]),
    ([*TRAIN, "--shuffle", "global"], ["--shuffle", "invalid choice: 'global'"]),
    ([*TRAIN, "--policy", "actor-learner", "--staleness", "-1"], ["staleness=-1", "0 (synchronous)"]),
    ([*TRAIN, "--policy", "actor-learner", "--actor-devices", "0"], ["actor_devices=0", "positive"]),
    ([*TRAIN, "--policy", "actor-learner", "--transfer-dtype", "fp8"], ["--transfer-dtype", "invalid choice: 'fp8'"]),
    ([*TRAIN, "--policy", "actor-learner", "--seeds", "2"], ["policy='actor-learner'", "populations"]),
    (["explain", "ppo", "--env", "CartPole-v1", "--draw", "graph.gif"], ["draw='graph.gif'", ".png, .svg"]),
    # seeds and sweeps
    ([*TRAIN, "--seeds", "0"], ["seeds=0", "positive"]),
    ([*TRAIN, "--sweep", "num_envs=4,8"], ["sweep='num_envs'", "static field", "separate runs"]),
    ([*TRAIN, "--sweep", "lr=fast"], ["sweep='lr=fast'", "numbers"]),
    ([*TRAIN, "--sweep", "lr"], ["sweep='lr'", "NAME=V1,V2"]),
    ([*TRAIN, "--sweep", "lr=loguniform:1e-5:1e-2"], ["samples=None", "--samples"]),
    ([*TRAIN, "--sweep", "lr=gauss:0:1", "--samples", "4"], ["sweep='lr=gauss:0:1'", "uniform, loguniform"]),
    ([*TRAIN, "--sweep", "learning_rate=1e-3"], ["sweep='learning_rate'", "sweepable"]),
    ([*TRAIN, "--samples", "8"], ["samples=8", "random search"]),
    # run length, rows and checkpoints
    ([*TRAIN, "--chunk-iterations", "0"], ["chunk_iterations=0", "positive"]),
    ([*TRAIN, *TINY[:6], "--chunk-iterations", "2", "--checkpoint-every", "3"],
     ["checkpoint_every=3", "multiple of chunk_iterations (2)", "e.g. 2"]),
    ([*TRAIN, "--keep-checkpoints", "0"], ["keep_checkpoints=0", "at least one"]),
    # run directories
    ([*TRAIN, "--run-dir", "{file}"], ["run_dir=", "is a file"]),
    ([*TRAIN, "--run-dir", "{existing}"], ["run_dir=", "already holds files", "--resume", "--overwrite"]),
    ([*TRAIN, "--run-dir", "{existing}", "--resume", "--overwrite"], ["--resume and --overwrite exclude each other"]),
    ([*TRAIN, "--resume"], ["resume=True", "--run-dir"]),
    ([*TRAIN, "--run-dir", "{empty}", "--resume"], ["holds no run to resume"]),
    ([*TRAIN, *TINY, "--run-dir", "{existing}", "--resume", "--lr", "1e-3"],
     ["lr: 0.00025 -> 0.001", "jaxrl-frag resume"]),
    (["resume", "{empty}"], ["holds no run to resume (no config.json)"]),
    (["resume", "{existing}", "--override", "lr=1e-3"], ["override='lr=1e-3'", "cannot change in a resumed run"]),
    (["resume", "{existing}", "--override", "total_steps=lots"], ["override='total_steps=lots'", "whole number"]),
    (["resume", "{existing}", "--override", "total_steps"], ["override='total_steps'", "NAME=VALUE"]),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An existing finished run, an empty directory and a plain file."""
    root = tmp_path_factory.mktemp("bad_input")
    existing = root / "existing"
    assert main([*TRAIN, *TINY, "--run-dir", str(existing)]) == 0
    (root / "empty").mkdir()
    (root / "file").write_text("not a directory\n")
    return {"existing": existing, "empty": root / "empty", "file": root / "file"}


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


def test_there_are_at_least_25_cases() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_exits_2_with_a_message_and_touches_nothing(
    argv: list[str], expected: list[str], places: dict[str, Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # a default run directory would appear here
    argv = [a.format(**{k: str(v) for k, v in places.items()}) for a in argv]
    root = places["existing"].parent
    before = _snapshot(root)
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's own usage errors
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    for text in expected:
        assert text in err, err
    assert "Traceback" not in err and "error:" in err.strip().splitlines()[-1]
    assert _snapshot(root) == before
    assert list(tmp_path.iterdir()) == []
