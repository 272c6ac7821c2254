"""A tiny causal-LM checkpoint folder written as a user's ``save_pretrained`` would write it (safetensors, config,
a word-level tokenizer that pads on the left), for the generation serving tests. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import LlamaConfig, LlamaForCausalLM

from explain_client.protos import explain_messages
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.tasks.generation_schema import decode_generation_row, encode_generation
from serving_core.wire import Encoding, row_encoding
from tests.checkpoints import WORDS, decoder_tokenizer, save
from tests.weights import perturb

#: Prompts made of the tokenizer's words.
PROMPTS = ("the service was", "a slow rude waiter and the food", "good")


def causal_lm(folder: Path, pad: bool = True, positions: int = 128) -> Path:
    """A 2-layer Llama causal LM over :data:`tests.checkpoints.WORDS` (ids: <unk> 0, <s> 1, </s> 2, <pad> 3) with
    ``positions`` positions."""
    tokenizer = decoder_tokenizer(pad)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=positions, bos_token_id=1, eos_token_id=2,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )  # fmt: skip
    model: Any = perturb(LlamaForCausalLM(config), 21, unit_embeddings=None).eval()
    return save(model, tokenizer, folder)


def serve_rows(service: Any, config: HandlerConfig, requests: list[Any]) -> list[dict[str, Any]]:
    """Requests (JSON documents, or serialized ``ExplainRequest`` bytes) decoded, served as one batch by a
    :class:`~serving_core.tasks.generation_service.GenerationService` and encoded: each answer as its JSON document,
    or ``{"protobuf": ExplainResponse}``; a row that fails to decode is served as its error."""
    rows: list[Any] = []
    encodings = []
    for request in requests:
        raw = {"body": json.dumps(request).encode()} if isinstance(request, dict) else {"request": request}
        encodings.append(row_encoding(raw))
        try:
            rows.append(decode_generation_row(raw, False, config))
        except RowError as error:
            rows.append(error)
    outcomes, timings = service.run(rows, encodings)
    assert timings.generate >= 0
    answers: list[dict[str, Any]] = []
    for outcome in outcomes:
        body = encode_generation(outcome)
        if outcome.encoding is Encoding.JSON:
            answers.append(json.loads(body))
        else:
            answers.append({"protobuf": explain_messages().ExplainResponse.FromString(body)})
    return answers


__all__ = ["PROMPTS", "WORDS", "causal_lm", "serve_rows"]
