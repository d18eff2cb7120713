"""PPO on a MinAtar game, several seeds trained as one population, beside gymnax's published figure.

    python benchmarks/minatar.py [--env Breakout-MinAtar] [--steps 1e7] [--seeds 2] [--torso mlp] [--activation relu]

The settings are gymnax-blines' PPO for MinAtar (``agents/<game>/ppo.yaml``): 64
environments x 128 steps, 8 minibatches x 4 epochs, a constant learning rate of 5e-4,
gamma 0.999, GAE lambda 0.95, clip 0.2, entropy 0.01, value 0.5, gradient norm 0.5 and
two hidden layers of 256 per network, ReLU. The gymnax README lists the return of those agents
after 1e7 steps (its "Ckpt (Return)" column, in ``REFERENCE``). ``--torso mlp`` flattens
the image as gymnax-blines does; ``auto``, the recipe's default, puts a 3x3 convolution
under each MLP. What still differs: the initialisation (gymnax-blines': flax's default
kernels, biases uniform in [0, 0.05); ours orthogonal, zero biases) and its 1/129 of the
steps that never reach the learner. Its "warm-up" interpolates between two equal rates:
the rate is constant, as here.

Prints the compile time, training steps per second (all seeds together, compilation
excluded) and each seed's mean episode return along the run.
"""

from __future__ import annotations

import argparse
import time

# gymnax 1.0 README, "Ckpt (Return)": gymnax-blines' PPO agents after 1e7 steps
REFERENCE = {"Asterix-MinAtar": 15, "Breakout-MinAtar": 28, "Freeway-MinAtar": 58, "SpaceInvaders-MinAtar": 131}
GYMNAX_BLINES = dict(num_envs=64, num_steps=128, num_minibatches=8, num_epochs=4, lr=5e-4, anneal_lr=False,
                     gamma=0.999, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
                     hidden=(256, 256), activation="relu")


def main() -> None:
    import jax  # here, not above: parity.py reads GYMNAX_BLINES without JAX (benchmarks/results.py renders its table)
    import numpy as np

    import jaxrl_frag as jf
    from jaxrl_frag.transforms import Population

    jax.config.update("jax_enable_compilation_cache", False)  # compile times of fresh compiles, not cache reads
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="Breakout-MinAtar", choices=sorted(REFERENCE))
    parser.add_argument("--steps", type=float, default=1e7, help="environment steps per seed")
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0 .. SEEDS-1, trained as one population")
    parser.add_argument("--torso", default="mlp", choices=("auto", "cnn", "mlp"))
    parser.add_argument("--activation", default="relu", choices=("relu", "tanh"))
    args = parser.parse_args()

    settings = GYMNAX_BLINES | {"torso": args.torso, "activation": args.activation}
    algo = jf.recipes.PPO.create(args.env, total_steps=int(args.steps), **settings)
    t0 = time.perf_counter()
    program = jf.compile(Population.of([algo] * args.seeds, list(range(args.seeds))))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    history = program.run(jax.random.PRNGKey(0))
    jax.block_until_ready(history.state)
    train_s = time.perf_counter() - t0

    steps = history["env_steps"]
    returns = history["episode_return"].reshape(len(steps), args.seeds)
    print(f"PPO on {args.env}, torso {args.torso} (network torso: {algo.network_torso}), {args.seeds} seeds x "
          f"{int(steps[-1]):,} steps; compile {compile_s:.1f} s, train {train_s:.1f} s, "
          f"{args.seeds * steps[-1] / train_s:,.0f} steps/s")
    print("| env steps | " + " | ".join(f"seed {s} return" for s in range(args.seeds)) + " |")
    print("|---|" + "---|" * args.seeds)
    for row in np.unique(np.linspace(0, len(steps) - 1, 11).round().astype(int)):
        print(f"| {int(steps[row]):,} | " + " | ".join(f"{r:.1f}" for r in returns[row]) + " |")
    final = history.last("episode_return")
    print(f"final return per seed {np.round(final, 1).tolist()}, mean {np.mean(final):.1f}; "
          f"gymnax README after 1e7 steps: {REFERENCE[args.env]}")


if __name__ == "__main__":
    main()
