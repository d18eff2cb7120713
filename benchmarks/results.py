"""The current benchmark figures, as tables, from the records the benchmarks write.

    python benchmarks/results.py            # writes benchmarks/RESULTS.md and docs/parity.md
    python benchmarks/results.py --check    # exit 1 where either differs from what the records give

Each table reads its records: ``benchmarks/results/TABLE.json`` (a list of records, each
with what was measured, the values, the machine, the date, the command and its ``source``),
the parity rows' ``benchmarks/parity/ROW.json`` and the boosting runs' ``boost/**.json``.
A benchmark given ``--json benchmarks/results/TABLE.json`` replaces the records of what it
measured (the same ``what``) and keeps the others; records transcribed from the dated log
name their section of ``HISTORY.md`` as their source, those a run wrote the file itself.
The standard library only: no JAX, no GPU, nothing outside this repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RECORDS = HERE / "results"
RESULTS = HERE / "RESULTS.md"
PARITY_PAGE = ROOT / "docs" / "parity.md"
HISTORY = "HISTORY.md § "  # how a transcribed record names its section


# ---- writing records (the benchmarks' --json) ----

def machine(device: str) -> str:
    """This machine in words: its processor and core count, and the device the program ran on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()}-core {cpu}; {device}"


def record(what: dict[str, Any], values: dict[str, Any], device: str) -> dict[str, Any]:
    """A record of this run: ``what`` identifies the row (a later run of the same ``what``
    replaces it), ``values`` its figures; the machine, today's date and the command line."""
    command = " ".join(["python", os.path.relpath(sys.argv[0], ROOT) if sys.argv[0] else "-", *sys.argv[1:]])
    return {"what": what, "values": values, "machine": machine(device), "date": datetime.date.today().isoformat(),
            "command": command}


def save(path: Path | str, records: Iterable[dict[str, Any]]) -> None:
    """Put ``records`` into the records file ``path``: each replaces the one with the same
    ``what`` (or joins the end), its ``source`` the file itself; the others stay."""
    path = Path(path)
    kept = json.loads(path.read_text())["records"] if path.exists() else []
    for new in records:
        new = dict(new, source=os.path.relpath(path.resolve(), ROOT).replace(os.sep, "/"))
        same = [i for i, old in enumerate(kept) if old["what"] == new["what"]]
        if same:
            kept[same[0]] = new
        else:
            kept.append(new)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"records": kept}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


# ---- reading them ----

def load(table: str) -> list[dict[str, Any]]:
    return json.loads((RECORDS / f"{table}.json").read_text())["records"]


def provenance(records: list[dict[str, Any]]) -> str:
    """Where a table's figures come from: the sections of HISTORY.md they were transcribed
    from (with their dates), and the files runs wrote."""
    transcribed: dict[str, list[str]] = {}
    written: dict[str, list[str]] = {}
    for r in records:
        into = transcribed if r["source"].startswith(HISTORY) else written
        key = r["source"].removeprefix(HISTORY)
        if r["date"] not in into.setdefault(key, []):
            into[key].append(r["date"])
    parts = []
    if transcribed:
        parts.append("figures transcribed from HISTORY.md (not re-run): " + "; ".join(
            f"§ \"{section}\" ({', '.join(dates)})" for section, dates in transcribed.items()))
    if written:
        parts.append("figures written by the runs: " + "; ".join(
            f"`{file}` ({', '.join(dates)})" for file, dates in written.items()))
    return "Sources: " + "; ".join(parts) + "."


def markdown(head: list[str], rows: Iterable[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def steps(x: float) -> str:
    """5e+05 as 5e5, 1.85e+05 as 1.85e5."""
    mantissa, exponent = f"{x:.3g}".split("e") if "e" in f"{x:.3g}" else (f"{x:.3g}", "0")
    return f"{mantissa}e{int(exponent)}" if exponent != "0" else mantissa


def section(title: str, intro: str, table: str, records: list[dict[str, Any]], command: str) -> str:
    return (f"## {title}\n\n{intro}\n\nRegenerate the records: {command}\n\n{table}\n\n{provenance(records)}\n")


@dataclasses.dataclass(frozen=True)
class Table:
    """A table of ``benchmarks/results/RECORDS.json``: a row a record, ``cells`` of its
    ``what`` and ``values``, then its machine and date."""

    records: str
    title: str
    head: tuple[str, ...]
    cells: Callable[[dict[str, Any], dict[str, Any]], list[str]]
    intro: str
    command: str

    def __call__(self) -> str:
        records = load(self.records)
        rows = [[*self.cells(r["what"], r["values"]), r["machine"], r["date"]] for r in records]
        return section(self.title, self.intro, markdown([*self.head, "machine", "date"], rows), records, self.command)


# ---- the tables ----

def overhead_cells(w: dict[str, Any], v: dict[str, Any]) -> list[str]:
    return [w["env"], str(w["envs"]), steps(w["steps"]), f"**{v['train_ratio']:.3f}** ({v['train_per_repeat']:.3f})",
            f"**{v['compile_ratio']:.3f}** ({v['compile_per_repeat']:.3f})",
            f"{v['fused_train_s']:.2f} / {v['framework_train_s']:.2f}",
            f"{v['fused_compile_s']:.2f} / {v['framework_compile_s']:.2f}",
            f"{v['fused_return']:.1f} / {v['framework_return']:.1f}"]


overhead = Table(
    "overhead", "Framework PPO against the hand-fused yardstick",
    ("env", "envs", "steps", "train ratio (per-repeat)", "compile ratio (per-repeat)", "train s, fused / framework",
     "compile s, fused / framework", "final return, fused / framework"), overhead_cells,
    "PPO on gymnax's CartPole-v1 and Acrobot-v1 (`--env`) at the hand-fused yardstick's settings "
    "(`../shared/bench/fused_ppo.py`: 128 steps per environment, 4 epochs x 4 minibatches, 2x64 tanh), both in one "
    "process, alternating, fresh compiles. Ratio = "
    "framework / fused of the median seconds (wall time): below 1.00 the framework is faster; in brackets the median "
    "of the per-repeat ratios. HISTORY.md holds no accelerator (H200) measurement of this benchmark: every row is "
    "from a 2-core CPU.",
    "`.venv/bin/python benchmarks/overhead.py --fused ../shared/bench/fused_ppo.py --repeats 3 "
    "--configs 4:5e5,256:2e6,1024:5e6 --json benchmarks/results/overhead.json`")


def policies_cells(w: dict[str, Any], v: dict[str, Any]) -> list[str]:
    return [w["policy"], w["workload"], f"**{', '.join(map(str, v['ratio']))}**",
            f"{v['per_round']:.3f}" if "per_round" in v else "-",
            f"{v['final_return']:.1f} / {v['single_return']:.1f}" if "final_return" in v else "-"]


policies = Table(
    "policies", "Distribution policies against SingleDevice",
    ("policy", "workload", "train time / SingleDevice", "per-round", "final return, policy / single"), policies_cells,
    "Each policy's compiled program against `SingleDevice`'s, in one process, alternating after a warm-up run. Ratio "
    "= the policy's median train seconds / SingleDevice's (below 1 the policy is faster); per-round: the median of "
    "the paired ratios; several figures are separate runs of the command. The actor-learner rows ran on two forced "
    "CPU devices sharing the two cores, with the recipes' CartPole defaults of the time.",
    "`.venv/bin/python benchmarks/policies.py --repeats 5 --json benchmarks/results/policies.json`; "
    "`.venv/bin/python benchmarks/actor_learner.py --recipe ppo --repeats 3 --json benchmarks/results/policies.json` "
    "(and `--recipe impala`)")


def population_cells(w: dict[str, Any], v: dict[str, Any]) -> list[str]:
    ratios = (f"population / fused **{v['vs_fused']:.3f}** (per-round {v['vs_fused_per_round']:.3f}); sequential "
              f"solo / population **{v['sequential_over_population']:.2f}x**" if "vs_fused" in v else "")
    return [w["contender"], ", ".join(f"{x:.1f}" for x in v["train_s"]), f"{v['median_train_s']:.2f}",
            f"{v['median_compile_s']:.2f}", f"{v['final_return']:.1f}", ratios]


population = Table(
    "population", "Sixteen seeds as one population",
    ("contender", "train s (each round)", "median train s", "median compile s", "mean final return",
     "ratios of the median train s"), population_cells,
    "Sixteen seeds of PPO on CartPole-v1 (4 environments and 5e5 steps a seed): the framework's `Population` of 16 "
    "as one program, the yardstick's `fused_ppo.py --seeds 16` (`jax.jit(jax.vmap(train))`) and 16 solo runs one "
    "after another; each measurement a fresh process, the contenders alternating. Seconds of wall time; population "
    "/ fused below 1: the population trains faster; sequential solo / population: the population's speedup over 16 "
    "solo runs; per-round: the median of the rounds' ratios.",
    "`.venv/bin/python benchmarks/population.py --seeds 16 --repeats 3 --json benchmarks/results/population.json`")


def host_cells(w: dict[str, Any], v: dict[str, Any]) -> list[str]:
    if "steps_per_s" in v:
        speeds = " / ".join(f"{x:,.0f}" for x in v["steps_per_s"]) + " (median)"
    elif "steps_per_s_pairs" in v:
        speeds = " / ".join(", ".join(f"{x:,.0f}" for x in side) for side in v["steps_per_s_pairs"]) + " (pairs)"
    else:
        speeds = "-"
    return [w["a"], w["b"], w["env"], f"**{v['ratio']:.2f}x**", ", ".join(f"{x:.2f}" for x in v["pairs"]) or "-",
            speeds]


host_envs = Table(
    "host_envs", "Host environments",
    ("A", "B", "environment: what is timed", "A / B", "pairs", "steps/s, A / B"), host_cells,
    "Environments stepped on the host: the framework's pools (worker processes, or ale-py's threads in process) "
    "against strict alternation, Stable-Baselines3 PPO and EnvPool, each side measured in the same process run, "
    "alternating. Ratio = A's environment steps per second / B's, the median of the pairs' ratios: above 1 A is "
    "faster.\n\n"
    "The Ray rows (`benchmarks/ray_fleet.py`) run a local Ray cluster whose CPU nodes share this machine's 2 cores "
    "with everything else, so they measure a remote worker's cost, never the gain of more machines. That cost, "
    "`c = (1 / ray - 1 / local) * 8` a step of the 8 environments at one worker, is about 1.4 ms (Acrobot), 2.7 ms "
    "(the slow pure-Python CartPole, `benchmarks/slow_env.py`, 0.9 ms a step) and 4.9 ms (Breakout: its frames) "
    "here. The scaling model: `n` environments a worker, each worker on CPUs of its own, step in `n * s + c` "
    "(`s` a local worker's seconds an environment step), so a CPU machine of one worker gives `n / (n * s + c)` "
    "steps/s, and `W` machines `W` times that while the trainer's inference and learning keep up (the "
    "environment ring hides one group's inference behind the others' stepping). Projected at 32 environments a "
    "machine: the slow CartPole 1,000 steps/s a machine (0.91 of a local worker's), 16,000 on 16 machines "
    "against 1,800 from this machine's 2 cores; Breakout 900 a machine (0.86, and less: `c` grows with the "
    "frames' bytes, measured here at 8); Acrobot 6,200 (0.72). Not checked on separate machines: none here.",
    "`.venv/bin/python benchmarks/host_envs.py ring|sb3|stepping ... --json benchmarks/results/host_envs.json`; "
    "`.venv/bin/python benchmarks/ray_fleet.py --envs ale:Breakout gymnasium:Acrobot-v1 "
    "gymnasium:slow_env:SlowCartPole-v0 --workers 1 2 4 --num-envs 8 --steps 200 --pairs 3 --json "
    "benchmarks/results/host_envs.json` (each row's own command is in its record)")


def figures(v: dict[str, Any], side: str) -> str:
    """One side's figures with as many decimals as they were printed with, their mean with at most 2."""
    d = v["decimals"][side]
    mean = f" (mean {v[side + '_mean']:.{min(d, 2)}f})" if side + "_mean" in v else ""
    return ", ".join(f"{x:.{d}f}" for x in v[side]) + mean


def time_ratio(what: str, v: dict[str, Any]) -> str:
    x, d = v[f"{what}_ratio"], v["decimals"]["ratio"]
    if isinstance(x, list):
        return f"{what} {', '.join(f'{r:.{d}f}' for r in x)} (per seed)"
    low, high = v[f"{what}_ratio_range"]
    return f"{what} **{x:.{d}f}** (median of {v['rounds']} rounds; {low:.{d}f}-{high:.{d}f})"


def multi_agent_cells(w: dict[str, Any], v: dict[str, Any]) -> list[str]:
    times = "; ".join(time_ratio(what, v) for what in ("train", "compile") if f"{what}_ratio" in v) or "-"
    return [w["what"], w["env"], w["steps"], figures(v, "ours"), figures(v, "theirs"), times]


multi_agent = Table(
    "multi_agent", "Multi-agent against JaxMARL",
    ("what", "environment", "steps", "ours", "JaxMARL's script", "ratio, ours / JaxMARL's"), multi_agent_cells,
    "The multi-agent recipes beside JaxMARL's own baseline scripts, unmodified, run here at the same settings: final "
    "returns (the last 10% of each side's rows) or SMAX win rates per seed, and where the two ran in alternating "
    "rounds on a quiet core, the time ratio: ours / JaxMARL's seconds, the median over the rounds with their range "
    "(below 1 ours is faster).",
    "`.venv/bin/python benchmarks/jaxmarl_ippo.py --jaxmarl-python JM_VENV/bin/python --jaxmarl-ippo "
    "JAXMARL/baselines/IPPO --steps 2e6 --rounds 5 --json benchmarks/results/multi_agent.json` (the SMAX rows: "
    "`python benchmarks/parity.py run ROW` and `benchmarks/jaxmarl_smax.py`)")


def suite_cells(w: dict[str, Any], v: dict[str, Any]) -> list[str]:
    return [w["commit"], f"`{w['command']}`", w["cache"], v["tests"], f"**{v['wall_s']}**", v.get("detail", "-")]


suite_times = Table(
    "suite_times", "Test suite times",
    ("commit", "command", "compilation cache", "tests passed", "wall s", "of which"), suite_cells,
    "Wall seconds of the suite from a clean clone, as `/usr/bin/time -v` printed them (the CI machine's: its run's "
    "time as CI reported it). `.ci/run` sets up `.venv`, runs ruff, the strict docs build, `make test` and then "
    "`make test-long`. \"Empty\": a fresh `XDG_CACHE_HOME`, so every program is compiled; \"warm\": the same "
    "command again with that cache.",
    "`git clone REPO X && cd X && XDG_CACHE_HOME=X-cache /usr/bin/time -v bash .ci/run` (likewise `make test-fast`; "
    "warm: again with the same cache); no benchmark writes these, so the records are written by hand into "
    "`benchmarks/results/suite_times.json`")


def parity_table() -> str:
    sys.path.insert(0, str(HERE))
    import parity  # its rows and table need the standard library only

    return parity.table()


PARITY_INTRO = ("Final return: per seed, the mean return of the training episodes over the last 10% of the steps "
                "(stochastic policy; \"greedy\" where the reference reports its greedy policy's, as Brax does), "
                "SMAX's win rate likewise; the mean over seeds with a 95% bootstrap interval; steps/s of training "
                "after compiling, all seeds together, on the device named. Where the CPU ran a shorter budget than "
                "the reference's, the row says so (\"of 10,000,000\") and, where the reference published a curve, "
                "gives its value at the steps run. The references' own measures differ (gymnax-blines: test "
                "episodes of one checkpoint; the zoo: a deterministic evaluation of one agent; CleanRL: 3 seeds).")


def parity() -> str:
    table = parity_table()
    return (f"## Parity with the published references\n\n{PARITY_INTRO}\n\nRegenerate a row: `python "
            f"benchmarks/parity.py run ROW [--steps S]` (writes `benchmarks/parity/ROW.json`); "
            f"`python benchmarks/parity.py list` lists the rows and their settings.\n\n{table}\n\n"
            "Sources: each row read from `benchmarks/parity/ROW.json` (measured 2026-12-01 to 2026-12-02 on a "
            "2-core CPU; HISTORY.md § \"Parity with the published references (issue 20)\" discusses them). "
            "Also a page of the documentation (`docs/parity.md`).\n")


def boosting() -> str:
    records = load("boosting")
    parts = []
    for r in records:
        run = json.loads((ROOT / r["json"]).read_text())
        fix = r["values"].get("corrections", {})
        rows = []
        for name, s in run["summary"].items():
            s = dict(s, **fix.get(name, {}))
            reach = s.get("steps_to_fixed_large")
            rows.append([name, f"{s['final_mean']:.1f} [{s['ci_low']:.1f}, {s['ci_high']:.1f}]",
                         ", ".join(f"{x:.1f}" for x in s["finals"]), f"{s['device_seconds']:.1f}",
                         f"{s['mean_actors']:.1f}",
                         "-" if reach is None else f"{steps(reach)} ({s['fraction_of_fixed_large']:.2f})"])
        note = f" {r['values']['note']}" if "note" in r["values"] else ""
        parts.append(f"**{r['what']['run']}** ({r['machine']}, {r['date']}; `{r['command']}`; read from "
                     f"`{r['json']}`).{note}\n\n" + markdown(
                         ["strategy", "final return, mean [95% CI]", "per seed", "device-seconds", "mean actors",
                          "steps to fixed-large's final (fraction)"], rows))
    intro = ("PPO with adaptive actor boosting (`jaxrl_frag.transforms.boost`) against fixed actor counts at equal "
             "environment steps, the seeds of each strategy as one population. Final return: each seed's mean "
             "episode return over its last 10% of the steps. Device-seconds: rounds x the calibrated seconds of a "
             "round at its rung (actor + learner + probe), on the machine named. The fraction is of fixed-large's "
             "steps (Nitro's claim: at most 0.6). Runs made before stop 39 split every rung's batch into a fixed "
             "minibatch count (`--minibatches count`, the default then); the current default is `batch`.\n\n"
             "Host environments boosted on an elastic Ray fleet against a fixed fleet (PPO, gymnasium:CartPole-v1, "
             "ladder 4-16 over 16 actors, 1e5 steps, one seed, 2026-12-07): the cost model prices the elastic fleet "
             "at 0.67x the fixed one, but the worker-seconds it held were 1.16x (released at once: 208 actors started "
             "again, the run 1.46x longer) or 1.14x (kept alive 10 s: it never shrank); HISTORY.md § \"Boosting host "
             "environments: an elastic Ray fleet (issue 44, logged 2026-12-07)\" has the runs and their commands.")
    command = ("`cd benchmarks && ../.venv/bin/python boost.py --env ENV --seeds N --budget B --out boost/FOLDER` "
               "(each run's own command below); its JSON is read as it is")
    return section("Adaptive actor boosting", intro, "\n\n".join(parts), records, command)


TABLES: tuple[Callable[[], str], ...] = (overhead, policies, population, host_envs, multi_agent, parity, boosting,
                                         suite_times)


def results_md() -> str:
    head = ("# Benchmark results\n\nThe current figure of every benchmark, one table each, rendered by `python "
            "benchmarks/results.py` from the records the benchmarks write (`benchmarks/results/*.json`, "
            "`benchmarks/parity/*.json`, `benchmarks/boost/**/*.json`); do not edit this file by hand. Each table "
            "says its units, what its ratio divides by what, the command that regenerates its records and where "
            "its figures come from. The machines are shared and noisy, so only ratios measured side by side in one "
            "run mean much. `benchmarks/HISTORY.md` is the dated log: every measurement with its setting, the "
            "runs that led to it and what was found on the way.\n")
    return "\n".join([head, *(table() for table in TABLES)])


def parity_md() -> str:
    return ("# Parity with the published references\n\n"
            "Each recipe on an environment at a published reference's settings, several seeds, beside the "
            "reference's figure. " + PARITY_INTRO + "\n\n"
            "This page is rendered by `python benchmarks/results.py` from `benchmarks/parity/ROW.json`, which "
            "`python benchmarks/parity.py run ROW` writes; the references' sources and settings are the rows of "
            "`benchmarks/parity.py`, and `benchmarks/HISTORY.md` has the runs behind each row.\n\n"
            + parity_table() + "\n")


def outputs() -> dict[Path, str]:
    return {RESULTS: results_md(), PARITY_PAGE: parity_md()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a file differs")
    args = parser.parse_args()
    stale = []
    for path, text in outputs().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        raise SystemExit("differs from its records: " + ", ".join(str(p.relative_to(ROOT)) for p in stale))


if __name__ == "__main__":
    main()
