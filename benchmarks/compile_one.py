"""What building ``init`` and the iterations as one program would save: XLA compile seconds
of the ways to build a single-device PPO program, side by side.

    python benchmarks/compile_one.py [--env CartPole-v1] [--num-envs 4] [--repeats 3]

Each way is lowered (as ``SingleDevice`` lowers its programs) and compiled ``--repeats``
times afresh (no persistent cache, JAX's in-memory caches cleared), alternating:

- ``two programs``: today's build, the iterations with XLA's defaults, then ``init`` with
  ``compile_options(run_once=True)``, one after the other;
- ``two on threads``: the same two compiled at once, ``init`` on a second thread;
- ``one program``: ``init`` folded into the iterations' program behind a ``lax.cond``
  on a flag (a first call from a key, later ones from the state), with XLA's defaults.

It also compiles ``init`` alone under each set of options (XLA's defaults,
``RUN_ONCE_OPTIONS``, ``compile_options(run_once=True)``), which says on this backend
whether compiling what runs once for compile time pays. It prints the medians and the
ratios to ``two programs`` (the median of the per-repeat ratios; below 1.00 the way is
quicker to build).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp

import jaxrl_frag as jf
from jaxrl_frag import tracing
from jaxrl_frag.chunking import Chunk, run_iterations
from jaxrl_frag.policy import RUN_ONCE_OPTIONS, compile_options

KEY = jax.ShapeDtypeStruct((2,), jnp.uint32)
COUNT = jax.ShapeDtypeStruct((), jnp.int32)


def folded(algorithm: jf.Algorithm, key: jax.Array, fresh: jax.Array, state: Any, chunk: Chunk,
           iterations: jax.Array, k: jax.Array, offset: jax.Array) -> Any:
    """``run_iterations`` from ``state``, or where ``fresh`` from ``init(key)``."""
    state = jax.lax.cond(fresh, lambda _: tracing.init(algorithm, key), lambda held: held, state)
    return run_iterations(algorithm, state, chunk, iterations, k, offset, max_rows=jf.Program.max_rows_per_call,
                          check_finite=True)


def ways(algorithm: jf.Algorithm) -> dict[str, Callable[[], object]]:
    """Each way of building, as a function that lowers and compiles it."""
    state = jax.eval_shape(tracing.init, algorithm, KEY)
    chunk = Chunk.empty(jax.eval_shape(tracing.checked_step, algorithm, state)[1])
    call = functools.partial(run_iterations, max_rows=jf.Program.max_rows_per_call, check_finite=True)
    quick = compile_options(run_once=True)

    def iterations() -> jax.stages.Lowered:
        return jax.jit(call, donate_argnums=(1,)).lower(algorithm, state, chunk, COUNT, COUNT, COUNT)

    def init() -> jax.stages.Lowered:
        return jax.jit(tracing.init).lower(algorithm, KEY)

    def two() -> object:
        return iterations().compile(), init().compile(compiler_options=quick)

    def threads() -> object:
        lowered = iterations(), init()
        with ThreadPoolExecutor(1) as pool:
            started = pool.submit(lowered[1].compile, compiler_options=quick)
            return lowered[0].compile(), started.result()

    def one() -> object:
        return jax.jit(folded, donate_argnums=(3,)).lower(algorithm, KEY, jax.ShapeDtypeStruct((), jnp.bool_), state,
                                                          chunk, COUNT, COUNT, COUNT).compile()

    return {"two programs": two, "two on threads": threads, "one program": one,
            "init: XLA's defaults": lambda: init().compile(),
            "init: RUN_ONCE_OPTIONS": lambda: init().compile(compiler_options=RUN_ONCE_OPTIONS),
            "init: compile_options(run_once=True)": lambda: init().compile(compiler_options=quick)}


def main() -> None:
    jax.config.update("jax_enable_compilation_cache", False)  # compile times of fresh compiles, not cache reads
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    algorithm = jf.recipes.PPO.create(args.env, num_envs=args.num_envs, total_steps=args.num_envs * 128 * 100)
    tasks = ways(algorithm)
    seconds: dict[str, list[float]] = {name: [] for name in tasks}
    for repeat in range(args.repeats):
        for name in (list(tasks) if repeat % 2 == 0 else list(reversed(tasks))):
            jax.clear_caches()
            t0 = time.perf_counter()
            tasks[name]()
            seconds[name].append(time.perf_counter() - t0)
    device = jax.devices()[0]
    print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}), {args.env}, {args.num_envs} environments, "
          f"{args.repeats} alternating repeats, fresh compiles")
    print(json.dumps({name: [round(s, 3) for s in values] for name, values in seconds.items()}))
    print("| way | compile s (median) | ratio to two programs (median per repeat) |")
    print("|---|---|---|")
    for name, values in seconds.items():
        ratio = statistics.median(s / t for s, t in zip(values, seconds["two programs"], strict=True))
        print(f"| {name} | {statistics.median(values):.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
