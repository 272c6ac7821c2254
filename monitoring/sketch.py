"""A heavy-hitters sketch over weighted keys: Space-Saving (Metwally, Agrawal and El Abbadi, 2005) with weights.

The sketch keeps at most ``capacity`` counters. Adding ``weight`` to a key it holds increases that counter; a key it
does not hold takes a free counter or, when all are taken, the smallest counter's place with that counter's value
plus ``weight`` (the key it evicts is forgotten).

Error bound (weights ≥ 0, ``W`` the total weight added): the counters sum to ``W``; a held key's counter
overestimates its true weight by at most its ``error`` (the counter it took over), and every ``error`` and the
smallest counter are at most ``W / capacity``; a key not held has a true weight of at most ``W / capacity``.
So each key's estimate ``estimate(key)`` (0 if not held) is within ``W / capacity`` of its true weight. With a
row's word shares summing to 1, ``W`` is the number of rows, and a word's mean share over those rows is known to
within ``1 / capacity``. Every key whose true weight exceeds ``W / capacity`` is held.

Memory: ``capacity`` counters plus a heap of at most ``4 × capacity`` entries, whatever the number of distinct keys.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator

#: Default counters per sketch: mean shares to within 1/1000 = 0.001.
DEFAULT_CAPACITY = 1000


class SpaceSaving:
    """Weighted Space-Saving over hashable keys (see the module docstring for the bound)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        """An empty sketch of ``capacity`` counters.

        Raises:
            ValueError: if ``capacity`` is not a positive integer.
        """
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self.total = 0.0
        self._counts: dict[Hashable, float] = {}
        self._errors: dict[Hashable, float] = {}
        # (count, tie-break, key): entries go stale when a key's count grows; the live entry matches its count.
        self._heap: list[tuple[float, int, Hashable]] = []
        self._pushed = 0

    def __len__(self) -> int:
        """How many keys the sketch holds (at most ``capacity``)."""
        return len(self._counts)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` holds a counter."""
        return key in self._counts

    def add(self, key: Hashable, weight: float) -> None:
        """Add ``weight`` (≥ 0) to ``key``.

        Raises:
            ValueError: for a negative or non-finite weight.
        """
        if not weight >= 0.0 or weight == float("inf"):
            raise ValueError(f"weights must be finite and non-negative, got {weight!r}")
        if weight == 0.0:
            return
        self.total += weight
        counts = self._counts
        if key in counts:
            counts[key] += weight
        elif len(counts) < self.capacity:
            counts[key] = weight
            self._errors[key] = 0.0
        else:
            smallest, evicted = self._pop_smallest()
            del counts[evicted]
            del self._errors[evicted]
            counts[key] = smallest + weight
            self._errors[key] = smallest
        self._push(key, counts[key])

    def estimate(self, key: Hashable) -> float:
        """The key's counter (an overestimate by at most :meth:`error`), 0 for a key not held."""
        return self._counts.get(key, 0.0)

    def error(self, key: Hashable) -> float:
        """The most the key's counter overestimates its weight (for a key not held: :meth:`floor`)."""
        return self._errors[key] if key in self._errors else self.floor()

    def floor(self) -> float:
        """The smallest counter when the sketch is full (a bound on any key not held), else 0."""
        if len(self._counts) < self.capacity:
            return 0.0
        return min(self._counts.values())

    def items(self) -> Iterator[tuple[Hashable, float]]:
        """``(key, counter)`` of every key held, in no particular order."""
        return iter(self._counts.items())

    def bound(self) -> float:
        """The guaranteed bound on any key's estimation error: total weight / capacity."""
        return self.total / self.capacity

    def _push(self, key: Hashable, count: float) -> None:
        self._pushed += 1
        heapq.heappush(self._heap, (count, self._pushed, key))
        if len(self._heap) > 4 * self.capacity:  # drop the stale entries
            self._heap = [(value, order, held) for value, order, held in self._heap if self._counts.get(held) == value]
            heapq.heapify(self._heap)

    def _pop_smallest(self) -> tuple[float, Hashable]:
        """The smallest live counter and its key (its heap entry removed)."""
        while True:
            count, _, key = heapq.heappop(self._heap)
            if self._counts.get(key) == count:
                return count, key
