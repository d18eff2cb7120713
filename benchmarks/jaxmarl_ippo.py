"""IPPO: the framework against JaxMARL's own baseline script, side by side, alternating,
each round a fresh process, on MPE_simple_spread_v3 (``--task mpe``) or MABrax's ant_4x2
(``--task mabrax``: continuous actions); ``--env`` runs the task's script and settings on
another of JaxMARL's environments.

    python benchmarks/jaxmarl_ippo.py --jaxmarl-python VENV/bin/python \
        --jaxmarl-ippo JAXMARL/baselines/IPPO [--task mpe] [--env NAME] [--steps 2e6] [--rounds 3] \
        [--seed 0] [--no-check-finite] [--json benchmarks/results/multi_agent.json]

JaxMARL's side runs ``ippo_ff_mpe.py`` or ``ippo_ff_mabrax.py`` from a checkout of
JaxMARL's repository (the folder ``--jaxmarl-ippo``), unmodified, under a Python that has
its dependencies (``jaxmarl[algs]``: distrax, hydra, omegaconf, wandb): a few lines given
to ``python -c`` read its config (``config/ippo_ff_<task>.yaml``), call its ``make_train``
(the MABrax script's with the network's key split from the seed's, as its ``main`` does),
compile the jitted ``train`` ahead of time and run it once, wandb disabled (its
per-update ``io_callback`` stays, as published). The framework's side trains ``IPPO``
at its defaults for the environment, which are JaxMARL's settings (MPE: 16 environments
x 128 steps, 4 epochs of 4 minibatches, Adam 2.5e-4 annealed, 64x64 tanh networks,
parameters shared; MABrax: 64 x 300, Adam 1e-3, value coefficient 4.5, entropy 2e-6);
what still differs: ours appends each agent's one-hot id to its inputs, bootstraps the
value at the time limit where JaxMARL's treats it as a termination, and checks every
iteration's state and metrics for non-finite values (``--no-check-finite``: compiled
without the check, as ``jf.compile(..., check_finite=False)``). Both on the same steps
and seed.

Prints each round's compile and train seconds, the ratios framework / JaxMARL (median
of the rounds' ratios; below 1 the framework is faster) and each side's final return,
the mean over the last 10% of its rows or updates (JaxMARL's ``returned_episode_returns``,
per agent: on MPE its logger scales each agent's reward by the agent count, so it is
divided by 3 here to compare with ours, the agents' mean; MABrax's agents share one
reward, so per agent is the team's). ``--json`` puts the ratios and returns into that
records file (RESULTS.md's multi-agent table), replacing the record of the same script,
environment and steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import textwrap

import results
from peers import alternate_rounds, run_python

OURS = textwrap.dedent("""
    import json, time, jax, numpy as np
    import jaxrl_frag as jf
    algo = jf.recipes.IPPO.create("jaxmarl:{env}", total_steps={steps})
    start = time.perf_counter(); program = jf.compile(algo, check_finite={check_finite}); compile_s = time.perf_counter() - start
    start = time.perf_counter(); history = program.run(jax.random.PRNGKey({seed}))
    jax.block_until_ready(history.state); train_s = time.perf_counter() - start
    print(json.dumps({{"compile_s": compile_s, "train_s": train_s, "steps": int(history.final["env_steps"]),
                      "final_return": float(np.nanmean(history["episode_return"][-len(history.rows) // 10:]))}}))
""")

THEIRS = textwrap.dedent("""
    import json, sys, time, jax, wandb
    from omegaconf import OmegaConf
    sys.path.insert(0, {folder!r})
    from ippo_ff_{task} import make_train
    config = OmegaConf.to_container(OmegaConf.load({folder!r} + "/config/ippo_ff_{task}.yaml"))
    config["TOTAL_TIMESTEPS"] = {steps}
    config["ENV_NAME"] = {env!r}
    wandb.init(mode="disabled")
    key = jax.random.PRNGKey({seed})
    if {split_init}:  # the MABrax script's main: the network's key split from the seed's
        key, init_key = jax.random.split(key)
        train = jax.jit(make_train(config, init_key))
    else:
        train = jax.jit(make_train(config))
    start = time.perf_counter(); compiled = train.lower(key).compile(); compile_s = time.perf_counter() - start
    start = time.perf_counter(); out = jax.block_until_ready(compiled(key)); train_s = time.perf_counter() - start
    returns = out["metrics"]["returned_episode_returns"]
    steps = config["NUM_STEPS"] * config["NUM_ENVS"] * returns.shape[0]
    print(json.dumps({{"compile_s": compile_s, "train_s": train_s, "steps": int(steps),
                      "final_return": float(returns[-max(1, returns.shape[0] // 10):].mean()) / {scale}}}))
""")


# per task: our environment id, whether JaxMARL's make_train takes the network's key, its return's scale to ours
TASKS = {"mpe": ("MPE_simple_spread_v3", False, 3), "mabrax": ("ant_4x2", True, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jaxmarl-python", required=True, help="a Python with jaxmarl[algs] installed")
    parser.add_argument("--jaxmarl-ippo", required=True, help="JaxMARL's baselines/IPPO folder")
    parser.add_argument("--task", choices=sorted(TASKS), default="mpe",
                        help="mpe: MPE_simple_spread_v3 (ippo_ff_mpe.py); mabrax: ant_4x2 (ippo_ff_mabrax.py)")
    parser.add_argument("--env", help="a JaxMARL name to run instead of the task's own (its script and settings "
                                      "kept), e.g. hopper_3x1 for mabrax")
    parser.add_argument("--steps", type=float, default=2e6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="put the figures into this records file (benchmarks/results/multi_agent.json)")
    parser.add_argument("--check-finite", action=argparse.BooleanOptionalAction, default=True,
                        help="the framework's per-iteration finite check (its default: on)")
    args = parser.parse_args()
    steps = int(args.steps)
    env, split_init, scale = TASKS[args.task]
    env = args.env or env
    ours_code = OURS.format(env=env, steps=steps, seed=args.seed, check_finite=args.check_finite)
    theirs_code = THEIRS.format(folder=args.jaxmarl_ippo, task=args.task, env=env, steps=steps, seed=args.seed,
                                split_init=split_init, scale=scale)
    rounds = alternate_rounds(lambda: run_python(sys.executable, ours_code),
                              lambda: run_python(args.jaxmarl_python, theirs_code), args.rounds, "JaxMARL")
    print(f"steps: framework {rounds[0][0]['steps']:,}, JaxMARL {rounds[0][1]['steps']:,}")
    if args.json:
        values: dict[str, object] = {"ours": list(dict.fromkeys(o["final_return"] for o, _ in rounds)),
                                     "theirs": list(dict.fromkeys(t["final_return"] for _, t in rounds)),
                                     "rounds": len(rounds), "decimals": {"ours": 2, "theirs": 2, "ratio": 3}}
        for what in ("train", "compile"):
            ratios = [o[f"{what}_s"] / t[f"{what}_s"] for o, t in rounds]
            values |= {f"{what}_ratio": statistics.median(ratios), f"{what}_ratio_range": [min(ratios), max(ratios)]}
        script = f"ippo_ff_{args.task}.py"
        results.save(args.json, [results.record(
            {"what": f"IPPO beside {script}", "env": f"jaxmarl:{env}", "steps": results.steps(steps)}, values,
            "each round a fresh process, framework and JaxMARL alternating")])


if __name__ == "__main__":
    main()
