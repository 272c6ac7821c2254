"""One explained row's attribution as shares, and its health.

A row's explanation is a list of units (words of the text, the prompt's words, image patches), each with its score
(a word's: the sum of its tokens' scores, :mod:`explainers.units`) and whether it is a *special* unit — a special
token the tokenizer added (``[CLS]``, ``<s>``) or a template token of a chat prompt. Its **shares**: each ordinary
unit's absolute score over the absolute mass of the ordinary units, summed per key (a word's key is its text,
case-folded, so "The" and "the" are one word; a patch's key is its position). Special units are kept apart: their
part of the whole absolute mass is the row's ``special_share``.

Health, per row: ``special_share``; ``negative_share`` (the negative scores' part of the absolute mass, specials
included); ``entropy`` of the shares in bits (0: one unit carries everything; ``log2(n)``: spread evenly over n keys).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class ScoredUnit:
    """One unit of an explanation.

    Attributes:
        key: what identifies it across rows (a word's case-folded text, a patch's position).
        score: its attribution (the sum of its tokens' scores).
        special: a special or template token, kept apart from the shares.
    """

    key: Hashable
    score: float
    special: bool = False


@dataclass(frozen=True)
class RowShares:
    """A row's shares and health numbers.

    Attributes:
        shares: each key's share of the ordinary units' absolute mass (summing to 1, or empty if that mass is 0).
        special_share: the special units' part of the absolute mass (0 when the mass is 0).
        negative_share: the negative scores' part of the absolute mass.
        entropy: the entropy of ``shares`` in bits.
    """

    shares: dict[Hashable, float]
    special_share: float
    negative_share: float
    entropy: float


def word_key(text: str) -> str:
    """The key of a word: its text, case-folded."""
    return text.casefold()


def row_shares(units: Sequence[ScoredUnit]) -> RowShares:
    """The shares and health of one row's units (see the module docstring); non-finite scores count as 0."""
    ordinary: dict[Hashable, float] = {}
    special_mass = 0.0
    negative_mass = 0.0
    total = 0.0
    for unit in units:
        score = unit.score if math.isfinite(unit.score) else 0.0
        mass = abs(score)
        total += mass
        if score < 0:
            negative_mass += mass
        if unit.special:
            special_mass += mass
        else:
            ordinary[unit.key] = ordinary.get(unit.key, 0.0) + mass
    ordinary_mass = total - special_mass
    shares = {key: mass / ordinary_mass for key, mass in ordinary.items() if mass > 0} if ordinary_mass > 0 else {}
    entropy = -sum(share * math.log2(share) for share in shares.values())
    return RowShares(
        shares,
        special_mass / total if total > 0 else 0.0,
        negative_mass / total if total > 0 else 0.0,
        max(entropy, 0.0),
    )


def mean_shares(rows: Sequence[Mapping[K, float]]) -> dict[K, float]:
    """The exact mean share per key over ``rows`` (a key absent from a row has share 0 there)."""
    if not rows:
        return {}
    sums: dict[K, float] = {}
    for shares in rows:
        for key, share in shares.items():
            sums[key] = sums.get(key, 0.0) + share
    return {key: total / len(rows) for key, total in sums.items()}
