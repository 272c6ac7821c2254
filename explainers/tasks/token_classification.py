"""Token classifiers (NER, PII detection, tagging): every entity of a batch explained, with one forward.

:func:`explain_tokens` groups each row's predicted tags into spans by the tagging scheme of the model's labels
(:mod:`explainers.tasks.tagging`), or takes the spans the caller gives, and explains each span for the summed logit
of its tags over its tokens through :func:`explainers.tasks.targets.explain_targets`: one forward for the batch, the
spans derived from that forward's predictions, and for the gradient methods the vector-Jacobian products of all spans
batched. :func:`predict_tokens` gives the same spans and scores without an attribution (a forward only).

>>> batch = tokenizer(texts, return_tensors="pt", padding=True, return_special_tokens_mask=True)
>>> result = explain_tokens(model, batch, method="attnlrp")
>>> result.spans[0]        # [(1, 3, 3), (6, 7, 5)]: tokens 1-2 tagged B-PER I-PER, token 6 B-LOC
>>> result.scores[0, 0]    # the first entity's attribution over row 0's tokens

Special tokens: pass the tokenizer's ``special_tokens_mask`` in ``inputs`` (``return_special_tokens_mask=True``);
those tokens are never part of a predicted span (a head trained with ignored labels there predicts noise). The key
is read here and not passed to the model. Without it every real token may be part of a span.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..architectures.description import describe, model_config
from ..capture import forward_pass, prepared_model
from ..deadline import Deadline
from ..defaults import DEFAULT_METHOD
from ..errors import InvalidInputError, InvalidTargetError, UnsupportedModelError
from ..inputs import validate_inputs
from .tagging import LabelScheme, Span, group_spans, label_scheme, span_tags
from .targets import Targets, explain_targets

if TYPE_CHECKING:
    from ..methods.registry import OptionValue

#: Input keys read here and not passed to the model.
SPECIAL_TOKENS_KEY = "special_tokens_mask"
_READ_HERE = frozenset({SPECIAL_TOKENS_KEY, "offset_mapping"})


@dataclass(frozen=True)
class TokenPrediction:
    """A token classifier's spans for a batch, without attribution (:func:`predict_tokens`).

    Attributes:
        spans: per row, its spans ``(start, end, label)``: token positions (``end`` exclusive) and the index of the
            label at the span's first token (``B-PER``); the form ``positions=`` takes.
        span_scores: per row, each span's score: the mean over its tokens of the probability of each token's tag.
        logits: ``(batch, seq_len, num_labels)`` of the forward.
        labels: the label names in index order (``id2label``).
        scheme: the tagging scheme read from them: ``BIO``, ``BIOES``, ``IO`` or ``none`` (each token its own span).
        entities: whether the spans are grouped entities (``False``: one span per token, or the caller's spans).
        attention_mask: ``(batch, seq_len)`` 1 for the real tokens.
    """

    spans: list[list[Span]]
    span_scores: list[list[float]]
    logits: Tensor
    labels: tuple[str, ...]
    scheme: str
    entities: bool
    attention_mask: Tensor

    @property
    def probabilities(self) -> Tensor:
        """``(batch, seq_len, num_labels)`` softmax over the labels at each token."""
        return self.logits.softmax(dim=-1)

    def entity_type(self, span: Span) -> str:
        """The entity type of a span (``PER`` for a span whose label is ``B-PER``; the label itself without a
        scheme)."""
        tag = label_scheme(self.labels).tags[span[2]]
        return tag.type or tag.name


@dataclass(frozen=True)
class TokenExplanation(TokenPrediction):
    """The result of :func:`explain_tokens`.

    Attributes:
        method: the registry name of the method.
        options: the options used, defaults filled in.
        scores: ``(batch, max spans, seq_len)``: row ``b``'s ``k``-th span's attribution over the tokens, exactly 0
            at padding and for ``k`` past the row's last span.
        values: ``(batch, max spans)`` each span's objective (its tags' summed logit), 0 past a row's last span.
        seconds: wall time of the stages (``forward``, ``backward``, ``attribution``).
    """

    method: str
    options: Mapping[str, OptionValue]
    scores: Tensor
    values: Tensor
    seconds: Mapping[str, float]


def _split_inputs(inputs: Mapping[str, Any]) -> tuple[dict[str, Any], Tensor | None]:
    if not isinstance(inputs, Mapping):
        raise InvalidInputError(f"inputs must be a mapping such as a tokenizer's output, got {type(inputs).__name__}")
    special = inputs.get(SPECIAL_TOKENS_KEY)
    if special is not None and not isinstance(special, Tensor):
        raise InvalidInputError(f"inputs[{SPECIAL_TOKENS_KEY!r}] must be a torch.Tensor, got {type(special).__name__}")
    return {key: value for key, value in inputs.items() if key not in _READ_HERE}, special


def _token_classifier(model: nn.Module) -> tuple[Any, LabelScheme]:
    arch = describe(model)
    if arch.task != "token_classification":
        raise UnsupportedModelError(
            f"{type(model).__name__} is not a token classifier: explain_tokens takes a *ForTokenClassification model "
            "(explain sequence classifiers with explainers.explain)"
        )
    config = model_config(model)
    try:
        scheme = label_scheme(config.id2label)
    except ValueError as error:
        raise UnsupportedModelError(f"the model's id2label cannot be read: {error}") from None
    if len(scheme.tags) != int(config.num_labels):
        raise UnsupportedModelError(f"id2label has {len(scheme.tags)} labels, the head has {config.num_labels}")
    return arch, scheme


def _eligible(mask: Tensor, special: Tensor | None) -> Tensor:
    if special is None:
        return mask.bool()
    if special.shape != mask.shape:
        raise InvalidInputError(
            f"{SPECIAL_TOKENS_KEY} must have the shape of input_ids {tuple(mask.shape)}, got {tuple(special.shape)}"
        )
    return mask.bool() & (special.to(mask.device) == 0)


def _given_spans(positions: Any, scheme: LabelScheme, mask: Tensor) -> list[list[Span]]:
    """Validate ``positions=``: per row a list of ``(start, end, label)`` on real tokens."""
    batch = mask.shape[0]
    if not isinstance(positions, Sequence) or isinstance(positions, str) or len(positions) != batch:
        raise InvalidTargetError(f"positions must hold one list of (start, end, label) per row ({batch} rows)")
    lengths = mask.sum(dim=1).tolist()
    spans: list[list[Span]] = []
    for row, row_spans in enumerate(positions):
        if not isinstance(row_spans, Sequence) or isinstance(row_spans, str):
            raise InvalidTargetError(f"positions[{row}] must be a list of (start, end, label)")
        checked: list[Span] = []
        for item in row_spans:
            if (
                not isinstance(item, Sequence)
                or len(item) != 3
                or not all(isinstance(value, int) and not isinstance(value, bool) for value in item)
            ):
                raise InvalidTargetError(f"positions[{row}] holds {item!r}: each span is (start, end, label) of ints")
            start, end, label = (int(value) for value in item)
            real = mask[row].bool()
            if not 0 <= start < end <= mask.shape[1] or not bool(real[start:end].all()):
                raise InvalidTargetError(
                    f"span ({start}, {end}) of row {row} must be a non-empty range of its {int(lengths[row])} real "
                    "tokens (token positions, end exclusive)"
                )
            if not 0 <= label < len(scheme.tags):
                raise InvalidTargetError(f"span label {label} of row {row} must be in [0, {len(scheme.tags) - 1}]")
            checked.append((start, end, label))
        spans.append(checked)
    return spans


def _predicted_spans(predicted: Tensor, scheme: LabelScheme, eligible: Tensor, entities: bool) -> list[list[Span]]:
    rows = predicted.tolist()
    flags = eligible.tolist()
    if entities:
        return [group_spans(tags, scheme, row_flags) for tags, row_flags in zip(rows, flags, strict=True)]
    return [
        [
            (position, position + 1, tag)
            for position, (tag, flag) in enumerate(zip(tags, row_flags, strict=True))
            if flag
        ]
        for tags, row_flags in zip(rows, flags, strict=True)
    ]


def span_targets(spans: Sequence[Sequence[Span]], scheme: LabelScheme, mask: Tensor) -> Targets:
    """The :class:`~explainers.tasks.targets.Targets` of the spans: round ``k`` is each row's ``k``-th span, its
    objective the summed logit of its tags (:func:`~explainers.tasks.tagging.span_tags`) over its tokens, read by the
    map methods as the mean of its tokens' rows; every real token is visible (:meth:`Targets.over_spans`, with each
    token's own tag instead of one label for the span)."""
    targets = Targets.over_spans(spans, mask)
    labels = torch.zeros(targets.labels.shape, dtype=torch.long)
    for row, row_spans in enumerate(spans):
        for index, span in enumerate(row_spans):
            labels[index, row, : span[1] - span[0]] = torch.tensor(span_tags(span, scheme))
    return replace(targets, labels=labels.to(targets.labels.device))


def _span_scores(logits: Tensor, spans: Sequence[Sequence[Span]], scheme: LabelScheme) -> list[list[float]]:
    probabilities = logits.detach().float().softmax(dim=-1).cpu()
    scores: list[list[float]] = []
    for row, row_spans in enumerate(spans):
        row_scores = []
        for span in row_spans:
            tags = torch.tensor(span_tags(span, scheme))
            picked = probabilities[row, torch.arange(span[0], span[1]), tags]
            row_scores.append(float(picked.mean()))
        scores.append(row_scores)
    return scores


def _resolve_spans(
    logits: Tensor, positions: Any, scheme: LabelScheme, eligible: Tensor, mask: Tensor, entities: bool
) -> list[list[Span]]:
    if positions is not None:
        return _given_spans(positions, scheme, mask)
    return _predicted_spans(logits.argmax(dim=-1), scheme, eligible, entities)


def predict_tokens(
    model: nn.Module, inputs: Mapping[str, Any], *, positions: Any = None, entities: bool = True
) -> TokenPrediction:
    """A token classifier's spans and their scores for a batch (one forward, no attribution).

    Args:
        model: a ``*ForTokenClassification`` model of the support registry; left exactly as it was found.
        inputs: a tokenizer's right-padded batch, optionally with ``special_tokens_mask``.
        positions: per row a list of ``(start, end, label)`` to score instead of the predicted spans.
        entities: group the predicted tags into entities by the label scheme (``O`` skipped); ``False``: one span
            per token (special tokens excepted), for its predicted label, ``O`` included.

    Raises:
        ExplainError: for a model that is not a token classifier, bad inputs or bad ``positions``.
    """
    arch, scheme = _token_classifier(model)
    model_inputs, special = _split_inputs(inputs)
    validated = validate_inputs(arch, model, model_inputs)
    mask = validated["attention_mask"]
    eligible = _eligible(mask, special)
    if positions is not None:
        _given_spans(positions, scheme, mask)  # refuse bad spans before the forward
    with prepared_model(model):
        logits = forward_pass(model, arch, validated, frozenset()).logits.detach()
    spans = _resolve_spans(logits, positions, scheme, eligible, mask, entities)
    return TokenPrediction(
        spans=spans,
        span_scores=_span_scores(logits, spans, scheme),
        logits=logits,
        labels=tuple(tag.name for tag in scheme.tags),
        scheme=scheme.name,
        entities=entities and positions is None,
        attention_mask=mask,
    )


def explain_tokens(
    model: nn.Module,
    inputs: Mapping[str, Any],
    *,
    method: str = DEFAULT_METHOD,
    positions: Any = None,
    entities: bool = True,
    deadline: Deadline | float | None = None,
    **options: Any,
) -> TokenExplanation:
    """Explain every entity (or given span) of a batch of a token classifier, with one forward.

    Args:
        model: a ``*ForTokenClassification`` model of an encoder family (bert, roberta, xlm-roberta, distilbert,
            electra, albert, deberta-v2, modernbert); used in eval mode with the capture attention for the call and
            left exactly as it was found.
        inputs: a tokenizer's right-padded batch (``input_ids``, ``attention_mask``, optional ``token_type_ids``),
            optionally with ``special_tokens_mask`` (those tokens are never in a predicted span).
        method: one of :func:`explainers.available_methods` that the family accepts for token classifiers; default
            :data:`~explainers.DEFAULT_METHOD` (``attnlrp``).
        positions: ``None`` (explain the predicted spans) or per row a list of ``(start, end, label)``: token
            positions, ``end`` exclusive, ``label`` an index of ``id2label`` (the form of the result's ``spans``).
        entities: with predicted spans, group the tags into entities by the scheme of ``id2label`` (``O`` skipped;
            a label set that follows no scheme is read token by token); ``False``: explain every token (special
            tokens excepted) for its predicted label, ``O`` included.
        deadline: abandon the work once this :class:`~explainers.deadline.Deadline` (or this many seconds from now)
            has passed: checked before the forward and between chunks of the entities' explanation.
        **options: the method's options, as :func:`explainers.explain` takes them.

    Returns:
        A :class:`TokenExplanation`: ``spans``, ``span_scores`` and ``scores (batch, max spans, seq_len)``.

    Raises:
        ExplainError: for a model that is not a token classifier, an unknown or refused method, a bad option, bad
            inputs or bad ``positions``; :class:`~explainers.deadline.DeadlineExceededError` once ``deadline`` has
            passed.
    """
    arch, scheme = _token_classifier(model)
    model_inputs, special = _split_inputs(inputs)
    mask = validate_inputs(arch, model, model_inputs)["attention_mask"]
    eligible = _eligible(mask, special)
    if positions is not None:
        _given_spans(positions, scheme, mask)  # refuse bad spans before the forward
    resolved: list[list[Span]] = []

    def resolve(logits: Tensor) -> Targets:
        resolved[:] = _resolve_spans(logits, positions, scheme, eligible, mask, entities)
        return span_targets(resolved, scheme, mask)

    explained = explain_targets(model, model_inputs, resolve, method=method, deadline=Deadline.of(deadline), **options)
    scores = explained.scores.transpose(0, 1)  # (B, K, n)
    values = explained.values.transpose(0, 1)
    return TokenExplanation(
        spans=resolved,
        span_scores=_span_scores(explained.logits, resolved, scheme),
        logits=explained.logits,
        labels=tuple(tag.name for tag in scheme.tags),
        scheme=scheme.name,
        entities=entities and positions is None,
        attention_mask=mask,
        method=explained.method,
        options=explained.options,
        scores=scores,
        values=values,
        seconds=explained.seconds,
    )
