"""Shared fixtures: compile each expensive program once per session.

Every program this suite compiles, in this process or in any process it starts (the CLI,
workers, notebook kernels), goes through JAX's persistent compilation cache, so a program
that several tests build is compiled once and loaded after that. The cache lives in the
user's cache directory (``JAXRL_FRAG_CACHE_DIR`` to put it elsewhere); a clean checkout
starts with it empty, and a program read back from it computes bitwise what a fresh
compilation does (``test_compilation_cache.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

# eight CPU devices for the data-parallel tests; set before jax initialises its backend
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
CACHE_DIR = os.environ.setdefault(
    "JAXRL_FRAG_CACHE_DIR",
    str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jaxrl_frag" / "test-xla"),
)
# the same settings as the CLI's (jaxrl_frag.app.cli.runtime.enable_compilation_cache), as environment variables so
# that the processes the tests start inherit them: multi-process workers and notebook kernels set no cache themselves
os.environ["JAX_COMPILATION_CACHE_DIR"] = CACHE_DIR
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"  # below it, compiling beats reading back

import jax  # noqa: E402
import pytest  # noqa: E402

import jaxrl_frag as jf  # noqa: E402

# jax read the variables above when it was imported; set here as well in case a plugin imported it first
jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
# a whole suite's programs take about 50 MB; past this the oldest entries go, when a session starts
CACHE_BYTES = 2 * 2**30

# marked here rather than in the module (see the markers in pyproject.toml): modules of real processes throughout
# (multi-process runs, a wheel build, a plugin package installed and driven through the console script, host
# environments' worker pools), and every test that reads the 5e5-step yardstick run
SLOW_MODULES = ("test_multiprocess.py", "test_packaging.py", "test_plugins.py", "test_host_envs.py", "test_host_pool.py",
                "test_host_ray.py")
# under pytest-xdist modules go to the two workers in this order, the costliest first so that no worker is left with
# a long one at the end: the documents' commands (one test of about 8 minutes in make test, 6 in make test-long) and
# the Atari test are the longest, the recipe x policy matrix (60 programs) the largest module of make test
FIRST_MODULES = ("test_readme_commands.py", "test_host_envs.py", "test_matrix.py")


def prune(cache: Path, max_bytes: int) -> None:
    """Remove the oldest files of the compilation cache ``cache`` until it holds at most ``max_bytes``."""
    entries = sorted((p.stat().st_mtime, p.stat().st_size, p) for p in cache.glob("*") if p.is_file())
    total = sum(size for _, size, _ in entries)
    for _, size, path in entries:
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        total -= size


def pytest_sessionstart(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: the controller has pruned
        return
    prune(Path(CACHE_DIR), CACHE_BYTES)


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    """A copy of the module's ``finished`` run, to change."""
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (folders as ``<dir>``), to compare before and after."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SLOW_MODULES or "cartpole_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    # the longest modules first, those holding slow or learning tests, each module's tests together and in order
    long = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("learning")}
    first = {name: i for i, name in enumerate(FIRST_MODULES)}
    items.sort(key=lambda item: (first.get(item.path.name, len(first)), item.path not in long))


@contextlib.contextmanager
def optimized(full: bool) -> Iterator[None]:
    """Programs compiled within, in this process and in the processes it starts, with XLA's full optimizations or
    without its costlier ones (a third less compile time, programs about 1.7x slower; on CPU the framework's own
    programs without XLA's fusion emitters as well, ``policy.compile_options``: their compile time more than
    halves again)."""
    before = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS"), jax.config.read("jax_disable_most_optimizations")
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = str(int(not full))
    jax.config.update("jax_disable_most_optimizations", not full)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before[1])
        if before[0] is None:
            del os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"]
        else:
            os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = before[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A test without a learning threshold runs a few iterations, so compiling is most of its time: its programs
    compile without the costlier optimizations. A learning test compiles as a user's run does, and so does one that
    claims two different programs compute alike to the last bit (marked ``users_compilation``)."""
    with optimized(full=any(item.get_closest_marker(name) for name in ("learning", "users_compilation"))):
        yield


@pytest.fixture(scope="session")
def cartpole_program() -> jf.Program:
    """PPO on CartPole-v1 with the yardstick's settings: 5e5 steps, 4 envs (fully optimized: tests run it whole)."""
    with optimized(full=True):
        return jf.compile(jf.recipes.PPO.create("CartPole-v1", total_steps=500_000), chunk_iterations=16)


@pytest.fixture(scope="session")
def cartpole_run(cartpole_program: jf.Program) -> jf.History:
    return cartpole_program.run(jax.random.PRNGKey(0))
