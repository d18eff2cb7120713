"""IPPO on MPE_simple_spread_v3: the framework against JaxMARL's own baseline script,
side by side, alternating, each round a fresh process.

    python benchmarks/jaxmarl_ippo.py --jaxmarl-python VENV/bin/python \
        --jaxmarl-ippo JAXMARL/baselines/IPPO [--steps 2e6] [--rounds 3] [--no-check-finite]

JaxMARL's side runs ``ippo_ff_mpe.py`` from a checkout of JaxMARL's repository (the
folder ``--jaxmarl-ippo``), unmodified, under a Python that has its dependencies
(``jaxmarl[algs]``: distrax, hydra, omegaconf, wandb): a few lines given to ``python -c``
read its config (``config/ippo_ff_mpe.yaml``), call its ``make_train``, compile the
jitted ``train`` ahead of time and run it once, wandb disabled (its per-update
``io_callback`` stays, as published). The framework's side trains ``IPPO`` with the
same settings (JaxMARL's: 16 environments x 128 steps, 4 epochs of 4 minibatches, Adam
2.5e-4 annealed, 64x64 tanh networks, parameters shared); what still differs: ours
appends each agent's one-hot id to its inputs, bootstraps the value at the time limit
where JaxMARL's treats it as a termination, and checks every iteration's state and
metrics for non-finite values (``--no-check-finite``: compiled without the check, as
``jf.compile(..., check_finite=False)``). Both on the same steps and seed.

Prints each round's compile and train seconds, the ratios framework / JaxMARL (median
of the rounds' ratios; below 1 the framework is faster) and each side's final return,
the mean over the last 10% of its rows or updates (JaxMARL's ``returned_episode_returns`` is the agents' summed return, its logger
scaling each agent's reward by the agent count: divided by 3 here to compare with
ours, the agents' mean).
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from peers import alternate_rounds, run_python

OURS = textwrap.dedent("""
    import json, time, jax
    import jaxrl_frag as jf
    algo = jf.recipes.IPPO.create("jaxmarl:MPE_simple_spread_v3", total_steps={steps})
    start = time.perf_counter(); program = jf.compile(algo, check_finite={check_finite}); compile_s = time.perf_counter() - start
    start = time.perf_counter(); history = program.run(jax.random.PRNGKey({seed}))
    jax.block_until_ready(history.state); train_s = time.perf_counter() - start
    print(json.dumps({{"compile_s": compile_s, "train_s": train_s, "steps": int(history.final["env_steps"]),
                      "final_return": float(history["episode_return"][-len(history.rows) // 10:].mean())}}))
""")

THEIRS = textwrap.dedent("""
    import json, sys, time, jax, wandb
    from omegaconf import OmegaConf
    sys.path.insert(0, {folder!r})
    from ippo_ff_mpe import make_train
    config = OmegaConf.to_container(OmegaConf.load({folder!r} + "/config/ippo_ff_mpe.yaml"))
    config["TOTAL_TIMESTEPS"] = {steps}
    wandb.init(mode="disabled")
    train = jax.jit(make_train(config))
    key = jax.random.PRNGKey({seed})
    start = time.perf_counter(); compiled = train.lower(key).compile(); compile_s = time.perf_counter() - start
    start = time.perf_counter(); out = jax.block_until_ready(compiled(key)); train_s = time.perf_counter() - start
    returns = out["metrics"]["returned_episode_returns"]
    steps = config["NUM_STEPS"] * config["NUM_ENVS"] * returns.shape[0]
    print(json.dumps({{"compile_s": compile_s, "train_s": train_s, "steps": int(steps),
                      "final_return": float(returns[-max(1, returns.shape[0] // 10):].mean()) / 3}}))
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jaxmarl-python", required=True, help="a Python with jaxmarl[algs] installed")
    parser.add_argument("--jaxmarl-ippo", required=True, help="JaxMARL's baselines/IPPO folder")
    parser.add_argument("--steps", type=float, default=2e6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-finite", action=argparse.BooleanOptionalAction, default=True,
                        help="the framework's per-iteration finite check (its default: on)")
    args = parser.parse_args()
    steps = int(args.steps)
    ours_code = OURS.format(steps=steps, seed=args.seed, check_finite=args.check_finite)
    theirs_code = THEIRS.format(folder=args.jaxmarl_ippo, steps=steps, seed=args.seed)
    rounds = alternate_rounds(lambda: run_python(sys.executable, ours_code),
                              lambda: run_python(args.jaxmarl_python, theirs_code), args.rounds, "JaxMARL")
    print(f"steps: framework {rounds[0][0]['steps']:,}, JaxMARL {rounds[0][1]['steps']:,}")


if __name__ == "__main__":
    main()
