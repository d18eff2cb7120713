"""Parity with the published references: each row a recipe on an environment at the
reference's settings, several seeds, beside the figure the reference publishes.

    python benchmarks/parity.py list
    python benchmarks/parity.py run ROW [--seeds N] [--steps S]     # writes benchmarks/parity/ROW.json
    python benchmarks/parity.py table                              # the table (python benchmarks/results.py writes it)

A row's seeds run as one population where its environment is traced into the program,
one after another where it is a host environment. Its final return is, per seed, the
mean episode return over the last 10% of the environment steps (the training policy's
episodes; where the reference reports its greedy policy's, as Brax does, the greedy
episodes played after each iteration, marked "greedy"); the table gives the mean over
seeds and a 95% bootstrap interval, and steps/s of training after compiling, all seeds
together. ``--steps`` runs a shorter
budget than the row's (a CPU stand-in for an accelerator row); the table then says so and,
where the reference published a curve (``parity/references/ROW.json``: its steps and
returns, with their source), gives the curve's value at the steps run. Rows never run
read "not measured".
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).parent))
from minatar import GYMNAX_BLINES  # gymnax-blines' PPO for MinAtar, with its sources

if TYPE_CHECKING:
    import numpy as np

    import jaxrl_frag as jf

# JAX, NumPy and the package are imported where a row runs, so that the rows and the table
# (benchmarks/results.py renders it into RESULTS.md and docs/parity.md) need the standard library only
HERE = Path(__file__).parent
OUT = HERE / "parity"
CURVES = OUT / "references"

GYMNAX_BLINES_MINATAR = GYMNAX_BLINES | {"torso": "mlp", "total_steps": 10_000_000}
BLINES = "gymnax 1.0 README, 'Ckpt (Return)' (gymnax-blines PPO, one seed, 164 test episodes)"
# JaxMARL's budget for these is 1e7 steps (baselines/*/config); its paper (arXiv 2311.10090) gives curves, not numbers
JAXMARL = "JaxMARL baselines' 1e7-step budget; the rows run 1e6 of it"
# Brax's notebooks/training.ipynb, PPO per task: an iteration is batch_size x num_minibatches x unroll_length steps
# over num_envs environments (num_steps here), 32 minibatches of batch_size x unroll_length, the advantages
# bootstrapped after every unroll; its networks (brax.training.agents.ppo.networks: a policy of 4 x 32 and a value
# network of 5 x 256, swish, the policy a tanh-squashed Gaussian with a state-dependent scale), its reward scaling,
# its value loss unclipped, its gradients too (a norm of 1e9 clips nothing); it reports the greedy policy's return.
# Still not Brax's: it computes the advantages again for each minibatch with the parameters being learnt
BRAX_PPO = dict(num_minibatches=32, lr=3e-4, normalize_obs=True, anneal_lr=False, clip_eps=0.3, clip_value=False,
                max_grad_norm=1e9, activation="swish", hidden=(32,) * 4, value_hidden=(256,) * 5,
                action_dist="tanh-gaussian")
EVAL_EPISODES = 32
# how the table writes a row's result of each metric (the mean, then its interval), where not as a return
RESULTS = {"episode_won": "win rate {:.2f} [{:.2f}, {:.2f}]", "eval_return": "{:.1f} [{:.1f}, {:.1f}] greedy",
           "versus_random_lost": "lost {:.3f} [{:.3f}, {:.3f}] of the games against random moves"}
CURVE_POINTS = 20  # of a row's own curve kept in its JSON


@dataclasses.dataclass(frozen=True)
class Row:
    """A recipe on an environment at the reference's settings, and the reference's figure."""

    name: str
    recipe: str
    env: str
    settings: dict[str, Any]
    reference: str
    source: str
    seeds: int = 5
    accelerator: bool = False  # its budget is out of reach on the CPU
    # what the table reports: the training episodes' return, SMAX's win rate (episode_won), the return of
    # EVAL_EPISODES greedy episodes played after every iteration (eval_return: the reference's measure), or in a game
    # of two players the share of the games lost against random moves (versus_random_lost: AlphaZero's rows)
    metric: str = "episode_return"

    @property
    def steps(self) -> int:
        return int(self.settings["total_steps"])


ROWS = (
    *(Row(f"ppo-{game.lower()}-minatar", "PPO", f"{game}-MinAtar", GYMNAX_BLINES_MINATAR, figure, BLINES, seeds=2,
          accelerator=True)
      for game, figure in (("Breakout", "28 (the repository's newer checkpoint: 22.9)"), ("Asterix", "15"),
                           ("Freeway", "58"), ("SpaceInvaders", "131"))),
    Row("ppo-acrobot", "PPO", "Acrobot-v1",
        dict(num_envs=16, num_steps=32, num_minibatches=4, num_epochs=4, lr=5e-4, anneal_lr=False, gamma=0.99,
             max_grad_norm=1.0, total_steps=500_000), "-80", BLINES),
    Row("ppo-pendulum", "PPO", "Pendulum-v1", dict(total_steps=1_000_000),
        "-200.6 (gymnax-blines' PPO checkpoint at 1e6 steps; the README's -130 is its ES agent)",
        "gymnax-blines agents/Pendulum-v1/ppo.pkl, final evaluation"),
    Row("dqn-breakout-minatar", "DQN", "Breakout-MinAtar", dict(total_steps=5_000_000), "none published for JAX",
        "-", seeds=2, accelerator=True),
    # QR-DQN (a dueling head, 50 quantiles) at its MinAtar defaults: the MinAtar network and DQN's replay and epsilon
    # schedule of Young & Tian (2019); distributional agents on MinAtar are published as curves only
    Row("qrdqn-breakout-minatar", "QRDQN", "Breakout-MinAtar", dict(total_steps=5_000_000),
        "none published as a number (Revisiting Rainbow: curves of C51 and Rainbow, not read off)",
        "Obando-Ceron & Castro 2021, arXiv 2011.14826", seeds=2, accelerator=True),
    Row("impala-cartpole", "IMPALA", "CartPole-v1", dict(total_steps=1_000_000),
        "none published (PPO: 490.0 +- 6.1 at 5e5, CleanRL)", "cleanrl docs/rl-algorithms/ppo.md"),
    Row("impala-breakout-minatar", "IMPALA", "Breakout-MinAtar", dict(total_steps=10_000_000), "none published",
        "-", seeds=2, accelerator=True),
    Row("sac-pendulum", "SAC", "Pendulum-v1", dict(total_steps=20_000), "-157.0 +- 88.7 at 2e4 (one agent)",
        "rl-baselines3-zoo benchmark.md"),
    # the zoo's td3.yml (gamma 0.98, Adam 1e-3, 1e4 random steps first); its 400x300 networks 64x64 here, as SAC's
    Row("td3-pendulum", "TD3", "Pendulum-v1", dict(total_steps=20_000), "-151.9 +- 90.2 at 2e4 (one agent)",
        "rl-baselines3-zoo benchmark.md"),
    Row("ppo-brax-ant", "PPO", "brax:ant",
        dict(BRAX_PPO, num_envs=4096, num_steps=80, unroll_length=5, num_epochs=4, gamma=0.97, ent_coef=1e-2,
             reward_scale=10.0, total_steps=50_000_000),
        "~5,850 at 2.5e7 (read off the plot)", "brax notebooks/training.ipynb",
        seeds=1, accelerator=True, metric="eval_return"),
    Row("ppo-brax-halfcheetah", "PPO", "brax:halfcheetah",
        dict(BRAX_PPO, num_envs=2048, num_steps=160, unroll_length=20, num_epochs=8, gamma=0.95, ent_coef=1e-3,
             total_steps=50_000_000),
        "none published (settings only)", "brax notebooks/training.ipynb", seeds=1, accelerator=True,
        metric="eval_return"),
    Row("ppo-brax-hopper", "PPO", "brax:hopper",
        # PureJaxRL's ppo_continuous_action.py, the figure's source (NORMALIZE_ENV: observations and rewards)
        dict(num_envs=2048, num_steps=10, num_minibatches=32, num_epochs=4, lr=3e-4, anneal_lr=False, ent_coef=0.0,
             hidden=(256, 256), normalize_obs=True, scale_reward=True, total_steps=50_000_000),
        "~1,450 at 5e7 (PureJaxRL's notebook, one seed)", "purejaxrl examples/brax_minatar.ipynb", seeds=1,
        accelerator=True),
    Row("sac-brax-hopper", "SAC", "brax:hopper",
        # Brax's notebooks/training.ipynb trains hopper with SAC: 128 environments, 64 gradient steps of 512 per
        # environment step of all 128, Adam 6e-4, discount 0.997, a replay of 2^20 steps, 8192 before learning;
        # its observation normalisation and reward scaling (30) are not settings of this SAC
        dict(num_envs=128, num_steps=1, num_updates=64, minibatch_size=512, lr=6e-4, gamma=0.997,
             buffer_size=1_048_576, learning_starts=8192, total_steps=6_553_600),
        "none published as a number (a curve only)", "brax notebooks/training.ipynb", seeds=1, accelerator=True),
    Row("pqn-cartpole", "PQN", "CartPole-v1", dict(total_steps=500_000), "~500 (a curve against wall time only)",
        "purejaxql docs/cart_pole_time.png", seeds=3),
    Row("pqn-breakout-minatar", "PQN", "Breakout-MinAtar", dict(total_steps=10_000_000),
        "none published as a number (purejaxql's README: curves only)", "purejaxql config/alg/pqn_minatar.yaml",
        seeds=2, accelerator=True),
    *(Row(f"{recipe.lower()}-{tag}", recipe, env, dict(total_steps=1_000_000), reference, JAXMARL, seeds=3,
          metric=metric)
      for recipe, tag, env, metric, reference in (
          ("IPPO", "mpe-spread", "jaxmarl:MPE_simple_spread_v3", "episode_return",
           "-22.8 at 2e6 (JaxMARL's ippo_ff_mpe.py, seed 0, run here; ours -19.5 at 2e6: HISTORY.md)"),
          ("MAPPO", "mpe-spread", "jaxmarl:MPE_simple_spread_v3", "episode_return",
           "JaxMARL's paper: a curve only"),
          ("IPPO", "smax-3m", "jaxmarl:SMAX_3m", "episode_won",
           "win rate 0.53 at 1e6 (JaxMARL's recurrent ippo_rnn_smax.py, 3 seeds, run here: jaxmarl_smax.py)"),
          ("MAPPO", "smax-3m", "jaxmarl:SMAX_3m", "episode_won",
           "win rate 0.80 at 1e6 (JaxMARL's recurrent mappo_rnn_smax.py, 3 seeds, run here: jaxmarl_smax.py)"),
          ("IPPO", "smax-2s3z", "jaxmarl:SMAX_2s3z", "episode_won",
           "win rate 0.07 at 1e6 (JaxMARL's recurrent ippo_rnn_smax.py, 3 seeds, run here: jaxmarl_smax.py)"),
          ("MAPPO", "smax-2s3z", "jaxmarl:SMAX_2s3z", "episode_won",
           "win rate 0.99 at 1e6 (JaxMARL's recurrent mappo_rnn_smax.py, seed 0, run here: jaxmarl_smax.py)"),
          ("PQNVDN", "smax-3m", "jaxmarl:SMAX_3m", "episode_won", "JaxMARL's paper: a curve only"),
          ("QMIX", "smax-3m", "jaxmarl:SMAX_3m", "episode_won",
           "JaxMARL's recurrent qmix_rnn.py at 1e6: not yet run to its end here (jaxmarl_smax.py --recipe qmix)"))),
    # tic-tac-toe is a draw with perfect play: a player who plays it perfectly loses no game against any moves
    Row("alphazero-tictactoe", "AlphaZero", "pgx:tic_tac_toe", dict(total_steps=400_000),
        "0.000: perfect play loses no game (the game is a draw)", "the game's value; AlphaZero's claim is play that "
        "approaches perfect play (Silver et al. 2018)", seeds=3, metric="versus_random_lost"),
    Row("ppo-atari-breakout", "PPO", "ale:Breakout",
        dict(num_envs=8, num_steps=128, num_minibatches=4, num_epochs=4, lr=2.5e-4, clip_eps=0.1,
             total_steps=10_000_000), "414.7 +- 28.1 (3 seeds, 1e7 steps = 4e7 frames)",
        "cleanrl docs/rl-algorithms/ppo.md (ppo_atari.py)", seeds=1, accelerator=True),
)
BY_NAME = {row.name: row for row in ROWS}


def tail_mean(steps: np.ndarray, returns: np.ndarray, fraction: float = 0.1) -> float:
    """The mean of the finite returns in the rows over the last ``fraction`` of the steps."""
    import numpy as np

    tail = returns[steps >= steps[-1] * (1 - fraction)]
    return float(np.mean(tail[np.isfinite(tail)])) if np.isfinite(tail).any() else float("nan")


def final_returns(history: jf.History, metric: str = "episode_return") -> list[float]:
    """Per seed (population member), the mean of ``metric`` (the return by default) over
    the last 10% of the steps."""
    import numpy as np

    steps = np.asarray(history["env_steps"]).reshape(len(history.rows), -1)[:, 0]
    returns = np.asarray(history[metric]).reshape(len(steps), -1)
    return [tail_mean(steps, returns[:, m]) for m in range(returns.shape[1])]


def run(row: Row, seeds: int, steps: int | None) -> dict[str, Any]:
    """Train ``row`` on ``seeds`` seeds; what the table shows, with how it was run."""
    import jax
    import numpy as np

    import jaxrl_frag as jf
    from jaxrl_frag.app.summary import bootstrap_ci
    from jaxrl_frag.transforms import Population
    from jaxrl_frag.transforms.evaluated import Evaluated

    jax.config.update("jax_enable_compilation_cache", False)  # compile times of fresh compiles, not cache reads
    settings = dict(row.settings, **({"total_steps": steps} if steps else {}))
    algo = getattr(jf.recipes, row.recipe).create(row.env, **settings)
    if row.metric == "eval_return":
        algo = Evaluated.create(algo, 1, EVAL_EPISODES)
    traced = algo.env.capabilities.traceable
    start = time.perf_counter()
    program = jf.compile(Population.of([algo] * seeds, list(range(seeds))) if traced else algo)
    compile_s = time.perf_counter() - start
    finals, train_s = [], 0.0
    for key in [jax.random.PRNGKey(0)] if traced else [jax.random.PRNGKey(s) for s in range(seeds)]:
        start = time.perf_counter()
        history = program.run(key)
        train_s += time.perf_counter() - start
        finals += final_returns(history, row.metric)
    done = int(np.asarray(history.final["env_steps"]).flat[0])  # a population's members step alike
    low, high = bootstrap_ci(np.array(finals))
    return {"row": row.name, "seeds": seeds, "env_steps": done, "finals": finals, "mean": float(np.mean(finals)),
            "curve": curve(history, row.metric),
            "ci": [float(low), float(high)], "steps_per_s": seeds * done / train_s, "compile_s": compile_s,
            "device": jax.devices()[0].device_kind, "jax": jax.__version__, "reduced": bool(steps) and steps < row.steps,
            "command": " ".join(["python", "benchmarks/parity.py", *sys.argv[1:]])}


def curve(history: jf.History, metric: str, points: int = CURVE_POINTS) -> list[list[float]]:
    """The last seed's (population member's) ``metric`` at up to ``points`` iterations
    evenly spread to the last: ``[env_steps, value]`` pairs (``None`` where no episode ended)."""
    import numpy as np

    steps = np.asarray(history["env_steps"]).reshape(len(history.rows), -1)[:, -1]
    values = np.asarray(history[metric]).reshape(len(steps), -1)[:, -1]
    rows = np.unique(np.linspace(0, len(steps) - 1, min(points, len(steps))).round().astype(int))
    return [[int(steps[i]), float(values[i]) if np.isfinite(values[i]) else None] for i in rows]


def reference_at(row: Row, steps: int) -> str:
    """The reference's curve at ``steps`` (interpolated), or "" where it published none."""
    path = CURVES / f"{row.name}.json"
    if not path.exists():
        return ""
    curve = json.loads(path.read_text())
    return f"; its curve at {steps:,}: {interp(steps, curve['steps'], curve['returns']):,.1f}"


def interp(x: float, xs: list[float], ys: list[float]) -> float:
    """``numpy.interp`` for one point: linear between the points around ``x``, the end values beyond them."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])


def table() -> str:
    """The parity table, one line per row, from what ``run`` wrote."""
    lines = ["| recipe | environment | steps | seeds | final return (SMAX: win rate; a game: the share lost to random moves), "
             "mean [95% CI] | reference | published in | "
             "steps/s (device) |", "|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        path = OUT / f"{row.name}.json"
        if path.exists():
            r = json.loads(path.read_text())
            steps = f"{r['env_steps']:,}" + (f" (of {row.steps:,})" if r["reduced"] else "")
            reference = row.reference + (reference_at(row, r["env_steps"]) if r["reduced"] else "")
            result = RESULTS.get(row.metric, "{:.1f} [{:.1f}, {:.1f}]").format(r["mean"], *r["ci"])
            if not math.isfinite(r["mean"]):
                result = "none: no episode ended within the steps run"
            speed = f"{r['steps_per_s']:,.0f} ({r['device']})"
            seeds = str(r["seeds"])
        else:
            steps, seeds, speed, reference = f"{row.steps:,}", str(row.seeds), "-", row.reference
            result = "not measured" + (" (accelerator row; no GPU lent)" if row.accelerator else "")
        lines.append(f"| {row.recipe.lower()} | {row.env} | {steps} | {seeds} | {result} | {reference} | "
                     f"{row.source} | {speed} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the rows")
    one = commands.add_parser("run", help="train one row's seeds and write parity/ROW.json")
    one.add_argument("row", choices=sorted(BY_NAME))
    one.add_argument("--seeds", type=int, help="default: the row's")
    one.add_argument("--steps", type=float, help="a shorter budget than the row's (the table says so)")
    commands.add_parser("table", help="print the table (python benchmarks/results.py writes it into RESULTS.md)")
    args = parser.parse_args()
    if args.command == "list":
        for row in ROWS:
            print(f"{row.name:28} {row.recipe:7} {row.env:24} {row.steps:>12,} steps  x{row.seeds}"
                  + ("  (accelerator)" if row.accelerator else ""))
    elif args.command == "run":
        row = BY_NAME[args.row]
        result = run(row, args.seeds or row.seeds, int(args.steps) if args.steps else None)
        OUT.mkdir(exist_ok=True)
        (OUT / f"{row.name}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
    else:
        print(table())


if __name__ == "__main__":
    main()
