"""Units a reader thinks in: tokens grouped into words or sentences of the text they came from, and scores summed
over each unit's tokens.

Scores are computed per token; a unit's score is **the sum of its tokens' scores**. A sum is the one aggregation that
keeps what the methods promise: LRP-family relevances (AttnLRP, CP-LRP, Chefer's relevance) are conserved, so a
unit's relevance is the share of the explained output its tokens carry together, and gradient × input is a sum over
the embedding dimensions that the sum over tokens extends; a rollout row still sums to 1. A mean or a maximum would
favour words the tokenizer happens to split, or not.

Any explanation can be grouped: :func:`token_units` needs only the text, each token's character offsets into it and,
optionally, *segments* (character spans with a label, e.g. the messages and documents of a rendered chat):

- ``granularity="token"``: one unit per token (its text is the characters it covers, never a ``Ġ``/``▁``/``##``
  piece);
- ``"word"``: words of the text (letters and digits, with inner apostrophes and hyphens, and decimal numbers), each
  run of other non-space characters (punctuation, ``<|im_start|>``) its own word;
- ``"sentence"``: sentences of the text: a sentence ends after ``.``, ``!``, ``?`` or ``…`` (with closing quotes or
  brackets) followed by a space and a character that is not a lower-case letter, and at every line break. A simple
  rule, not a linguistic parser: "Dr. Smith" is cut after "Dr.".

Tokens are assigned by their *anchor*, their first non-space character: a token belongs to the word (sentence)
that holds its anchor, and to the segment that holds it. Consecutive tokens of the same word (sentence) and segment
form one unit; a unit never crosses a segment boundary, so a template token next to a message's word is its own unit.
A token of white space only (``Ċ``, a lone ``▁``) joins the next token's unit when that token is in the same segment,
else the previous token's, else it is a unit of its own. A token without characters (``offsets`` ``None``: a special
token the tokenizer added, such as ``<s>`` or ``[CLS]``) is always a unit of its own. Every token is in exactly one
unit, in order, so the unit scores of an explanation sum to its token scores' sum.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .errors import InvalidOptionError

Granularity = Literal["token", "word", "sentence"]
#: The granularities, in order of size.
GRANULARITIES: tuple[Granularity, ...] = ("token", "word", "sentence")

_WORD = re.compile(r"\d+(?:[.,]\d+)+|\w+(?:['\u2019\-]\w+)*|[^\w\s]+")
_SENTENCE_END = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*")


@dataclass(frozen=True)
class Segment:
    """A labelled character span of the text, ``[start, end)``: a message, a document, the prompt.

    Attributes:
        start: its first character.
        end: one past its last character.
        label: what it is, e.g. ``("message", 0)`` or ``("document", 2)``.
    """

    start: int
    end: int
    label: Hashable


@dataclass(frozen=True)
class Unit:
    """Consecutive tokens ``[first, stop)`` read as one word, sentence or token.

    Attributes:
        text: the unit's characters, ``text[start:end]`` (white space around it left out); for a token without
            characters, the token's own text as given in ``pieces`` (``<s>``), else ``""``.
        start: the first character (``None`` for a token without characters).
        end: one past the last character (``None`` likewise).
        first: the index of its first token.
        stop: one past the index of its last token.
        label: the label of the segment its tokens are in (``None``: in no segment).
    """

    text: str
    start: int | None
    end: int | None
    first: int
    stop: int
    label: Hashable = None

    @property
    def tokens(self) -> range:
        """The indices of its tokens."""
        return range(self.first, self.stop)


def check_granularity(granularity: str) -> Granularity:
    """``granularity`` if it is one of :data:`GRANULARITIES`.

    Raises:
        InvalidOptionError: naming the valid ones.
    """
    if granularity not in GRANULARITIES:
        raise InvalidOptionError(f"granularity must be one of {', '.join(GRANULARITIES)}, got {granularity!r}")
    return granularity


def word_spans(text: str) -> list[tuple[int, int]]:
    """The character spans of the words of ``text`` (see the module docstring)."""
    return [match.span() for match in _WORD.finditer(text)]


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The character spans of the sentences of ``text``, white space around each left out (see the module
    docstring)."""
    spans: list[tuple[int, int]] = []
    for line_start, line in _lines(text):
        cursor = 0
        for match in _SENTENCE_END.finditer(line):
            end = match.end()
            rest = line[end:]
            following = rest.lstrip()
            if following and (len(following) == len(rest) or following[0].islower()):
                continue  # "3.5", "e.g. the": no space after it, or a lower-case letter follows
            spans.append((line_start + cursor, line_start + end))
            cursor = end
        spans.append((line_start + cursor, line_start + len(line)))
    return [stripped for span in spans if (stripped := _strip(text, span)) is not None]


def _lines(text: str) -> list[tuple[int, str]]:
    """``(start, line)`` of each line of ``text`` (line breaks left out)."""
    lines = []
    position = 0
    for line in text.split("\n"):
        lines.append((position, line))
        position += len(line) + 1
    return lines


def _strip(text: str, span: tuple[int, int]) -> tuple[int, int] | None:
    """``span`` without the white space at its ends (``None`` if nothing is left)."""
    start, end = span
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def _anchor(text: str, offset: tuple[int, int] | None) -> tuple[int | None, bool]:
    """A token's anchor character (its first non-space one; else its first one) and whether it has a non-space
    character."""
    if offset is None:
        return None, False
    start, end = offset
    for position in range(max(start, 0), min(end, len(text))):
        if not text[position].isspace():
            return position, True
    return (start if start < end else None), False


def token_units(
    text: str,
    offsets: Sequence[tuple[int, int] | None],
    granularity: str = "word",
    *,
    segments: Sequence[Segment] = (),
    pieces: Sequence[str] | None = None,
) -> list[Unit]:
    """Group tokens into units of ``granularity`` (see the module docstring for the rules).

    Args:
        text: the text the tokens were read from.
        offsets: per token, its ``(start, end)`` characters in ``text`` (end exclusive), or ``None`` for a token
            without characters (a special token the tokenizer added).
        granularity: ``token``, ``word`` or ``sentence``.
        segments: labelled character spans (non-overlapping); a unit never crosses from one to another.
        pieces: per token, its text for the units of tokens without characters (``None``: ``""``).

    Returns:
        The units, in token order; every token is in exactly one.

    Raises:
        InvalidOptionError: for an unknown granularity.
        ValueError: if ``pieces`` has another length than ``offsets``.
    """
    chosen = check_granularity(granularity)
    if pieces is not None and len(pieces) != len(offsets):
        raise ValueError(f"{len(pieces)} pieces for {len(offsets)} tokens")
    labels = _Labels(segments)
    if chosen == "token":
        units = []
        for index, offset in enumerate(offsets):
            anchor, _ = _anchor(text, offset)
            units.append(_unit(text, offsets, pieces, index, index + 1, labels.at(anchor), strip=False))
        return units
    spans = _Spans(word_spans(text) if chosen == "word" else sentence_spans(text))
    kinds: list[str] = []  # "alone" (no characters), "space" (white space only) or "unit"
    keys: list[Hashable] = []  # the unit key of each token: its span and segment label
    token_labels: list[Hashable] = []
    for index, offset in enumerate(offsets):
        anchor, visible = _anchor(text, offset)
        label = labels.at(anchor)
        token_labels.append(label)
        if offset is None or anchor is None:
            kinds.append("alone")
            keys.append(("alone", index))
        elif not visible:
            kinds.append("space")
            keys.append(("space", index))
        else:
            kinds.append("unit")
            keys.append((spans.at(anchor), label))
    for index in range(len(offsets)):
        if kinds[index] == "space":
            host = _host(kinds, token_labels, index)
            if host is not None:
                keys[index] = keys[host]
    units = []
    first = 0
    for index in range(1, len(offsets) + 1):
        if index == len(offsets) or keys[index] != keys[first]:
            label = next((token_labels[i] for i in range(first, index) if kinds[i] == "unit"), token_labels[first])
            units.append(_unit(text, offsets, pieces, first, index, label, strip=True))
            first = index
    return units


class _Labels:
    """The label of the segment holding a character."""

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.ordered = sorted(segments, key=lambda segment: segment.start)
        self.starts = [segment.start for segment in self.ordered]

    def at(self, position: int | None) -> Hashable:
        if position is None:
            return None
        index = bisect.bisect_right(self.starts, position) - 1
        if index >= 0 and position < self.ordered[index].end:
            return self.ordered[index].label
        return None


class _Spans:
    """The index of the word or sentence holding a character."""

    def __init__(self, spans: Sequence[tuple[int, int]]) -> None:
        self.spans = list(spans)
        self.starts = [start for start, _ in self.spans]

    def at(self, position: int) -> int:
        index = bisect.bisect_right(self.starts, position) - 1
        if index >= 0 and position < self.spans[index][1]:
            return index
        return -1 - position  # a character in no span: a key of its own


def _host(kinds: Sequence[str], labels: Sequence[Hashable], index: int) -> int | None:
    """The token whose unit a white-space token joins: the next token with characters when only white space of
    the same segment lies between them, else the previous token of its segment (``None``: neither)."""
    label = labels[index]
    following = index + 1
    while following < len(kinds) and kinds[following] == "space" and labels[following] == label:
        following += 1
    if following < len(kinds) and kinds[following] == "unit" and labels[following] == label:
        return following
    previous = index - 1
    while previous >= 0 and kinds[previous] == "space" and labels[previous] == label:
        previous -= 1
    if previous >= 0 and kinds[previous] == "unit" and labels[previous] == label:
        return previous
    return None


def _unit(
    text: str,
    offsets: Sequence[tuple[int, int] | None],
    pieces: Sequence[str] | None,
    first: int,
    stop: int,
    label: Hashable,
    strip: bool,
) -> Unit:
    covered = [offset for offset in offsets[first:stop] if offset is not None and offset[0] < offset[1]]
    if not covered:
        at = next((offset[0] for offset in offsets[first:stop] if offset is not None), None)
        piece = pieces[first] if pieces is not None and at is None else ""
        return Unit(piece, at, at, first, stop, label)
    start = min(offset[0] for offset in covered)
    end = max(offset[1] for offset in covered)
    if strip:
        start, end = _strip(text, (start, end)) or (start, end)
    return Unit(text[start:end], start, end, first, stop, label)


def unit_scores(scores: Tensor | Sequence[float], units: Sequence[Unit]) -> Tensor:
    """Sum scores over each unit's tokens: ``(..., n_tokens)`` → ``(..., n_units)``.

    A prefix of the tokens is accepted (a generation step's context covers the first tokens only): the units then
    get the sum over their tokens in the prefix, and the units after it are left out (units that start in the
    prefix are kept, so a word a step sees in part has the sum of the part it sees).

    Args:
        scores: ``(..., n_tokens)`` token scores (or a prefix of them), a tensor or a list of floats.
        units: the units, as :func:`token_units` gives them.

    Returns:
        ``(..., n_units)`` the summed scores.

    Raises:
        ValueError: if there are more scores than tokens.
    """
    values = scores if isinstance(scores, Tensor) else torch.tensor(list(scores), dtype=torch.float64)
    length = values.shape[-1]
    total = units[-1].stop if units else 0
    if length > total:
        raise ValueError(f"{length} scores for {total} tokens")
    kept = [unit for unit in units if unit.first < length]
    index = torch.empty(length, dtype=torch.long, device=values.device)
    for position, unit in enumerate(kept):
        index[unit.first : min(unit.stop, length)] = position
    summed = values.new_zeros((*values.shape[:-1], len(kept)))
    return summed.index_add_(-1, index, values)


@dataclass(frozen=True)
class UnitExplanation:
    """An explanation grouped into units: :func:`explain_units`.

    Attributes:
        granularity: ``token``, ``word`` or ``sentence``.
        units: the units, in order.
        scores: ``(..., len(units))`` each unit's score, the sum of its tokens' scores.
    """

    granularity: Granularity
    units: tuple[Unit, ...]
    scores: Tensor


def explain_units(
    text: str,
    offsets: Sequence[tuple[int, int] | None],
    scores: Tensor | Sequence[float],
    granularity: str = "word",
    *,
    segments: Sequence[Segment] = (),
    pieces: Sequence[str] | None = None,
) -> UnitExplanation:
    """Any token-level explanation read in words or sentences: the units of ``text`` (:func:`token_units`) and the
    sum of each unit's token scores (:func:`unit_scores`).

    >>> encoded = tokenizer(text, return_offsets_mapping=True)
    >>> special = encoded["special_tokens_mask"]  # with return_special_tokens_mask=True
    >>> offsets = [None if flag else tuple(span) for span, flag in zip(encoded["offset_mapping"], special)]
    >>> words = explain_units(text, offsets, attribution.scores[0], "word")

    Args:
        text: the text the tokens were read from.
        offsets: each token's ``(start, end)`` characters, ``None`` for a special token without characters.
        scores: ``(..., n_tokens)`` token scores (one explanation, or several over the same tokens).
        granularity: ``token``, ``word`` or ``sentence``.
        segments: labelled character spans that units must not cross.
        pieces: each token's text, used for the tokens without characters.

    Raises:
        InvalidOptionError: for an unknown granularity.
        ValueError: if the scores do not match the tokens.
    """
    units = token_units(text, offsets, granularity, segments=segments, pieces=pieces)
    values = scores if isinstance(scores, Tensor) else torch.tensor(list(scores), dtype=torch.float64)
    if values.shape[-1] != len(offsets):
        raise ValueError(f"{values.shape[-1]} scores for {len(offsets)} tokens")
    return UnitExplanation(check_granularity(granularity), tuple(units), unit_scores(values, units))
