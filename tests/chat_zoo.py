"""Tiny chat models of every decoder family, built in the test (nothing downloaded): a fast tokenizer trained here on
a few sentences in the family's style (byte-level BPE with ``Ġ`` for Llama 3, Qwen and GPT-2; SentencePiece-style
``▁`` pieces for Mistral and Gemma), its control tokens, a chat template written after the family's own (Llama 3's
headers and ``trim``; Qwen 2's ChatML with a default system prompt; a ChatML that takes ``documents`` for Qwen 3;
Mistral's ``[INST]`` that refuses a system message; Gemma's turns that ``trim`` and refuse a system message; GPT-2
has none), and a float64 2-layer causal LM of the family over that vocabulary (:mod:`tests.arch_zoo`'s configs).
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from .arch_zoo import _configs
from .causal_zoo import CLASSES
from .weights import perturb

LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
QWEN3_DOCUMENTS = (
    "{% if documents %}{{ '<|im_start|>system\nDocuments:\n' }}{% for document in documents %}"
    "{{ '<|document|>' + (document.title or '') + '\n' + document.text + '\n' }}{% endfor %}{{ '<|im_end|>\n' }}"
    "{% endif %}{% for message in messages %}"
    "{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ChatStyle:
    """A family's tokenizer style, control tokens and chat template."""

    pieces: str  # "bytes" (byte-level BPE, Ġ) or "metaspace" (▁)
    bos: str
    eos: str
    controls: tuple[str, ...]
    template: str | None


STYLES: dict[str, ChatStyle] = {
    "llama": ChatStyle(
        "bytes", "<|begin_of_text|>", "<|eot_id|>", ("<|start_header_id|>", "<|end_header_id|>"), LLAMA3
    ),
    "qwen2": ChatStyle("bytes", "<|endoftext|>", "<|im_end|>", ("<|im_start|>",), QWEN2),
    "qwen3": ChatStyle("bytes", "<|endoftext|>", "<|im_end|>", ("<|im_start|>", "<|document|>"), QWEN3_DOCUMENTS),
    "mistral": ChatStyle("metaspace", "<s>", "</s>", ("[INST]", "[/INST]"), MISTRAL),
    "gemma2": ChatStyle("metaspace", "<bos>", "<eos>", ("<start_of_turn>", "<end_of_turn>"), GEMMA2),
    "gpt2": ChatStyle("bytes", "<|endoftext|>", "<|endoftext|>", (), None),
}
#: The families with a chat template.
CHAT_FAMILIES = tuple(family for family, style in STYLES.items() if style.template is not None)

DOCUMENTS = (
    {"title": "Eiffel Tower", "text": "The Eiffel Tower was finished in 1889. It stands in Paris, by the Seine."},
    {"title": "Big Ben", "text": "Big Ben is the bell of a clock tower in London. The tower was finished in 1859."},
    "The Colosseum is an amphitheatre in Rome. It was finished in the year 80.",
)
QUESTION = "When was the Eiffel Tower finished?"
SYSTEM = "You answer questions about old buildings. Be brief!"
_CORPUS = (
    *(document if isinstance(document, str) else document["title"] + "\n" + document["text"] for document in DOCUMENTS),
    QUESTION,
    SYSTEM,
    "It was finished in 1889. The tower is in Paris; the bell is in London.",
    "user assistant system model Documents: [1] [2] [3] You are a helpful assistant.",
    "What about Big Ben? And the Colosseum? Which one is the oldest of them all, and why?",
    "".join(chr(code) for code in range(32, 127)),
)


def tokenizer(family: str) -> PreTrainedTokenizerFast:
    """The family's tiny fast tokenizer, with its chat template (none for GPT-2), padding on the left."""
    style = STYLES[family]
    specials = ["<unk>", "<pad>", style.bos, style.eos, *style.controls]
    specials = list(dict.fromkeys(specials))
    if style.pieces == "bytes":
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        backend = Tokenizer(models.BPE(unk_token="<unk>"))
        backend.normalizer = normalizers.Replace(" ", "▁")
        backend.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
        backend.decoder = decoders.Replace("▁", " ")
        alphabet = []
    trainer = trainers.BpeTrainer(
        vocab_size=360, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    backend.train_from_iterator(list(_CORPUS) * 3, trainer)
    made = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=style.bos, eos_token=style.eos, unk_token="<unk>", pad_token="<pad>",
        padding_side="left",
    )  # fmt: skip
    if style.template is not None:
        made.chat_template = style.template
    return made


@functools.cache
def chat_model(family: str, seed: int = 0) -> tuple[Any, PreTrainedTokenizerFast]:
    """The family's tiny float64 causal LM (eval mode, eager attention) and its tokenizer; cached, do not change
    them."""
    made = tokenizer(family)
    config = _configs()[family]()
    config.vocab_size = len(made)
    if family == "gpt2":
        config.n_positions = 512
    else:
        config.max_position_embeddings = 512
    if family in ("mistral", "gemma2"):
        config.sliding_window = 512
    config.bos_token_id = made.bos_token_id
    config.eos_token_id = made.eos_token_id
    config.pad_token_id = made.pad_token_id
    config._attn_implementation = "eager"
    model = perturb(CLASSES[family][0](config), 301 + seed).double().eval()
    model.generation_config.eos_token_id = made.eos_token_id
    model.generation_config.pad_token_id = made.pad_token_id
    return model, made


def save_chat_model(family: str, folder: Path) -> Path:
    """The family's tiny chat model saved as ``save_pretrained`` writes it (float32 safetensors, the tokenizer with
    its ``chat_template.jinja``)."""
    model, made = chat_model(family)
    copy.deepcopy(model).float().save_pretrained(folder)
    made.save_pretrained(folder)
    return folder
