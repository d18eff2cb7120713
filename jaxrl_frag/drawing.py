"""The fragment graph of an ``Explanation`` as a picture.

Fragments are boxes coloured by role, grouped by where they run (one group per
device group); arrows carry the data that flows once per iteration, labelled with
its name and bytes; arrows that cross between device groups are transfers (red,
with their bytes in the program's transfer precision); the collectives a group's
program runs are listed under it. The incoming training state and hyperparameters
are on the left, the outgoing state and metrics on the right.

``draw`` writes Graphviz's DOT source (``.dot``), a plain-text listing (``.txt``), or
a picture (``.png``, ``.svg``, ``.pdf``): rendered by Graphviz's ``dot`` where that
program exists, else by matplotlib with a layered left-to-right layout.
"""

from __future__ import annotations

import dataclasses
import errno
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from jaxrl_frag.collectives import Collective, summary
from jaxrl_frag.errors import check
from jaxrl_frag.graph import FragmentGraph, format_bytes
from jaxrl_frag.writes import write_atomically


class Moved(Protocol):
    """What ``draw`` reads of a transfer between device groups (``explanation.Transfer``)."""

    direction: str
    name: str
    nbytes: dict[str, int]
    carried: bool


class Explained(Protocol):
    """What ``draw`` reads of a program's explanation (``explanation.Explanation``)."""

    graph: FragmentGraph
    placement: str
    collectives: Sequence[Collective]
    transfers: Sequence[Moved]
    transfer_dtype: str
    groups: dict[str, str]

    def group_of(self, role: str) -> str | None: ...

ROLE_COLOURS = {"actor": "#b7e4c7", "learner": "#bcd4f6", "buffer": "#fde2a7", "evaluator": "#e9d5f5"}
OTHER_COLOUR = "#e5e5e5"
FORMATS = (".png", ".svg", ".pdf", ".dot", ".txt")


@dataclasses.dataclass(frozen=True)
class _Arrow:
    src: str
    dst: str
    label: str
    transfer: bool


@dataclasses.dataclass
class _Picture:
    """What is drawn, whatever draws it: boxes by column, their groups and arrows."""

    columns: list[list[str]]  # node ids, left to right
    labels: dict[str, str]
    colours: dict[str, str]
    groups: dict[str, list[str]]  # group caption (placement, collectives) -> fragment node ids
    arrows: list[_Arrow]


def draw(explanation: Explained, path: str | Path) -> Path:
    """Write the picture of ``explanation``'s graph to ``path``, whole or not at all
    (``writes.write_atomically``: a failure raises ``WriteError`` naming ``path``, the
    earlier file there as it was); its suffix chooses the format (``FORMATS``). Returns
    the path written."""
    path = check_path(path)
    if path.suffix == ".txt":
        return write_atomically(path, str(explanation) + "\n")
    picture = _picture(explanation)
    source = _dot(picture)
    if path.suffix == ".dot":
        return write_atomically(path, source)
    if not shutil.which("dot"):
        return write_atomically(path, lambda tmp: _matplotlib(picture, explanation.placement, tmp))

    def graphviz(tmp: Path) -> None:
        done = subprocess.run(["dot", f"-T{path.suffix[1:]}", "-o", str(tmp)], input=source.encode(), capture_output=True)
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            raise OSError(errno.EIO, f"Graphviz's dot failed: {said[-1] if said else done.returncode}", str(path))

    return write_atomically(path, graphviz)


def check_path(path: str | Path) -> Path:
    """``path`` if ``draw`` can write it, else ``ConfigError``."""
    path = Path(path)
    check(path.suffix in FORMATS, "draw", str(path), f"name a file ending in one of {', '.join(FORMATS)}")
    check(path.parent.is_dir(), "draw", str(path), "the folder does not exist; create it first")
    return path


def _picture(explanation: Explained) -> _Picture:
    graph = explanation.graph
    role = {n.name: n.role for n in graph.nodes}
    labels = {n.name: f"{n.name}\n{n.flops:.3g} FLOPs" for n in graph.nodes}
    colours = {n.name: ROLE_COLOURS.get(n.role, OTHER_COLOUR) for n in graph.nodes}
    labels |= {"in:state": "state", "in:algorithm": "hyperparameters", "out:state": "state'", "out:metrics": "metrics"}
    colours |= dict.fromkeys(("in:state", "in:algorithm", "out:state", "out:metrics"), "#ffffff")

    def group(name: str) -> str | None:
        """The device group a fragment runs on (None where there is one group)."""
        return explanation.group_of(role[name])

    def endpoint(name: str, incoming: bool) -> str:
        if name in role:
            return name
        return f"{'in' if incoming else 'out'}:{name}"

    merged: dict[tuple[str, str], list[str]] = defaultdict(list)
    crossing: set[tuple[str, str]] = set()
    for e in graph.edges:
        src, dst = endpoint(e.src, True), endpoint(e.dst, False)
        port = (e.dst_port if e.dst in role else e.src_port) or e.src
        port = "hyperparameters" if port == "self" else port  # a recipe's bound dataclass
        merged[(src, dst)].append(f"{port}: {format_bytes(e.nbytes)}"
                                  + (" (env-batched)" if e.batch_axis is not None else ""))
        if e.src in role and e.dst in role and group(e.src) != group(e.dst):
            crossing.add((src, dst))
    by_name = {t.name.rsplit(".", 1)[-1]: t for t in explanation.transfers}
    arrows = []
    for (src, dst), lines in merged.items():
        if (src, dst) in crossing:
            moved = [by_name[p] for p in by_name if any(line.startswith(f"{p}:") for line in lines)]
            lines = [*lines, f"transfer in {explanation.transfer_dtype}: "
                     f"{format_bytes(sum(t.nbytes[explanation.transfer_dtype] for t in moved))}"]
        arrows.append(_Arrow(src, dst, "\n".join(lines), (src, dst) in crossing))
    for t in (t for t in explanation.transfers if t.carried):  # one group's output is another's next input
        source, destination = t.direction.split(" -> ")
        sender = next(n.name for n in graph.nodes if group(n.name) == source)
        receiver = next(n.name for n in graph.nodes if group(n.name) == destination)
        arrows.append(_Arrow(sender, receiver, f"{t.name.split('.', 1)[-1]} for the next iteration\ntransfer in "
                                            f"{explanation.transfer_dtype}: "
                                            f"{format_bytes(t.nbytes[explanation.transfer_dtype])}", True))
    groups: dict[str, list[str]] = defaultdict(list)
    for n in graph.nodes:
        caption = explanation.groups.get(group(n.name) or "") or "\n".join([explanation.placement,
                                                                      *summary(explanation.collectives)])
        groups[caption].append(n.name)
    columns = [["in:state", "in:algorithm"], *([n.name] for n in graph.nodes), ["out:state", "out:metrics"]]
    return _Picture(columns, labels, colours, dict(groups), arrows)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _dot(picture: _Picture) -> str:
    """Graphviz source for ``picture``."""
    lines = ["digraph fragments {", "  rankdir=LR; node [shape=box, style=\"rounded,filled\", fontname=Helvetica];",
             "  edge [fontname=Helvetica, fontsize=9];"]
    for i, (caption, names) in enumerate(picture.groups.items()):
        lines.append(f"  subgraph cluster_{i} {{ label={_quote(caption)}; style=dashed; fontname=Helvetica;")
        lines += [f"    {_quote(n)} [label={_quote(picture.labels[n])}, fillcolor={_quote(picture.colours[n])}];"
                  for n in names]
        lines.append("  }")
    placed = {n for names in picture.groups.values() for n in names}
    for column in picture.columns:
        lines += [f"  {_quote(n)} [label={_quote(picture.labels[n])}, fillcolor={_quote(picture.colours[n])}];"
                  for n in column if n not in placed]
    for a in picture.arrows:
        style = ", color=red, fontcolor=red, penwidth=2" + (", constraint=false, style=dashed"
                                                            if a.src != a.dst and _backwards(picture, a) else "")
        lines.append(f"  {_quote(a.src)} -> {_quote(a.dst)} [label={_quote(a.label)}"
                     + (style if a.transfer else "") + "];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _column_of(picture: _Picture) -> dict[str, int]:
    return {n: i for i, column in enumerate(picture.columns) for n in column}


def _backwards(picture: _Picture, arrow: _Arrow) -> bool:
    column = _column_of(picture)
    return column[arrow.dst] <= column[arrow.src]


def _matplotlib(picture: _Picture, placement: str, path: Path) -> None:
    """``picture`` drawn with matplotlib: the incoming state as a bar on top, the
    fragments in execution order in a row, the outgoing state and metrics as a bar
    below; each fragment's reads and writes labelled beside its vertical arrows,
    data between fragments above the horizontal ones, transfers in red."""
    from matplotlib.figure import Figure  # no pyplot: the global backend stays as it is
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fragments = [n for names in picture.groups.values() for n in names]
    fragments.sort(key=_column_of(picture).__getitem__)
    box_w, box_h, gap = 3.4, 1.4, 4.6
    width = 2 + len(fragments) * box_w + (len(fragments) - 1) * gap + 2
    fig = Figure(figsize=(width * 0.9, 8.5))
    ax = fig.subplots()
    ax.set(xlim=(0, width), ylim=(-1.6, 10.2))
    ax.axis("off")
    ax.set_title(placement, fontsize=10, wrap=True)
    x = {n: 2 + box_w / 2 + i * (box_w + gap) for i, n in enumerate(fragments)}
    top, row, bottom = 9.0, 5.6, 1.6

    def bar(y: float, text: str) -> None:
        ax.add_patch(FancyBboxPatch((0.5, y - 0.4), width - 1, 0.8, boxstyle="round,pad=0.05", facecolor="#f4f4f4",
                                    edgecolor="grey"))
        ax.text(width / 2, y, text, ha="center", va="center", fontsize=10)

    def arrow(start: tuple[float, float], end: tuple[float, float], colour: str = "black", bend: float = 0.0,
              dashed: bool = False) -> None:
        ax.add_patch(FancyArrowPatch(start, end, connectionstyle=f"arc3,rad={bend}", arrowstyle="-|>",
                                     mutation_scale=14, color=colour, linewidth=2 if colour == "red" else 1.2,
                                     linestyle="--" if dashed else "-"))

    bar(top, "training state and hyperparameters, at the start of the iteration")
    bar(bottom, "training state after the iteration  ·  metrics")
    for caption, names in picture.groups.items():
        left = min(x[n] for n in names) - box_w / 2 - 0.35
        right = max(x[n] for n in names) + box_w / 2 + 0.35
        ax.add_patch(FancyBboxPatch((left, row - box_h / 2 - 0.5), right - left, box_h + 1.3, fill=False,
                                    boxstyle="round,pad=0.05", linestyle="--", edgecolor="grey"))
        ax.text(left + 0.1, row - box_h / 2 - 0.45, caption.split("\n")[0], ha="left", va="bottom", fontsize=8,
                color="dimgrey")
    for n in fragments:
        ax.add_patch(FancyBboxPatch((x[n] - box_w / 2, row - box_h / 2), box_w, box_h, boxstyle="round,pad=0.05",
                                    facecolor=picture.colours[n], edgecolor="black"))
        ax.text(x[n], row, picture.labels[n], ha="center", va="center", fontsize=10)
        reads = [a.label for a in picture.arrows if a.dst == n and a.src.startswith("in:")]
        writes = [a.label for a in picture.arrows if a.src == n and a.dst.startswith("out:")]
        arrow((x[n] - 1.1, top - 0.4), (x[n] - 1.1, row + box_h / 2))
        ax.text(x[n] - 1.3, (top - 0.4 + row + box_h / 2 + 0.8) / 2, "\n".join(reads), ha="right", va="center",
                fontsize=7)
        arrow((x[n] + 1.1, row - box_h / 2), (x[n] + 1.1, bottom + 0.4))
        ax.text(x[n] + 1.3, (row - box_h / 2 - 0.5 + bottom + 0.4) / 2, "\n".join(writes), ha="left", va="center",
                fontsize=7)
    for a in picture.arrows:
        if a.src not in x or a.dst not in x:
            continue
        colour = "red" if a.transfer else "black"
        if x[a.dst] > x[a.src]:  # forward, within the iteration
            arrow((x[a.src] + box_w / 2, row + 0.2), (x[a.dst] - box_w / 2, row + 0.2), colour)
            ax.text((x[a.src] + x[a.dst]) / 2, row + 0.35, a.label, ha="center", va="bottom", fontsize=7,
                    color=colour)
        else:  # back to an earlier fragment: the next iteration's input
            arrow((x[a.src] - box_w / 2, row - 0.35), (x[a.dst] + box_w / 2, row - 0.35), colour, dashed=True)
            ax.text((x[a.src] + x[a.dst]) / 2, row - 0.5, a.label, ha="center", va="top", fontsize=7, color=colour)
    footer = ["  ·  ".join(caption.split("\n")) for caption in picture.groups]
    ax.text(width / 2, -0.6, "\n".join(footer), ha="center", va="top", fontsize=8, color="dimgrey")
    fig.savefig(path, dpi=110, bbox_inches="tight")
