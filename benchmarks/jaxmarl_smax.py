"""JaxMARL's own SMAX baselines, run here as the reference for the SMAX parity rows:
its published scripts (recurrent IPPO and MAPPO, ``baselines/{IPPO,MAPPO}``, and QMIX,
``baselines/QLearning/qmix_rnn.py``) unmodified at a stated budget, their win rate as
they log it.

    python benchmarks/jaxmarl_smax.py --jaxmarl-python VENV/bin/python --baselines JAXMARL/baselines \
        --recipe ippo --map 3m [--steps 1e6] [--seeds 3]

Each seed runs in a fresh process of ``--jaxmarl-python`` (a Python with
``jaxmarl[algs]``): a few lines given to ``python -c`` read the script's config
(``config/ippo_rnn_smax.yaml`` or ``config/mappo_homogenous_rnn_smax.yaml``; for QMIX
``config/config.yaml`` with ``config/alg/ql_rnn_smax.yaml`` over it, as Hydra's
``+alg=ql_rnn_smax`` composes them), set the map, budget and seed, call its
``make_train`` and run the jitted ``train`` once, collecting what its per-update
callback gives ``wandb.log`` (wandb disabled). Prints each seed's win rate, the mean
over the last 10% of its updates (the parity rows' measure), and their mean. QMIX's
script logs no win rate of its own: its training episodes' is the mean of
``returned_won_episode``, the win of each environment's last finished battle, which its
callback averages over an update's steps and environments.
"""

from __future__ import annotations

import argparse
import statistics
import textwrap

from peers import run_python

SCRIPTS = {"ippo": ("IPPO", "ippo_rnn_smax", "ippo_rnn_smax.yaml"),
           "mappo": ("MAPPO", "mappo_rnn_smax", "mappo_homogenous_rnn_smax.yaml"),
           "qmix": ("QLearning", "qmix_rnn", "config.yaml")}

THEIRS = textwrap.dedent("""
    import json, sys, time, jax, wandb
    from omegaconf import OmegaConf
    sys.path.insert(0, {folder!r})
    from {module} import make_train
    config = OmegaConf.to_container(OmegaConf.load({folder!r} + "/config/{config}"), resolve=False)
    config.update(MAP_NAME={map!r}, TOTAL_TIMESTEPS={steps}, SEED={seed}, NUM_SEEDS=1, WANDB_MODE="disabled")
    config["ENTITY"] = ""
    wandb.init(mode="disabled")
    logged = []  # after init, which sets wandb.log
    wandb.log = lambda values, *args, **kwargs: logged.append({{k: float(v) for k, v in values.items()
                                                                if k in ("win_rate", "env_step")}})
    start = time.perf_counter()
    jax.block_until_ready(jax.jit(make_train(config))(jax.random.PRNGKey({seed})))
    tail = logged[-max(1, len(logged) // 10):]
    print(json.dumps({{"seconds": time.perf_counter() - start, "updates": len(logged),
                      "steps": int(logged[-1]["env_step"]), "win_rate": sum(r["win_rate"] for r in tail) / len(tail)}}))
""")

# the Q-learning scripts: Hydra's composition of config.yaml and the algorithm's file, the environment made as the
# script makes it (env_from_config), and the win of each environment's last finished battle as the win rate
QLEARNING = textwrap.dedent("""
    import json, sys, time, jax, wandb
    from omegaconf import OmegaConf
    sys.path.insert(0, {folder!r})
    from {module} import make_train, env_from_config
    config = OmegaConf.to_container(OmegaConf.load({folder!r} + "/config/{config}"), resolve=False)
    config.update(OmegaConf.to_container(OmegaConf.load({folder!r} + "/config/alg/ql_rnn_smax.yaml"), resolve=False))
    # a WANDB_MODE other than "disabled" makes the script call wandb.log, which is caught here (wandb itself disabled)
    config.update(MAP_NAME={map!r}, TOTAL_TIMESTEPS={steps}, SEED={seed}, NUM_SEEDS=1, WANDB_MODE="offline")
    env, _ = env_from_config(dict(config, ENV_KWARGS=dict(config["ENV_KWARGS"])))
    wandb.init(mode="disabled")
    logged = []
    wandb.log = lambda values, *args, **kwargs: logged.append({{"win_rate": float(values["returned_won_episode"]),
                                                                "env_step": float(values["env_step"])}})
    start = time.perf_counter()
    jax.block_until_ready(jax.jit(make_train(config, env))(jax.random.PRNGKey({seed})))
    tail = logged[-max(1, len(logged) // 10):]
    print(json.dumps({{"seconds": time.perf_counter() - start, "updates": len(logged),
                      "steps": int(logged[-1]["env_step"]), "win_rate": sum(r["win_rate"] for r in tail) / len(tail)}}))
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jaxmarl-python", required=True, help="a Python with jaxmarl[algs] installed")
    parser.add_argument("--baselines", required=True, help="JaxMARL's baselines folder")
    parser.add_argument("--recipe", choices=sorted(SCRIPTS), default="ippo")
    parser.add_argument("--map", default="3m")
    parser.add_argument("--steps", type=float, default=1e6)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    group, module, config = SCRIPTS[args.recipe]
    rates = []
    for seed in range(args.seeds):
        template = QLEARNING if group == "QLearning" else THEIRS
        code = template.format(folder=f"{args.baselines}/{group}", module=module, config=config, map=args.map,
                               steps=int(args.steps), seed=seed)
        result = run_python(args.jaxmarl_python, code)
        rates.append(result["win_rate"])
        print(f"seed {seed}: win rate {result['win_rate']:.3f} over the last 10% of {result['updates']} updates, "
              f"{result['steps']:,} steps, {result['seconds']:.0f} s", flush=True)
    print(f"JaxMARL {module} on SMAX {args.map}: mean win rate {statistics.mean(rates):.3f} over {len(rates)} seeds")


if __name__ == "__main__":
    main()
