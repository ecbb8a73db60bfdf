"""The ranks of a distributed run side by side: each rank's peak, the imbalance between them,
and the same module in each (NOTE [ One file per rank ] in ckview/trace/ranks.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckview.analysis.summary import RunSummary


@dataclass(frozen=True)
class RankComparison:
    """One run of every rank: peaks, which rank is highest and lowest, modules across ranks."""

    labels: list[str]
    """Each rank's label ('rank 0', or a file name), in the order given."""
    peaks: list[int]
    highest: int
    """Index (into ``labels``) of the rank with the highest peak; the first such."""
    lowest: int
    modules: list[tuple[str, list[int]]]
    """Module path -> bytes live at each rank's own peak, largest anywhere first."""

    @property
    def imbalance(self) -> float:
        """Highest peak over lowest peak (see ``peak_imbalance``)."""
        return peak_imbalance(self.peaks)[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": [
                {"rank": lb, "peak_bytes": p} for lb, p in zip(self.labels, self.peaks, strict=True)
            ],
            "highest": self.labels[self.highest],
            "lowest": self.labels[self.lowest],
            "imbalance": self.imbalance,
            "modules": [{"module": m, "bytes": b} for m, b in self.modules],
        }


def peak_imbalance(peaks: Sequence[int]) -> tuple[float, int, int]:
    """(highest / lowest peak, index of the highest, index of the lowest): 1.0 is balanced,
    inf when a rank peaked at 0 bytes; the first index where several are equal."""
    if not peaks:
        raise ValueError("no peaks to compare")
    high, low = peaks.index(max(peaks)), peaks.index(min(peaks))
    return (peaks[high] / peaks[low] if peaks[low] else float("inf")), high, low


def compare_ranks(
    labels: Sequence[str], summaries: Sequence[RunSummary], top: int = 8
) -> RankComparison:
    """Compare one run's ``summaries`` across ranks (``top_modules`` at each rank's peak)."""
    if not summaries or len(labels) != len(summaries):
        raise ValueError("one label per summary, at least one summary")
    peaks = [s.peak_bytes for s in summaries]
    _, highest, lowest = peak_imbalance(peaks)
    per_rank = [dict(s.top_modules) for s in summaries]
    paths = {path for modules in per_rank for path in modules}
    rows = [(path, [m.get(path, 0) for m in per_rank]) for path in paths]
    rows.sort(key=lambda row: (-max(row[1]), row[0]))
    return RankComparison(
        labels=list(labels),
        peaks=peaks,
        highest=highest,
        lowest=lowest,
        modules=rows[:top],
    )
