"""A generation row's log-probabilities (``logprobs``) as its answer shows them: each step's chosen token's
log-probability and its most probable tokens, each token decoded alone (special tokens kept) and spelled in bytes.

The log-probabilities come from the generation loop (:func:`explainers.generate_continuation`) or, for a given
continuation, from its probabilities' forward (:func:`explainers.step_logprobs`); here each row takes its share of the
batch's (:func:`row_logprobs`) and :class:`LogprobsDecoder` fills its steps. A token's bytes are a byte-level BPE
piece's own bytes (:func:`byte_level_decoder`), a byte-fallback piece's (``<0xE2>``) byte, else its decoded text's
UTF-8.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from explainers import StepLogprobs

from .generation_schema import GenerationStepOutcome, TopToken

#: A byte-fallback piece of a SentencePiece vocabulary (``<0xE2>``).
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(frozen=True)
class RowLogprobs:
    """One row's log-probabilities.

    Attributes:
        chosen: per step, the chosen token's log-probability.
        top: per step, ``(token id, log-probability)`` of the most probable tokens.
    """

    chosen: list[float]
    top: list[list[tuple[int, float]]]


def row_logprobs(
    recorded: StepLogprobs | None, offset: int, real: torch.Tensor, asked: int | None
) -> RowLogprobs | None:
    """Row ``offset``'s share of a batch's :class:`~explainers.StepLogprobs`.

    Args:
        recorded: the batch's log-probabilities (``None``: none were recorded).
        offset: the row's offset in the batch.
        real: the row's real steps (a mask).
        asked: how many alternatives the row asked for (``None``: it did not ask).

    Returns:
        Its real steps' log-probabilities with ``asked`` alternatives each; ``None`` when the row did not ask.
    """
    if asked is None or recorded is None:
        return None
    chosen = recorded.chosen[offset][real].tolist()
    ids = recorded.top_ids[offset][real][:, :asked].tolist()
    values = recorded.top_values[offset][real][:, :asked].tolist()
    top = [list(zip(step_ids, step_values, strict=True)) for step_ids, step_values in zip(ids, values, strict=True)]
    return RowLogprobs(chosen, top)


def byte_level_decoder(tokenizer: Any) -> dict[str, int] | None:
    """The character → byte map of a byte-level BPE tokenizer (GPT-2's ``bytes_to_unicode``, inverted: its pieces
    spell bytes with printable characters), or ``None`` when the tokenizer's decoder is not byte-level.

    Args:
        tokenizer: a Hugging Face tokenizer (a fast one has the decoder's description).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    try:
        decoder = json.loads(backend.to_str()).get("decoder") if backend is not None else None
    except (AttributeError, ValueError):
        return None
    kinds = [decoder, *(decoder.get("decoders") or [])] if isinstance(decoder, dict) else []
    if not any(isinstance(kind, dict) and kind.get("type") == "ByteLevel" for kind in kinds):
        return None
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


class LogprobsDecoder:
    """Fills a row's steps with their log-probabilities, decoded by one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        """Decode with ``tokenizer``.

        Args:
            tokenizer: the model's tokenizer.
        """
        self.tokenizer = tokenizer
        self.byte_decoder = byte_level_decoder(tokenizer)
        self.special_pieces = frozenset(str(piece) for piece in tokenizer.all_special_tokens)

    def fill(self, steps: Sequence[GenerationStepOutcome], logprobs: RowLogprobs) -> None:
        """Each step's log-probability, decoded text and most probable tokens (``logprobs``).

        Args:
            steps: the row's steps, filled in place.
            logprobs: the row's log-probabilities.
        """
        for step, chosen, top in zip(steps, logprobs.chosen, logprobs.top, strict=True):
            step.logprob = chosen
            step.text = self.decoded(step.token_id)
            step.bytes = self.token_bytes(step.token, step.text)
            ids = [token for token, _ in top]
            pieces = [str(piece) for piece in self.tokenizer.convert_ids_to_tokens(ids)]
            texts = [self.decoded(token) for token in ids]
            step.top = [
                TopToken(piece, token, text, value, self.token_bytes(piece, text))
                for piece, text, (token, value) in zip(pieces, texts, top, strict=True)
            ]

    def decoded(self, token: int) -> str:
        """One token's text as an OpenAI-style ``logprobs`` entry shows it: decoded alone, special tokens kept.

        Args:
            token: the token id.
        """
        return str(self.tokenizer.decode([token], skip_special_tokens=False))

    def token_bytes(self, piece: str, text: str) -> list[int]:
        """A token's bytes: a byte-level BPE piece's own bytes (a piece of a character split over tokens included,
        which decodes alone to U+FFFD), a byte-fallback piece's (``<0xE2>``) byte, else its decoded text's UTF-8.

        Args:
            piece: the token's vocabulary piece.
            text: the token decoded alone.
        """
        fallback = _BYTE_PIECE.fullmatch(piece)
        if fallback is not None:
            return [int(fallback.group(1), 16)]
        decoder = self.byte_decoder
        if decoder is not None and piece not in self.special_pieces and all(c in decoder for c in piece):
            return [decoder[character] for character in piece]
        return list(text.encode("utf-8"))
