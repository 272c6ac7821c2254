"""Token classifiers' answers as text: the input with its entities marked, and a chosen entity's attribution as
coloured words (terminal) or on the HTML page, where clicking an entity shows its attribution (CSS ``:target``, no
scripts).

Entities are marked by their character offsets into the input; each entity type gets one highlight colour (the
same type always the same colour within a rendering). The attribution of an entity is drawn as any text explanation
(:mod:`explain_client.words`: pieces merged into words, a word's score the sum of its pieces' scores, colours
relative to the largest word score of that entity).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from .results import Entity, Prediction
from .words import ansi, explanation_words, html_words, terminal_words

#: Highlight colours of entity types, in order of first appearance (light, so black text stays readable).
TYPE_RGB = (
    (255, 214, 102),
    (158, 218, 229),
    (197, 176, 213),
    (152, 223, 138),
    (255, 187, 120),
    (247, 182, 210),
    (219, 219, 141),
    (196, 156, 148),
)


def type_colours(entities: Sequence[Entity]) -> dict[str, tuple[int, int, int]]:
    """Each entity type's highlight colour, by order of first appearance."""
    colours: dict[str, tuple[int, int, int]] = {}
    for entity in entities:
        if entity.label not in colours:
            colours[entity.label] = TYPE_RGB[len(colours) % len(TYPE_RGB)]
    return colours


def _pieces(text: str, entities: Sequence[Entity]) -> list[tuple[str, int | None]]:
    """The text cut into runs: ``(run, entity index)`` for an entity's characters, ``(run, None)`` between them.
    Overlapping entities (given spans may overlap) are marked from the first one's start to the last one's end."""
    runs: list[tuple[str, int | None]] = []
    position = 0
    for index, entity in sorted(enumerate(entities), key=lambda item: (item[1].start, item[1].end)):
        start = max(entity.start, position)
        if entity.end <= start:
            continue
        if start > position:
            runs.append((text[position:start], None))
        runs.append((text[start : entity.end], index))
        position = entity.end
    if position < len(text):
        runs.append((text[position:], None))
    return runs


def marked_text(text: str, entities: Sequence[Entity], color: bool = True) -> str:
    """The input with its entities marked: highlighted with a ``[#1 PER]`` tag after each (colour), or as
    ``[Angela Merkel](#1 PER)`` (no colour)."""
    colours = type_colours(entities)
    parts = []
    for run, index in _pieces(text, entities):
        if index is None:
            parts.append(run)
            continue
        entity = entities[index]
        if color:
            parts.append(f"{ansi(run, colours[entity.label])}\x1b[2m[#{index + 1} {entity.label}]\x1b[0m")
        else:
            parts.append(f"[{run}](#{index + 1} {entity.label})")
    return "".join(parts)


def entity_line(index: int, entity: Entity) -> str:
    """``#1  Angela Merkel  PER (B-PER)  0.982  chars 0-13``."""
    tag = f" ({entity.tag})" if entity.tag != entity.label else ""
    return f"#{index + 1}  {entity.text}  {entity.label}{tag}  {entity.score:.3f}  chars {entity.start}-{entity.end}"


def terminal_entities(
    prediction: Prediction, text: str, color: bool = True, chosen: int | None = None, header: bool = True
) -> str:
    """A token classifier's answer in the terminal: the marked text and one line per entity (``header``) and, when
    explained, the attribution of the ``chosen`` entity (0-based; ``None``: every entity's, one after another).

    Raises:
        ValueError: if the prediction is not a token classifier's, or ``chosen`` is not one of its entities.
    """
    answer = prediction.token_classification
    if answer is None:
        raise ValueError("not a token classifier's answer")
    entities = answer.entities
    if chosen is not None and not 0 <= chosen < len(entities):
        raise ValueError(f"there is no entity #{chosen + 1}: the answer has {len(entities)}")
    lines = []
    if header:
        lines = [f"entities ({answer.scheme}): {len(entities)}", "  " + marked_text(text, entities, color)]
        if prediction.truncated:
            lines.append("note: the text was truncated to the model's max_length; entities past it are not found")
        lines += ["  " + entity_line(index, entity) for index, entity in enumerate(entities)]
    if answer.method is not None:
        for index in range(len(entities)) if chosen is None else [chosen]:
            entity = entities[index]
            lines.append(f"{answer.method} for #{index + 1} '{entity.text}' ({entity.tag}):")
            lines.append("  " + terminal_words(explanation_words(answer.explanation(index)), color))
    return "\n".join(lines)


#: The CSS :func:`html_entities` needs, besides the page's :data:`~explain_client.words.BASE_CSS`.
ENTITY_CSS = """
.ent { padding: 2px 3px; border-radius: 3px; color: #000; text-decoration: none; }
.ent sup { font-size: 10px; margin-left: 2px; color: #333; }
.entity-row { display: none; }
.entity-row:target { display: block; }
.hint { color: #555; font-size: 13px; }
"""


def html_entities(text: str, predictions: Sequence[Prediction], anchor: str) -> str:
    """The HTML block of a token classifier's answers for one input (one per method asked): the text with each entity
    a link that shows its attribution rows, one per method (hidden until chosen; ``anchor`` makes the ids unique on
    the page). Needs the page's CSS (:data:`~explain_client.words.BASE_CSS` and :data:`ENTITY_CSS`).

    Raises:
        ValueError: if a prediction is not a token classifier's.
    """
    answers = [prediction.token_classification for prediction in predictions]
    if not answers or any(answer is None for answer in answers):
        raise ValueError("not a token classifier's answer")
    first = answers[0]
    assert first is not None
    colours = type_colours(first.entities)
    marked = []
    for run, index in _pieces(text, first.entities):
        if index is None:
            marked.append(html.escape(run))
            continue
        entity = first.entities[index]
        red, green, blue = colours[entity.label]
        title = html.escape(f"#{index + 1} {entity.tag} {entity.score:.3f}", True)
        marked.append(
            f'<a class="ent" href="#{anchor}-{index + 1}" style="background: rgb({red},{green},{blue})" '
            f'title="{title}">{html.escape(run)}<sup>{html.escape(entity.label)}</sup></a>'
        )
    parts = [f'<div class="row">{"".join(marked)}</div>']
    explained = [answer for answer in answers if answer is not None and answer.method is not None]
    if not explained:
        return "\n".join(parts)
    parts.append('<div class="hint">choose an entity to see its attribution</div>')
    for index, entity in enumerate(first.entities):
        rows = []
        for answer in explained:
            assert answer.method is not None
            label = (
                f"{html.escape(answer.method)}<br><small>for #{index + 1} '{html.escape(entity.text)}' "
                f"({html.escape(entity.tag)})</small>"
            )
            words = html_words(explanation_words(answer.explanation(index)))
            rows.append(f'<div class="row"><span class="method">{label}</span>{words}</div>')
        parts.append(f'<div class="entity-row" id="{anchor}-{index + 1}">{"".join(rows)}</div>')
    return "\n".join(parts)
