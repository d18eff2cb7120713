"""``Explanation``: what ``Program.explain`` reports about one training iteration."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jaxrl_frag import drawing
from jaxrl_frag.collectives import Collective, totals
from jaxrl_frag.graph import FragmentGraph, format_bytes


@dataclasses.dataclass(frozen=True)
class Transfer:
    """A value copied between device groups once per iteration, and its bytes in each
    transfer precision."""

    direction: str  # "actor -> learner": between groups named in ``Explanation.groups``
    name: str
    leaves: tuple[str, ...]
    nbytes: dict[str, int]  # by transfer dtype
    carried: bool = False  # for the next iteration (parameters), rather than within this one


@dataclasses.dataclass
class Explanation:
    """The fragment graph, the placement, the collectives, the transfers between device
    groups (``transfer_dtype`` the one this program uses) and the cost of one iteration.
    Under a policy with several device groups, ``groups`` describes each by name: its
    devices and its program's collectives; ``role_groups`` names the group of each
    fragment role that has its own, the others running on the last group."""

    graph: FragmentGraph
    placement: str
    collectives: list[Collective]
    cost: dict[str, float]
    memory: dict[str, int]
    compile_seconds: dict[str, float]
    transfers: list[Transfer] = dataclasses.field(default_factory=list)
    transfer_dtype: str = "float32"
    groups: dict[str, str] = dataclasses.field(default_factory=dict)
    role_groups: dict[str, str] = dataclasses.field(default_factory=dict)

    def group_of(self, role: str) -> str | None:
        """The device group that runs fragments of ``role`` (None with one group)."""
        return self.role_groups.get(role, list(self.groups)[-1]) if self.groups else None

    def draw(self, path: str | Path) -> Path:
        """The fragment graph as a picture (or DOT source, or text) at ``path``: see ``drawing``."""
        return drawing.draw(self, path)

    def transfer_bytes(self, dtype: str | None = None) -> int:
        """Bytes moved between device groups per iteration in ``dtype`` (default: this program's)."""
        return sum(t.nbytes[dtype or self.transfer_dtype] for t in self.transfers)

    def __str__(self) -> str:
        lines = [f"placement: {self.placement}", str(self.graph), "collectives per iteration:"]
        for kind, (count, nbytes) in totals(self.collectives).items():
            lines.append(f"  {kind:<20} {count:>6} runs {format_bytes(nbytes):>11} in all")
        lines += [f"    {format_bytes(c.nbytes):>10} x{c.times:<5} {c.shape[:90]}" for c in self.collectives[:6]]
        if not self.collectives:
            lines.append("  none")
        if self.transfers:
            dtypes = list(self.transfers[0].nbytes)
            lines.append(f"transfers between device groups per iteration (this program: {self.transfer_dtype}):")
            lines.append(f"  {'direction':<18} {'value':<26}" + "".join(f"{d:>12}" for d in dtypes))
            for t in self.transfers:
                lines.append(f"  {t.direction:<18} {t.name:<26}"
                             + "".join(f"{format_bytes(t.nbytes[d]):>12}" for d in dtypes))
            lines.append(f"  {'total':<45}" + "".join(f"{format_bytes(self.transfer_bytes(d)):>12}"
                                                       for d in dtypes))
        lines.append("cost per iteration:")
        lines += [f"  {k:<38} {v:.4g}" for k, v in self.cost.items()]
        lines += [f"  {k:<38} {format_bytes(v)}" for k, v in self.memory.items()]
        lines.append("compile seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in self.compile_seconds.items()))
        return "\n".join(lines)
