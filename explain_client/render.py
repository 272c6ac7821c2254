"""Explanations as text: words coloured by score in a terminal or on a self-contained HTML page (image explanations
on that page are drawn by :mod:`explain_client.pictures`, which needs the ``pictures`` extra).

Merge rule (stated in every rendering): the tokenizer's sub-word pieces are merged into words, and **a word's score
is the sum of its pieces' scores** (a sum keeps the total attribution, e.g. a rollout row still sums to 1, and does
not favour words that happen to be split). A piece continues the previous word when it starts with ``##``
(WordPiece: BERT, MiniLM, DistilBERT); for tokenizers that mark word *starts* instead (``Ġ`` byte-level BPE:
RoBERTa; ``▁`` SentencePiece), a piece without the mark continues the previous word. Special tokens ([CLS], [SEP],
<s>, …) are not shown. Colours are the score divided by the largest absolute word score of that explanation:
white = 0, red = +1 (supports the explained class), blue = -1 (speaks against it).
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .results import Explanation, Prediction

PIECES_RULE = (
    "Sub-word pieces are merged into words (WordPiece '##' pieces join the previous piece; for 'Ġ'/'▁' tokenizers a "
    "piece without the word-start mark joins it); a word's score is the sum of its pieces' scores. Special tokens "
    "are hidden."
)
COLOUR_LEGEND = "Colour = score / max |word score| of the row: white 0, red +1, blue -1."
NUMBER_LEGEND = "word[+0.42] = score / max |word score| of the row, in [-1, +1]."
#: The rule as every coloured rendering states it (terminal with colours, HTML).
MERGE_RULE = f"{PIECES_RULE} {COLOUR_LEGEND}"


def legend(color: bool) -> str:
    """The note under a terminal rendering: the merge rule, and how to read the colours or the numbers."""
    return f"{PIECES_RULE} {COLOUR_LEGEND if color else NUMBER_LEGEND}"


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


def explanation_words(explanation: Explanation) -> list[Word]:
    """The merged words of a text explanation.

    Raises:
        ValueError: for an image explanation.
    """
    if explanation.tokens is None:
        raise ValueError("an image explanation has no tokens")
    return merge_pieces(explanation.tokens, explanation.scores, explanation.special_tokens)


# ----------------------------------------------------------------------------------------------------- terminal


def _ansi(text: str, rgb: tuple[int, int, int]) -> str:
    red, green, blue = rgb
    return f"\x1b[48;2;{red};{green};{blue}m\x1b[38;2;0;0;0m{text}\x1b[0m"


def _probabilities_line(prediction: Prediction) -> str:
    ordered = sorted(prediction.probabilities.items(), key=lambda item: -item[1])
    return "  ".join(f"{label} {probability:.3f}" for label, probability in ordered)


def prediction_line(prediction: Prediction) -> str:
    """What the model predicted, on one line: ``label: negative   (negative 0.955  neutral 0.030 …)``; multi-label
    heads: ``labels: a, b (p ≥ 0.5)   (…)``; regression heads: ``value: 3.14``."""
    if prediction.head_type == "regression":
        return f"value: {prediction.value:.6g}" if prediction.value is not None else "value: none"
    if prediction.head_type == "multi_label":
        chosen = ", ".join(prediction.labels) or "none"
        threshold = f" (p ≥ {prediction.threshold:g})" if prediction.threshold is not None else ""
        return f"labels: {chosen}{threshold}   ({_probabilities_line(prediction)})"
    return f"label: {prediction.label}   ({_probabilities_line(prediction)})"


def terminal_words(words: Sequence[Word], color: bool = True) -> str:
    """Words on one line: coloured backgrounds (24-bit ANSI) or, without colour, ``word[+0.42]``."""
    values = normalise([word.score for word in words])
    if color:
        return " ".join(_ansi(word.text, score_rgb(value)) for word, value in zip(words, values, strict=True))
    return " ".join(f"{word.text}[{value:+.2f}]" for word, value in zip(words, values, strict=True))


def terminal_prediction(prediction: Prediction, color: bool = True, service_default: bool = False) -> str:
    """Label, probabilities and (for text) the words coloured by score, as terminal text; ``service_default``: the
    request left the method to the service, so the line naming the method says it was the model's default. An
    explanation asked for only when unsure and not computed is one line saying why."""
    lines = [prediction_line(prediction)]
    if prediction.truncated:
        lines.append("note: the text was truncated to the model's max_length")
    if prediction.skipped is not None:
        lines.append(f"{prediction.skipped.method}: {prediction.skipped.message}")
    explanation = prediction.explanation
    if explanation is not None:
        chosen = ", the model's default method" if service_default else ""
        unsure = (
            f", confidence {prediction.confidence:.3g} < {prediction.below:g}"
            if prediction.below is not None and prediction.confidence is not None
            else ""
        )
        lines.append(f"{explanation.method}{chosen} (explaining '{explanation.target_label}'{unsure}):")
        if explanation.tokens is not None:
            lines.append("  " + terminal_words(explanation_words(explanation), color))
        else:
            lines.extend("  " + line for line in terminal_grid(explanation, color).splitlines())
    return "\n".join(lines)


def terminal_grid(explanation: Explanation, color: bool = True) -> str:
    """An image explanation's patch grid as coloured cells (or numbers without colour)."""
    values = normalise(list(explanation.scores))
    assert explanation.grid is not None
    height, width = explanation.grid
    rows = []
    for row in range(height):
        cells = values[row * width : (row + 1) * width]
        if color:
            rows.append("".join(_ansi("  ", score_rgb(value)) for value in cells))
        else:
            rows.append(" ".join(f"{value:+.2f}" for value in cells))
    return "\n".join(rows)


def terminal_compare(predictions: Sequence[Prediction], color: bool = True) -> str:
    """Several methods' explanations of the same text side by side: one row per word, one column per method.

    Raises:
        ValueError: if the predictions do not explain the same tokens.
    """
    explanations = [prediction.explanation for prediction in predictions]
    if not explanations or any(explanation is None for explanation in explanations):
        raise ValueError("every prediction must carry an explanation")
    first = predictions[0]
    header = [prediction_line(first)]
    if any(explanation.grid is not None for explanation in explanations if explanation):
        for explanation in explanations:
            assert explanation is not None
            header.append(f"{explanation.method}:")
            header.extend("  " + line for line in terminal_grid(explanation, color).splitlines())
        return "\n".join(header)
    columns = [explanation_words(explanation) for explanation in explanations if explanation is not None]
    texts = [word.text for word in columns[0]]
    if any([word.text for word in column] != texts for column in columns):
        raise ValueError("the explanations do not cover the same tokens")
    normalised = [normalise([word.score for word in column]) for column in columns]
    names = [explanation.method for explanation in explanations if explanation is not None]
    word_width = max([len("word"), *(len(text) for text in texts)])
    cell = max(8, *(len(name) for name in names))
    lines = [*header, "word".ljust(word_width) + " | " + " | ".join(name.center(cell) for name in names)]
    lines.append("-" * len(lines[-1]))
    for index, text in enumerate(texts):
        cells = []
        for values in normalised:
            number = f"{values[index]:+.2f}".center(cell)
            cells.append(_ansi(number, score_rgb(values[index])) if color else number)
        lines.append(text.ljust(word_width) + " | " + " | ".join(cells))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------- HTML

_CSS = """
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


def _html_words(words: Sequence[Word]) -> str:
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


def _entity_css() -> str:
    from .entities import ENTITY_CSS

    return ENTITY_CSS


def _png_data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def html_page(
    items: Sequence[tuple[str, Sequence[Prediction | Exception]]],
    title: str = "Explanations",
    images: Sequence[bytes | None] | None = None,
) -> str:
    """A self-contained HTML page (inline CSS, images as data URIs, no scripts or external resources).

    Args:
        items: per input, its display text and one prediction per method (all explaining that input), or the
            error that method's call raised.
        title: the page title.
        images: per input, the PNG/JPEG bytes of an image input (for image explanations), else ``None``.

    Returns:
        The HTML document.
    """
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}{_entity_css()}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        '<div class="legend">score / max |score|: -1<span></span>+1 (red supports the explained class)</div>',
    ]
    for index, (text, results) in enumerate(items):
        parts.append('<div class="item">')
        parts.append(f'<div class="input">{html.escape(text)}</div>')
        first = next((result for result in results if isinstance(result, Prediction)), None)
        if first is not None and first.token_classification is not None:
            from .entities import html_entities

            answers = [result for result in results if isinstance(result, Prediction)]
            parts.append(html_entities(text, answers, f"item{index + 1}-entity"))
            parts.extend(
                f'<div class="row error">{html.escape(str(result))}</div>'
                for result in results
                if not isinstance(result, Prediction)
            )
            parts.append("</div>")
            continue
        if first is not None:
            probabilities = "".join(
                f'<span class="prob">{html.escape(label)} {probability:.3f}'
                f'<span class="bar" style="width:{round(60 * probability)}px"></span></span>'
                for label, probability in first.probabilities.items()
            )
            truncated = " (truncated)" if first.truncated else ""
            if first.head_type == "regression":
                label = html.escape(f"{first.value:.6g}" if first.value is not None else "none")
            elif first.head_type == "multi_label":
                label = html.escape(", ".join(first.labels) or "none")
            else:
                label = html.escape(str(first.label))
            parts.append(f'<div class="pred">prediction: <b>{label}</b>{truncated} &nbsp; {probabilities}</div>')
        image = images[index] if images is not None and index < len(images) else None
        for result in results:
            if not isinstance(result, Prediction):
                parts.append(f'<div class="row error">{html.escape(str(result))}</div>')
                continue
            explanation = result.explanation
            if explanation is None:
                continue
            label = f"{explanation.method}<br><small>for '{html.escape(explanation.target_label)}'</small>"
            if explanation.tokens is not None:
                body = _html_words(explanation_words(explanation))
            else:
                from .pictures import grid_png, overlay_png

                overlay = overlay_png(image, explanation) if image is not None else grid_png(explanation)
                body = f'<img class="heat" alt="{html.escape(explanation.method)}" src="{_png_data_uri(overlay)}">'
            parts.append(f'<div class="row"><span class="method">{label}</span>{body}</div>')
        parts.append("</div>")
    parts.append(f'<p class="note">{html.escape(MERGE_RULE)}</p></body></html>')
    return "\n".join(parts)
