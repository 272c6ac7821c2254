"""Generation models (causal LMs) in the client: the request (:class:`GenerationCall`), the answer
(:class:`Generation`, one :class:`GenerationStep` per generated token) and their JSON and protobuf forms, identical
on REST and gRPC (docs/SERVING.md, "Generation models")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .results import ServiceError

Steps = Sequence[int] | str | tuple[str, int, int | None] | None
"""Steps to explain: ``None`` (every step), step indices, ``"sum"``, or ``("sum", start, stop)`` for a span."""


@dataclass(frozen=True)
class GenerationCall:
    """One generation request.

    Attributes:
        prompt: the prompt.
        max_new_tokens: new tokens to write (``None``: the model's default).
        sampling: ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``seed`` (``None``: greedy).
        continuation: explain this continuation (text) instead of generating.
        continuation_ids: or this one, as token ids.
        method: the attribution method (``""``: the model's default method; ``None``: no explanation, only the
            generation and its probabilities).
        steps: which steps to explain (see :data:`Steps`).
        contrast: a foil token (text or id) for every step, or one per step.
        options: method options.
    """

    prompt: str
    max_new_tokens: int | None = None
    sampling: Mapping[str, Any] | None = None
    continuation: str | None = None
    continuation_ids: Sequence[int] | None = None
    method: str | None = None
    steps: Steps = None
    contrast: str | int | Sequence[str | int] | None = None
    options: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The REST/JSON request document."""
        document: dict[str, Any] = {"prompt": self.prompt}
        if self.max_new_tokens is not None:
            document["max_new_tokens"] = self.max_new_tokens
        if self.sampling:
            document["generation"] = dict(self.sampling)
        if self.continuation is not None:
            document["continuation"] = self.continuation
        if self.continuation_ids is not None:
            document["continuation_ids"] = list(self.continuation_ids)
        if self.method is None:
            document["explain"] = False
            return document
        explain: dict[str, Any] = {"method": self.method, **dict(self.options)} if self.method else dict(self.options)
        if isinstance(self.steps, tuple) and self.steps and self.steps[0] == "sum":
            explain["steps"] = {"sum": [self.steps[1], self.steps[2]]}
        elif self.steps is not None:
            explain["steps"] = self.steps if isinstance(self.steps, str) else list(self.steps)
        if self.contrast is not None:
            explain["contrast"] = self.contrast if isinstance(self.contrast, str | int) else list(self.contrast)
        document["explain"] = explain
        return document

    def fill_message(self, message: Any) -> Any:
        """Fill an ``ExplainRequest``'s ``generation`` field (proto/explain.proto) and return the message."""
        request = message.generation
        request.prompt = self.prompt
        request.max_new_tokens = self.max_new_tokens or 0
        if self.sampling:
            sampling = request.sampling
            sampling.do_sample = bool(self.sampling.get("do_sample", False))
            for name in ("temperature", "top_k", "top_p", "seed"):
                if self.sampling.get(name) is not None:
                    setattr(sampling, name, self.sampling[name])
        if self.continuation is not None:
            request.continuation = self.continuation
        if self.continuation_ids is not None:
            request.continuation_ids.extend(int(token) for token in self.continuation_ids)
        if self.method is not None:
            explain = request.explain
            explain.method = self.method
            if isinstance(self.steps, tuple) and self.steps and self.steps[0] == "sum":
                _, start, stop = self.steps
                explain.sum, explain.sum_start = True, int(start or 0)
                if stop is not None:
                    explain.sum_stop = int(stop)
            elif self.steps == "sum":
                explain.sum = True
            elif self.steps is not None and not isinstance(self.steps, str):
                explain.steps.extend(int(step) for step in self.steps if isinstance(step, int))
            foils = [self.contrast] if isinstance(self.contrast, str | int) else list(self.contrast or [])
            if foils and all(isinstance(foil, int) for foil in foils):
                explain.contrast_ids.extend(foil for foil in foils if isinstance(foil, int))
            elif foils:
                explain.contrast.extend(str(foil) for foil in foils)
            for key, value in self.options.items():
                explain.options[key] = int(value)
        return message


@dataclass(frozen=True)
class GenerationStep:
    """One generated token: its piece, id, probability and, when explained, its scores over the context tokens
    (the prompt's tokens, then the tokens generated before it)."""

    token: str
    token_id: int
    probability: float
    scores: tuple[float, ...] | None = None
    value: float | None = None
    foil: str | None = None
    foil_id: int | None = None

    @property
    def explained(self) -> bool:
        """Whether this step carries scores."""
        return self.scores is not None


@dataclass(frozen=True)
class Generation:
    """A generation model's answer: the text, the prompt's tokens, each generated step and what was explained.

    Attributes:
        text: the generated text (special tokens skipped).
        stop_reason: ``eos``, ``length`` (the token budget) or ``given`` (a given continuation).
        prompt_tokens: the prompt's tokens.
        prompt_special_tokens: which of them are special tokens.
        steps: one :class:`GenerationStep` per generated token.
        method: the method of the explanation (``None``: none was asked).
        options: its options.
        summed: ``(start, stop)`` when the summed log-probability of those steps was explained.
        sum_scores: its scores over the context tokens (prompt, then the steps before the span's last).
        sum_value: its value.
        seconds: server-side attribution seconds.
    """

    text: str
    stop_reason: str
    prompt_tokens: tuple[str, ...]
    prompt_special_tokens: tuple[bool, ...]
    steps: tuple[GenerationStep, ...]
    method: str | None = None
    options: Mapping[str, int] = field(default_factory=dict)
    summed: tuple[int, int] | None = None
    sum_scores: tuple[float, ...] | None = None
    sum_value: float | None = None
    seconds: float = 0.0

    def context_tokens(self, step: int) -> list[str]:
        """The tokens step ``step``'s scores are over: the prompt's, then the earlier generated tokens."""
        return [*self.prompt_tokens, *(entry.token for entry in self.steps[:step])]

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> Generation:
        """Parse a JSON response row.

        Raises:
            ServiceError: when the row carries an ``error`` object.
        """
        error = document.get("error")
        if error is not None:
            raise ServiceError(
                str(error.get("code", "internal")), str(error.get("message", "")), error.get("http_status"),
                error.get("grpc_code"),
            )  # fmt: skip
        steps = tuple(
            GenerationStep(
                token=str(step["token"]),
                token_id=int(step["token_id"]),
                probability=float(step["probability"]),
                scores=tuple(float(v) for v in step["scores"]) if "scores" in step else None,
                value=float(step["value"]) if "value" in step else None,
                foil=step.get("foil"),
                foil_id=int(step["foil_id"]) if "foil_id" in step else None,
            )
            for step in document.get("steps", [])
        )
        explanation = document.get("explanation") or {}
        summed = explanation.get("sum")
        return cls(
            text=str(document.get("text", "")),
            stop_reason=str(document.get("stop_reason", "")),
            prompt_tokens=tuple(document.get("prompt_tokens", [])),
            prompt_special_tokens=tuple(bool(flag) for flag in document.get("prompt_special_tokens", [])),
            steps=steps,
            method=explanation.get("method"),
            options={str(k): int(v) for k, v in dict(explanation.get("options", {})).items()},
            summed=(int(summed["start"]), int(summed["stop"])) if summed else None,
            sum_scores=tuple(float(v) for v in summed["scores"]) if summed else None,
            sum_value=float(summed["value"]) if summed else None,
            seconds=float(explanation.get("seconds", 0.0)),
        )

    @classmethod
    def from_protobuf(cls, response: Any) -> Generation:
        """Parse an ``ExplainResponse`` (or raise its row error)."""
        if response.HasField("error"):
            error = response.error
            raise ServiceError(error.code, error.message, int(error.http_status) or None, error.grpc_code or None)
        result = response.generation
        steps = tuple(
            GenerationStep(
                token=step.token,
                token_id=int(step.token_id),
                probability=float(step.probability),
                scores=tuple(float(v) for v in step.scores) if step.explained else None,
                value=float(step.value) if step.explained else None,
                foil=step.foil or None,
                foil_id=int(step.foil_id) if step.foil else None,
            )
            for step in result.steps
        )
        return cls(
            text=result.text,
            stop_reason=result.stop_reason,
            prompt_tokens=tuple(result.prompt_tokens),
            prompt_special_tokens=tuple(bool(flag) for flag in result.prompt_special_tokens),
            steps=steps,
            method=result.method or None,
            options={str(k): int(v) for k, v in result.options.items()},
            summed=(int(result.sum_start), int(result.sum_stop)) if result.summed else None,
            sum_scores=tuple(float(v) for v in result.sum_scores) if result.summed else None,
            sum_value=float(result.sum_value) if result.summed else None,
            seconds=float(result.seconds),
        )

    def to_dict(self) -> dict[str, Any]:
        """The answer as a JSON-ready dict (the REST response format)."""
        steps = []
        for step in self.steps:
            entry: dict[str, Any] = {"token": step.token, "token_id": step.token_id, "probability": step.probability}
            if step.scores is not None:
                entry["scores"] = list(step.scores)
                entry["value"] = step.value
            if step.foil_id is not None:
                entry["foil"], entry["foil_id"] = step.foil, step.foil_id
            steps.append(entry)
        document: dict[str, Any] = {
            "task": "generation", "text": self.text, "stop_reason": self.stop_reason,
            "prompt_tokens": list(self.prompt_tokens), "prompt_special_tokens": list(self.prompt_special_tokens),
            "steps": steps,
        }  # fmt: skip
        if self.method is not None:
            explanation: dict[str, Any] = {"method": self.method, "options": dict(self.options)}
            if self.summed is not None:
                explanation["sum"] = {
                    "start": self.summed[0], "stop": self.summed[1], "scores": list(self.sum_scores or ()),
                    "value": self.sum_value,
                }  # fmt: skip
            else:
                explanation["steps"] = [index for index, step in enumerate(self.steps) if step.explained]
            explanation["seconds"] = self.seconds
            document["explanation"] = explanation
        return document
