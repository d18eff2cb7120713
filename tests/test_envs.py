"""Environments: terminated and truncated kept apart, auto-reset, statistics wrappers, Brax, and
the convolutional torso for image observations."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_frag as jf
from jaxrl_frag import ConfigError, envs


def run(env: envs.Env, steps: int, action: int = 0):
    state, _ = env.reset(jax.random.PRNGKey(0))

    def body(state, key):
        state, ts = env.step(key, state, jnp.full((env.num_envs,), action))
        return state, ts

    return jax.lax.scan(body, state, jax.random.split(jax.random.PRNGKey(1), steps))


def test_the_options_in_an_id_make_the_environment_that_its_name_makes_again() -> None:
    """``@name=value`` after an id (envs.id_options) goes to the environment's constructor; the
    environment is named with the options that differ from its defaults, by name, so that its name
    makes an equal environment (what evaluate and resume do); a recipe takes the defaults of the id
    without its options."""
    from jaxrl_frag.envs import id_options

    assert [id_options.value(text) for text in ("3", "0.5", "true", "false", "positional")] == [
        3, 0.5, True, False, "positional"]
    env = envs.make("brax:inverted_pendulum@episode_length=500@backend=positional")
    assert (env.backend, env.episode_length) == ("positional", 500)
    assert env.name == "brax:inverted_pendulum@backend=positional@episode_length=500"
    assert envs.make(env.name) == env == envs.make("brax:inverted_pendulum", backend="positional", episode_length=500)
    assert envs.make("brax:inverted_pendulum@backend=generalized") == envs.make("brax:inverted_pendulum")
    assert envs.make("brax:inverted_pendulum@backend=generalized").name == "brax:inverted_pendulum"
    masked = envs.make("brax:inverted_pendulum@backend=positional@obs=0,1", num_envs=2)
    assert masked.name == "brax:inverted_pendulum@backend=positional@obs=0,1"
    assert masked.observation_space.shape == (2,)
    assert envs.make(masked.name, num_envs=2) == masked
    every_action = envs.make("Breakout-MinAtar@use_minimal_action_set=false")
    assert (every_action.action_space.n, envs.make("Breakout-MinAtar").action_space.n) == (6, 3)
    assert every_action.name == "Breakout-MinAtar@use_minimal_action_set=false"
    assert envs.make(every_action.name) == every_action
    # a registered factory gets the options, and must name its environment with them
    envs.register("NamedCartPole-v0", lambda gravity=9.8: envs.GymnaxEnv.make("CartPole-v1") if gravity == 9.8 else
                  dataclasses.replace(envs.GymnaxEnv.make("CartPole-v1"), name=f"NamedCartPole-v0@gravity={gravity}"))
    assert envs.make("NamedCartPole-v0@gravity=3.5").name == "NamedCartPole-v0@gravity=3.5"
    with pytest.raises(ConfigError, match=r"named the environment 'CartPole-v1', not with the options @gravity=9.8"):
        envs.make("NamedCartPole-v0@gravity=9.8")
    ppo = jf.recipes.PPO.create("brax:inverted_pendulum@backend=positional")
    assert ppo.env.name == "brax:inverted_pendulum@backend=positional"
    brax_defaults = jf.recipes.PPO.defaults("brax:inverted_pendulum")
    assert (ppo.num_envs, ppo.gamma) == (brax_defaults["num_envs"], brax_defaults["gamma"]) != (
        jf.recipes.PPO.fields()["num_envs"], jf.recipes.PPO.fields()["gamma"])


def test_time_limit_is_a_truncation_not_a_termination() -> None:
    # MountainCar never reaches the goal by pushing left: every episode ends by the 200-step time limit
    env = envs.make("MountainCar-v0", num_envs=2)
    _, ts = jax.jit(lambda: run(env, 450))()
    done_at = np.nonzero(np.asarray(ts.done[:, 0]))[0]
    np.testing.assert_array_equal(done_at, [199, 399])
    assert not np.asarray(ts.terminated).any()
    np.testing.assert_array_equal(np.asarray(ts.info["episode_length"])[done_at, 0], [200, 200])
    # the observation after a done is a fresh reset; the final one is where the car was
    assert not np.allclose(np.asarray(ts.obs[199]), np.asarray(ts.final_obs[199]))
    np.testing.assert_array_equal(np.asarray(ts.obs[198]), np.asarray(ts.final_obs[198]))


def test_cartpole_falling_over_is_a_termination() -> None:
    env = envs.make("CartPole-v1", num_envs=3)
    _, ts = jax.jit(lambda: run(env, 60))()
    assert np.asarray(ts.terminated).any()
    assert not np.asarray(ts.truncated).any()
    ended = np.asarray(ts.done)
    returns = np.asarray(ts.info["episode_return"])[ended]
    lengths = np.asarray(ts.info["episode_length"])[ended]
    np.testing.assert_array_equal(returns, lengths)  # reward 1 per step


def test_normalize_observation_standardizes() -> None:
    env = envs.make("Pendulum-v1", num_envs=64, normalize_obs=True)
    _, ts = jax.jit(lambda: run(env, 300))()
    obs = np.asarray(ts.obs[100:]).reshape(-1, 3)
    np.testing.assert_allclose(obs.mean(0), 0.0, atol=0.25)
    np.testing.assert_allclose(obs.std(0), 1.0, atol=0.25)


def test_scale_reward_divides_by_return_std_and_keeps_episode_returns_raw() -> None:
    raw = envs.make("Pendulum-v1", num_envs=16)
    scaled = envs.make("Pendulum-v1", num_envs=16, scale_reward=True)
    _, ts_raw = jax.jit(lambda: run(raw, 210))()
    _, ts = jax.jit(lambda: run(scaled, 210))()
    assert np.abs(np.asarray(ts.reward)).mean() < 0.2 * np.abs(np.asarray(ts_raw.reward)).mean()
    np.testing.assert_allclose(np.asarray(ts.info["episode_return"]), np.asarray(ts_raw.info["episode_return"]))


def test_running_moments_merge_equals_whole_batch() -> None:
    x = jax.random.normal(jax.random.PRNGKey(3), (1000, 2)) * 3 + 1
    m = envs.RunningMoments.zeros((2,))
    for chunk in np.split(np.asarray(x), 10):
        m = m.update(jnp.asarray(chunk))
    np.testing.assert_allclose(m.mean, x.mean(0), rtol=1e-3)
    np.testing.assert_allclose(m.var, x.var(0), rtol=1e-3)


def test_unknown_environment_lists_the_available_ones() -> None:
    with pytest.raises(ConfigError) as err:
        envs.make("CartPole-v2")
    assert err.value.field == "env" and "CartPole-v1" in str(err.value) and "available" in str(err.value)


def test_minatar_observations_are_images() -> None:
    env = envs.make("Breakout-MinAtar", num_envs=2)
    assert env.observation_space.shape == (10, 10, 4)
    assert isinstance(env.action_space, envs.Discrete)
    _, ts = jax.jit(lambda: run(env, 5))()
    assert ts.obs.shape == (5, 2, 10, 10, 4)


@pytest.fixture(scope="module")
def pendulum_rollout():
    """25 steps of 2 Brax inverted pendulums under a constant action, compiled once: an
    episode lasts at most 20 physics steps, each action repeated twice (so 10 calls of ``step``)."""
    env = envs.make("brax:inverted_pendulum", num_envs=2, episode_length=20, action_repeat=2)

    def rollout(action):
        state, first_obs = env.reset(jax.random.PRNGKey(0))

        def body(state, key):
            return env.step(key, state, jnp.full((2, 1), action))

        _, ts = jax.lax.scan(body, state, jax.random.split(jax.random.PRNGKey(1), 25))
        return first_obs, ts

    return env, jax.jit(rollout)


def test_brax_spaces_and_time_limit_is_a_truncation(pendulum_rollout) -> None:
    env, rollout = pendulum_rollout
    assert env.observation_space.shape == (4,) and np.isinf(env.observation_space.high).all()
    assert env.action_space == envs.Box((-1.0,), (1.0,), (1,))
    first_obs, ts = rollout(0.0)  # pushing neither way keeps the pole up past the time limit
    assert ts.obs.shape == ts.final_obs.shape == (25, 2, 4) and ts.reward.shape == (25, 2)
    done_at = np.nonzero(np.asarray(ts.done[:, 0]))[0]
    np.testing.assert_array_equal(done_at, [9, 19])
    assert np.asarray(ts.truncated[done_at]).all() and not np.asarray(ts.terminated).any()
    np.testing.assert_array_equal(np.asarray(ts.reward), 2.0)  # 1 per physics step, two per action
    np.testing.assert_array_equal(np.asarray(ts.info["episode_return"])[done_at, 0], [20.0, 20.0])
    # the episode ended where the pole was after 20 physics steps, not at a reset observation
    assert not np.allclose(np.asarray(ts.final_obs[9]), np.asarray(ts.obs[9]))
    assert not np.allclose(np.asarray(ts.final_obs[9]), np.asarray(first_obs))
    np.testing.assert_array_equal(np.asarray(ts.final_obs[8]), np.asarray(ts.obs[8]))


def test_brax_pole_falling_is_a_termination(pendulum_rollout) -> None:
    _, rollout = pendulum_rollout
    _, ts = rollout(1.0)  # full force one way: the pole falls within a few steps, again and again
    assert np.asarray(ts.terminated).sum() >= 10 and not np.asarray(ts.truncated).any()
    assert np.asarray(ts.info["episode_length"])[np.asarray(ts.done)].max() < 10


@pytest.mark.slow  # a process of its own: brax not yet imported
def test_brax_ids_are_listed_and_bad_ones_refused_before_brax_loads() -> None:
    code = ("import sys; from jaxrl_frag import ConfigError, envs\n"
            "assert 'brax:hopper' in envs.available() and 'brax:inverted_pendulum' in envs.available()\n"
            "for kwargs in ({'name': 'brax:hoper'}, {'name': 'brax:hopper', 'backend': 'warp'},\n"
            "               {'name': 'brax:hopper', 'episode_length': 0}):\n"
            "    try:\n"
            "        envs.make(**kwargs)\n"
            "    except ConfigError as err:\n"
            "        print(err.field, '|', err)\n"
            "assert 'brax' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == 3
    assert out[0].startswith("env |") and "brax:hoper" in out[0] and "did you mean brax:hopper" in out[0]
    assert out[1].startswith("backend |") and "'warp'" in out[1] and "generalized, positional, spring, mjx" in out[1]
    assert out[2].startswith("episode_length |") and "positive integer" in out[2]


@pytest.mark.slow  # a process of its own, a user's command in it: gymnax not yet imported
def test_gymnax_training_leaves_its_plotting_imports_to_a_render(tmp_path) -> None:
    # gymnax's modules import seaborn and pyplot (1.7 s of a command's start) for Pong's and Catch's renderers only
    code = ("import sys, jax\n"
            "from jaxrl_frag.app.cli import main\n"
            f"assert main(['train', 'ppo', '--env', 'CartPole-v1', '--num-envs', '2', '--num-steps', '8',\n"
            f"             '--total-steps', '32', '--run-dir', {str(tmp_path / 'run')!r}]) == 0\n"
            "print(sorted(m for m in ('seaborn', 'matplotlib.pyplot', 'pandas') if m in sys.modules))\n"
            "from gymnax.environments.bsuite import catch\n"
            "from gymnax.environments.misc import pong\n"
            "from jaxrl_frag import envs\n"
            "env = envs.make('Pong-misc', num_envs=None)\n"
            "state, _ = env.reset(jax.random.PRNGKey(0))\n"
            "print(type(env.env.render(state, env.params)).__name__, type(pong.sns.color_palette('cubehelix', 3)).__name__)\n"
            "import matplotlib, matplotlib.pyplot as plt\n"
            "print(type(plt) is type(sys), plt is matplotlib.pyplot, plt is sys.modules['matplotlib.pyplot'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-3:] == ["[]", "AxesImage _ColorPalette", "True True True"], out.stdout

def test_brax_ids_are_brax_physics_environments() -> None:
    from brax import envs as brax_envs

    assert set(envs.brax_env.NAMES) == set(brax_envs._envs) - {"fast"}  # "fast" is brax's test environment


def test_minatar_networks_get_a_convolution_and_ppo_and_impala_train_on_it() -> None:
    for recipe in (jf.recipes.PPO, jf.recipes.IMPALA):
        algo = recipe.create("Breakout-MinAtar", num_envs=2, num_steps=8, total_steps=16, num_minibatches=1, hidden=(32,))
        assert algo.network_torso == "cnn"  # torso "auto" on (10, 10, 4) observations
        history = jf.compile(algo, chunk_iterations=1).run(jax.random.PRNGKey(0))
        assert history.final["env_steps"] == 16 and np.isfinite(history.final["loss"])
        params = history.state.params["params"]
        assert params["pi"]["conv"]["kernel"].shape == (3 * 3 * 4, 16)
        assert params["v"]["Dense_0"]["kernel"].shape == (8 * 8 * 16, 32)
    assert jf.recipes.PPO.create("Breakout-MinAtar", torso="mlp").network_torso == "mlp"
    assert jf.recipes.PPO.create("CartPole-v1").network_torso == "mlp"


@pytest.mark.parametrize(("size", "kernel", "stride"), [(10, 3, 1), (84, 8, 4), (20, 4, 2), (9, 3, 1), (11, 4, 2)])
def test_patches_times_a_kernel_is_a_valid_strided_convolution(size: int, kernel: int, stride: int) -> None:
    """The MinAtar convolution and the three of the Atari network (odd sizes too)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, size, size, 4))
    weights = jax.random.normal(jax.random.PRNGKey(1), (kernel, kernel, 4, 16))
    expected = jax.lax.conv_general_dilated(x, weights, (stride, stride), "VALID",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"), precision="highest")
    # patches lay a window out block by block: (block row, block col, row in block, col in block, channel)
    k = kernel // stride
    laid_out = weights.reshape(k, stride, k, stride, 4, 16).transpose(0, 2, 1, 3, 4, 5).reshape(-1, 16)
    got = jf.recipes.networks.patches(x, kernel, stride) @ laid_out
    np.testing.assert_allclose(got, expected, atol=1e-3)


@pytest.mark.parametrize(("env", "torso", "message"), [
    ("CartPole-v1", "cnn", "needs image observations (H, W, C); CartPole-v1 observes shape (4,)"),
    ("Breakout-MinAtar", "atari", "needs images of at least 36x36"),
    ("Breakout-MinAtar", "conv", "choose one of auto, atari, cnn, mlp"),
])
def test_a_torso_that_cannot_work_is_refused(env: str, torso: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        jf.recipes.PPO.create(env, torso=torso)
    assert err.value.field == "torso" and message in str(err.value)
