"""JAX's persistent compilation cache, which the suite turns on (conftest.py) so that a
program compiled by one test or subprocess is loaded, not compiled again, by the next:
a program loaded from the cache computes bitwise what a freshly compiled one does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
