"""What the monitor reads of one served row, per task: whether it was predicted, and each explanation it carries as
shares (:mod:`monitoring.shares`) keyed by method and a bounded label.

- ``text`` classifiers: the row's words (the ``word`` granularity of :mod:`serving_core.tasks.text_units`, special
  tokens apart), whatever granularity the row asked for: a row answered in tokens is tokenized again with character
  offsets, exactly as the service groups words, by the reader's own tokenizer (a copy: a fast tokenizer must not be
  called from two threads). A row answered in sentences joins the health numbers but not the drift window (its
  words are not known). Label: the predicted class.
- ``image`` classifiers: the patches, keyed by position (``(row, column)`` of the grid). Label: the predicted class.
- ``token_classification``: one explanation per explained entity, over the row's words; label: the entity type
  (``PER`` for ``B-PER``).
- ``generation``: the prompt's words (template and special tokens apart), the mean share over the row's explained
  steps (or its summed span, or its sentences); label :data:`ALL`. Drift needs the words: rows answered in
  ``word`` granularity join it; rows in tokens or sentences join the health numbers only.

Label values come only from the model's label set (a value outside it is :data:`OTHER`), method values only from the
registry (:func:`serving_core.metrics.metric_method`), never from request text.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from explainers import label_scheme, token_units, unit_scores
from serving_core.metrics import metric_method
from serving_core.tasks.text_units import text_units

from .shares import RowShares, ScoredUnit, row_shares, word_key

#: The label of a value outside the model's label set.
OTHER = "other"
#: The label of a generation model's explanations (it has no labels).
ALL = "all"


@dataclass(frozen=True)
class Observation:
    """One explanation of a served row.

    Attributes:
        method: the method (a registered name).
        label: the bounded label it is kept under.
        shares: its shares and health.
        drift: whether its shares are over the monitored units (words, patches) and join the drift window.
    """

    method: str
    label: str
    shares: RowShares
    drift: bool = True


@dataclass(frozen=True)
class Reading:
    """What one served row adds to the monitor.

    Attributes:
        predicted: it was served (an error answer is not).
        explained: its explanations (empty: prediction only).
    """

    predicted: bool
    explained: tuple[Observation, ...] = ()

    @property
    def method(self) -> str | None:
        """The method that explained it (``None``: not explained)."""
        return self.explained[0].method if self.explained else None


#: A reader: ``(decoded row or None, outcome) → Reading``.
Reader = Callable[[Any, Any], Reading]


def bounded(label: str, allowed: Iterable[str]) -> str:
    """``label`` if it is in ``allowed``, else :data:`OTHER`."""
    return label if label in set(allowed) else OTHER


def average_shares(rows: Sequence[RowShares]) -> RowShares:
    """The mean of several explanations' shares and health numbers (one row explained at several steps)."""
    if len(rows) == 1:
        return rows[0]
    count = len(rows)
    shares: dict[Hashable, float] = {}
    for row in rows:
        for key, share in row.shares.items():
            shares[key] = shares.get(key, 0.0) + share / count
    return RowShares(
        shares,
        sum(row.special_share for row in rows) / count,
        sum(row.negative_share for row in rows) / count,
        sum(row.entropy for row in rows) / count,
    )


class ClassificationReader:
    """Reads a ``text`` or ``image`` classifier's outcomes (:class:`serving_core.tasks.classify_schema.RowOutcome`)."""

    def __init__(self, labels: Sequence[str], tokenizer: Any = None, max_length: int = 128) -> None:
        """A reader for a model of ``labels``.

        Args:
            labels: the model's class names (the label set).
            tokenizer: text models: a fast tokenizer of the model, owned by the reader (``None``: rows answered in
                tokens join the health numbers only).
            max_length: the model's ``max_length`` (the service truncates there).
        """
        self.labels = tuple(labels)
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, row: Any, outcome: Any) -> Reading:
        """The reading of one served row."""
        if outcome.error is not None:
            return Reading(False)
        if outcome.method is None or outcome.scores is None:
            return Reading(True)
        label_id = int(outcome.label_id)
        label = self.labels[label_id] if 0 <= label_id < len(self.labels) else OTHER
        method = metric_method(outcome.method)
        if outcome.grid is not None:
            columns = int(outcome.grid[1])
            units = [ScoredUnit((i // columns, i % columns), float(s)) for i, s in enumerate(outcome.scores)]
            return Reading(True, (Observation(method, label, row_shares(units)),))
        units, drift = self._units(row, outcome)
        return Reading(True, (Observation(method, label, row_shares(units), drift),))

    def _units(self, row: Any, outcome: Any) -> tuple[list[ScoredUnit], bool]:
        if outcome.granularity != "token" and outcome.context is not None:
            units = [
                ScoredUnit(_pair_key(unit.text, unit.segment), float(score), unit.special)
                for unit, score in zip(outcome.context, outcome.scores, strict=False)
            ]
            return units, outcome.granularity == "word"
        special = outcome.special_tokens or [False] * len(outcome.scores)
        text = getattr(row, "text", None)
        if self.tokenizer is None or text is None:
            return _token_units(outcome.scores, special), False
        words, described = self._words(text, getattr(row, "text_pair", None), outcome.tokens or [])
        if not words or words[-1].stop != len(outcome.scores):
            return _token_units(outcome.scores, special), False
        summed = unit_scores([float(s) for s in outcome.scores], words).tolist()
        return [
            ScoredUnit(_pair_key(unit.text, unit.segment), score, unit.special)
            for unit, score in zip(described, summed, strict=True)
        ], True

    def _words(self, text: str, pair: str | None, pieces: Sequence[str]) -> tuple[list[Any], list[Any]]:
        """The row's words as the service groups them (``ExplanationService._fill_units``)."""
        encoded = self.tokenizer(
            text, pair, truncation=True, max_length=self.max_length,
            return_offsets_mapping=True, return_special_tokens_mask=True,
        )  # fmt: skip
        special = [bool(flag) for flag in encoded["special_tokens_mask"]]
        offsets: list[tuple[int, int] | None] = [
            None if flag or end <= start else (int(start), int(end))
            for (start, end), flag in zip(encoded["offset_mapping"], special, strict=True)
        ]
        sequences = [None if flag else seq for seq, flag in zip(encoded.sequence_ids(0), special, strict=True)]
        if len(pieces) != len(offsets):
            pieces = self.tokenizer.convert_ids_to_tokens(encoded["input_ids"])
        return text_units(text, pair, offsets, sequences, pieces, "word")


def _token_units(scores: Sequence[float], special: Sequence[bool]) -> list[ScoredUnit]:
    """Tokens as units, keyed by position (a row whose words are not known: health only)."""
    return [ScoredUnit(index, float(score), bool(special[index]) if index < len(special) else False)
            for index, score in enumerate(scores)]  # fmt: skip


def _pair_key(text: str, segment: int | None) -> str:
    """A word's key; a sentence pair's second text keeps its words apart (``2:word``)."""
    return word_key(text) if segment != 1 else "2:" + word_key(text)


class TokenReader:
    """Reads a token classifier's outcomes (:class:`serving_core.tasks.token_schema.TokenOutcome`)."""

    def __init__(self, labels: Sequence[str]) -> None:
        """A reader for a model of tags ``labels`` (``O``, ``B-PER``, ...): its entity types are the label set."""
        self.types = frozenset(tag.type for tag in label_scheme(list(labels)).tags if not tag.outside)

    def __call__(self, row: Any, outcome: Any) -> Reading:
        """The reading of one served row: one observation per explained entity."""
        if outcome.error is not None:
            return Reading(False)
        if outcome.method is None:
            return Reading(True)
        method = metric_method(outcome.method)
        words = self._words(getattr(row, "text", None), outcome)
        observations = []
        for entity in outcome.entities:
            if entity.scores is None:
                continue
            label = bounded(entity.label, self.types)
            if outcome.granularity != "token" and outcome.context is not None:
                units = [
                    ScoredUnit(word_key(unit.text), float(score), unit.special)
                    for unit, score in zip(outcome.context, entity.scores, strict=False)
                ]
                drift = outcome.granularity == "word"
            elif words is not None:
                summed = unit_scores([float(s) for s in entity.scores], words[0]).tolist()
                units = [ScoredUnit(key, score, flag) for (key, flag), score in zip(words[1], summed, strict=True)]
                drift = True
            else:
                special = outcome.special_tokens or [False] * len(entity.scores)
                units = _token_units(entity.scores, special)
                drift = False
            observations.append(Observation(method, label, row_shares(units), drift))
        return Reading(True, tuple(observations))

    @staticmethod
    def _words(text: str | None, outcome: Any) -> tuple[list[Any], list[tuple[str, bool]]] | None:
        """The row's words from its tokens' offsets (specials apart), or ``None`` without the text."""
        if text is None or outcome.offsets is None or outcome.granularity != "token":
            return None
        special = outcome.special_tokens or [False] * len(outcome.offsets)
        offsets = [
            None if flag or end <= start else (int(start), int(end))
            for (start, end), flag in zip(outcome.offsets, special, strict=True)
        ]
        units = token_units(text, offsets, "word", pieces=outcome.tokens)
        return units, [(word_key(unit.text), unit.start is None) for unit in units]


class GenerationReader:
    """Reads a generation model's outcomes (:class:`serving_core.tasks.generation_schema.GenerationOutcome`)."""

    def __call__(self, row: Any, outcome: Any) -> Reading:
        """The reading of one served row: the prompt's shares, averaged over its explained steps or spans."""
        if outcome.error is not None:
            return Reading(False)
        if outcome.method is None:
            return Reading(True)
        lists: list[list[float]] = [step.scores for step in outcome.steps if step.explained and step.scores]
        if outcome.sum_scores:
            lists.append(outcome.sum_scores)
        lists += [span.scores for span in (outcome.sentences or []) if getattr(span, "scores", None)]
        if outcome.span is not None and getattr(outcome.span, "scores", None):
            lists.append(outcome.span.scores)
        if not lists:
            return Reading(True)
        word_context = outcome.granularity == "word" and outcome.context is not None
        rows = []
        for scores in lists:
            if outcome.context is not None:
                units = [
                    ScoredUnit(word_key(unit.text) if word_context else index, float(score), unit.template)
                    for index, (unit, score) in enumerate(zip(outcome.context, scores, strict=False))
                    if not unit.generated
                ]
            else:
                special = outcome.prompt_special or []
                units = [
                    ScoredUnit(index, float(score), bool(special[index]) if index < len(special) else False)
                    for index, score in enumerate(scores[: len(outcome.prompt_tokens)])
                ]
            rows.append(row_shares(units))
        return Reading(True, (Observation(metric_method(outcome.method), ALL, average_shares(rows), word_context),))
