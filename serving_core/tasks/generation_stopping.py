"""Where a generated row ends: at its EOS, at the step whose text first contains one of its ``stop`` sequences (its
steps keep the tokens that wrote the stop sequence, as they keep an EOS, and its text ends before it), or, while it is
still being written, once its deadline has passed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from explainers import Deadline


def stopper(
    tokenizer: Any,
    eos: frozenset[int],
    stops: Sequence[tuple[str, ...]],
    deadlines: Sequence[Deadline | None],
    budgets: Sequence[int],
    passed: Callable[[int], None],
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The ``stop`` callback of the generation loop (``None``: no row has stop sequences or a deadline).

    A row ends at the step whose decoded text first contains one of its sequences, or, while it is still being written
    (no EOS yet, under its token budget, no stop sequence), once its deadline has passed.

    Args:
        tokenizer: the model's tokenizer (to decode the rows' tokens).
        eos: the model's end-of-sequence token ids.
        stops: each row's stop sequences.
        deadlines: each row's deadline (``None``: none).
        budgets: each row's token budget (``max_new_tokens``).
        passed: told the offset of a row whose deadline passed while it was written, once.

    Returns:
        A function of the tokens written so far (a row each) to the rows that end at this step.
    """
    if not any(stops) and not any(deadlines):
        return None
    finished: set[int] = set()

    def stopped(tokens: torch.Tensor) -> torch.Tensor:
        ended = torch.zeros(tokens.shape[0], dtype=torch.bool)
        for row, sequences in enumerate(stops):
            if sequences:
                text = tokenizer.decode(tokens[row].tolist(), skip_special_tokens=True)
                ended[row] = any(sequence in text for sequence in sequences)
        for row, deadline in enumerate(deadlines):
            if deadline is None or row in finished:
                continue
            written = tokens[row].tolist()
            if bool(ended[row]) or len(written) >= budgets[row] or any(token in eos for token in written):
                finished.add(row)  # it ends here or has ended: answered, whatever its deadline
            elif deadline.passed:
                finished.add(row)
                passed(row)
                ended[row] = True
        return ended

    return stopped


def first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """Where the first of ``stops`` starts in ``text`` and which it is (the longest of those starting there), or
    ``None``.

    Args:
        text: the decoded answer.
        stops: the row's stop sequences.
    """
    found = [(text.find(stop), -len(stop), stop) for stop in stops if stop in text]
    if not found:
        return None
    start, _, stop = min(found)
    return start, stop


def until_eos(tokens: Sequence[int], eos: frozenset[int]) -> list[int]:
    """The tokens up to and including the first EOS.

    Args:
        tokens: a continuation's token ids.
        eos: the model's end-of-sequence token ids.
    """
    kept: list[int] = []
    for token in tokens:
        kept.append(int(token))
        if token in eos:
            break
    return kept


def clipped(
    text: str, offsets: Sequence[tuple[int, int] | None], length: int
) -> tuple[str, list[tuple[int, int] | None]]:
    """The answer text cut to its first ``length`` characters, and the tokens' offsets in it (a token with no
    character left, one of a stop sequence, has none, as an EOS).

    Args:
        text: the answer's tokens decoded.
        offsets: each token's character offsets in ``text`` (``None``: none).
        length: the characters the row's answer keeps (fewer than ``text``'s when a stop sequence cut it).
    """
    if length >= len(text):
        return text, list(offsets)
    kept: list[tuple[int, int] | None] = []
    for offset in offsets:
        kept.append(None if offset is None or offset[0] >= length else (offset[0], min(offset[1], length)))
    return text[:length], kept
