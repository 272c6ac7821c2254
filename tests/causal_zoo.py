"""Tiny causal LMs of every decoder family (the configs of :mod:`tests.arch_zoo`), float64, and their classifier
twins: the same weights in a ``*ForSequenceClassification`` whose ``score`` layer is the LM head, so that the
classifier path (:func:`explainers.explain`) explains "the LM head read as a classifier over the vocabulary" for a
context alone. That twin is the oracle of the generation tests: a step's scores must equal the twin's explanation
of the step's context with the step's token as target.

Gemma 2's causal LM caps its logits (``final_logit_softcapping``: ``c·tanh(z/c)``), its sequence classifier does
not; the twin of a capped model is therefore built from an uncapped copy (see :func:`build_causal`), and the capped
model is tested on its own (its objectives are the capped logits).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import (
    Gemma2ForCausalLM,
    Gemma2ForSequenceClassification,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    MistralForCausalLM,
    MistralForSequenceClassification,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
)

from .arch_zoo import PAD, VOCAB, _configs, perturb

EOS = 2
#: model type -> (causal LM class, sequence classifier class)
CLASSES: dict[str, tuple[Any, Any]] = {
    "llama": (LlamaForCausalLM, LlamaForSequenceClassification),
    "qwen2": (Qwen2ForCausalLM, Qwen2ForSequenceClassification),
    "qwen3": (Qwen3ForCausalLM, Qwen3ForSequenceClassification),
    "mistral": (MistralForCausalLM, MistralForSequenceClassification),
    "gemma2": (Gemma2ForCausalLM, Gemma2ForSequenceClassification),
    "gpt2": (GPT2LMHeadModel, GPT2ForSequenceClassification),
}
FAMILIES = tuple(CLASSES)


def build_causal(model_type: str, seed: int = 0, softcap: bool = False) -> Any:
    """A tiny causal LM in float64 and eval mode, eager attention, EOS id 2 and pad id 1 (Gemma 2 uncapped unless
    ``softcap``)."""
    config = _configs()[model_type]()
    config.eos_token_id = EOS
    config.pad_token_id = PAD
    if model_type == "gemma2" and not softcap:
        config.final_logit_softcapping = None
    config._attn_implementation = "eager"
    model = perturb(CLASSES[model_type][0](config), 101 + seed).double().eval()
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = PAD
    return model


def classifier_twin(lm: Any) -> Any:
    """The LM's weights in its family's sequence classifier, the LM head as the ``score`` layer, and as pad id one
    that no token has (the vocabulary size): a context alone is one unpadded row, whose last token the head reads
    whatever it is (integrated gradients repeats that row along its path, so the classifier needs some pad id)."""
    model_type = lm.config.model_type
    config = type(lm.config).from_dict(lm.config.to_dict())
    config.num_labels = int(lm.get_output_embeddings().weight.shape[0])
    config.pad_token_id = None
    config._attn_implementation = "eager"
    twin = CLASSES[model_type][1](config).double().eval()
    state = {("score.weight" if key == "lm_head.weight" else key): value for key, value in lm.state_dict().items()}
    twin.load_state_dict(state, strict=True)
    twin.config.pad_token_id = config.num_labels
    return twin


def prompts(lengths: tuple[int, ...] = (5, 2, 7), side: str = "left", seed: int = 0) -> dict[str, Tensor]:
    """Random prompts (never the pad, BOS or EOS id) padded on ``side`` with the pad id."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        span = slice(width - length, width) if side == "left" else slice(0, length)
        ids[row, span] = torch.randint(3, VOCAB, (length,), generator=generator)
        mask[row, span] = 1
    return {"input_ids": ids, "attention_mask": mask}
