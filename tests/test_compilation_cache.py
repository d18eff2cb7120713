"""JAX's persistent compilation cache, which the suite turns on (conftest.py) so that a
program compiled by one test or subprocess is loaded, not compiled again, by the next:
a program loaded from the cache computes bitwise what a freshly compiled one does; and
``jf.compile`` turns it on for a user's process that sets none (a second process reads
the first one's programs back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# compile and run PPO under SingleDevice and DataParallel in a fresh process; save every
# leaf of the final states and every metric; print what the cache did
PROBE = r"""
import json, sys
import jax
import numpy as np

cache, out = sys.argv[1], sys.argv[2]
jax.config.update("jax_compilation_cache_dir", cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # every program, however quick to compile
events = []
jax.monitoring.register_event_listener(lambda event, **_: events.append(event))

import jaxrl_frag as jf
from jaxrl_frag.sharding import DataParallel, SingleDevice

algo = jf.recipes.PPO.create("CartPole-v1", num_envs=8, num_steps=16, total_steps=8 * 16 * 4, num_minibatches=2)
arrays = {}
for name, policy in (("single", SingleDevice()), ("parallel", DataParallel(2))):
    history = jf.compile(algo, policy, chunk_iterations=2).run(jax.random.PRNGKey(5))
    for i, leaf in enumerate(jax.tree.leaves(history.state)):
        arrays[f"{name}/state/{i}"] = np.asarray(leaf)
    for metric in history.rows[0]:
        if metric != "sps":  # wall-clock
            arrays[f"{name}/metric/{metric}"] = np.asarray(history[metric])
np.savez(out, **arrays)
print(json.dumps({kind: events.count(f"/jax/compilation_cache/{kind}") for kind in ("cache_hits", "cache_misses")}))
"""


def probe(cache: Path, out: Path) -> dict[str, int]:
    proc = subprocess.run([sys.executable, "-c", PROBE, str(cache), str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two processes, each compiling and running two programs
def test_a_program_loaded_from_the_cache_computes_what_a_fresh_compilation_does(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fresh = probe(cache, tmp_path / "fresh.npz")  # an empty cache: every program compiled, and written
    assert fresh["cache_hits"] == 0 and fresh["cache_misses"] > 0, fresh
    assert any(cache.iterdir())
    cached = probe(cache, tmp_path / "cached.npz")  # the same programs again: every one read back
    assert cached == {"cache_hits": fresh["cache_misses"], "cache_misses": 0}, (fresh, cached)
    with np.load(tmp_path / "fresh.npz") as a, np.load(tmp_path / "cached.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        assert any("/state/" in name for name in a.files) and any("/metric/" in name for name in a.files)
        for name in a.files:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# jf.compile from Python in a fresh process that sets no cache itself: where the programs go, how long compiling took,
# how many executables it built and what the cache did
API_PROBE = r"""
import json
import jax

events = []
jax.monitoring.register_event_listener(lambda event, **_: events.append(event))

import jaxrl_frag as jf

program = jf.compile(jf.recipes.PPO.create("CartPole-v1", num_envs=8, total_steps=8 * 128 * 10))
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir, "compile_s": program.compile_seconds,
                  "executables": len(program.executables),
                  **{kind: events.count(f"/jax/compilation_cache/{kind}") for kind in ("cache_hits", "cache_misses")}}))
"""


@pytest.mark.slow  # two processes, each compiling PPO as a user's run does
def test_a_second_process_compiling_from_python_reads_the_first_ones_programs_back(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # as a user's shell has it: no cache of JAX's set, XLA's full optimisations (the training program then takes more
    # than the half second from which the cache keeps programs)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "JAX_DISABLE_MOST_OPTIMIZATIONS"))}
    env["JAXRL_FRAG_CACHE_DIR"] = str(cache)

    def probe() -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-c", API_PROBE], capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    fresh = probe()  # an empty cache: every program compiled, and those of at least half a second written
    assert fresh["dir"] == str(cache) and fresh["cache_hits"] == 0, fresh
    assert fresh["executables"] == 2  # the iterations' program and init's (compiled for compile time)
    written = sorted(p.name for p in cache.iterdir())
    assert len(written) == fresh["cache_misses"] and any(name.startswith("jit_run_iterations") for name in written), (
        fresh, written)  # JAX counts a program written as a miss
    cached = probe()  # every program the first process wrote, read back
    assert cached["dir"] == str(cache) and cached["cache_hits"] == fresh["cache_misses"], (fresh, cached)
    assert cached["compile_s"] < fresh["compile_s"], (fresh, cached)
    print(f"jf.compile: {fresh['compile_s']:.2f} s with an empty cache, {cached['compile_s']:.2f} s in a second process")
