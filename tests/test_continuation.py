"""The generation loop and given continuations (explainers/tasks/continuation.py) on tiny causal LMs of every decoder
family: greedy equals transformers' ``generate`` row by row, left and right padding agree, rows stop at their own
EOS, a row that ended leaves the loop, sampling is reproducible from a seed and independent of the batch, and bad
settings or continuations are refused with one message each."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from explainers import InvalidInputError, InvalidOptionError
from explainers.tasks.continuation import (
    GenerationSettings,
    filtered_logits,
    generate_continuation,
    given_continuation,
)

from .arch_zoo import PAD
from .causal_zoo import EOS, FAMILIES, build_causal, prompts


@functools.cache
def _model(model_type: str) -> Any:
    return build_causal(model_type)


def _alone(batch: dict[str, torch.Tensor], row: int) -> dict[str, torch.Tensor]:
    keep = batch["attention_mask"][row].bool()
    return {key: value[row : row + 1][:, keep] for key, value in batch.items()}


def _hf_generate(model: Any, inputs: dict[str, torch.Tensor], new: int, eos: int | None = EOS) -> list[int]:
    output = model.generate(
        **inputs, max_new_tokens=new, do_sample=False, pad_token_id=PAD, eos_token_id=eos, min_new_tokens=0
    )
    return output[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_greedy_equals_generate_row_by_row_on_both_padding_sides(model_type: str) -> None:
    model = _model(model_type)
    flags = [module.training for module in model.modules()]
    implementation = model.config._attn_implementation
    left = generate_continuation(model, prompts(side="left"), 5)
    right = generate_continuation(model, prompts(side="right"), 5)
    assert torch.equal(left.tokens, right.tokens) and torch.equal(left.prompt_ids, right.prompt_ids)
    assert left.prompt_mask[:, -1].all()  # re-padded on the left
    batch = prompts()
    for row in range(3):
        expected = _hf_generate(model, _alone(batch, row), 5)
        got = left.tokens[row][left.token_mask[row]].tolist()
        assert got == expected[: len(got)] and len(got) == len(expected)
    assert [module.training for module in model.modules()] == flags
    assert model.config._attn_implementation == implementation


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "qwen3"])
def test_each_row_stops_at_its_own_eos(model_type: str) -> None:
    model = _model(model_type)
    batch = prompts()
    free = generate_continuation(model, batch, 6, {"eos_token_id": None})
    stop = int(free.tokens[0, 2])
    made = generate_continuation(model, batch, 6, {"eos_token_id": stop})
    for row in range(3):
        tokens = free.tokens[row].tolist()
        length = tokens.index(stop) + 1 if stop in tokens else 6
        assert made.token_mask[row].tolist() == [True] * length + [False] * (made.steps - length)
        assert made.tokens[row, :length].tolist() == tokens[:length]
        assert (made.tokens[row, length:] == PAD).all()
        assert _hf_generate(model, _alone(batch, row), 6, eos=stop) == tokens[:length]
    assert made.sequence_mask[:, made.prompt_width :].bool().equal(made.token_mask)
    assert made.forward_mask[:, made.prompt_width :].eq(1).all()  # left-padded only: the forward sees every column


def test_per_row_budgets_and_the_longest_row_sets_the_width() -> None:
    model = _model("llama")
    made = generate_continuation(model, prompts(), [2, 4, 1], {"eos_token_id": None})
    assert made.steps == 4
    assert made.token_mask.sum(dim=1).tolist() == [2, 4, 1]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_row_that_ends_leaves_the_loop(model_type: str) -> None:
    """Once a row has ended the model computes the others only (its batch shrinks), and each row's tokens and
    log-probabilities are still its own alone."""
    model = _model(model_type)
    batch = prompts()
    sizes: list[int] = []
    hook = model.register_forward_hook(lambda module, args, kwargs, output: sizes.append(kwargs["input_ids"].shape[0]),
                                       with_kwargs=True)  # fmt: skip
    try:
        made = generate_continuation(model, batch, [2, 5, 1], {"eos_token_id": None}, top_logprobs=2)
    finally:
        hook.remove()
    assert sizes == [3, 2, 1, 1, 1]
    for row, budget in enumerate([2, 5, 1]):
        alone = generate_continuation(model, _alone(batch, row), budget, {"eos_token_id": None}, top_logprobs=2)
        assert made.tokens[row, :budget].tolist() == alone.tokens[0].tolist()
        assert made.logprobs is not None and alone.logprobs is not None
        assert torch.allclose(made.logprobs.chosen[row, :budget], alone.logprobs.chosen[0], atol=1e-5)
        assert torch.equal(made.logprobs.top_ids[row, :budget], alone.logprobs.top_ids[0])


@pytest.mark.parametrize("model_type", ["mistral", "gpt2"])
def test_sampling_is_reproducible_and_does_not_depend_on_the_batch(model_type: str) -> None:
    model = _model(model_type)
    batch = prompts()
    settings = {"do_sample": True, "seed": 11, "temperature": 1.5, "top_p": 0.95, "eos_token_id": None}
    first = generate_continuation(model, batch, 8, settings)
    again = generate_continuation(model, batch, 8, settings)
    assert torch.equal(first.tokens, again.tokens)
    for row in range(3):
        alone = generate_continuation(model, _alone(batch, row), 8, settings)
        assert torch.equal(alone.tokens[0], first.tokens[row])
    other = generate_continuation(model, batch, 8, {**settings, "seed": [12, 13, 14]})
    assert not torch.equal(other.tokens, first.tokens)
    greedy = generate_continuation(model, batch, 8, {"eos_token_id": None})
    top_one = generate_continuation(model, batch, 8, {"do_sample": True, "top_k": 1, "eos_token_id": None})
    assert torch.equal(top_one.tokens, greedy.tokens)


def test_filters_keep_what_they_should() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filtered_logits(logits, GenerationSettings(do_sample=True, top_p=0.8)).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    kept = filtered_logits(logits, GenerationSettings(do_sample=True, top_k=3)).isfinite()
    assert kept.tolist() == [[True, True, True, False]]
    scaled = filtered_logits(logits, GenerationSettings(do_sample=True, temperature=2.0))
    assert torch.allclose(scaled, logits / 2)


def test_a_given_continuation_ends_at_eos_or_where_its_mask_ends() -> None:
    model = _model("qwen2")
    batch = prompts()
    tokens = torch.tensor([[5, EOS, 7, 8], [9, 10, 11, 12], [EOS, 4, 4, 4]])
    made = given_continuation(model, batch, tokens)
    assert made.token_mask.tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]
    assert made.tokens[0].tolist() == [5, EOS, PAD, PAD]
    masked = given_continuation(
        model, batch, {"input_ids": tokens, "attention_mask": torch.tensor([[1, 1, 1, 0], [1] * 4, [1, 1, 0, 0]])}
    )
    assert masked.token_mask.sum(dim=1).tolist() == [3, 4, 2]
    generated = generate_continuation(model, batch, 5)
    assert torch.equal(given_continuation(model, batch, generated.tokens).token_mask, generated.token_mask)


@pytest.mark.parametrize(
    "continuation, message",
    [
        (torch.zeros((2, 3), dtype=torch.long), r"expected \(3, T\)"),
        (torch.zeros((3, 0), dtype=torch.long), "T >= 1"),
        (torch.full((3, 2), 60), r"in \[0, 59\]"),
        (torch.zeros((3, 2)), "integer tensor"),
        ("abc", "integer tensor"),
        ({"input_ids": torch.ones((3, 2), dtype=torch.long), "attention_mask": torch.tensor([[0, 1]] * 3)}, "right"),
        (torch.ones((3, 60), dtype=torch.long), "beyond the model's 64 positions"),
    ],
)
def test_bad_continuations_are_refused(continuation: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        given_continuation(_model("llama"), prompts(), continuation)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"beams": 2}, "unknown generation setting"),
        ({"do_sample": "yes"}, "do_sample"),
        ({"temperature": 0}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": -3}, "seed"),
        ({"eos_token_id": 99}, r"\[0, 59\]"),
    ],
)
def test_bad_generation_settings_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        generate_continuation(_model("llama"), prompts(), 3, settings)


def test_bad_prompts_and_budgets_are_refused() -> None:
    model = _model("gpt2")
    batch = prompts()
    with pytest.raises(InvalidOptionError, match="max_new_tokens"):
        generate_continuation(model, batch, 0)
    with pytest.raises(InvalidOptionError, match="3 prompts"):
        generate_continuation(model, batch, [1, 2])
    with pytest.raises(InvalidInputError, match="beyond the model's 64 positions"):
        generate_continuation(model, batch, 60)
    mixed = {key: value.clone() for key, value in batch.items()}
    mixed["attention_mask"][0] = torch.tensor([0, 1, 1, 1, 1, 1, 0])
    with pytest.raises(InvalidInputError, match="left-padded"):
        generate_continuation(model, mixed, 2)
    with pytest.raises(InvalidInputError, match="unexpected: token_type_ids"):
        generate_continuation(model, {**batch, "token_type_ids": batch["input_ids"]}, 2)


def test_rows_of_one_batch_may_each_have_their_own_settings() -> None:
    """A served batch: each row generates with its own sampling settings and budget, as it would alone."""
    model = _model("qwen3")
    batch = prompts()
    settings: list[dict[str, Any]] = [
        {"eos_token_id": None},
        {"do_sample": True, "seed": 4, "top_k": 8, "eos_token_id": None},
        {"do_sample": True, "seed": 9, "temperature": 0.5, "eos_token_id": None},
    ]
    together = generate_continuation(model, batch, [3, 5, 4], settings)
    for row in range(3):
        alone = generate_continuation(model, _alone(batch, row), [3, 5, 4][row], settings[row])
        assert together.tokens[row][together.token_mask[row]].tolist() == alone.tokens[0].tolist()
