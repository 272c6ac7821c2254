"""A tiny causal-LM checkpoint folder written as a user's ``save_pretrained`` would write it (safetensors, config,
a word-level tokenizer that pads on the left), for the generation serving tests. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import LlamaConfig, LlamaForCausalLM

from tests.checkpoints import WORDS, decoder_tokenizer, save
from tests.weights import perturb

#: Prompts made of the tokenizer's words.
PROMPTS = ("the service was", "a slow rude waiter and the food", "good")


def causal_lm(folder: Path, pad: bool = True) -> Path:
    """A 2-layer Llama causal LM over :data:`tests.checkpoints.WORDS` (ids: <unk> 0, <s> 1, </s> 2, <pad> 3)."""
    tokenizer = decoder_tokenizer(pad)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )  # fmt: skip
    model: Any = perturb(LlamaForCausalLM(config), 21, unit_embeddings=None).eval()
    return save(model, tokenizer, folder)


__all__ = ["PROMPTS", "WORDS", "causal_lm"]
