"""Generated text and its explanation as pictures: the terminal (each generated token with its top context tokens;
or, for sentences, the answer with ``[1]``-style citations after each sentence and each sentence's top words and
documents), a self-contained HTML page (choose a generated token, or a sentence, to see its attribution over the
prompt and the tokens before it, and the documents it cites; a small dependency-free script inside the page) and a
PNG of the step (or sentence) × context matrix (``pictures`` extra).

Colours are those of :func:`explain_client.words.score_rgb`: a step's scores divided by their largest absolute
value, white 0, red +1 (pushed the model towards the token), blue -1.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Sequence

from .generation import Generation
from .words import ansi, normalise, score_rgb

LEGEND = (
    "Each explained token's scores are over its context (the prompt's tokens, then the tokens generated before it), "
    "divided by their largest absolute value: red +1 pushed the model towards the token, blue -1 away from it."
)
CITATION_LEGEND = (
    "A sentence's scores explain its summed log-probability; a document's score is the sum over its tokens, and a "
    "sentence cites [n] the documents scoring above 0 and at least half the best one. Words and sentences are summed "
    "over their tokens."
)


def _clean(token: str) -> str:
    """A tokenizer piece as text (byte-level BPE's Ġ and SentencePiece's ▁ mark a leading space)."""
    return token.replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\\n")


def _context(generation: Generation, count: int) -> tuple[list[str], list[bool]]:
    """The texts of the first ``count`` context units (or tokens) and which of them to leave out of top lists:
    special tokens, and the units the chat template added."""
    if generation.context is not None:
        units = generation.context[:count]
        return [unit.text for unit in units], [unit.template or unit.special for unit in units]
    tokens = [*generation.prompt_tokens, *(entry.token for entry in generation.steps)][:count]
    special = [*generation.prompt_special_tokens, *([False] * len(generation.steps))][:count]
    return tokens, special


def top_units(generation: Generation, scores: Sequence[float], top: int = 3) -> list[tuple[str, float]]:
    """The ``top`` context units (tokens, words or sentences) of some scores by absolute score, with their normalised
    scores (special tokens and template units left out)."""
    texts, hidden = _context(generation, len(scores))
    values = normalise(list(scores))
    ranked = sorted((index for index in range(len(texts)) if not hidden[index]), key=lambda index: -abs(values[index]))
    return [(_clean(texts[index]).strip() or texts[index], values[index]) for index in ranked[:top]]


def top_context(generation: Generation, step: int, top: int = 3) -> list[tuple[str, float]]:
    """The ``top`` context units of ``step`` by absolute score, with their normalised scores (special tokens and
    template units left out)."""
    entry = generation.steps[step]
    return [] if entry.scores is None else top_units(generation, entry.scores, top)


def _cells(context: Sequence[tuple[str, float]], color: bool) -> str:
    return " ".join(ansi(text, score_rgb(value)) if color else f"{text}[{value:+.2f}]" for text, value in context)


def cited_answer(generation: Generation, share: float = 0.5) -> str:
    """The answer text with ``[n]`` (1-based document numbers) after each sentence that cites documents
    (:meth:`~explain_client.generation.AnswerSpan.cited`)."""
    if not generation.sentences:
        return generation.text
    parts: list[str] = []
    cursor = 0
    for sentence in generation.sentences:
        parts.append(generation.text[cursor : sentence.end])
        parts.append("".join(f" [{document + 1}]" for document in sentence.cited(share)))
        cursor = sentence.end
    parts.append(generation.text[cursor:])
    return "".join(parts)


def _document_name(generation: Generation, index: int, width: int = 60) -> str:
    """A document as the rendered prompt holds it: its title, else the start of its text."""
    part = (generation.documents or ())[index]
    prompt = generation.rendered_prompt or ""
    if part.title_start is not None and part.title_end is not None:
        text = prompt[part.title_start : part.title_end]
    elif part.start is not None and part.end is not None:
        text = prompt[part.start : part.end]
    else:
        text = "(not located in the prompt)"
    return text if len(text) <= width else text[: width - 1] + "…"


def _terminal_sentences(generation: Generation, color: bool, top: int) -> list[str]:
    """The cited answer, then one line per sentence (or the span): its log-probability, top units and documents."""
    lines = []
    spans = list(generation.sentences or ()) or ([generation.span] if generation.span is not None else [])
    if generation.sentences is not None and generation.documents:
        lines.append(f"with citations: {cited_answer(generation)}")
    what = "each sentence" if generation.sentences is not None else "the span"
    lines.append(f"{generation.method} explaining {what} (its summed log-probability):")
    for number, span in enumerate(spans, start=1):
        line = f"  {number:>3} {span.text!r} (steps {span.steps[0]}..{span.steps[1] - 1}, log p = {span.value:.3f})"
        context = top_units(generation, span.scores, top)
        if context:
            line += "  <- " + _cells(context, color)
        lines.append(line)
        if span.documents is not None:
            ranked = ", ".join(f"[{c.document + 1}] {c.score:+.3g}" for c in span.documents)
            lines.append(f"      documents: {ranked}")
    if generation.documents:
        lines.append("documents:")
        for index in range(len(generation.documents)):
            lines.append(f"  [{index + 1}] {_document_name(generation, index)}")
    return lines


def terminal_generation(generation: Generation, color: bool = True, top: int = 3) -> str:
    """The generated text, then one line per generated token: its probability and, when explained, its ``top``
    context tokens by absolute score (coloured, or with ``[+0.42]`` numbers without colour)."""
    lines = [f"generated ({generation.stop_reason}): {generation.text}"]
    if generation.method is not None and (generation.sentences is not None or generation.span is not None):
        return "\n".join(lines + _terminal_sentences(generation, color, top))
    if generation.method is not None:
        what = "the summed log-probability" if generation.summed else "each token"
        lines.append(f"{generation.method} explaining {what}:")
    for index, step in enumerate(generation.steps):
        line = f"  {index:>3} {_clean(step.token)!r:<14} p={step.probability:.3f}"
        if step.foil_id is not None:
            line += f" vs {_clean(step.foil or '')!r}"
        context = top_context(generation, index, top)
        if context:
            line += "  <- " + _cells(context, color)
        lines.append(line)
    if generation.summed is not None and generation.sum_scores is not None:
        start, stop = generation.summed
        cells = _cells(top_units(generation, generation.sum_scores, top), color)
        lines.append(f"  sum of steps {start}..{stop - 1} (log p = {generation.sum_value:.3f}) <- " + cells)
    return "\n".join(lines)


_CSS = """
body { font-family: 'DejaVu Sans', Arial, sans-serif; margin: 24px; color: #111; background: #fff; }
h1 { font-size: 20px; } .item { border-top: 1px solid #ccc; padding: 12px 0; }
.ctx, .gen { line-height: 2.1; font-size: 18px; } .gen { margin-top: 10px; }
.tok { padding: 3px 4px; margin: 0 1px; border-radius: 3px; color: #000; background: #fff; }
.tok.template { color: #777; font-size: 14px; } .tok.answer { font-style: italic; }
.step, .sentence { cursor: pointer; border: 1px solid #999; }
.sentence { padding: 3px 4px; margin: 0 2px; border-radius: 3px; }
.step.chosen, .sentence.chosen { outline: 3px solid #222; } .step.plain { cursor: default; border-style: dashed; }
.cite { font-size: 13px; color: #333; vertical-align: super; }
.docs { margin-top: 10px; font-size: 14px; } .doc { padding: 3px 6px; margin: 3px 0; border-radius: 3px; }
.doc.cited { outline: 2px solid #222; }
.info { font-size: 14px; color: #333; margin-top: 6px; min-height: 18px; }
.note { color: #555; font-size: 12px; max-width: 900px; }
"""

# The page's script: choosing a generated token (or a sentence) colours the context units by its scores (normalised
# by the largest absolute score, white → red for +, white → blue for -; the units it cannot see stay white) and, for
# a sentence, the documents by their citation scores (the cited ones outlined).
_SCRIPT = """
(function () {
  function colour(v) {
    v = Math.max(-1, Math.min(1, v));
    var end = v >= 0 ? [214, 39, 40] : [31, 119, 180], w = Math.abs(v);
    return 'rgb(' + end.map(function (c) { return Math.round(255 * (1 - w) + c * w); }).join(',') + ')';
  }
  function paint(elements, scores) {
    var largest = 0;
    scores.forEach(function (s) { largest = Math.max(largest, Math.abs(s)); });
    elements.forEach(function (el, i) {
      var v = (i < scores.length && largest > 0) ? scores[i] / largest : 0;
      el.style.background = i < scores.length ? colour(v) : '#fff';
      el.dataset.value = i < scores.length ? v.toFixed(4) : '';
    });
  }
  document.querySelectorAll('.item').forEach(function (item) {
    var data = JSON.parse(item.querySelector('script.data').textContent);
    var context = item.querySelectorAll('.ctx .tok, .gen .tok');
    var docs = item.querySelectorAll('.doc');
    var info = item.querySelector('.info.chosen-info');
    function choose(step) {
      paint(context, data.steps[step].scores);
      context.forEach(function (el, i) { el.classList.toggle('chosen', i === data.prompt + step); });
      info.textContent = 'step ' + step + ': ' + JSON.stringify(data.steps[step].token) + ' p=' +
        data.steps[step].probability.toFixed(3);
    }
    function chooseSentence(index) {
      var sentence = data.sentences[index];
      paint(context, sentence.scores);
      var byDoc = [];
      sentence.documents.forEach(function (pair) { byDoc[pair[0]] = pair[1]; });
      paint(docs, docs.length ? Array.prototype.map.call(docs, function (el, i) { return byDoc[i] || 0; }) : []);
      docs.forEach(function (el, i) { el.classList.toggle('cited', sentence.cited.indexOf(i) >= 0); });
      item.querySelectorAll('.sentence').forEach(function (el) {
        el.classList.toggle('chosen', Number(el.dataset.sentence) === index);
      });
      info.textContent = 'sentence ' + (index + 1) + ': log p=' + sentence.value.toFixed(3) +
        (sentence.cited.length ? ', cites ' + sentence.cited.map(function (d) { return '[' + (d + 1) + ']'; })
          .join(' ') : '');
    }
    item.querySelectorAll('.step:not(.plain)').forEach(function (el) {
      el.addEventListener('click', function () { choose(Number(el.dataset.step)); });
    });
    item.querySelectorAll('.sentence').forEach(function (el) {
      el.addEventListener('click', function () { chooseSentence(Number(el.dataset.sentence)); });
    });
    if (data.sentences.length) { chooseSentence(0); } else if (data.first >= 0) { choose(data.first); }
  });
})();
"""


def _unit_spans(generation: Generation) -> tuple[list[str], list[str]]:
    """The context units as spans (class ``tok``): the prompt's (template units marked), then the answer's."""
    prompt: list[str] = []
    answer: list[str] = []
    for unit in generation.context or ():
        classes = "tok" + (" template" if unit.template or unit.special else "") + (" answer" if unit.generated else "")
        extra = f' data-doc="{unit.document}"' if unit.document is not None else ""
        extra += f' data-message="{unit.message}"' if unit.message is not None else ""
        span = f'<span class="{classes}"{extra}>{html.escape(_clean(unit.text))}</span>'
        (answer if unit.generated else prompt).append(span)
    return prompt, answer


def _item_parts(result: Generation) -> tuple[list[str], dict[str, object]]:
    """The HTML of one answer and the data its script reads."""
    parts: list[str] = []
    spans = list(result.sentences or ()) or ([result.span] if result.span is not None else [])
    units = result.context is not None and (result.granularity != "token" or bool(spans))
    if units:
        prompt, answer = _unit_spans(result)
        parts.append('<div class="ctx">' + "".join(prompt) + "".join(answer) + "</div>")
    else:
        prompt = [
            f'<span class="tok{" special" if special else ""}">{html.escape(_clean(token))}</span>'
            for token, special in zip(result.prompt_tokens, result.prompt_special_tokens, strict=True)
        ]
        parts.append('<div class="ctx">' + "".join(prompt) + "</div>")
    if spans:
        sentences = []
        for index, span in enumerate(spans):
            cited = "".join(f'<span class="cite">[{document + 1}]</span>' for document in span.cited())
            sentences.append(
                f'<span class="sentence" data-sentence="{index}" title="log p={span.value:.3f}">'
                f"{html.escape(span.text)}</span>{cited}"
            )
        parts.append('<div class="gen">' + " ".join(sentences) + "</div>")
    else:
        generated = []
        for index, step in enumerate(result.steps):
            kind = ("" if units else "tok ") + ("step" if step.explained else "step plain")
            generated.append(
                f'<span class="{kind}" data-step="{index}" title="p={step.probability:.3f}">'
                f"{html.escape(_clean(step.token))}</span>"
            )
        parts.append('<div class="gen">' + "".join(generated) + "</div>")
    if result.documents:
        documents = [
            f'<div class="doc" data-doc="{index}">[{index + 1}] {html.escape(_document_name(result, index, 200))}</div>'
            for index in range(len(result.documents))
        ]
        parts.append('<div class="docs">' + "".join(documents) + "</div>")
    parts.append('<div class="info chosen-info"></div>')
    data: dict[str, object] = {
        "prompt": -(10**9) if units else len(result.prompt_tokens),
        "first": next((index for index, step in enumerate(result.steps) if step.explained), -1),
        "steps": [
            {"token": step.token, "probability": step.probability, "scores": list(step.scores or ())}
            for step in result.steps
        ],
        "sentences": [
            {
                "scores": list(span.scores),
                "value": span.value,
                "documents": [[citation.document, citation.score] for citation in span.documents or ()],
                "cited": span.cited(),
            }
            for span in spans
        ],
    }
    return parts, data


def html_generation_page(items: Sequence[tuple[str, Generation | Exception]], title: str = "Generation") -> str:
    """A self-contained HTML page (inline CSS, one small inline script, no external resources): per prompt, its
    context (tokens, or the words or sentences asked for) and the generated tokens; choosing (clicking) an explained
    generated token colours the context by its scores. An answer explained by sentences shows them instead, each
    followed by its ``[n]`` citations, and the documents: choosing a sentence colours the context by its scores and
    the documents by their citation scores (the cited ones outlined). The first explained token (or sentence) is
    chosen when the page opens."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    cited = False
    for label, result in items:
        parts.append('<div class="item">')
        parts.append(f'<div class="info">{html.escape(label)}</div>')
        if not isinstance(result, Generation):
            parts.append(f'<div class="info">{html.escape(str(result))}</div></div>')
            continue
        body, data = _item_parts(result)
        parts.extend(body)
        cited = cited or bool(data["sentences"])
        payload = json.dumps(data).replace("</", "<\\/")
        parts.append(f'<script type="application/json" class="data">{payload}</script>')
        parts.append("</div>")
    parts.append(f'<p class="note">{html.escape(LEGEND)}</p>')
    if cited:
        parts.append(f'<p class="note">{html.escape(CITATION_LEGEND)}</p>')
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(parts)


def generation_png(generation: Generation, cell: int = 18) -> bytes:
    """The step × context matrix as a PNG: one row per generated token (or per sentence, for an answer explained by
    sentences), one column per context unit (the prompt's tokens or units, then the answer's), each explained row
    coloured by its normalised scores; what a row cannot see is grey. Needs the ``pictures`` extra (Pillow, NumPy)."""
    from PIL import Image, ImageDraw

    spans = list(generation.sentences or ()) or ([generation.span] if generation.span is not None else [])
    if generation.context is not None and (generation.granularity != "token" or spans):
        columns = [unit.text for unit in generation.context]
        prompt = sum(1 for unit in generation.context if not unit.generated)
    else:
        columns = [*generation.prompt_tokens, *(step.token for step in generation.steps)]
        prompt = len(generation.prompt_tokens)
    rows: list[tuple[str, tuple[float, ...] | None]] = (
        [(span.text, span.scores) for span in spans]
        if spans
        else [(step.token, step.scores) for step in generation.steps]
    )
    label = 110
    top = 110
    image = Image.new("RGB", (label + cell * len(columns) + 4, top + cell * len(rows) + 4), "white")
    draw = ImageDraw.Draw(image)
    for column, text in enumerate(columns):
        picture = Image.new("RGB", (top - 4, cell), "white")
        ImageDraw.Draw(picture).text((2, 2), _clean(text).strip()[:14], fill=(0, 0, 0))
        image.paste(picture.rotate(90, expand=True), (label + column * cell, 2))
    for row, (text, scores) in enumerate(rows):
        draw.text((2, top + row * cell + 3), f"{row}: {_clean(text).strip()[:12]}", fill=(0, 0, 0))
        values = normalise(list(scores)) if scores is not None else []
        for column in range(len(columns)):
            if column < len(values):
                fill = score_rgb(values[column])
            elif column < prompt + row and scores is None:
                fill = (245, 245, 245)
            else:
                fill = (200, 200, 200)
            left, upper = label + column * cell, top + row * cell
            draw.rectangle([left, upper, left + cell - 1, upper + cell - 1], fill=fill, outline=(230, 230, 230))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()
