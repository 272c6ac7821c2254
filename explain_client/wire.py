"""The wire form of one call: a :class:`Request` (one input and what to ask about it) as the JSON document REST
posts (docs/SERVING.md) or the protobuf ``ExplainRequest`` gRPC sends (proto/explain.proto), and an
``ExplainResponse`` read back as a :class:`~explain_client.results.Prediction` (its row error raised as the same
:class:`~explain_client.results.ServiceError` a REST caller gets). Generation calls have theirs in
:mod:`explain_client.generation`.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .protos import read_options, write_options
from .results import ContextUnit, Entity, Explanation, Prediction, ServiceError, Skipped, TokenClassification

Target = str | int | None
#: A plain input of :meth:`~explain_client.client.ExplainClient.explain_many`: a text, a ``(text, text_pair)``
#: sentence pair, or image bytes.
PlainInput = str | bytes | tuple[str, str]
#: ``method=SERVICE_DEFAULT``: explain with the model's own default method (its ``default_method``, ``attnlrp`` for
#: the default models), chosen by the service; the answer's ``explanation.method`` says which it was.
SERVICE_DEFAULT = ""


@dataclass(frozen=True)
class Request:
    """One input and what to ask about it.

    Attributes:
        text: the text, for a text model.
        image: PNG or JPEG bytes, for an image model.
        text_pair: the second text of a sentence pair (NLI, question/passage, …), for a text model that takes
            pairs; ``None`` = a single text.
        method: the attribution method; :data:`SERVICE_DEFAULT` (``""``) = the model's default method, chosen by
            the service; ``None`` asks for the prediction only.
        target: the class to explain (label name or index); ``None`` = the predicted class.
        options: method options (``start_layer``, ``layer``, ``n_steps``, …).
        below: explain only when the prediction's confidence is below this probability in (0, 1] (the answer's
            ``explained`` and ``skipped`` say what happened); ``None`` = the model's ``explain_below`` setting
            (none: always).
        always: explain whatever the confidence, overriding the model's ``explain_below``.
        granularity: ``word`` or ``sentence``: the explanation in the text's words or sentences (each unit scored by
            the sum of its tokens' scores); ``None``: tokens.
    """

    text: str | None = None
    image: bytes | None = None
    method: str | None = None
    target: Target = None
    options: Mapping[str, int | float] = field(default_factory=dict)
    text_pair: str | None = None
    below: float | None = None
    always: bool = False
    granularity: str | None = None

    def __post_init__(self) -> None:
        """Exactly one input; a pair only with a text; ``below`` a probability, not with ``always``."""
        if (self.text is None) == (self.image is None):
            raise ValueError("give exactly one of text= or image=")
        if self.text_pair is not None and self.text is None:
            raise ValueError("text_pair= goes with text= (the second text of a sentence pair)")
        if self.below is not None and (isinstance(self.below, bool) or not 0 < self.below <= 1):
            raise ValueError(f"below= must be a probability in (0, 1], got {self.below!r}")
        if self.below is not None and self.always:
            raise ValueError("give below= (explain only when unsure) or always=True, not both")

    def to_json(self) -> dict[str, Any]:
        """The REST/JSON request document."""
        document: dict[str, Any] = {}
        if self.text is not None:
            document["text"] = self.text
            if self.text_pair is not None:
                document["text_pair"] = self.text_pair
        else:
            document["image"] = base64.b64encode(self.image or b"").decode("ascii")
        if self.method is None:
            document["explain"] = False
        else:
            explain: dict[str, Any] = {"method": self.method} if self.method else {}
            explain.update(self.options)
            if self.target is not None:
                explain["target"] = self.target
            if self.always:
                explain["below"] = None
            elif self.below is not None:
                explain["below"] = self.below
            if self.granularity is not None:
                explain["granularity"] = self.granularity
            document["explain"] = explain
        return document

    def fill_message(self, message: Any) -> Any:
        """Fill an empty ``ExplainRequest`` (proto/explain.proto) with this request and return it: the message
        :meth:`to_json`'s document is on REST."""
        if self.text is not None:
            message.text = self.text
            if self.text_pair is not None:
                message.text_pair = self.text_pair
        else:
            message.image = self.image or b""
        if self.method is not None:
            message.explain.SetInParent()  # present, even empty: explain (with the model's default method)
            message.explain.method = self.method
            if self.always:
                message.explain.always = True
            elif self.below is not None:
                message.explain.below = self.below
            if isinstance(self.target, str):
                message.explain.target_label = self.target
            elif self.target is not None:
                message.explain.target_id = int(self.target)
            write_options(message.explain, self.options)
            if self.granularity is not None:
                message.explain.granularity = self.granularity
        return message


def _float32(value: float) -> float:
    """A float32 from the wire with float32's precision (0.9, not 0.8999999761581421)."""
    return float(f"{value:.7g}")


def _token_classification(proto: Any) -> TokenClassification:
    """An ``ExplainResponse.token_classification`` → :class:`TokenClassification`."""
    explained = bool(proto.method)
    return TokenClassification(
        scheme=proto.scheme or "none",
        entities=tuple(
            Entity(
                text=entity.text,
                label=entity.label,
                tag=entity.tag or entity.label,
                label_id=int(entity.label_id),
                start=int(entity.start),
                end=int(entity.end),
                token_start=int(entity.token_start),
                token_end=int(entity.token_end),
                # float32 on the wire: shown with float32's precision (0.9, not 0.8999999761581421)
                score=_float32(entity.score),
                scores=tuple(_float32(value) for value in entity.scores) if explained else None,
            )
            for entity in proto.entities
        ),
        tokens=tuple(proto.tokens),
        special_tokens=tuple(bool(flag) for flag in proto.special_tokens),
        offsets=tuple((int(offset.start), int(offset.end)) for offset in proto.offsets),
        method=proto.method or None,
        options=read_options(proto),
        seconds=float(proto.seconds),
        granularity=proto.granularity or "token",
        context=tuple(ContextUnit.from_protobuf(unit) for unit in proto.context) if proto.granularity else None,
    )


def prediction_from_protobuf(response: Any) -> Prediction:
    """An ``ExplainResponse`` → :class:`~explain_client.results.Prediction`.

    Raises:
        ServiceError: the row's error, when the response carries one.
    """
    if response.HasField("error"):
        error = response.error
        raise ServiceError(error.code, error.message, int(error.http_status) or None, error.grpc_code or None,
                           request_id=response.request_id or None)  # fmt: skip
    if response.HasField("token_classification"):
        return Prediction(
            label=None,
            label_id=None,
            probabilities={},
            truncated=bool(response.truncated),
            head_type="token_classification",
            token_classification=_token_classification(response.token_classification),
            request_id=response.request_id or None,
        )
    explanation: Explanation | None = None
    if response.HasField("explanation"):
        proto = response.explanation
        grid = tuple(int(value) for value in proto.grid)
        explanation = Explanation(
            method=proto.method,
            target=int(proto.target),
            target_label=proto.target_label,
            options=read_options(proto),
            scores=tuple(float(value) for value in proto.scores),
            tokens=None if grid else tuple(proto.tokens),
            special_tokens=None if grid else tuple(bool(flag) for flag in proto.special_tokens),
            grid=(grid[0], grid[1]) if grid else None,
            seconds=float(proto.seconds),
            pooled=proto.pooled or "first",
            segments=tuple(int(value) for value in proto.segments) if proto.segments and not grid else None,
            granularity=proto.granularity or "token",
            context=tuple(ContextUnit.from_protobuf(unit) for unit in proto.context) if proto.granularity else None,
        )
    head_type = response.head_type or "single_label"
    regression = head_type == "regression"
    # A protobuf map has no order (REST keeps the class order); compare probabilities as a mapping.
    return Prediction(
        label=None if regression else response.label,
        label_id=None if regression else int(response.label_id),
        probabilities={str(key): float(value) for key, value in response.probabilities.items()},
        truncated=bool(response.truncated),
        explanation=explanation,
        head_type=head_type,
        labels=tuple(response.labels),
        # float32 on the wire: shown with float32's precision (0.3, not 0.30000001192092896)
        threshold=_float32(response.threshold) if head_type == "multi_label" else None,
        value=float(response.value) if response.HasField("value") else None,
        explained=bool(response.explained) if response.HasField("explained") else None,
        below=_float32(response.below) if response.HasField("below") else None,
        confidence=_float32(response.confidence) if response.HasField("confidence") else None,
        skipped=Skipped(response.skipped.reason, response.skipped.method, response.skipped.message)
        if response.HasField("skipped")
        else None,
        request_id=response.request_id or None,
    )
