"""Canaries: a probe set explained again on the same model, compared with the answers recorded when it was built.

A probe is a request document (``{"text": ...}``, ``{"text": ..., "text_pair": ...}``) and a method; its reference is
the prediction and the explanation's scores recorded by ``explain-monitor canaries record`` on the packaged model.
Re-explained on byte-identical inputs, a canary sees what input-drift monitoring cannot: a changed checkpoint,
library version, device or numeric setting, even when inputs and predictions look the same.

**Agreement** of one probe: ``1 - d / (‖a‖₁ + ‖r‖₁)`` for the answer's scores ``a`` and the reference's ``r``,
where ``d = Σ max(0, |aᵢ - rᵢ| - tolᵢ)`` and ``tolᵢ = rtol·|rᵢ| + atol·max|r|`` (``rtol`` 1e-4, ``atol`` 1e-5):
an L1 distance normalised by both masses, so it lies in [0, 1] (triangle inequality), is 1.0 when the scores are
equal up to float noise (differences within the tolerance count as none: another thread count or a batch of other
rows reorders sums), 0 (less the tolerance) for scores of opposite sign or disjoint support, and — unlike a
cosine — it sees a change of scale (an explanation twice as large agrees 2/3). Scores of another length (the
tokenizer changed) agree 0.
``explain_canary_agreement{model,method}`` is the worst probe's agreement;
``explain_canary_prediction_agreement`` the share of probes with their reference prediction.

:class:`CanaryRunner` runs them at start and every ``interval_s`` seconds, in idle time (it waits until the given
``is_idle()`` says so) on a daemon thread at the lowest CPU priority (``nice 19`` for that thread only).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

FORMAT = "explain-monitor-canaries"
VERSION = 1
RTOL = 1e-4
ATOL = 1e-5


class CanaryError(ValueError):
    """A canary file that cannot be used (the message names the file and the reason)."""


@dataclass(frozen=True)
class Probe:
    """One canary input.

    Attributes:
        document: the request document (``text``, ``text_pair``; what the model's door takes, less ``explain``).
        method: the method it is explained with.
    """

    document: Mapping[str, Any]
    method: str


@dataclass(frozen=True)
class ProbeAnswer:
    """A probe's answer: its prediction (a label index, a list, a text) and its explanation's scores."""

    prediction: Any
    scores: Sequence[float]


@dataclass(frozen=True)
class Canary:
    """A probe and its reference answer."""

    probe: Probe
    reference: ProbeAnswer


@dataclass(frozen=True)
class CanaryReading:
    """One run of a method's probes: the worst agreement and the share of reference predictions."""

    agreement: float
    prediction_agreement: float
    probes: int


#: Explains a batch of probes: one answer per probe, in order (the lead wires it to the model's service).
Explain = Callable[[Sequence[Probe]], Sequence[ProbeAnswer]]


def agreement(answer: Sequence[float], reference: Sequence[float], rtol: float = RTOL, atol: float = ATOL) -> float:
    """One probe's agreement with its reference (see the module docstring)."""
    if len(answer) != len(reference):
        return 0.0
    if not all(math.isfinite(value) for value in answer):
        return 0.0
    scale = max((abs(value) for value in reference), default=0.0)
    distance = sum(
        max(0.0, abs(a - r) - (rtol * abs(r) + atol * scale)) for a, r in zip(answer, reference, strict=True)
    )
    mass = sum(abs(value) for value in answer) + sum(abs(value) for value in reference)
    if mass == 0.0:
        return 1.0
    return max(0.0, 1.0 - distance / mass)


def compare(canaries: Sequence[Canary], answers: Sequence[ProbeAnswer]) -> dict[str, CanaryReading]:
    """Each method's reading of a run (``answers`` in the order of ``canaries``)."""
    if len(answers) != len(canaries):
        raise ValueError(f"{len(answers)} answers for {len(canaries)} probes")
    grouped: dict[str, list[tuple[float, bool]]] = {}
    for canary, answer in zip(canaries, answers, strict=True):
        grouped.setdefault(canary.probe.method, []).append(
            (agreement(answer.scores, canary.reference.scores), answer.prediction == canary.reference.prediction)
        )
    return {
        method: CanaryReading(min(a for a, _ in rows), sum(same for _, same in rows) / len(rows), len(rows))
        for method, rows in grouped.items()
    }


def canaries_document(model: str, canaries: Sequence[Canary]) -> dict[str, Any]:
    """The JSON document of a canary set."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": model,
        "probes": [
            {
                "input": dict(canary.probe.document),
                "method": canary.probe.method,
                "prediction": canary.reference.prediction,
                "scores": [float(value) for value in canary.reference.scores],
            }
            for canary in canaries
        ],
    }


def write_canaries(model: str, canaries: Sequence[Canary], path: Path) -> None:
    """Write a canary set to ``path`` as JSON (floats as Python writes them: they read back identical)."""
    path.write_text(json.dumps(canaries_document(model, canaries), ensure_ascii=False) + "\n", encoding="utf-8")


def read_canaries(path: Path) -> list[Canary]:
    """Read and validate a canary file.

    Raises:
        CanaryError: ``bad canary file PATH: REASON``.
    """
    try:
        return parse_canaries(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise CanaryError(f"bad canary file {path}: {reason}") from None


def parse_canaries(document: Any) -> list[Canary]:
    """A canary set from its parsed JSON document.

    Raises:
        ValueError: saying what is wrong.
    """
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not an {FORMAT} document (its 'format' must be {FORMAT!r})")
    if document.get("version") != VERSION:
        raise ValueError(f"version {document.get('version')!r} is not {VERSION}")
    if not isinstance(document.get("model"), str):
        raise ValueError("'model' must be a string")
    probes = document.get("probes")
    if not isinstance(probes, list) or not probes:
        raise ValueError("'probes' must be a non-empty list")
    canaries = []
    for position, probe in enumerate(probes):
        where = f"probes[{position}]"
        if not isinstance(probe, dict) or set(probe) != {"input", "method", "prediction", "scores"}:
            raise ValueError(f"{where} must have exactly the keys input, method, prediction, scores")
        if not isinstance(probe["input"], dict) or not probe["input"]:
            raise ValueError(f"{where}: input must be a non-empty request document")
        if not isinstance(probe["method"], str) or not probe["method"]:
            raise ValueError(f"{where}: method must be a method name")
        scores = probe["scores"]
        if not isinstance(scores, list) or not all(
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) for value in scores
        ):
            raise ValueError(f"{where}: scores must be a list of finite numbers")
        reference = ProbeAnswer(probe["prediction"], [float(value) for value in scores])
        canaries.append(Canary(Probe(probe["input"], probe["method"]), reference))
    return canaries


def record(probes: Sequence[Probe], explain: Explain) -> list[Canary]:
    """The probes with their reference answers, explained now by ``explain``.

    Raises:
        ValueError: naming the first probe that was not explained (an error answer, or no scores).
    """
    answers = explain(probes)
    for position, (probe, answer) in enumerate(zip(probes, answers, strict=True)):
        if not answer.scores:
            raise ValueError(f"probe {position} ({probe.method}) was not explained: {answer.prediction!r}")
    return [
        Canary(probe, ProbeAnswer(answer.prediction, list(answer.scores)))
        for probe, answer in zip(probes, answers, strict=True)
    ]


class CanaryRunner:
    """Runs a canary set at start and every ``interval_s`` in idle time, on a low-priority daemon thread."""

    def __init__(
        self,
        canaries: Sequence[Canary],
        explain: Explain,
        *,
        interval_s: float = 600.0,
        is_idle: Callable[[], bool] = lambda: True,
        on_reading: Callable[[dict[str, CanaryReading]], None] | None = None,
        poll_s: float = 0.25,
    ) -> None:
        """A runner of ``canaries``.

        Args:
            canaries: the probes and their references.
            explain: explains a batch of probes (it must serialize with the model's serving: the same model
                object must not run two batches at once).
            interval_s: seconds from one run's end to the next run.
            is_idle: whether the model is idle now (no batch running or queued); a due run waits for it.
            on_reading: called with each run's readings (the monitor publishes them).
            poll_s: seconds between two looks at ``is_idle``.
        """
        if not canaries:
            raise ValueError("a canary runner needs probes")
        self.canaries = list(canaries)
        self.explain = explain
        self.interval_s = interval_s
        self.is_idle = is_idle
        self.on_reading = on_reading
        self.poll_s = poll_s
        self.last: dict[str, CanaryReading] | None = None
        self.runs = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> dict[str, CanaryReading]:
        """Explain every probe now and compare (one batch), publishing the readings."""
        readings = compare(self.canaries, self.explain([canary.probe for canary in self.canaries]))
        self.last = readings
        self.runs += 1
        if self.on_reading is not None:
            self.on_reading(readings)
        return readings

    def start(self) -> None:
        """Start the thread (a first run as soon as the model is idle)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="canaries", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the thread (a run in progress finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        _lower_priority()
        while not self._stop.is_set():
            while not self.is_idle():
                if self._stop.wait(self.poll_s):
                    return
            try:
                self.run_once()
            except Exception:
                logger.exception("canary run failed")
            if self._stop.wait(self.interval_s):
                return


def _lower_priority() -> None:
    """The calling thread at nice 19 (Linux: a thread's own priority; elsewhere, nothing)."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not permitted
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
