"""Shared fixtures: compile each expensive program once per session."""

from __future__ import annotations

import os

# eight CPU devices for the data-parallel tests; set before jax initialises its backend
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAXRL_FRAG_CACHE_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "jaxrl_frag_test_cache"))

import jax
import pytest

import jaxrl_frag as jf


@pytest.fixture(scope="session")
def cartpole_program() -> jf.Program:
    """PPO on CartPole-v1 with the yardstick's settings: 5e5 steps, 4 envs."""
    return jf.compile(jf.recipes.PPO.create("CartPole-v1", total_steps=500_000), chunk_iterations=16)


@pytest.fixture(scope="session")
def cartpole_run(cartpole_program: jf.Program) -> jf.History:
    return cartpole_program.run(jax.random.PRNGKey(0))
