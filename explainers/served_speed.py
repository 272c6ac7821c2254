"""A model's speed kept up to date from the batches it serves: the probe measured at load
(:meth:`~explainers.timing.ModelSpeed.measure`) corrected by the ratio of each served batch's actual seconds to its
estimate.

A probe is a few forwards at one moment: measured while other models load, it can be many times too slow, and on a quiet
moment before the machine fills up, too fast. Every estimate the cost model makes is linear in the speed's times
(:func:`~explainers.timing.estimate_seconds`, :func:`~explainers.timing.generation_seconds`), so a correction is one
factor: a :class:`ServedSpeed` keeps, per *kind* of work (a method with its options, ``predict``, ``generate``), the
ratios ``actual / estimate`` of the last :data:`WINDOW` batches (each estimated at the probe's speed, the sum of its
rows' estimates, as the batch ran, beside whatever else shared the machine) with the length of their longest row, and
scales the probe by :data:`HEADROOM` times the upper quartile (:data:`QUANTILE`) of the ratios of batches of a similar
length (within a factor :data:`LENGTH_BAND`): the cost model's fixed costs make the ratio grow with the length, so a row
longer than every batch served takes the longest batches' ratio grown with the square of its length (attention's cost),
up to the probe's own estimate unless those batches found the probe too fast, and a shorter one the ratio of the longer
batches. A kind is a method with its options (:func:`work_kind`), so that ``integrated_gradients``
at 1,024 steps is not estimated from batches at 16. A kind not served yet is estimated at the probe, raised (never
lowered) by the ratios of every kind: batches of cheap work do not make an expensive request look cheap, a machine
slower than its probe slows every estimate; before any batch the probe is used as measured (its
:data:`~explainers.timing.SAFETY` factor included). A row of a kind no batch corrected that is refused over the budget
alone has the model probed again (:meth:`ServedSpeed.recheck`, at most every :data:`REPROBE_S`). A batch's work is
recorded in a :class:`BatchLedger`: the speed each kind was admitted at, and its estimated seconds;
:meth:`BatchLedger.settle` hands the batch's actual seconds to the served speed.

The estimates after correction are about :data:`HEADROOM` times the recent actual time of the same kind of work
(``bench/timing_tasks.py`` measures ``actual / estimate`` before and after a slow probe is corrected). A refusal still
rests on them, so a request that cannot fit is refused at once; the deadlines stay the hard guard.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping

from .timing import ModelSpeed

#: The corrected estimate is this many times the recent ``actual / estimate`` ratio (its upper quartile): the margin
#: left for a batch slower than the recent ones.
HEADROOM = 2.5
#: Batches whose ratio is kept per kind of work (the older ones are forgotten: the machine's load changes).
WINDOW = 16
#: The quantile of the kept ratios the correction follows (above the median: the estimate errs high).
QUANTILE = 0.75
#: Batches whose longest row is within this factor of a row's length count as of its length.
LENGTH_BAND = 2.0
#: The kind that collects every batch's ratio (the correction of a kind not served yet).
ANY_KIND = "*"
#: The kind of a row that asks for its prediction only.
PREDICT = "predict"
#: The kind of a causal LM's writing of its answer.
GENERATE = "generate"
#: Seconds between two probes for a kind of work no batch has corrected yet (:meth:`ServedSpeed.recheck`).
REPROBE_S = 30.0
#: The length two probes are compared at (the faster is kept).
COMPARED_LENGTH = 64


class ServedSpeed:
    """A model's probe speed and the corrections its served batches made to it (module docstring).

    Attributes:
        probe: the speed measured at load (safety factor included).
        learns: whether served batches correct it (``False``: a speed given as is, e.g. by a test or a benchmark).
        headroom: :data:`HEADROOM`.
    """

    #: The kind of a row that asks for its prediction only (:data:`PREDICT`).
    PREDICT = PREDICT
    #: The kind of a causal LM's writing (:data:`GENERATE`).
    GENERATE = GENERATE

    def __init__(
        self,
        probe: ModelSpeed,
        *,
        learns: bool = True,
        measure: Callable[[], ModelSpeed] | None = None,
        reprobe_s: float = REPROBE_S,
        headroom: float = HEADROOM,
        window: int = WINDOW,
    ) -> None:
        """Start from ``probe``; ``learns=False`` keeps it as given whatever is observed.

        Args:
            probe: the measured speed.
            learns: whether :meth:`observe` corrects it.
            measure: probes the model again (:meth:`recheck`; ``None``: never).
            reprobe_s: the seconds between two probes.
            headroom: the factor the corrected estimates keep above the recent actual times.
            window: the batches kept per kind.
        """
        self.probe = probe
        self.learns = learns
        self.headroom = headroom
        self._measure = measure
        self._reprobe_s = reprobe_s
        self._probed = time.monotonic()
        self._window = window
        self._ratios: dict[str, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()

    def recheck(self, kind: str = ANY_KIND) -> bool:
        """Probe the model again when a row of ``kind`` was refused over the budget alone and no served batch of that
        kind corrected the probe (a probe measured while the machine was busy would else refuse such rows for the
        model's life), at most once per ``reprobe_s``; the faster of the two probes is kept, and the kept ratios are
        restated against it.

        Args:
            kind: the refused row's kind of work.

        Returns:
            Whether the probe changed (the refused row may be estimated again).
        """
        if self._measure is None or not self.learns:
            return False
        with self._lock:
            if self._ratios.get(kind):
                return False
        now = time.monotonic()
        if now - self._probed < self._reprobe_s:
            return False
        self._probed = now
        fresh = self._measure()
        change = fresh.forward_seconds(COMPARED_LENGTH) / self.probe.forward_seconds(COMPARED_LENGTH)
        if change >= 1.0:
            return False
        with self._lock:
            self.probe = fresh
            for seen in self._ratios.values():  # a ratio is actual / estimate: the estimates shrank by ``change``
                restated = [(ratio / change, length) for ratio, length in seen]
                seen.clear()
                seen.extend(restated)
        return True

    @property
    def batches(self) -> int:
        """How many served batches the corrections rest on (the last :data:`WINDOW` at most)."""
        with self._lock:
            return len(self._ratios.get(ANY_KIND, ()))

    def factor(self, kind: str, length: int = 0) -> float:
        """The factor the probe's estimates of ``kind`` of work on rows of ``length`` tokens are multiplied by (1:
        nothing observed yet; module docstring).

        Args:
            kind: a method's name, :data:`PREDICT` or :data:`GENERATE`.
            length: the row's tokens (0: any length, every kept batch counts).
        """
        with self._lock:
            own, every = self._ratios.get(kind), self._ratios.get(ANY_KIND)
            if own:
                return self.headroom * _ratio_at(list(own), length, self.headroom)
            if not every:
                return 1.0
            return max(1.0, self.headroom * _ratio_at(list(every), length, self.headroom))

    def speed(self, kind: str, length: int = 0) -> ModelSpeed:
        """The probe, corrected for ``kind`` of work at ``length`` tokens (:meth:`factor`).

        Args:
            kind: a method's name, :data:`PREDICT` or :data:`GENERATE`.
            length: the row's tokens (0: any length).
        """
        return scaled(self.probe, self.factor(kind, length))

    def ledger(self) -> BatchLedger:
        """A new batch's ledger (the speeds its rows are admitted at, and their estimates)."""
        return BatchLedger(self)

    def observe(self, work: Mapping[str, float], actual_s: float, lengths: Mapping[str, int] | None = None) -> None:
        """Record one served batch: its estimate at the probe's speed, by kind of work, and its actual seconds.

        Every batch's ratio is kept for :data:`ANY_KIND`; it is kept for a kind too when that kind is at least half of
        the batch's estimate (a mixed batch's time cannot be split between its kinds).

        Args:
            work: seconds estimated at :attr:`probe` per kind (the sum of the batch's rows of that kind).
            actual_s: the seconds the batch took.
            lengths: the tokens of each kind's longest row (absent: 0, of any length).
        """
        total = sum(work.values())
        if not self.learns or total <= 0 or actual_s <= 0:
            return
        ratio = actual_s / total
        longest = dict(lengths or {})
        with self._lock:
            kept = [kind for kind, seconds in work.items() if seconds >= total / 2]
            for kind in (ANY_KIND, *kept):
                length = max(longest.values(), default=0) if kind == ANY_KIND else longest.get(kind, 0)
                self._ratios.setdefault(kind, deque(maxlen=self._window)).append((ratio, length))

    def __repr__(self) -> str:
        return f"ServedSpeed(probe={self.probe}, batches={self.batches}, factor={self.factor(ANY_KIND):.3g})"


class BatchLedger:
    """One batch's admission: the corrected speed each kind of work was admitted at (read once, so that a row's
    estimate and its record agree) and the batch's estimated seconds per kind, in the probe's terms."""

    def __init__(self, served: ServedSpeed) -> None:
        """Record a batch for ``served``.

        Args:
            served: the model's served speed.
        """
        self.served = served
        self._factors: dict[tuple[str, int], float] = {}
        self._speeds: dict[tuple[str, int], tuple[ModelSpeed, ModelSpeed]] = {}
        self._work: dict[str, float] = defaultdict(float)
        self._lengths: dict[str, int] = defaultdict(int)

    def _factor(self, kind: str, length: int) -> float:
        if (kind, length) not in self._factors:
            self._factors[kind, length] = self.served.factor(kind, length)
        return self._factors[kind, length]

    def speed(self, kind: str, length: int = 0) -> ModelSpeed:
        """The speed ``kind`` of work on rows of ``length`` tokens is admitted at in this batch (the served speed's
        current probe, at the factor as first read).

        Args:
            kind: a method's name, :data:`PREDICT` or :data:`GENERATE`.
            length: the row's tokens (0: any length).
        """
        probe = self.served.probe
        made = self._speeds.get((kind, length))
        if made is None or made[0] is not probe:  # scaled once per kind and length (again if the model was probed)
            made = probe, scaled(probe, self._factor(kind, length))
            self._speeds[kind, length] = made
        return made[1]

    def add(self, kind: str, seconds: float, length: int = 0) -> None:
        """Count admitted work.

        Args:
            kind: its kind (a method's name, :data:`PREDICT`, :data:`GENERATE`).
            seconds: its estimate at this ledger's :meth:`speed` of ``kind`` and ``length``.
            length: its row's tokens (as given to :meth:`speed`).
        """
        self._work[kind] += seconds / self._factor(kind, length)
        self._lengths[kind] = max(self._lengths[kind], length)

    @property
    def estimated(self) -> float:
        """The batch's admitted work in seconds at the probe's speed."""
        return sum(self._work.values())

    def settle(self, actual_s: float) -> None:
        """The batch ran in ``actual_s`` seconds: hand it to the served speed (:meth:`ServedSpeed.observe`)."""
        self.served.observe(dict(self._work), actual_s, dict(self._lengths))


def work_kind(method: str, options: Mapping[str, object]) -> str:
    """The kind of work of a row explained with ``method`` at ``options``, e.g.
    ``integrated_gradients internal_batch_size=64 n_steps=50``.

    Args:
        method: the method's name.
        options: its options as resolved (defaults filled in), so that a request naming the defaults is of the same
            kind as one that leaves them out.
    """
    return " ".join([method, *(f"{name}={value}" for name, value in sorted(options.items()))])


def scaled(speed: ModelSpeed, factor: float) -> ModelSpeed:
    """``speed`` with every time multiplied by ``factor`` (every estimate scales with it)."""
    if factor == 1.0:
        return speed
    return dataclasses.replace(
        speed, call=speed.call * factor, token=speed.token * factor, python=speed.python * factor,
        step=speed.step * factor,
    )  # fmt: skip


def _ratio_at(seen: list[tuple[float, int]], length: int, headroom: float) -> float:
    """The ratio ``actual / estimate`` for a row of ``length`` tokens from the kept ``(ratio, longest row)`` of
    served batches (module docstring); beyond the longest batch, grown with the square of the length (attention's
    cost), up to the probe's own estimate unless the batches found the probe too fast."""
    if length <= 0:
        return _quantile([ratio for ratio, _ in seen], QUANTILE)
    near = [ratio for ratio, longest in seen if longest <= 0 or length / LENGTH_BAND <= longest <= length * LENGTH_BAND]
    if near:
        return _quantile(near, QUANTILE)
    longer = [ratio for ratio, longest in seen if longest > length]
    if longer:  # the longer batches' ratio errs high for a shorter row
        return _quantile(longer, QUANTILE)
    top = max(longest for _, longest in seen)
    nearest = _quantile([ratio for ratio, longest in seen if longest * LENGTH_BAND >= top], QUANTILE)
    return min(nearest * (length / top) ** 2, max(nearest, 1.0 / headroom))


def _quantile(values: list[float], quantile: float) -> float:
    """The percentile cut of ``values`` nearest ``quantile``: the cut ``statistics.quantiles(values, n=100,
    method="inclusive")`` gives there, the same float, computed alone (the other 98 cuts are not needed)."""
    if len(values) == 1:
        return values[0]
    if not values:
        raise statistics.StatisticsError("must have at least one data point")
    data = sorted(values)
    cut = min(max(round(quantile * _CUTS), 1), _CUTS - 1)  # the cut's rank among the 99
    below, delta = divmod(cut * (len(data) - 1), _CUTS)
    return (data[below] * (_CUTS - delta) + data[below + 1] * delta) / _CUTS


#: The number of intervals :func:`_quantile` cuts the kept ratios into (percentiles).
_CUTS = 100
