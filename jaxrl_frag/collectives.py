"""The collectives in a compiled program, read back from its HLO.

Each collective is counted as often as it runs: an instruction inside a loop
body counts once per iteration of every enclosing loop whose trip count XLA
knows (``known_trip_count``); loops of unknown length count once.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict

import numpy as np

from jaxrl_frag.graph import format_bytes

KINDS = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+(?P<op>[\w\-]+)\(")
_ARRAY = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction: its kind, result shape, bytes it carries each time
    it runs, and how many times it runs per run of the program."""

    kind: str
    shape: str
    nbytes: int
    times: int

    def __str__(self) -> str:
        return f"{self.kind} {self.shape} x{self.times}"


def totals(collectives: list[Collective]) -> dict[str, tuple[int, int]]:
    """Per kind: how many run and how many bytes they carry in all."""
    out: dict[str, tuple[int, int]] = {}
    for c in collectives:
        count, nbytes = out.get(c.kind, (0, 0))
        out[c.kind] = (count + c.times, nbytes + c.times * c.nbytes)
    return out


def _nbytes(shape: str) -> int:
    return sum(_DTYPE_BYTES[dt] * int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64))
               for dt, dims in _ARRAY.findall(shape))


def _computations(hlo: str) -> tuple[dict[str, list[str]], str]:
    comps: dict[str, list[str]] = {}
    entry, current = "", None
    for line in hlo.splitlines():
        head = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head and not line.startswith(" "):
            current = head.group(2)
            comps[current] = []
            if head.group(1):
                entry = current
        elif current is not None and line.strip() and line.strip() != "}":
            comps[current].append(line)
    return comps, entry


def audit(hlo: str) -> list[Collective]:
    """The collectives of a compiled module's HLO text, with how often each runs."""
    comps, entry = _computations(hlo)
    multiplier: dict[str, int] = defaultdict(int)

    def visit(name: str, times: int) -> None:
        multiplier[name] += times
        for line in comps.get(name, []):
            trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            for attr, callee in re.findall(r"\b(body|condition|to_apply|calls|branch_computations)=\{?%?([\w.\-]+)", line):
                if callee in comps and attr != "to_apply":
                    visit(callee, times * (int(trip.group(1)) if attr == "body" and trip else 1))

    visit(entry, 1)
    found = []
    for name, times in multiplier.items():
        for line in comps[name]:
            m = _INSTRUCTION.match(line)
            kind = m.group("op").removesuffix("-start") if m else ""
            if kind in KINDS:
                shape = re.sub(r"\{[\d,]*\}|/\*index=\d+\*/", "", m.group("shape"))
                found.append(Collective(kind, shape, _nbytes(shape), times))
    return sorted(found, key=lambda c: -c.nbytes * c.times)


def summary(collectives: list[Collective]) -> list[str]:
    """One line per kind: how many run per iteration and the bytes they carry."""
    return [f"{kind}: {count} per iteration, {format_bytes(nbytes)}"
            for kind, (count, nbytes) in totals(collectives).items()] or ["no collectives"]
