"""The token events of a batch's streaming rows (:mod:`serving_core.streaming`), made from the decoding loop's steps
(:func:`explainers.generate_continuation`'s ``on_step``) as they are written.

Each streaming row has its own text: its tokens decoded as a whole after each step (special tokens skipped, as the
answer's ``text``), of which the new characters are sent, except an unfinished character (a token that ends inside
one) and, for a row with ``stop`` sequences, the last characters that could still be the start of one (the answer's
text ends before its stop sequence: nothing of it is ever sent). A step whose token adds no character waits for the
next one that does. Once the row is answered, :meth:`RowStreams.finish` sends what is left of its answer's text.
Rows of one batch stream independently: each row's events go to its own listener as its tokens are written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from explainers import GeneratedStep

from ..streaming import Listener, token_event
from .generation_logprobs import LogprobsDecoder, RowLogprobs
from .generation_schema import GenerationStepOutcome, step_to_dict


class _RowText:
    """One row's decoded text and what of it was sent."""

    def __init__(self, tokenizer: Any, hold: int) -> None:
        self.tokenizer = tokenizer
        self.hold = hold
        self.ids: list[int] = []
        self.sent = ""
        self.steps: list[dict[str, Any]] = []

    def add(self, token: int, step: dict[str, Any]) -> str:
        """The new characters that can be sent once ``token`` is written."""
        self.ids.append(token)
        self.steps.append(step)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # a character still being written, byte by byte
            text = text.rstrip("\ufffd")
        visible = text[: max(len(text) - self.hold, 0)]
        if len(visible) <= len(self.sent) or not visible.startswith(self.sent):
            return ""
        delta = visible[len(self.sent) :]
        self.sent = visible
        return delta


class RowStreams:
    """The streaming rows of one generation call: their listeners, their texts."""

    def __init__(
        self,
        tokenizer: Any,
        logprobs: LogprobsDecoder,
        listeners: Sequence[Listener | None],
        stops: Sequence[tuple[str, ...]],
        asked: Sequence[int | None],
    ) -> None:
        """Stream the rows of a generation call.

        Args:
            tokenizer: the model's tokenizer.
            logprobs: decodes a step's log-probabilities as the answer shows them.
            listeners: each row's listener (``None``: the row does not stream), by its position in the batch.
            stops: each row's stop sequences.
            asked: each row's ``logprobs`` (``None``: it did not ask).
        """
        self.logprobs = logprobs
        self.listeners = list(listeners)
        self.asked = list(asked)
        self.rows = [_RowText(tokenizer, max((len(stop) for stop in row), default=1) - 1) for row in stops]
        self.tokenizer = tokenizer

    def hook(self, generating: Sequence[int]) -> Callable[[GeneratedStep], None] | None:
        """The ``on_step`` of the generation call of the rows ``generating`` (their positions, in its batch order);
        ``None`` when none of them streams."""
        if not any(self.listeners[position] is not None for position in generating):
            return None
        return lambda step: self.on_step(step, generating)

    def on_step(self, step: GeneratedStep, generating: Sequence[int]) -> None:
        """One step of the decoding loop: each streaming row that wrote a token sends its new characters.

        Args:
            step: the step.
            generating: the position of each of the step's rows.
        """
        for offset, position in enumerate(generating):
            listener = self.listeners[position]
            if listener is None or not bool(step.written[offset]):
                continue
            token = int(step.tokens[offset])
            outcome = GenerationStepOutcome(
                token=str(self.tokenizer.convert_ids_to_tokens(token)),
                token_id=token,
                probability=float(step.probabilities[offset]),
            )
            asked = self.asked[position]
            if asked is not None and step.logprobs is not None:
                ids = step.logprobs.top_ids[offset, 0, :asked].tolist()
                values = step.logprobs.top_values[offset, 0, :asked].tolist()
                chosen = float(step.logprobs.chosen[offset, 0])
                self.logprobs.fill([outcome], RowLogprobs([chosen], [list(zip(ids, values, strict=True))]))
            row = self.rows[position]
            delta = row.add(token, step_to_dict(outcome))
            if delta:
                listener(token_event(delta, row.steps))
                row.steps = []

    def finish(self, position: int, text: str) -> None:
        """Row ``position`` is answered with ``text``: send what of it (and of its steps) is not sent yet."""
        listener = self.listeners[position]
        if listener is None:
            return
        row = self.rows[position]
        rest = text[len(row.sent) :] if text.startswith(row.sent) else ""
        if rest or row.steps:
            listener(token_event(rest, row.steps))
            row.sent, row.steps = row.sent + rest, []
