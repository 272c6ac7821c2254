"""Classifier and token-classifier answers in words or sentences (``explain.granularity``): the input's tokens
grouped into units of the text (:mod:`explainers.units`), each unit's score the sum of its tokens' scores.

A sentence pair's two texts are grouped each on its own (a unit never spans both); a unit's offsets are into its
own text (``segment`` 0 for ``text``, 1 for ``text_pair``). A special token (``[CLS]``, ``[SEP]``, ``<s>``) is a unit
of its own, marked ``special``, without offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from explainers import Segment, Unit, token_units

#: The characters put between a pair's two texts while grouping (so that no word or sentence spans both).
_PAIR_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class TextUnit:
    """One unit of a classifier's input.

    Attributes:
        text: its characters (a special token: the token itself).
        start: its first character in its text (``None`` for a special token).
        end: one past its last character.
        special: a special token the tokenizer added.
        segment: sentence pairs: 0 (``text``) or 1 (``text_pair``); ``None`` for a single text or a special token.
    """

    text: str
    start: int | None
    end: int | None
    special: bool = False
    segment: int | None = None

    def to_dict(self, pair: bool) -> dict[str, Any]:
        """The JSON object (``segment`` only for a sentence pair)."""
        document: dict[str, Any] = {"text": self.text, "start": self.start, "end": self.end, "special": self.special}
        if pair:
            document["segment"] = self.segment
        return document

    def fill(self, proto: Any) -> None:
        """Fill a ``ContextUnit`` message."""
        proto.text = self.text
        if self.start is not None and self.end is not None:
            proto.start, proto.end = self.start, self.end
        if self.segment is not None:
            proto.segment = self.segment
        proto.special = self.special


def text_units(
    text: str,
    pair: str | None,
    offsets: Sequence[tuple[int, int] | None],
    sequences: Sequence[int | None],
    pieces: Sequence[str],
    granularity: str,
) -> tuple[list[Unit], list[TextUnit]]:
    """The units of a classifier's input.

    Args:
        text: the text.
        pair: the second text of a sentence pair (``None``: a single text).
        offsets: each token's characters in its own text (``None``: a special token).
        sequences: each token's text: 0, 1 (the pair) or ``None`` (special).
        pieces: each token's piece (the text of a special token's unit).
        granularity: ``token``, ``word`` or ``sentence``.

    Returns:
        The library's units (token ranges, for :func:`explainers.unit_scores`) and their descriptions.
    """
    shift = len(text) + len(_PAIR_SEPARATOR)
    joined = text if pair is None else text + _PAIR_SEPARATOR + pair
    shifted = [
        None
        if offset is None
        else (offset[0] + (shift if sequence == 1 else 0), offset[1] + (shift if sequence == 1 else 0))
        for offset, sequence in zip(offsets, sequences, strict=True)
    ]
    segments = [Segment(0, len(text), 0)] + ([] if pair is None else [Segment(shift, shift + len(pair), 1)])
    units = token_units(joined, shifted, granularity, segments=segments, pieces=pieces)
    described = []
    for unit in units:
        if unit.start is None or unit.end is None:
            described.append(TextUnit(unit.text, None, None, special=True))
            continue
        segment = unit.label if isinstance(unit.label, int) else None
        moved = shift if segment == 1 else 0
        described.append(
            TextUnit(unit.text, unit.start - moved, unit.end - moved, segment=segment if pair is not None else None)
        )
    return units, described
