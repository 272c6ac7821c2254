"""The deadline a request may carry: an instant by which its answer is due, checked between chunks of work.

A :class:`Deadline` travels down with the work (:func:`explainers.explain`, :func:`explainers.explain_batch`'s
:class:`~explainers.RowRequest`, and the :class:`~explainers.methods.registry.ForwardInputs` of the methods that run
forwards of their own). :meth:`Deadline.check` is the one safe point: called between chunks (integrated gradients' path
points, SmoothGrad's samples, occlusion's copies) and before each group of a batch is scored, it abandons the work with
:class:`DeadlineExceededError` once the deadline has passed. Nothing is interrupted mid-pass and no thread is killed, so
the worker keeps serving and the batch's other rows are still answered.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .errors import ExplainError


class DeadlineExceededError(ExplainError):
    """The request's deadline passed before its explanation was done: the work was abandoned between two chunks."""


@dataclass(frozen=True)
class Deadline:
    """An instant on :func:`time.monotonic`'s clock by which a request's answer is due.

    Attributes:
        expires: the instant, in :func:`time.monotonic` seconds.
    """

    expires: float

    @classmethod
    def within(cls, seconds: float) -> Deadline:
        """The deadline ``seconds`` from now (a gRPC ``time_remaining()``, a timeout)."""
        return cls(time.monotonic() + float(seconds))

    @classmethod
    def at_unix(cls, unix_seconds: float) -> Deadline:
        """The deadline at the wall-clock instant ``unix_seconds`` (seconds since the epoch, as a header carries it)."""
        return cls.within(float(unix_seconds) - time.time())

    @classmethod
    def of(cls, value: Deadline | float | None) -> Deadline | None:
        """A deadline from what a caller passes: a :class:`Deadline`, seconds from now, or ``None`` (none)."""
        if value is None or isinstance(value, Deadline):
            return value
        return cls.within(float(value))

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self.expires - time.monotonic()

    @property
    def passed(self) -> bool:
        """Whether the deadline has passed."""
        return self.remaining() <= 0

    def check(self, where: str) -> None:
        """Abandon the work if the deadline has passed.

        Args:
            where: what was about to run (for the message), e.g. ``"integrated_gradients' path points 64-127"``.

        Raises:
            DeadlineExceededError: naming how long ago it passed and where the work stopped.
        """
        left = self.remaining()
        if left <= 0:
            raise _exceeded(where, left)

    def exceeded(self, where: str) -> DeadlineExceededError:
        """The error of work abandoned before ``where`` because the deadline passed (:meth:`check` raises it)."""
        return _exceeded(where, self.remaining())


def _exceeded(where: str, left: float) -> DeadlineExceededError:
    return DeadlineExceededError(
        f"the request's deadline passed {-left * 1000:,.0f} ms ago; the work was abandoned before {where} "
        "(send a later deadline, or a cheaper request: fewer steps, samples or tokens)"
    )
