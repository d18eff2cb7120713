"""``jaxrl-frag explain``: the fragment graph, placement, collectives and XLA's cost
figures of a recipe under a policy, without training."""

from __future__ import annotations

import argparse
from pathlib import Path

from jaxrl_frag.app.build import make_algorithm, make_policy
from jaxrl_frag.app.cli.spec_flags import run_spec


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draw", type=Path, default=None, metavar="FILE",
                        help="also draw the fragment graph: .png, .svg or .pdf (Graphviz's dot where it "
                             "exists, else matplotlib), .dot (Graphviz source) or .txt")


def explain(args: argparse.Namespace) -> int:
    from jaxrl_frag.app.rundir import check_output, report_write_failure
    from jaxrl_frag.drawing import check_path
    from jaxrl_frag.program import explain as explain_program

    if args.draw is not None:
        check_output("draw", check_path(args.draw))

    spec = run_spec(args)
    algo, _ = make_algorithm(spec, capped=False)
    policy = make_policy(spec)
    agents = getattr(getattr(algo, "env", None), "num_agents", None)
    team = f", {agents} agents on the axis after the environment batch" if agents else ""
    print(f"{spec.recipe} on {spec.env}: {algo.steps_per_iteration} environment steps per iteration{team}")
    explanation = explain_program(algo, policy)
    print(explanation)
    if args.draw is not None:
        try:
            print(f"wrote {explanation.draw(args.draw)}")
        except OSError as error:
            return report_write_failure(error, args.draw, "; the earlier file there, if any, is as it was")
    return 0
