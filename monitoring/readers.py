"""What the monitor reads of one served row, per task: whether it was predicted, and each explanation it carries as
shares (:mod:`monitoring.shares`) keyed by method and a bounded label.

- ``text`` classifiers: the row's words (the ``word`` granularity of :mod:`serving_core.tasks.text_units`, special
  tokens apart), whatever granularity the row asked for: a row answered in tokens is tokenized again with character
  offsets, exactly as the service groups words, by the reader's own tokenizer (a copy: a fast tokenizer must not be
  called from two threads). A row answered in sentences is read the same way from the scores over its tokens that
  its outcome keeps in memory (:mod:`serving_core.tasks.in_memory`: a sentence's score cannot be split into words;
  an outcome without them, pickled from another process, joins the health numbers only). Label: the predicted class.
- ``image`` classifiers: the patches, keyed by position (``(row, column)`` of the grid). Label: the predicted class.
- ``token_classification``: one explanation per explained entity, over the row's words (rows answered in tokens or
  in sentences: grouped from the row's tokens' offsets); label: the entity type (``PER`` for ``B-PER``).
- ``generation``: the prompt's words (template and special tokens apart), the mean share over the row's explained
  steps (or its summed span, or its sentences); label :data:`ALL`. A row answered in tokens is grouped into the
  words the service gives in ``word`` granularity from its context's offsets (:func:`prompt_words`); a row answered
  in sentences, from the scores over its tokens and the rendered prompt its outcome keeps in memory
  (:func:`rendered_words`).

Label values come only from the model's label set (a value outside it is :data:`OTHER`), method values only from the
registry (:func:`serving_core.metrics.metric_method`), never from request text.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from explainers import Segment, Unit, label_scheme, token_units, unit_scores
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
        token_scores = _in_memory(getattr(outcome, "token_scores", None))
        if outcome.granularity != "token" and outcome.context is not None and token_scores is None:
            units = [
                ScoredUnit(_pair_key(unit.text, unit.segment), float(score), unit.special)
                for unit, score in zip(outcome.context, outcome.scores, strict=False)
            ]
            return units, outcome.granularity == "word"
        scores = outcome.scores if token_scores is None else token_scores  # sentences: the tokens they summed
        special = outcome.special_tokens or [False] * len(scores)
        text = getattr(row, "text", None)
        if self.tokenizer is None or text is None:
            return _token_units(scores, special), False
        words, described = self._words(text, getattr(row, "text_pair", None), outcome.tokens or [])
        if not words or words[-1].stop != len(scores):
            return _token_units(scores, special), False
        summed = unit_scores([float(s) for s in scores], words).tolist()
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
            token_scores = _in_memory(getattr(entity, "token_scores", None))  # sentences: the tokens they summed
            in_tokens = outcome.granularity == "token" or token_scores is not None
            scores = entity.scores if token_scores is None else token_scores
            if not in_tokens and outcome.context is not None:
                units = [
                    ScoredUnit(word_key(unit.text), float(score), unit.special)
                    for unit, score in zip(outcome.context, scores, strict=False)
                ]
                drift = outcome.granularity == "word"
            elif in_tokens and words is not None and words[0] and words[0][-1].stop == len(scores):
                summed = unit_scores([float(s) for s in scores], words[0]).tolist()
                units = [ScoredUnit(key, score, flag) for (key, flag), score in zip(words[1], summed, strict=True)]
                drift = True
            else:
                special = outcome.special_tokens or [False] * len(scores)
                units = _token_units(scores, special)
                drift = False
            observations.append(Observation(method, label, row_shares(units), drift))
        return Reading(True, tuple(observations))

    @staticmethod
    def _words(text: str | None, outcome: Any) -> tuple[list[Any], list[tuple[str, bool]]] | None:
        """The row's words from its tokens' offsets (specials apart), or ``None`` without the text (or a row answered
        in words)."""
        if text is None or outcome.offsets is None or outcome.granularity == "word":
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
        """The reading of one served row: the prompt's shares, averaged over its explained steps or spans (a row in
        sentences: over the token scores its outcome keeps, grouped into words)."""
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
        attribution = _in_memory(getattr(outcome, "token_scores", None))
        words: PromptWords | None = None
        if attribution is not None and attribution.scores:  # sentences: the tokens they were summed from, in words
            words = rendered_words(attribution)
            lists = [scores.tolist() for scores in attribution.scores]
        elif outcome.context is not None:
            words = prompt_words(outcome.context, outcome.granularity)
        rows = [row_shares(self._units(outcome, scores, words)) for scores in lists]
        method = metric_method(outcome.method)
        return Reading(True, (Observation(method, ALL, average_shares(rows), words is not None),))

    @staticmethod
    def _units(outcome: Any, scores: Sequence[float], words: PromptWords | None) -> list[ScoredUnit]:
        """One explanation's prompt units: its words where known, else the context's units or the prompt's tokens,
        keyed by position (health only)."""
        if words is not None:
            return [ScoredUnit(key, score, special)
                    for (key, special), score in zip(words.described, words.scores(scores), strict=False)]  # fmt: skip
        if outcome.context is not None:
            return [
                ScoredUnit(index, float(score), unit.template)
                for index, (unit, score) in enumerate(zip(outcome.context, scores, strict=False))
                if not unit.generated
            ]
        special = outcome.prompt_special or []
        return [
            ScoredUnit(index, float(score), bool(special[index]) if index < len(special) else False)
            for index, score in enumerate(scores[: len(outcome.prompt_tokens)])
        ]


@dataclass(frozen=True)
class PromptWords:
    """The words of a generation row's prompt.

    Attributes:
        described: per word, its key (:func:`~monitoring.shares.word_key`) and whether it is kept apart (a template
            token, a token without characters).
        units: a context in tokens: the words as units over the prompt's tokens (``None``: the context is in words).
    """

    described: tuple[tuple[str, bool], ...]
    units: tuple[Unit, ...] | None = None

    def scores(self, scores: Sequence[float]) -> list[float]:
        """One explanation's scores over the context units, as the words' scores (a context in tokens: summed over
        each word's tokens)."""
        if self.units is None:
            return [float(score) for score in scores]
        prompt = [float(score) for score in scores[: self.units[-1].stop]] if self.units else []
        return unit_scores(prompt, list(self.units)).tolist() if prompt else []


def prompt_words(context: Sequence[Any], granularity: str) -> PromptWords | None:
    """The words of a generation row's prompt from its context units (``None``: a context in sentences, whose scores
    cannot be split into words — its outcome's kept token scores can: :func:`rendered_words` — or tokens whose
    characters are not known).

    A context in words gives them as they are. A context in tokens gives each prompt token's characters and place in
    the rendered prompt (:func:`serving_core.tasks.generation_context.row_context`): the tokens are grouped into
    words again as the service groups them for ``granularity: word`` — over the rendered prompt's text (characters
    that no token covers read as white space), never across the messages, documents or prompt the tokens are in,
    the template's tokens and the tokens without characters apart.
    """
    prompt = [unit for unit in context if not unit.generated]
    if granularity == "word":
        return PromptWords(tuple((word_key(unit.text), bool(unit.template)) for unit in prompt))
    if granularity != "token" or not prompt:
        return None
    offsets: list[tuple[int, int] | None] = []
    length = max((unit.end for unit in prompt if unit.end is not None), default=0)
    characters = [" "] * length
    for unit in prompt:
        if unit.start is None or unit.end is None:
            offsets.append(None)
            continue
        if unit.end - unit.start != len(unit.text):
            return None  # not a token's own characters: its words are not known
        characters[unit.start : unit.end] = unit.text
        offsets.append((unit.start, unit.end))
    if all(offset is None for offset in offsets):
        return None  # a slow tokenizer's tokens: no characters, no words
    labels = [_segment_label(unit) for unit in prompt]
    units = token_units(
        "".join(characters), offsets, "word", segments=_segments(offsets, labels), pieces=[unit.text for unit in prompt]
    )
    described = tuple((word_key(unit.text), unit.label is None) for unit in units)
    return PromptWords(described, tuple(units))


def rendered_words(attribution: Any) -> PromptWords:
    """The words of a generation row's prompt over its tokens, from the rendered prompt its outcome keeps in memory
    (:class:`serving_core.tasks.generation_context.PromptAttribution`: a row answered in sentences): the units a row
    asking for ``granularity: word`` gets, the template's tokens apart."""
    units = attribution.prompt_units("word")
    return PromptWords(tuple((word_key(unit.text), not isinstance(unit.label, tuple)) for unit in units), tuple(units))


def _in_memory(held: Any) -> Any:
    """The value an outcome keeps in memory for the monitor (:class:`serving_core.tasks.in_memory.InMemory`), or
    ``None``."""
    return None if held is None else held.value


def _segment_label(unit: Any) -> Hashable:
    """A prompt token's segment label as :func:`serving_core.tasks.generation_context.row_context` gave it."""
    if unit.message is not None:
        return ("message", unit.message)
    if unit.document is not None:
        return ("document", unit.document)
    return None if unit.template else ("prompt", 0)


def _segments(offsets: Sequence[tuple[int, int] | None], labels: Sequence[Hashable]) -> list[Segment]:
    """Each run of consecutive tokens with characters of one segment label, as a segment over their characters."""
    segments: list[Segment] = []
    current: list[Any] = []  # [start, end, label]
    for offset, label in zip(offsets, labels, strict=True):
        if offset is None:
            continue
        if current and current[2] == label:
            current[1] = max(current[1], offset[1])
            continue
        if current and current[2] is not None:
            segments.append(Segment(current[0], current[1], current[2]))
        current = [offset[0], offset[1], label]
    if current and current[2] is not None:
        segments.append(Segment(current[0], current[1], current[2]))
    return segments
