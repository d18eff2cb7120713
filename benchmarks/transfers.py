"""ActorLearner transfer precision: bytes moved between the device groups per
iteration, and the final return, for float32, bfloat16 and int8 transfers.

    python benchmarks/transfers.py [--seeds 3] [--recipes ppo,impala]

Each recipe trains on CartPole-v1 with its default settings under
``ActorLearner(1 actor device, 1 learner device, staleness 1)`` on two forced CPU
devices, once per precision and seed. Bytes are measured on the arrays that
actually cross (the in-flight trajectory and the parameters sent back), and
checked against ``explain``'s figures. The final return is the mean of the last
three rows of metrics, averaged over seeds (with each seed's value).
"""

from __future__ import annotations

import argparse
import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

import jax
import numpy as np

import jaxrl_frag as jf
from jaxrl_frag.sharding import ActorLearner
from jaxrl_frag.sharding.actor_learner import PipelineState
from jaxrl_frag.transforms.precision import TRANSFER_DTYPES


def crossing_bytes(state: PipelineState) -> int:
    """Bytes of one iteration's crossings: the packed trajectory and actor metrics in
    flight, and the newest parameter copy."""
    return sum(x.nbytes for x in jax.tree.leaves((state.in_flight, state.lagged[-1])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--recipes", default="ppo,impala")
    args = parser.parse_args()
    print("| recipe | transfer dtype | bytes / iteration | vs float32 | final return (mean) | per seed |")
    print("|---|---|---|---|---|---|")
    for name in args.recipes.split(","):
        algo = jf.recipes.RECIPES[name].create("CartPole-v1")
        baseline = None
        for dtype in TRANSFER_DTYPES:
            program = jf.compile(algo, ActorLearner(1, 1, staleness=1, transfer_dtype=dtype))
            finals = []
            for seed in range(args.seeds):
                history = program.run(jax.random.PRNGKey(seed))
                finals.append(float(np.mean(history["episode_return"][-3:])))
            moved = crossing_bytes(history.state)
            assert moved == program.explain().transfer_bytes(), (moved, program.explain().transfer_bytes())
            baseline = baseline or moved
            print(f"| {name} | {dtype} | {moved:,} | {moved / baseline:.3f} | {np.mean(finals):.1f} | "
                  f"{', '.join(f'{f:.0f}' for f in finals)} |", flush=True)


if __name__ == "__main__":
    main()
