"""``jaxrl-frag evaluate``: play a run's trained policy (its newest checkpoint) for
complete episodes in one compiled program, print the mean return with a 95% interval,
write ``eval.csv`` into the run directory and, with ``--video``, draw one episode.
Checkpoints and metrics.csv are only read; each file is written whole or not at all, a
failed write ending with status 5 naming the file and the cause."""

from __future__ import annotations

import argparse
from pathlib import Path

from jaxrl_frag.app import fields


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="the run directory (holds config.json and checkpoints/)")
    parser.add_argument("--episodes", type=fields.parse_int, default=10, help="complete episodes to play (default 10)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--greedy", dest="greedy", action="store_true", default=True,
                      help="the deterministic action: the most likely one, the Gaussian's mean, the greedy Q-value's "
                           "(the default)")
    mode.add_argument("--sample", dest="greedy", action="store_false",
                      help="draw actions from the policy (DQN and PQN: epsilon-greedy at the run's --epsilon-end)")
    parser.add_argument("--seed", type=fields.parse_int, default=0, help="seed of the environments and draws (default 0)")
    parser.add_argument("--member", type=fields.parse_int, default=None,
                        help="a population's member to evaluate (default 0)")
    parser.add_argument("--video", type=Path, default=None, metavar="PATH.gif|PATH.mp4",
                        help="also draw one episode into this animated GIF or MP4 (CartPole-v1, Pendulum-v1, and the "
                             "environment families that render: docs/environments.md)")


def evaluate(args: argparse.Namespace) -> int:
    from jaxrl_frag.app import summary
    from jaxrl_frag.app.evaluation import check_episodes, evaluate, restore
    from jaxrl_frag.app.rundir import RunDir, report_write_failure
    from jaxrl_frag.app.video import check_video, write_video
    from jaxrl_frag.bounds import SEED_MAX, check_count

    check_episodes(args.episodes)
    check_count("seed", args.seed, SEED_MAX, "seeds are uint32", low=0)
    run = RunDir(args.run_dir)
    env_id = run.read_config()["settings"]["env"]
    if args.video is not None:
        check_video(args.video, env_id)
    run.check_eval()
    run.check_writable()  # eval.csv is written there: refused now, before the episodes are played
    trained = restore(run.path, args.member)
    episodes = evaluate(trained, args.episodes, args.greedy, args.seed)
    low, high = summary.bootstrap_ci(episodes.returns)
    mode = "greedy" if args.greedy else "sampled"
    member = "" if trained.member is None else f", member {trained.member}"
    print(f"{mode} policy of {run.path} (iteration {trained.iteration}{member}) on {trained.evaluation_env}: mean return "
          f"{episodes.returns.mean():.2f}, 95% interval [{float(low):.2f}, {float(high):.2f}] over {args.episodes} "
          f"episodes (mean length {episodes.lengths.mean():.1f})")
    rows = [{"episode": i, "return": float(r), "length": int(n)}
            for i, (r, n) in enumerate(zip(episodes.returns, episodes.lengths, strict=True))]
    try:
        print(f"wrote {run.write_eval(rows)}")
        if args.video is not None:
            length, total = write_video(trained, args.video, args.greedy, args.seed)
            print(f"wrote {args.video}: one episode, {length} steps, return {total:.2f}")
    except OSError as error:
        return report_write_failure(error, run.path, "; the earlier file there, if any, is as it was")
    return 0
