"""A value an outcome keeps for readers in this process only (the monitor), never part of an answer.

A served outcome of a row answered in sentences keeps the attribution over its tokens that the sentences' scores were
summed from (:mod:`monitoring.readers` groups it into words). The answer encoders never read it; and an outcome
pickled to another process (a Ray Serve replica's results to its ingress) leaves it behind: unpickled, it is
``None``.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

T = TypeVar("T")


class InMemory(Generic[T]):
    """``value``, held by reference (no copy) as long as its holder; pickled, it is dropped (``None``)."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        """Hold ``value``."""
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled: nothing (the unpickled holder's field reads ``None``)."""
        return (_nothing, ())

    def __repr__(self) -> str:
        """Not the value (an outcome's repr stays short)."""
        return f"InMemory({type(self.value).__name__})"


def _nothing() -> None:
    """What an :class:`InMemory` is unpickled as."""
    return None
