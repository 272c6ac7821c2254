"""Token-classification labels: the tagging scheme read from ``id2label``, and predicted tags grouped into spans.

Pure functions over label names and integer tags; nothing here touches a model or a tensor library.

Schemes (:func:`label_scheme`), decided from the label names alone:

========  ==========================================================================================================
``BIO``   every label but ``O`` is ``B-X`` or ``I-X`` (IOB2; IOB1 reads the same way), with at least one ``B-``
``BIOES`` the prefixes include ``E-``/``S-`` (or BILOU's ``L-``/``U-``, read as ``E-``/``S-``), next to ``B-``/``I-``
``IO``    every label but ``O`` is ``I-X``, or a bare type name next to an ``O`` label (``O``, ``PER``, ``LOC``)
``none``  anything else (part-of-speech tags, a mix of prefixed and bare names, no ``O``): each token is its own span
========  ==========================================================================================================

A prefix is one of those letters followed by ``-`` or ``_`` (``B-PER``, ``b_per``); the type is the rest. ``O`` (any
case) is the outside label, never part of a span.

Grouping (:func:`group_spans`) is lenient, as seqeval's default mode: a span starts at ``B-X``/``S-X``, or at any tag
of type ``X`` that does not continue a span of type ``X`` (an ``I-PER`` after ``O``); it continues over ``I-X``/``E-X``
of the same type and ends after ``E-X``/``S-X``, before a tag of another type, ``O``, or a token that may not be in a
span (special tokens, padding).

Each span is explained for the summed logit of its tags over its tokens (:func:`span_tags`): the tag of its label at
its first token, and the scheme's continuation tags of the same type after it (``I-X``; ``E-X`` at the last token of a
``BIOES`` span of two or more tokens). For a well-formed prediction these are exactly the predicted tags; spans
given by the caller (``(start, end, label)``) are read the same way, so the result's spans can be given back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

SchemeName = Literal["BIO", "BIOES", "IO", "none"]
SCHEMES: tuple[str, ...] = ("BIO", "BIOES", "IO", "none")

#: A span: ``(start, end, label)`` with token positions (``end`` exclusive) and the label's index in ``id2label``.
Span = tuple[int, int, int]

_PREFIXES = {"B": "B", "I": "I", "E": "E", "S": "S", "L": "E", "U": "S"}


@dataclass(frozen=True)
class Tag:
    """One label of the model, parsed.

    Attributes:
        name: the label as ``id2label`` spells it.
        prefix: ``B``, ``I``, ``E`` or ``S`` (BILOU's ``L``/``U`` read as ``E``/``S``); ``""`` for ``O`` and for a
            bare type name.
        type: the entity type (``PER`` of ``B-PER``; the name itself for a bare name); ``""`` for ``O``.
    """

    name: str
    prefix: str
    type: str

    @property
    def outside(self) -> bool:
        """Whether this is the ``O`` label."""
        return self.type == ""


def parse_tag(name: str) -> Tag:
    """Parse one label name (see the module docstring)."""
    if name.upper() == "O":
        return Tag(name, "", "")
    if len(name) > 2 and name[1] in "-_" and name[0].upper() in _PREFIXES:
        return Tag(name, _PREFIXES[name[0].upper()], name[2:])
    return Tag(name, "", name)


@dataclass(frozen=True)
class LabelScheme:
    """The tagging scheme of a label set.

    Attributes:
        name: ``BIO``, ``BIOES``, ``IO`` or ``none`` (each token its own span).
        tags: the parsed labels, in index order.
    """

    name: SchemeName
    tags: tuple[Tag, ...]

    def index(self, prefix: str, type_: str) -> int | None:
        """The index of the label with this prefix and type (``None`` if the model has no such label).

        Args:
            prefix: the tag prefix: ``B``, ``I``, ``E``, ``S`` (``L``/``U`` are read as ``E``/``S``) or ``""``.
            type_: the entity type (``PER``, ``LOC``...); ``""`` for ``O``.
        """
        for position, tag in enumerate(self.tags):
            if tag.prefix == prefix and tag.type == type_:
                return position
        return None

    @property
    def outside(self) -> frozenset[int]:
        """The indices of the ``O`` label(s)."""
        return frozenset(index for index, tag in enumerate(self.tags) if tag.outside)


def labels_of(id2label: Mapping[int, str] | Mapping[str, str] | Sequence[str]) -> tuple[str, ...]:
    """The label names in index order, from a config's ``id2label`` (int or str keys) or a list.

    Raises:
        ValueError: if the indices are not ``0 .. n-1`` or the names are not distinct.
    """
    if isinstance(id2label, Mapping):
        by_index = {int(key): str(value) for key, value in id2label.items()}
        if sorted(by_index) != list(range(len(by_index))):
            raise ValueError(f"id2label must map 0..{len(by_index) - 1} to names, got keys {sorted(by_index)}")
        names = tuple(by_index[index] for index in range(len(by_index)))
    else:
        names = tuple(str(name) for name in id2label)
    if not names:
        raise ValueError("the label set is empty")
    if len(set(names)) != len(names):
        raise ValueError(f"label names must be distinct, got {list(names)}")
    return names


def label_scheme(id2label: Mapping[int, str] | Mapping[str, str] | Sequence[str]) -> LabelScheme:
    """Read the tagging scheme from the label names (see the module docstring for the rules)."""
    tags = tuple(parse_tag(name) for name in labels_of(id2label))
    inside = [tag for tag in tags if not tag.outside]
    has_outside = len(inside) < len(tags)
    prefixes = {tag.prefix for tag in inside}
    name: SchemeName = "none"
    if inside and "" not in prefixes:
        if prefixes <= {"I"}:
            name = "IO"
        elif prefixes <= {"B", "I"}:
            name = "BIO"
        elif prefixes & {"E", "S"}:
            name = "BIOES"
    elif inside and prefixes == {""} and has_outside:
        name = "IO"
    return LabelScheme(name, tags)


def _starts(scheme: LabelScheme, tag: Tag, previous: Tag | None) -> bool:
    """Whether ``tag`` starts a new span after ``previous`` (``None``: no span open)."""
    if previous is None or previous.type != tag.type:
        return True
    if tag.prefix in ("B", "S"):
        return True
    return scheme.name == "BIOES" and previous.prefix in ("E", "S")


def group_spans(tags: Sequence[int], scheme: LabelScheme, eligible: Sequence[bool] | None = None) -> list[Span]:
    """Group one row's predicted tags into spans (``O`` skipped).

    Args:
        tags: the predicted label index of each token.
        scheme: the label set's scheme (:func:`label_scheme`).
        eligible: per token, whether it may be in a span (``False`` for special tokens and padding, which also end
            any open span); ``None``: every token.

    Returns:
        ``(start, end, label)`` per span, in order, ``label`` the tag at the span's first token.

    Raises:
        ValueError: if a tag is not a label index or the lengths differ.
    """
    if eligible is not None and len(eligible) != len(tags):
        raise ValueError(f"{len(eligible)} eligibility flags for {len(tags)} tags")
    spans: list[Span] = []
    open_start = -1
    open_label = -1
    previous: Tag | None = None
    for position, index in enumerate(tags):
        if not 0 <= index < len(scheme.tags):
            raise ValueError(f"tag {index} at position {position} is not a label index (0..{len(scheme.tags) - 1})")
        tag = scheme.tags[index]
        usable = (eligible is None or bool(eligible[position])) and not tag.outside
        joins = usable and scheme.name != "none" and not _starts(scheme, tag, previous)
        if not joins and previous is not None:
            spans.append((open_start, position, open_label))
            previous = None
        if not usable:
            continue
        if previous is None:
            open_start, open_label = position, index
        previous = tag
        if scheme.name == "none":
            spans.append((position, position + 1, index))
            previous = None
    if previous is not None:
        spans.append((open_start, len(tags), open_label))
    return spans


def span_tags(span: Span, scheme: LabelScheme) -> list[int]:
    """The label index at each token of ``span`` whose logits its objective sums (see the module docstring).

    Raises:
        ValueError: for an empty span or a label that is not an index.
    """
    start, end, label = span
    if end <= start:
        raise ValueError(f"span ({start}, {end}, {label}) is empty: end must be greater than start")
    if not 0 <= label < len(scheme.tags):
        raise ValueError(f"span label {label} is not a label index (0..{len(scheme.tags) - 1})")
    length = end - start
    tag = scheme.tags[label]
    if scheme.name in ("none", "IO") or tag.outside or length == 1:
        return [label] * length
    inside = scheme.index("I", tag.type)
    inside = label if inside is None else inside
    tags = [label] + [inside] * (length - 1)
    if scheme.name == "BIOES":
        last = scheme.index("E", tag.type)
        tags[-1] = inside if last is None else last
    return tags


def tags_of_spans(spans: Sequence[Span], scheme: LabelScheme, length: int, outside: int) -> list[int]:
    """A row of ``length`` tags that holds ``spans`` (their :func:`span_tags`) and ``outside`` elsewhere; the inverse
    of :func:`group_spans` for spans that do not overlap."""
    tags = [outside] * length
    for span in spans:
        tags[span[0] : span[1]] = span_tags(span, scheme)
    return tags
