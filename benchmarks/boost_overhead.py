"""What the boosting machinery costs when it changes nothing: PPO held at 64
environments by a ladder (8, 16, 32, 64; strategy ``fixed``) against plain PPO with 64.

    python benchmarks/boost_overhead.py [--repeats 3] [--budget 1e6] [--env CartPole-v1]

Both run the same rounds on the same environments (``tests/test_boost.py`` shows they
compute the same thing). The ladder's run also carries the pool and the controller,
and the conditional whose other three branches are never taken. Each measurement is
a fresh process that compiles its contender and times one training run. The two
alternate, the order swapped every round. Prints the median compile and train seconds
and the ratio ladder / plain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CONTENDERS = ("plain", "ladder")


def measure(contender: str, env: str, budget: int) -> dict[str, float]:
    """Compile ``contender`` and time one training run of it, in this process."""
    import jax

    import jaxrl_frag as jf
    from jaxrl_frag.recipes import PPO
    from jaxrl_frag.transforms import boost

    jax.config.update("jax_enable_compilation_cache", False)  # compile times of fresh compiles, not cache reads
    recipe = PPO.create(env, num_envs=64, total_steps=budget)
    algo = recipe if contender == "plain" else boost.Boosted.create(recipe, strategy="fixed", budget_steps=budget,
                                                                              minibatches="count")
    t0 = time.perf_counter()
    program = jf.compile(algo, chunk_iterations=1)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    history = program.run(jax.random.PRNGKey(0))
    jax.block_until_ready(history.state)
    return {"compile_s": compile_s, "train_s": time.perf_counter() - t0, "rounds": history.iteration}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=1e6)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--measure", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.env, int(args.budget))))
        return
    results: dict[str, list[dict[str, float]]] = {c: [] for c in CONTENDERS}
    for r in range(args.repeats):
        for contender in CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]:
            out = subprocess.run([sys.executable, __file__, "--measure", contender, "--env", args.env,
                                  "--budget", str(args.budget)], capture_output=True, text=True, check=True)
            results[contender].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(contender, results[contender][-1], flush=True)
    median = {c: {k: statistics.median(m[k] for m in results[c]) for k in ("compile_s", "train_s")} for c in CONTENDERS}
    for c in CONTENDERS:
        print(f"{c}: compile {median[c]['compile_s']:.1f} s, train {median[c]['train_s']:.2f} s (median of {args.repeats})")
    print(f"train ratio ladder / plain: {median['ladder']['train_s'] / median['plain']['train_s']:.3f}")


if __name__ == "__main__":
    main()
