"""Scored words, the bottom layer of every rendering: the tokenizer's pieces merged into words, scores normalised
and coloured, and words drawn as ANSI terminal text or HTML spans (with the page's base CSS). It imports nothing of
the package but the result types; the renderers (:mod:`~explain_client.render`, :mod:`~explain_client.entities`,
:mod:`~explain_client.generation_render`, :mod:`~explain_client.pictures`) build on it.

Merge rule (stated in every rendering): the tokenizer's sub-word pieces are merged into words, and **a word's score
is the sum of its pieces' scores** (a sum keeps the total attribution, e.g. a rollout row still sums to 1, and does
not favour words that happen to be split). A piece continues the previous word when it starts with ``##``
(WordPiece: BERT, MiniLM, DistilBERT); for tokenizers that mark word *starts* instead (``Ġ`` byte-level BPE:
RoBERTa; ``▁`` SentencePiece), a piece without the mark continues the previous word. Special tokens ([CLS], [SEP],
<s>, …) are not shown. Colours are the score divided by the largest absolute word score of that explanation:
white = 0, red = +1 (supports the explained class), blue = -1 (speaks against it).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .results import Explanation

PIECES_RULE = (
    "Sub-word pieces are merged into words (WordPiece '##' pieces join the previous piece; for 'Ġ'/'▁' tokenizers a "
    "piece without the word-start mark joins it); a word's score is the sum of its pieces' scores. Special tokens "
    "are hidden."
)
COLOUR_LEGEND = "Colour = score / max |word score| of the row: white 0, red +1, blue -1."
NUMBER_LEGEND = "word[+0.42] = score / max |word score| of the row, in [-1, +1]."
#: The rule as every coloured rendering states it (terminal with colours, HTML).
MERGE_RULE = f"{PIECES_RULE} {COLOUR_LEGEND}"

POSITIVE_RGB = (214, 39, 40)
NEGATIVE_RGB = (31, 119, 180)
_WORD_START_MARKS = ("Ġ", "▁")


@dataclass(frozen=True)
class Word:
    """A displayed word: its text, summed score and the pieces it was merged from."""

    text: str
    score: float
    pieces: tuple[str, ...]


def merge_pieces(tokens: Sequence[str], scores: Sequence[float], special: Sequence[bool] | None = None) -> list[Word]:
    """Merge sub-word pieces into words (see the module docstring for the rule).

    Args:
        tokens: the tokenizer's pieces.
        scores: one score per piece.
        special: which pieces are special tokens (dropped); ``None`` = none are.

    Returns:
        The words in order, each with the sum of its pieces' scores.

    Raises:
        ValueError: if the lengths differ.
    """
    if len(tokens) != len(scores) or (special is not None and len(special) != len(tokens)):
        raise ValueError(f"{len(tokens)} tokens, {len(scores)} scores, {len(special or ())} special flags")
    flags = special if special is not None else [False] * len(tokens)
    start_marked = any(
        token.startswith(_WORD_START_MARKS) for token, flag in zip(tokens, flags, strict=True) if not flag
    )
    words: list[Word] = []
    previous_special = True
    for token, score, flag in zip(tokens, scores, flags, strict=True):
        if flag:
            previous_special = True
            continue
        if start_marked:
            continues = not token.startswith(_WORD_START_MARKS) and not previous_special and bool(words)
            text = token.lstrip("".join(_WORD_START_MARKS))
        else:
            continues = token.startswith("##") and bool(words) and not previous_special
            text = token[2:] if continues else token
        if continues:
            last = words[-1]
            words[-1] = Word(last.text + text, last.score + float(score), (*last.pieces, token))
        else:
            words.append(Word(text, float(score), (token,)))
        previous_special = False
    return words


def explanation_words(explanation: Explanation) -> list[Word]:
    """The merged words of a text explanation.

    Raises:
        ValueError: for an image explanation.
    """
    if explanation.tokens is None:
        raise ValueError("an image explanation has no tokens")
    return merge_pieces(explanation.tokens, explanation.scores, explanation.special_tokens)


def normalise(scores: Sequence[float]) -> list[float]:
    """Scores divided by their largest absolute value (all zeros stay zeros), so they lie in ``[-1, 1]``."""
    largest = max((abs(score) for score in scores), default=0.0)
    if largest == 0.0 or not math.isfinite(largest):
        return [0.0 for _ in scores]
    return [score / largest for score in scores]


def score_rgb(value: float) -> tuple[int, int, int]:
    """The colour of a normalised score in ``[-1, 1]``: white at 0, linearly to red at +1 and blue at -1."""
    value = max(-1.0, min(1.0, value))
    end = POSITIVE_RGB if value >= 0 else NEGATIVE_RGB
    weight = abs(value)
    return tuple(round(255 * (1 - weight) + channel * weight) for channel in end)  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------------- terminal


def ansi(text: str, rgb: tuple[int, int, int]) -> str:
    """``text`` in black on the background colour ``rgb`` (24-bit ANSI escapes, reset after it)."""
    red, green, blue = rgb
    return f"\x1b[48;2;{red};{green};{blue}m\x1b[38;2;0;0;0m{text}\x1b[0m"


def terminal_words(words: Sequence[Word], color: bool = True) -> str:
    """Words on one line: coloured backgrounds (24-bit ANSI) or, without colour, ``word[+0.42]``."""
    values = normalise([word.score for word in words])
    if color:
        return " ".join(ansi(word.text, score_rgb(value)) for word, value in zip(words, values, strict=True))
    return " ".join(f"{word.text}[{value:+.2f}]" for word, value in zip(words, values, strict=True))


# ---------------------------------------------------------------------------------------------------------- HTML

#: The CSS of an explanation page: the page, the prediction line, a row of words (``.row``, ``.method``) and the
#: word spans of :func:`html_words` (``.tok``).
BASE_CSS = """
body { font-family: 'DejaVu Sans', Arial, sans-serif; margin: 24px; color: #111; background: #fff; }
h1 { font-size: 20px; margin: 0 0 12px 0; }
.item { border-top: 1px solid #ccc; padding: 12px 0; }
.input { color: #555; font-size: 13px; margin-bottom: 6px; }
.pred { font-size: 15px; margin-bottom: 8px; }
.prob { display: inline-block; margin-right: 14px; }
.bar { display: inline-block; height: 10px; background: #444; vertical-align: middle; margin-left: 4px; }
.row { margin: 6px 0; line-height: 2.1; font-size: 18px; }
.method { display: inline-block; width: 150px; font-weight: bold; font-size: 14px; vertical-align: top; }
.tok { padding: 3px 4px; margin: 0 1px; border-radius: 3px; color: #000; }
.error { color: #b00; }
.legend { margin: 8px 0 16px 0; font-size: 13px; }
.legend span { display: inline-block; width: 240px; height: 14px; vertical-align: middle; margin: 0 6px;
  background: linear-gradient(to right, rgb(31,119,180), #fff, rgb(214,39,40)); }
.note { color: #555; font-size: 12px; max-width: 900px; }
img.heat { image-rendering: pixelated; margin-right: 12px; border: 1px solid #ccc; }
"""


def html_words(words: Sequence[Word]) -> str:
    """Words as HTML spans (class ``tok``) coloured by their normalised scores; each span's title gives the raw
    score and the pieces, its ``data-score`` the normalised score."""
    values = normalise([word.score for word in words])
    spans = []
    for word, value in zip(words, values, strict=True):
        red, green, blue = score_rgb(value)
        title = html.escape(f"{word.score:.4g} (normalised {value:+.2f}); pieces: {' '.join(word.pieces)}", True)
        spans.append(
            f'<span class="tok" style="background: rgb({red},{green},{blue})" data-score="{value:.4f}" '
            f'title="{title}">{html.escape(word.text)}</span>'
        )
    return " ".join(spans)
