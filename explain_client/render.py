"""Explanations as text: a prediction and its explanation in a terminal (coloured words, an image's patch grid,
several methods side by side) or on a self-contained HTML page. The words, their merge rule and their colours are
:mod:`explain_client.words`'; image explanations on the page are drawn by :mod:`explain_client.pictures` (the
``pictures`` extra) and token classifiers' answers by :mod:`explain_client.entities`.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

from .entities import ENTITY_CSS, html_entities
from .results import Explanation, Prediction

# The words' layer was part of this module; its public names are still importable from here.
from .words import (
    BASE_CSS,
    COLOUR_LEGEND,
    MERGE_RULE,
    NEGATIVE_RGB,
    NUMBER_LEGEND,
    PIECES_RULE,
    POSITIVE_RGB,
    Word,
    ansi,
    explanation_words,
    html_words,
    merge_pieces,
    normalise,
    score_rgb,
    terminal_words,
)

__all__ = [
    "COLOUR_LEGEND",
    "MERGE_RULE",
    "NEGATIVE_RGB",
    "NUMBER_LEGEND",
    "PIECES_RULE",
    "POSITIVE_RGB",
    "Word",
    "explanation_words",
    "html_page",
    "legend",
    "merge_pieces",
    "normalise",
    "prediction_line",
    "score_rgb",
    "terminal_compare",
    "terminal_grid",
    "terminal_prediction",
    "terminal_words",
]


def legend(color: bool) -> str:
    """The note under a terminal rendering: the merge rule, and how to read the colours or the numbers."""
    return f"{PIECES_RULE} {COLOUR_LEGEND if color else NUMBER_LEGEND}"


# ----------------------------------------------------------------------------------------------------- terminal


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
            rows.append("".join(ansi("  ", score_rgb(value)) for value in cells))
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
            cells.append(ansi(number, score_rgb(values[index])) if color else number)
        lines.append(text.ljust(word_width) + " | " + " | ".join(cells))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------- HTML


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
        f"<title>{html.escape(title)}</title><style>{BASE_CSS}{ENTITY_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        '<div class="legend">score / max |score|: -1<span></span>+1 (red supports the explained class)</div>',
    ]
    for index, (text, results) in enumerate(items):
        parts.append('<div class="item">')
        parts.append(f'<div class="input">{html.escape(text)}</div>')
        first = next((result for result in results if isinstance(result, Prediction)), None)
        if first is not None and first.token_classification is not None:
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
                body = html_words(explanation_words(explanation))
            else:
                from .pictures import grid_png, overlay_png

                overlay = overlay_png(image, explanation) if image is not None else grid_png(explanation)
                body = f'<img class="heat" alt="{html.escape(explanation.method)}" src="{_png_data_uri(overlay)}">'
            parts.append(f'<div class="row"><span class="method">{label}</span>{body}</div>')
        parts.append("</div>")
    parts.append(f'<p class="note">{html.escape(MERGE_RULE)}</p></body></html>')
    return "\n".join(parts)
