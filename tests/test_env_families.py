"""The environment families that come in through the environment seam, each one file in
``envs/`` and one entry point: Craftax (``craftax:``). Each is listed, refuses bad ids before anything is traced, steps under jit
and vmap, keeps terminations and truncations apart, learns past random play, and draws a
video. Their rows under every distribution policy are ``test_matrix.py``'s."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_frag as jf
from jaxrl_frag import ConfigError, envs
from jaxrl_frag.app.cli import main

CLASSIC, FULL = "craftax:Craftax-Classic-Symbolic-v1", "craftax:Craftax-Symbolic-v1"


@pytest.mark.slow  # a process of its own: nothing imported yet
def test_families_are_listed_lazily_and_bad_ids_exit_2_naming_the_ids(capsys: pytest.CaptureFixture[str]) -> None:
    # importing jaxrl_frag and listing the ids imports neither package; one that is missing is named with its install
    code = ("import sys; from jaxrl_frag import ConfigError, envs; envs.available()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('craftax',)))\n"
            "sys.modules['craftax'] = None\n"
            "for name in ('craftax:Craftax-Classic-Symbolic-v1',):\n"
            "    try:\n"
            "        envs.make(name)\n"
            "    except ConfigError as error:\n"
            "        print(error)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["[]",
                   f"env='{CLASSIC}': needs the craftax package, which is not installed: pip install 'jaxrl-frag[craftax]'"]
    assert main(["envs"]) == 0
    listed = capsys.readouterr().out
    assert "craftax:<id>" in listed, listed
    for bad, names in (("craftax:Craftax-Classic-v1", CLASSIC),):
        assert main(["train", "ppo", "--env", bad]) == 2
        err = capsys.readouterr().err
        assert bad in err and "did you mean" in err and names in err and "Traceback" not in err, err


def test_craftax_declares_its_spaces_capabilities_and_options() -> None:
    for name, size, actions in ((CLASSIC, 1345, 17), (FULL, 8268, 43)):
        env = envs.make(name)
        assert env.observation_space.shape == (size,) and env.action_space == envs.Discrete(actions)
        assert env.capabilities == envs.Capabilities(traceable=True, restorable=True, renders=True)
        assert env.max_steps == (10_000 if name == CLASSIC else 100_000)
        assert envs.make(name) == env and envs.make(name, max_timesteps=50) != env
    with pytest.raises(ConfigError, match="Craftax's parameters have no lava; they are max_timesteps, day_length"):
        envs.make(CLASSIC, lava=True)
    with pytest.raises(ConfigError, match="did you mean craftax:Craftax-Symbolic-v1"):
        envs.make("craftax:Craftax-Symbolic-v2")


@pytest.mark.long  # Craftax's game compiles for about a minute on 2 cores (and its textures load once for ~1 min)
def test_craftax_classic_steps_under_jit_and_vmap_truncates_at_its_limit_and_renders() -> None:
    env = envs.make(CLASSIC, num_envs=8, max_timesteps=20)
    n = env.action_space.n

    def act(obs, key):
        action = jax.random.randint(key, obs.shape[:1], 0, n)
        return action, action, ()

    state, obs = env.reset(jax.random.PRNGKey(0))
    steps, _, _, _, ended = jax.jit(lambda s, o, k: env.rollout(act, s, o, k, 45))(state, obs, jax.random.PRNGKey(1))
    done = np.asarray(ended.done)
    # random play lives past 20 steps: every episode is cut by the time limit, a truncation, at steps 20 and 40
    assert np.asarray(steps.truncated)[[19, 39]].all() and done.sum() == 16 and not np.asarray(steps.terminated).any()
    assert (np.asarray(ended.episode_length)[done] == 20).all()
    achievements = np.asarray(ended.stats["episode_achievements"])[done]
    assert np.isfinite(achievements).all() and (achievements >= 0).all() and achievements.max() <= 22
    assert np.isfinite(np.asarray(steps.reward)).all() and np.asarray(steps.next_obs).max() <= 1.0
    one = envs.make(CLASSIC)
    first, _ = one.reset(jax.random.PRNGKey(0))
    frames = one.render(jax.tree.map(lambda x: jnp.stack([x, x]), first))
    assert frames.dtype == np.uint8 and frames.shape[0] == 2 and frames.shape[-1] == 3 and frames.std() > 10


@pytest.mark.learning
@pytest.mark.long  # Craftax's game: about 6 minutes to compile and 14 to train on 2 busy cores (116 steps/s)
def test_ppo_learns_craftax_classic_past_random_play() -> None:
    """Random play returns RANDOM_RETURN a finished episode (2 achievements); PPO's first 1.25e4
    steps return 1.36 (2.3 achievements), its last 2.98 (3.9 achievements) at 1e5 steps (64
    environments x 64 steps; 1.0e5 steps measured in benchmarks/HISTORY.md)."""
    algo = jf.recipes.PPO.create(CLASSIC, num_envs=64, num_steps=64, total_steps=100_000, hidden=(128, 128))
    history = jf.compile(algo, chunk_iterations=3).run(jax.random.PRNGKey(0))
    assert history.final["episode_return"] >= 2.3 and history.final["episode_achievements"] >= 3.2, (
        history["episode_return"], history["episode_achievements"])

