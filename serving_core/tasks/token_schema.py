"""Response schema of token classifiers (task ``token_classification``): the entities of one row and how they are
written in JSON and in protobuf (``ExplainResponse.token_classification``).

A token classifier's request is a classifier's (:mod:`serving_core.tasks.classify_schema`: ``{"text": ...,
"explain": ...}``, or an ``ExplainRequest`` with ``text``); its answer is the entities found, each with its character
offsets and, when explained, its attribution over the row's tokens (docs/SERVING.md, "Token classification").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import wire
from ..errors import RowError
from ..wire import Encoding, rounded, rounded_list
from .in_memory import InMemory
from .text_units import TextUnit


@dataclass(frozen=True)
class EntityOutcome:
    """One entity of a row's answer.

    Attributes:
        text: ``text[start:end]``.
        label: the entity type (``PER`` for a span tagged ``B-PER I-PER``; the tag itself without a scheme).
        tag: the label of the span's first token, as ``id2label`` spells it.
        label_id: that label's index.
        start, end: character offsets into the text (``end`` exclusive).
        token_start, token_end: token positions (``end`` exclusive).
        score: the mean over its tokens of the probability of each token's tag.
        scores: its attribution over the row's tokens (``None`` when no explanation was asked), or over the row's
            units (:attr:`TokenOutcome.context`).
        token_scores: answered in sentences: the scores over the row's tokens they were summed from (in memory only,
            for the monitor's words; never answered).
    """

    text: str
    label: str
    tag: str
    label_id: int
    start: int
    end: int
    token_start: int
    token_end: int
    score: float
    scores: list[float] | None = None
    token_scores: InMemory[list[float]] | None = field(default=None, compare=False)


@dataclass
class TokenOutcome:
    """A token classifier's outcome for one row (or its error), ready to encode.

    Attributes:
        encoding: how the row came in (and is answered).
        error: the row's error, if it could not be served.
        tokens: the row's tokens as the tokenizer spells them.
        special_tokens: which tokens are special tokens.
        offsets: each token's character offsets into the text (``(0, 0)`` for special tokens).
        truncated: whether the text was cut at ``max_length`` tokens.
        scheme: the label scheme (``BIO``, ``BIOES``, ... or ``plain``).
        entities: the entities found, in text order.
        method: the method that explained the entities (``None``: not explained).
        options: the method's options as used.
        attribution_seconds: seconds of the rows' attribution after the shared passes.
        granularity: ``token``, ``word`` or ``sentence``: what each entity's ``scores`` are over.
        context: with ``word`` or ``sentence``: the units (each entity's ``scores`` has one score per unit).
    """

    encoding: Encoding
    error: RowError | None = None
    tokens: list[str] | None = None
    special_tokens: list[bool] | None = None
    offsets: list[tuple[int, int]] | None = None
    truncated: bool = False
    scheme: str = ""
    entities: list[EntityOutcome] = field(default_factory=list)
    method: str | None = None
    options: Mapping[str, int | float] = field(default_factory=dict)
    attribution_seconds: float = 0.0
    granularity: str = "token"
    context: list[TextUnit] | None = None


def token_outcome_to_dict(outcome: TokenOutcome) -> dict[str, Any]:
    """The JSON document of one token classifier's row (docs/SERVING.md, "Token classification")."""
    if outcome.error is not None:
        return wire.error_document(outcome.error)
    entities = []
    for entity in outcome.entities:
        document: dict[str, Any] = {
            "text": entity.text,
            "label": entity.label,
            "tag": entity.tag,
            "label_id": entity.label_id,
            "start": entity.start,
            "end": entity.end,
            "token_start": entity.token_start,
            "token_end": entity.token_end,
            "score": rounded(entity.score),
        }
        if entity.scores is not None:
            document["scores"] = rounded_list(entity.scores)
        entities.append(document)
    answer: dict[str, Any] = {
        "head_type": "token_classification",
        "scheme": outcome.scheme,
        "entities": entities,
        "tokens": outcome.tokens,
        "special_tokens": outcome.special_tokens,
        "offsets": [list(offset) for offset in outcome.offsets or []],
        "truncated": outcome.truncated,
    }
    if outcome.method is not None:
        answer["explanation"] = {
            "method": outcome.method,
            "options": dict(outcome.options),
            "seconds": round(outcome.attribution_seconds, 6),
        }
        if outcome.context is not None:
            answer["explanation"]["granularity"] = outcome.granularity
            answer["explanation"]["context"] = [unit.to_dict(False) for unit in outcome.context]
    return answer


def encode_token_outcome(outcome: TokenOutcome, labels: tuple[str, ...] = ()) -> bytes:
    """Encode one token classifier's row in the encoding its request came in (JSON, or an ``ExplainResponse`` whose
    ``token_classification`` holds the entities); ``labels`` is unused (the entities carry their labels)."""
    return wire.encode(outcome, token_outcome_to_dict, fill_token_response)


def fill_token_response(outcome: TokenOutcome, response: Any) -> None:
    """Fill an ``ExplainResponse`` with a served token classifier row's answer."""
    response.head_type = "token_classification"
    response.truncated = outcome.truncated
    answer = response.token_classification
    answer.scheme = outcome.scheme
    answer.tokens.extend(outcome.tokens or [])
    answer.special_tokens.extend(outcome.special_tokens or [])
    for start, end in outcome.offsets or []:
        answer.offsets.add(start=start, end=end)
    for entity in outcome.entities:
        answer.entities.add(
            text=entity.text,
            label=entity.label,
            tag=entity.tag,
            label_id=entity.label_id,
            start=entity.start,
            end=entity.end,
            token_start=entity.token_start,
            token_end=entity.token_end,
            score=entity.score,
            scores=entity.scores or [],
        )
    if outcome.method is not None:
        answer.method = outcome.method
        wire.fill_proto_options(answer, outcome.options)
        answer.seconds = outcome.attribution_seconds
        if outcome.context is not None:
            answer.granularity = outcome.granularity
            for unit in outcome.context:
                unit.fill(answer.context.add())
