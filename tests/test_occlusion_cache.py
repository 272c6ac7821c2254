"""Occlusion of a causal LM with the unchanged prefix's key/value cache equals occlusion without it: per row of a
left- and of a right-padded batch, every round (logits and log-probabilities), in float64 (1e-10) and float32 (1e-5),
chunked anyhow, on decoder families with rotary (Llama, Qwen 2) and learned absolute positions (GPT-2); padding gets
exactly 0, and the model is left exactly as it was found (config flags, weights, modes, no hooks)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

import explainers.methods.perturbation as methods
from explainers import Targets, explain_targets

from .arch_zoo import VOCAB
from .causal_zoo import build_causal, prompts

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def _targets(mask: Tensor, log_probabilities: bool) -> Targets:
    """Two rounds per row: the next token after the last real token, and after a real token in the middle."""
    real = mask.bool()
    last = torch.tensor([int(row.nonzero().max()) for row in real])
    middle = torch.tensor([int(row.nonzero()[len(row.nonzero()) // 2]) for row in real])
    generator = torch.Generator().manual_seed(5)
    positions = torch.stack([last, middle])
    labels = torch.randint(3, VOCAB, positions.shape, generator=generator)
    active = torch.ones_like(positions, dtype=torch.bool)
    return Targets.at_positions(positions, labels, active, mask, causal=True, log_probabilities=log_probabilities)


def _occlusion(lm: Any, batch: dict[str, Tensor], targets: Targets, cached: bool, **options: Any) -> Tensor:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(methods, "OCCLUSION_CACHE_MIN_TOKENS", 0 if cached else 10**9)
        calls: list[bool] = []
        forward_pass = methods.forward_pass

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(kwargs.get("cache") is not None)
            return forward_pass(*args, **kwargs)

        patch.setattr(methods, "forward_pass", counted)
        scores = explain_targets(lm, batch, targets, method="occlusion", **options).scores
    assert any(calls) == cached, "the cache is used exactly when asked"
    return scores


def _state(lm: Any) -> tuple[Any, ...]:
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.modules())
    flags = (lm.config.use_cache, lm.config._attn_implementation, lm.training, hooks)
    return flags, {key: value.clone() for key, value in lm.state_dict().items()}


@pytest.mark.parametrize(
    ("family", "dtype"), [("llama", torch.float64), ("gpt2", torch.float64), ("qwen2", torch.float32)]
)
def test_cached_occlusion_equals_uncached_per_row_left_and_right_padded(family: str, dtype: torch.dtype) -> None:
    lm = build_causal(family).to(dtype)
    before = _state(lm)
    for side in ("left", "right"):
        batch = prompts((6, 3, 9), side=side, seed=1)
        mask = batch["attention_mask"]
        targets = _targets(mask, log_probabilities=side == "right")
        plain = _occlusion(lm, batch, targets, cached=False)
        # 7 rows per pass: 2 copies of the 3 rows, chunks after a prefix of 0, 2, 4, ... columns; 3 rows: 1 copy
        for internal in (7, 3) if side == "left" else (7,):
            cached = _occlusion(lm, batch, targets, cached=True, internal_batch_size=internal)
            assert cached.shape == plain.shape
            for row in range(mask.shape[0]):
                real = mask[row].bool()
                expected, got = plain[:, row][:, real], cached[:, row][:, real]
                scale = float(expected.abs().max().clamp(min=1e-30))
                assert float((got - expected).abs().max()) <= TOLERANCE[dtype] * scale, (family, side, row)
                assert bool((cached[:, row][:, ~real] == 0).all()), "padding gets exactly 0"
    after = _state(lm)
    assert before[0] == after[0]
    assert all(torch.equal(before[1][key], after[1][key]) for key in before[1])


def test_the_cache_is_used_from_the_threshold_on_when_the_copies_span_several_forwards() -> None:
    lm = build_causal("llama")
    calls: list[bool] = []
    forward_pass = methods.forward_pass

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("cache") is not None)
        return forward_pass(*args, **kwargs)

    def uses_cache(lengths: tuple[int, ...], **options: Any) -> bool:
        calls.clear()
        batch = prompts(lengths, side="left")
        explain_targets(lm, batch, _targets(batch["attention_mask"], False), method="occlusion", **options)
        return any(calls)

    assert methods.OCCLUSION_CACHE_MIN_TOKENS == 16  # docs/SERVING.md gives the measurement
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(methods, "forward_pass", counted)
        patch.setattr(methods, "OCCLUSION_CACHE_MIN_TOKENS", 8)
        assert not uses_cache((7, 5), internal_batch_size=2)  # shorter than the threshold
        assert not uses_cache((8, 5))  # one forward holds every copy: nothing to reuse
        assert uses_cache((8, 5), internal_batch_size=6)  # 3 copies of 2 rows per forward
