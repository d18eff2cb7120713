"""PQN on a MinAtar game: the framework against the authors' own purejaxql script, side by
side, alternating, each round a fresh process.

    python benchmarks/purejaxql_pqn.py --purejaxql-python VENV/bin/python --purejaxql CHECKOUT \
        [--env Asterix-MinAtar] [--steps 1e7] [--rounds 1] [--seed 0] [--out benchmarks/parity/NAME]

purejaxql's side runs ``purejaxql/pqn_minatar.py`` from a checkout of its repository
(``--purejaxql``), unmodified, under a Python that has its dependencies as it pins them
(jax 0.4.38, flax, gymnax 0.0.6, hydra, omegaconf, wandb; its script calls ``jax.tree_map``,
gone from newer jax, and gymnax 0.0.8's Asterix does not trace): a few lines given to ``python -c`` read its
configuration (``config/config.yaml`` with ``config/alg/pqn_minatar.yaml``, as its hydra
entry point merges them), set the game and the budget (decay schedules over the same
budget), call its ``make_train``, compile the jitted ``train`` ahead of time and run it once.
Its greedy test episodes during training are switched off (``TEST_DURING_TRAINING``): the
framework's run does not play them, and both sides are compared on their training
returns. The framework's side trains ``PQN`` at its MinAtar defaults, which are that file's
settings (128 environments x 32 steps, 2 epochs of 32 minibatches, RAdam 5e-4 decayed
linearly, Q(lambda) 0.65, epsilon 1 to 0.05 over a tenth of the run, a 3x3 convolution of 16
channels and a 128-wide layer, each with LayerNorm). What still differs: purejaxql divides
the (0/1) MinAtar image by 255 and initialises with He-normal kernels (ours: the images as
they are, flax's default kernels).

Prints each round's compile and train seconds, their ratios framework / purejaxql and each
side's final return, the mean over the last 10% of its rows or updates. purejaxql's curve is
the mean over the environments of ``returned_episode_returns`` (each environment's last
finished episode) per update; the framework's, the mean return of the episodes that ended in
each row. ``--out`` writes both curves of the first round as JSON and as a PNG figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from peers import alternate_rounds, run_python

OURS = textwrap.dedent("""
    import json, time, jax
    import jaxrl_frag as jf
    algo = jf.recipes.PQN.create({env!r}, total_steps={steps})
    start = time.perf_counter(); program = jf.compile(algo); compile_s = time.perf_counter() - start
    start = time.perf_counter(); history = program.run(jax.random.PRNGKey({seed}))
    jax.block_until_ready(history.state); train_s = time.perf_counter() - start
    returns, steps = history["episode_return"], history["env_steps"]
    print(json.dumps({{"compile_s": compile_s, "train_s": train_s, "steps": int(history.final["env_steps"]),
                      "final_return": float(returns[-max(1, len(returns) // 10):].mean()),
                      "curve": [steps.tolist(), returns.tolist()], "jax": jax.__version__}}))
""")

THEIRS = textwrap.dedent("""
    import json, sys, time, jax
    from omegaconf import OmegaConf
    sys.path.insert(0, {folder!r} + "/purejaxql")
    from pqn_minatar import make_train
    load = lambda name: OmegaConf.to_container(OmegaConf.load({folder!r} + "/purejaxql/config/" + name))
    config = {{**load("config.yaml"), **load("alg/pqn_minatar.yaml")}}
    config.update(ENV_NAME={env!r}, TOTAL_TIMESTEPS={steps}, TOTAL_TIMESTEPS_DECAY={steps}, TEST_DURING_TRAINING=False,
                  WANDB_MODE="disabled")
    train = jax.jit(make_train(config))
    key = jax.random.PRNGKey({seed})
    start = time.perf_counter(); compiled = train.lower(key).compile(); compile_s = time.perf_counter() - start
    start = time.perf_counter(); out = jax.block_until_ready(compiled(key)); train_s = time.perf_counter() - start
    returns, steps = out["metrics"]["returned_episode_returns"], out["metrics"]["env_step"]
    print(json.dumps({{"compile_s": compile_s, "train_s": train_s, "steps": int(steps[-1]),
                      "final_return": float(returns[-max(1, returns.shape[0] // 10):].mean()),
                      "curve": [steps.tolist(), returns.tolist()], "jax": jax.__version__}}))
""")


def figure(ours: dict, theirs: dict, env: str) -> Figure:
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for side, label, color in ((ours, "jaxrl_frag pqn", "tab:blue"), (theirs, "purejaxql pqn_minatar.py", "tab:orange")):
        steps, returns = (np.asarray(x, np.float64) for x in side["curve"])
        ax.plot(steps, returns, color=color, lw=1.5, label=f"{label} (jax {side['jax']})")
    ax.set(xlabel="environment steps", ylabel="mean episode return (training)", title=f"PQN, {env}")
    ax.legend()
    fig.tight_layout()
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--purejaxql-python", required=True, help="a Python with purejaxql's dependencies installed")
    parser.add_argument("--purejaxql", required=True, help="a checkout of purejaxql's repository")
    parser.add_argument("--env", default="Asterix-MinAtar")
    parser.add_argument("--steps", type=float, default=1e7)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write NAME.json and NAME.png (both curves of the first round)")
    args = parser.parse_args()
    steps = int(args.steps)
    ours_code = OURS.format(env=args.env, steps=steps, seed=args.seed)
    theirs_code = THEIRS.format(folder=str(args.purejaxql), env=args.env, steps=steps, seed=args.seed)
    rounds = alternate_rounds(lambda: run_python(sys.executable, ours_code),
                              lambda: run_python(args.purejaxql_python, theirs_code), args.rounds, "purejaxql")
    ours, theirs = rounds[0]
    print(f"steps: framework {ours['steps']:,} (jax {ours['jax']}), purejaxql {theirs['steps']:,} (jax {theirs['jax']})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"env": args.env, "steps": steps, "seed": args.seed, "command": " ".join(sys.argv),
                  "rounds": [{side: {k: v for k, v in run.items() if k != "curve"} for side, run in
                              zip(("framework", "purejaxql"), pair, strict=True)} for pair in rounds],
                  "curves": {"framework": ours["curve"], "purejaxql": theirs["curve"]}}
        args.out.with_suffix(".json").write_text(json.dumps(record))
        figure(ours, theirs, args.env).savefig(args.out.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
