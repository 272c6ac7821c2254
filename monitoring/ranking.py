"""How far a window's attribution ranking is from the baseline's: nDCG@k, Spearman's rank correlation, and the
cosine of two mass maps. Pure functions of two ``{key: mean share}`` maps (numpy only).

- :func:`ndcg_at_k`: the window's keys ranked by their window share, each scored (its gain) by its *baseline*
  share, normalised by the baseline's own ranking — what ``sklearn.metrics.ndcg_score(y_true=baseline,
  y_score=window, k=k)`` computes (ties in the window's shares averaged, as sklearn does by default), the measure
  AWS Clarify and Azure ML's feature attribution drift use (an alert below 0.9). The keys compared are the union of
  both top-k lists (a key outside both cannot change nDCG@k), a key absent from one map having share 0 there. A
  window of fewer than k keys ranks the baseline's keys it lacks tied at 0 after its own, and they share the
  remaining positions' discounts (sklearn's tie averaging); a window of 500 rows has far more than k words.
- :func:`rank_correlation`: Spearman's ρ of the two maps over the union of both top-k lists (absent keys 0; ties
  get their average rank), as ``scipy.stats.spearmanr``; ``nan`` when either side is constant there.
- :func:`mass_cosine`: images: the cosine of the two maps as vectors over all their keys (patch positions).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping
from typing import TypeVar

import numpy as np

#: Default k of nDCG@k and of the top-k lists.
DEFAULT_K = 20

#: A key: a word, a patch position.
K = TypeVar("K", bound=Hashable)


def top_k(shares: Mapping[K, float], k: int) -> list[K]:
    """The ``k`` keys of the largest shares, largest first (ties: in the map's order)."""
    return [key for key, _ in sorted(shares.items(), key=lambda item: -item[1])[:k]]


def compared_keys(window: Mapping[K, float], baseline: Mapping[K, float], k: int) -> list[K]:
    """The union of the window's and the baseline's top-k keys (window's first)."""
    return list(dict.fromkeys([*top_k(window, k), *top_k(baseline, k)]))


def _vectors(window: Mapping[K, float], baseline: Mapping[K, float], keys: list[K]) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.array([window.get(key, 0.0) for key in keys], dtype=np.float64),
        np.array([baseline.get(key, 0.0) for key in keys], dtype=np.float64),
    )


def dcg(gains: np.ndarray, scores: np.ndarray, k: int) -> float:
    """Discounted cumulative gain at ``k`` of the ranking by ``scores``, ties averaged (sklearn's ``_dcg_sample_scores``
    with ``ignore_ties=False``): each group of tied scores gets the mean gain of its members over the sum of its
    positions' discounts ``1 / log2(position + 1)``, positions beyond ``k`` discounted to 0."""
    discount = 1.0 / np.log2(np.arange(len(gains)) + 2.0)
    discount[k:] = 0.0
    cumulative = np.cumsum(discount)
    _, inverse, counts = np.unique(-scores, return_inverse=True, return_counts=True)
    ranked = np.zeros(len(counts))
    np.add.at(ranked, inverse, gains)
    ranked /= counts
    ends = np.cumsum(counts) - 1
    sums = np.empty(len(counts))
    sums[0] = cumulative[ends[0]]
    sums[1:] = np.diff(cumulative[ends])
    return float((ranked * sums).sum())


def ndcg_at_k(window: Mapping[K, float], baseline: Mapping[K, float], k: int = DEFAULT_K) -> float:
    """nDCG@k of the window's ranking scored by the baseline's shares (see the module docstring).

    Returns:
        A value in [0, 1]: 1 when the window's top-k carries the baseline's best gains in the baseline's order; 0 when
        the baseline has no mass on the compared keys.

    Raises:
        ValueError: if ``k`` is not positive or a share is negative.
    """
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    keys = compared_keys(window, baseline, k)
    scores, gains = _vectors(window, baseline, keys)
    if (gains < 0).any() or (scores < 0).any():
        raise ValueError("shares must be non-negative")
    if len(keys) == 0:
        return 0.0
    ideal = _ideal_dcg(gains, k)
    if ideal == 0.0:
        return 0.0
    return dcg(gains, scores, k) / ideal


def _ideal_dcg(gains: np.ndarray, k: int) -> float:
    ordered = np.sort(gains)[::-1][:k]
    return float((ordered / np.log2(np.arange(len(ordered)) + 2.0)).sum())


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their average rank (``scipy.stats.rankdata``'s ``average``)."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    boundaries = np.concatenate(([True], ordered[1:] != ordered[:-1], [True]))
    starts = np.flatnonzero(boundaries)
    ranks = np.empty(len(values))
    for start, stop in itertools.pairwise(starts):
        ranks[order[start:stop]] = (start + stop + 1) / 2.0  # mean of ranks start+1 .. stop
    return ranks


def spearman(first: np.ndarray, second: np.ndarray) -> float:
    """Spearman's ρ of two vectors (Pearson's r of their average ranks); ``nan`` if either is constant."""
    if len(first) != len(second):
        raise ValueError(f"{len(first)} values against {len(second)}")
    if len(first) < 2:
        return float("nan")
    a = _average_ranks(first) - (len(first) + 1) / 2.0
    b = _average_ranks(second) - (len(second) + 1) / 2.0
    norm = float(np.sqrt((a * a).sum() * (b * b).sum()))
    if norm == 0.0:
        return float("nan")
    return float(np.clip((a * b).sum() / norm, -1.0, 1.0))


def rank_correlation(window: Mapping[K, float], baseline: Mapping[K, float], k: int = DEFAULT_K) -> float:
    """Spearman's ρ of the window's and the baseline's shares over the union of both top-k lists."""
    keys = compared_keys(window, baseline, k)
    scores, gains = _vectors(window, baseline, keys)
    return spearman(scores, gains)


def mass_cosine(window: Mapping[K, float], baseline: Mapping[K, float]) -> float:
    """The cosine of the two maps as vectors over all their keys (0 if either is all zero)."""
    keys = list(dict.fromkeys([*window, *baseline]))
    first, second = _vectors(window, baseline, keys)
    norm = float(np.linalg.norm(first) * np.linalg.norm(second))
    return float(first @ second / norm) if norm > 0 else 0.0
