"""Statistics over seeds: bootstrap confidence intervals and the interquartile mean."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np


def bootstrap_ci(values: np.ndarray, confidence: float = 0.95, resamples: int = 2000, seed: int = 0,
                 axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of the mean along ``axis``."""
    values = np.moveaxis(np.asarray(values, np.float64), axis, 0)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.shape[0], size=(resamples, values.shape[0]))
    means = values[idx].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    return np.percentile(means, tail, axis=0), np.percentile(means, 100 - tail, axis=0)


def iqm(values: np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% of the values (Agarwal et al. 2021)."""
    v = np.sort(np.asarray(values, np.float64))
    cut = int(np.floor(len(v) * 0.25))
    return float(v[cut: len(v) - cut].mean()) if len(v) > 2 * cut else float(v.mean())


def by_setting(final_returns: np.ndarray, members: list[tuple[dict[str, float], int]],
               failed: Collection[int] = ()) -> list[dict[str, object]]:
    """One row per hyperparameter setting: the final returns of its members but the
    ``failed`` ones summarised over seeds (mean with a 95% bootstrap interval,
    interquartile mean; NaN where every member failed), with the count of its failed
    members where any failed; best mean first."""
    groups: dict[tuple[tuple[str, float], ...], list[int]] = {}
    for i, (setting, _) in enumerate(members):
        groups.setdefault(tuple(sorted(setting.items())), []).append(i)
    rows = []
    for setting, indices in groups.items():
        kept = [i for i in indices if i not in failed]
        values = np.asarray(final_returns)[kept]
        low, high = bootstrap_ci(values) if kept else (np.nan, np.nan)
        rows.append({**dict(setting), "seeds": len(kept), **({"failed": len(indices) - len(kept)} if failed else {}),
                     "mean_return": float(values.mean()) if kept else np.nan, "ci95_low": float(low),
                     "ci95_high": float(high), "iqm_return": iqm(values) if kept else np.nan, "members": indices})
    return sorted(rows, key=lambda r: (np.isnan(r["mean_return"]), -r["mean_return"]))


def markdown(rows: list[dict[str, object]]) -> str:
    """The summary rows as a Markdown table (without the member lists)."""
    columns = [k for k in rows[0] if k != "members"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c])
                                       for c in columns) + " |")
    return "\n".join(lines)
