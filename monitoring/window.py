"""A sliding window of explained rows' shares, in bounded memory.

The window is cut into ``panes`` (5 by default) that fill one after the other, each a
:class:`~monitoring.sketch.SpaceSaving` sketch of the shares of its rows. The window is the last ``panes`` panes:
when a pane is full (``size / panes`` rows, or ``seconds / panes`` seconds for a window in time), a new pane opens
and the oldest beyond ``panes`` is dropped, so the window slides by one pane at a time and always holds between
``size - size / panes`` and ``size`` rows once it first filled (a window in time: the rows of the last ``seconds``,
to within a pane).

The window's mean share of a key is the sum of its panes' counters over the window's rows. Each pane's counters are
within ``rows_in_pane / capacity`` of the true sums (:mod:`monitoring.sketch`), so the mean share of any key is
within ``1 / capacity`` of its true mean over the window's rows. Memory: ``panes × capacity`` counters.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from .sketch import DEFAULT_CAPACITY, SpaceSaving

#: Panes a window is cut into (it slides by one pane).
DEFAULT_PANES = 5


@dataclass
class _Pane:
    sketch: SpaceSaving
    rows: int
    opened: float


class SlidingWindow:
    """The last ``size`` rows (or ``seconds`` seconds) of share maps, summarised per pane."""

    def __init__(
        self,
        size: int | None = 500,
        seconds: float | None = None,
        panes: int = DEFAULT_PANES,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        """A window of ``size`` rows, or of ``seconds`` seconds (give exactly one).

        Raises:
            ValueError: if neither or both are given, or a value is not positive.
        """
        if (size is None) == (seconds is None):
            raise ValueError("give the window a size in rows or a length in seconds, not both")
        if size is not None and size < panes:
            raise ValueError(f"a window of {size} rows cannot be cut into {panes} panes")
        if seconds is not None and not seconds > 0:
            raise ValueError(f"a window in time needs positive seconds, got {seconds!r}")
        if panes < 1:
            raise ValueError(f"panes must be positive, got {panes}")
        self.size = size
        self.seconds = seconds
        self.panes = panes
        self.capacity = capacity
        self._pane_rows = math.ceil(size / panes) if size is not None else None
        self._pane_seconds = seconds / panes if seconds is not None else None
        self._panes: deque[_Pane] = deque()
        #: Whether the window has once held its full size (a time window: once it spanned ``seconds``).
        self.completed = False

    @property
    def rows(self) -> int:
        """The rows in the window."""
        return sum(pane.rows for pane in self._panes)

    def add(self, shares: Mapping[Any, float], now: float) -> bool:
        """Add one row's shares (non-negative, summing to at most 1) at time ``now`` (seconds, monotonic).

        Returns:
            Whether a pane closed with this row (a row window: the row filled its pane, so the window holds its
            ``size`` rows; a time window: the row opened a new pane): the moment to read the window again.
        """
        rolled = self._roll(now)
        pane = self._panes[-1]
        for key, share in shares.items():
            pane.sketch.add(key, share)
        pane.rows += 1
        if self._pane_rows is None:
            return rolled
        assert self.size is not None
        if self.rows >= self.size:
            self.completed = True
        return pane.rows >= self._pane_rows

    def _roll(self, now: float) -> bool:
        """Open a new pane if the last one is full (dropping the oldest beyond ``panes``); whether one closed."""
        if self._panes and not self._pane_full(self._panes[-1], now):
            return False
        closed = bool(self._panes)
        opened = now
        if self._pane_seconds is not None and self._panes:
            # a time window's panes close on the clock: the panes no row fell into stay empty
            opened = self._panes[-1].opened + self._pane_seconds
            while opened + self._pane_seconds <= now:
                self._append(opened)
                opened += self._pane_seconds
        self._append(opened)
        return closed

    def _append(self, opened: float) -> None:
        self._panes.append(_Pane(SpaceSaving(self.capacity), 0, opened))
        while len(self._panes) > self.panes:
            self._panes.popleft()
            if self._pane_seconds is not None:
                self.completed = True

    def _pane_full(self, pane: _Pane, now: float) -> bool:
        if self._pane_rows is not None:
            return pane.rows >= self._pane_rows
        assert self._pane_seconds is not None
        return now >= pane.opened + self._pane_seconds

    def mean_shares(self) -> dict[Hashable, float]:
        """Each held key's mean share over the window's rows (within ``1 / capacity`` of the true mean)."""
        rows = self.rows
        if rows == 0:
            return {}
        sums: dict[Hashable, float] = {}
        for pane in self._panes:
            for key, count in pane.sketch.items():
                sums[key] = sums.get(key, 0.0) + count
        return {key: total / rows for key, total in sums.items()}

    def counters(self) -> int:
        """How many counters the window holds (at most ``panes × capacity``)."""
        return sum(len(pane.sketch) for pane in self._panes)
