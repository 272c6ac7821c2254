"""A generation row's prompt, read before anything is generated: rendered (its ``prompt`` after a documents block, or
its chat ``messages`` through the chat template, :func:`explainers.render_chat`), tokenized with character offsets,
and checked against the model (prompt and answer length, token ids, foils, the method and its options, the sampling
settings). Each refusal is the row's own :class:`~serving_core.errors.RowError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from explainers import (
    ExplainError,
    GenerationSettings,
    InvalidOptionError,
    PromptField,
    RenderedPrompt,
    check_generation_call,
    render_chat,
    render_prompt,
)

from ..config import HandlerConfig
from ..errors import RowError, from_explain_error
from .generation_schema import SENTENCES, GenerationAsk, GenerationRow


@dataclass
class Prepared:
    """A valid row, tokenized: its rendered prompt and ids and, for a given continuation, its ids.

    Attributes:
        index: the row's index in its batch.
        row: the decoded request.
        rendered: its prompt, rendered and tokenized.
        continuation_ids: the given continuation's token ids (``None``: the row generates).
        foils: its foils' token ids (``None``: no contrast).
        settings: its sampling settings.
    """

    index: int
    row: GenerationRow
    rendered: RenderedPrompt
    continuation_ids: list[int] | None
    foils: list[int] | None
    settings: GenerationSettings

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt's token ids."""
        return list(self.rendered.input_ids)


def explains_spans(ask: GenerationAsk, row: GenerationRow) -> bool:
    """Whether a row explains spans of its answer (its sentences, or the span asked for) rather than steps.

    Args:
        ask: the row's explanation request.
        row: the row.
    """
    return ask.span is not None or ask.steps == SENTENCES or (ask.steps is None and bool(row.documents))


class Prompts:
    """Reads the rows' prompts for one model and its tokenizer, under the handler's limits."""

    def __init__(
        self, config: HandlerConfig, tokenizer: Any, model: nn.Module, vocabulary: int, positions: int | None
    ) -> None:
        """Read prompts under ``config``'s limits.

        Args:
            config: the handler's configuration (``max_length``, ``max_new_tokens``, ``chat_template``).
            tokenizer: the model's tokenizer.
            model: the causal LM.
            vocabulary: the model's vocabulary size.
            positions: the model's position limit (``None``: none).
        """
        self.config = config
        self.tokenizer = tokenizer
        self.model = model
        self.vocabulary = vocabulary
        self.positions = positions

    def foil_id(self, foil: str | int) -> int:
        """A foil's token id: an id in the vocabulary, or the text of one token.

        Raises:
            RowError: ``invalid_target`` for an id outside the vocabulary or a text that is not one known token.
        """
        if isinstance(foil, int):
            if not 0 <= foil < self.vocabulary:
                raise RowError("invalid_target", f"foil id {foil} is not in the vocabulary [0, {self.vocabulary - 1}]")
            return foil
        vocabulary = self.tokenizer.get_vocab()
        if foil in vocabulary:
            return int(vocabulary[foil])
        ids = self.tokenizer(foil, add_special_tokens=False)["input_ids"]
        unknown = self.tokenizer.unk_token_id
        if len(ids) == 1 and unknown is not None and ids[0] == unknown and foil != self.tokenizer.unk_token:
            raise RowError("invalid_target", f"foil {foil!r} is not in the vocabulary (it is the unknown token)")
        if len(ids) != 1:
            raise RowError(
                "invalid_target",
                f"foil {foil!r} is not one token of the vocabulary (it tokenizes to {len(ids)} tokens): give a "
                "single token's text or its id",
            )
        return int(ids[0])

    def render(self, row: GenerationRow) -> RenderedPrompt:
        """The row's prompt rendered (chat template, documents block) and tokenized with character offsets.

        Raises:
            RowError: ``no_chat_template``, ``invalid_messages``, or ``invalid_request``/``invalid_option`` for what a
                slow tokenizer (no offsets) cannot do.
        """
        try:
            if row.messages is not None:
                return render_chat(self.tokenizer, row.messages, row.documents, chat_template=self.config.chat_template)
            if getattr(self.tokenizer, "is_fast", False):
                return render_prompt(self.tokenizer, row.prompt or "", row.documents)
            if row.documents:
                render_prompt(self.tokenizer, row.prompt or "", row.documents)  # raises: it needs offsets
            if row.ask is not None and (row.ask.granularity != "token" or explains_spans(row.ask, row)):
                raise InvalidOptionError(
                    "words, sentences and spans of the answer need a fast tokenizer's character offsets; this model's "
                    "tokenizer is not one (no tokenizer.json): explain tokens and steps"
                )
        except ExplainError as error:
            raise from_explain_error(error) from None
        prompt = row.prompt or ""
        ids = self.tokenizer(prompt)["input_ids"]
        return RenderedPrompt(prompt, tuple(ids), (None,) * len(ids), (PromptField("prompt", 0, "prompt"),))

    def prepare(self, index: int, row: GenerationRow) -> Prepared:
        """Row ``index`` rendered, tokenized and checked.

        Raises:
            RowError: for a prompt or an answer too long, a continuation's bad ids, a bad foil, or a method, option or
                sampling setting the model refuses.
        """
        rendered = self.render(row)
        prompt = list(rendered.input_ids)
        if len(prompt) > self.config.max_length:
            raise RowError(
                "too_many_tokens",
                f"the prompt has {len(prompt)} tokens; this model takes at most {self.config.max_length}",
            )
        continuation: list[int] | None = None
        if row.continuation_ids is not None:
            continuation = list(row.continuation_ids)
            if any(not 0 <= token < self.vocabulary for token in continuation):
                raise RowError("invalid_request", f"continuation_ids must be token ids in [0, {self.vocabulary - 1}]")
        elif row.continuation is not None:
            continuation = list(self.tokenizer(row.continuation, add_special_tokens=False)["input_ids"])
            if len(continuation) > self.config.max_new_tokens:
                raise RowError(
                    "too_many_tokens",
                    f"the continuation has {len(continuation)} tokens; this model explains at most "
                    f"{self.config.max_new_tokens} (max_new_tokens)",
                )
        answer = len(continuation) if continuation is not None else row.max_new_tokens
        if self.positions is not None and len(prompt) + answer > self.positions:
            raise RowError(
                "too_many_tokens",
                f"the prompt has {len(prompt)} tokens and {answer} new tokens would make {len(prompt) + answer}, "
                f"beyond the model's {self.positions} positions: send a shorter prompt or ask for at most "
                f"{max(self.positions - len(prompt), 0)} new tokens (max_new_tokens)",
            )
        foils = None
        try:
            if row.ask is not None:
                check_generation_call(self.model, row.ask.method, row.ask.options)
                if row.ask.contrast is not None:
                    foils = [self.foil_id(foil) for foil in row.ask.contrast]
            settings = GenerationSettings.from_mapping(row.sampling, self.model)
        except ExplainError as error:
            raise from_explain_error(error) from None
        return Prepared(index, row, rendered, continuation, foils, settings)
