"""Attribution drift of one (model, method, label): a sliding window of its rows' shares against its baseline.

Each explained row's shares join the window (:class:`~monitoring.window.SlidingWindow`). Each time the window
slides (a pane closes) once it has been full, it is read against the baseline: :func:`~monitoring.ranking.ndcg_at_k`,
:func:`~monitoring.ranking.rank_correlation` and, for patches, :func:`~monitoring.ranking.mass_cosine`. Without a
baseline file, the first full window becomes the baseline (and the readings start with the next slide).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from .ranking import DEFAULT_K, mass_cosine, ndcg_at_k, rank_correlation
from .sketch import DEFAULT_CAPACITY
from .window import DEFAULT_PANES, SlidingWindow


@dataclass(frozen=True)
class DriftReading:
    """One reading of a window against its baseline.

    Attributes:
        ndcg: nDCG@k of the window's ranking scored by the baseline's shares.
        rank_correlation: Spearman's ρ over the union of both top-k lists (``nan``: a constant side).
        mass_cosine: patches: the cosine of the two mass maps (``None`` for words).
        window_rows: rows in the window.
        baseline_rows: rows the baseline was built from.
    """

    ndcg: float
    rank_correlation: float
    mass_cosine: float | None
    window_rows: int
    baseline_rows: int


class DriftTracker:
    """The window and baseline of one (method, label)."""

    def __init__(
        self,
        baseline: Mapping[Hashable, float] | None = None,
        baseline_rows: int = 0,
        *,
        patches: bool = False,
        size: int | None = 500,
        seconds: float | None = None,
        k: int = DEFAULT_K,
        panes: int = DEFAULT_PANES,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        """A tracker against ``baseline`` (``None``: the first full window).

        Args:
            baseline: the baseline's mean shares.
            baseline_rows: the rows it was built from.
            patches: keys are patch positions (adds the mass cosine).
            size: the window in rows (or ``None`` with ``seconds``).
            seconds: the window in seconds.
            k: nDCG@k and the top-k lists.
            panes: the window's panes (it slides by one).
            capacity: counters per pane.
        """
        self.baseline = dict(baseline) if baseline is not None else None
        self.baseline_rows = baseline_rows
        self.patches = patches
        self.k = k
        self.window = SlidingWindow(size, seconds, panes, capacity)
        self.last: DriftReading | None = None

    def add(self, shares: Mapping[Hashable, float], now: float) -> DriftReading | None:
        """Add one row's shares; a new reading when the window slid, has been full once, and there is a baseline to
        read it against."""
        if not self.window.add(shares, now):
            return None
        if not self.window.completed:
            return None  # a partial window is too noisy to read
        if self.baseline is None:
            self.baseline = self.window.mean_shares()
            self.baseline_rows = self.window.rows
            return None
        self.last = self.read()
        return self.last

    def read(self) -> DriftReading:
        """The window against the baseline now.

        Raises:
            RuntimeError: if there is no baseline yet.
        """
        if self.baseline is None:
            raise RuntimeError("no baseline yet: the first full window becomes it")
        window = self.window.mean_shares()
        return DriftReading(
            ndcg_at_k(window, self.baseline, self.k),
            rank_correlation(window, self.baseline, self.k),
            mass_cosine(window, self.baseline) if self.patches else None,
            self.window.rows,
            self.baseline_rows,
        )
