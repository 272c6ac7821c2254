"""Generated text and its explanation as pictures: the terminal (each generated token with its top context tokens),
a self-contained HTML page (choose a generated token to see its attribution over the prompt and the tokens before
it; a small dependency-free script inside the page) and a PNG of the step × context matrix (``pictures`` extra).

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


def _clean(token: str) -> str:
    """A tokenizer piece as text (byte-level BPE's Ġ and SentencePiece's ▁ mark a leading space)."""
    return token.replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\\n")


def top_context(generation: Generation, step: int, top: int = 3) -> list[tuple[str, float]]:
    """The ``top`` context tokens of ``step`` by absolute score, with their normalised scores (special tokens left
    out)."""
    entry = generation.steps[step]
    if entry.scores is None:
        return []
    tokens = generation.context_tokens(step)
    special = [*generation.prompt_special_tokens, *([False] * step)]
    values = normalise(list(entry.scores))
    ranked = sorted(
        (index for index in range(len(tokens)) if not special[index]), key=lambda index: -abs(values[index])
    )
    return [(_clean(tokens[index]).strip() or tokens[index], values[index]) for index in ranked[:top]]


def terminal_generation(generation: Generation, color: bool = True, top: int = 3) -> str:
    """The generated text, then one line per generated token: its probability and, when explained, its ``top``
    context tokens by absolute score (coloured, or with ``[+0.42]`` numbers without colour)."""
    lines = [f"generated ({generation.stop_reason}): {generation.text}"]
    if generation.method is not None:
        what = "the summed log-probability" if generation.summed else "each token"
        lines.append(f"{generation.method} explaining {what}:")
    for index, step in enumerate(generation.steps):
        line = f"  {index:>3} {_clean(step.token)!r:<14} p={step.probability:.3f}"
        if step.foil_id is not None:
            line += f" vs {_clean(step.foil or '')!r}"
        context = top_context(generation, index, top)
        if context:
            cells = [ansi(token, score_rgb(value)) if color else f"{token}[{value:+.2f}]" for token, value in context]
            line += "  <- " + " ".join(cells)
        lines.append(line)
    if generation.summed is not None and generation.sum_scores is not None:
        start, stop = generation.summed
        tokens = generation.context_tokens(min(stop, len(generation.steps)) - 1)
        values = normalise(list(generation.sum_scores))
        ranked = sorted(range(len(tokens)), key=lambda index: -abs(values[index]))[:top]
        cells = [
            ansi(_clean(tokens[i]).strip(), score_rgb(values[i]))
            if color
            else f"{_clean(tokens[i]).strip()}[{values[i]:+.2f}]"
            for i in ranked
        ]
        lines.append(f"  sum of steps {start}..{stop - 1} (log p = {generation.sum_value:.3f}) <- " + " ".join(cells))
    return "\n".join(lines)


_CSS = """
body { font-family: 'DejaVu Sans', Arial, sans-serif; margin: 24px; color: #111; background: #fff; }
h1 { font-size: 20px; } .item { border-top: 1px solid #ccc; padding: 12px 0; }
.ctx, .gen { line-height: 2.1; font-size: 18px; } .gen { margin-top: 10px; }
.tok { padding: 3px 4px; margin: 0 1px; border-radius: 3px; color: #000; background: #fff; }
.step { cursor: pointer; border: 1px solid #999; }
.step.chosen { outline: 3px solid #222; } .step.plain { cursor: default; border-style: dashed; }
.info { font-size: 14px; color: #333; margin-top: 6px; min-height: 18px; }
.note { color: #555; font-size: 12px; max-width: 900px; }
"""

# The page's script: choosing a generated token colours its context tokens by its scores (normalised by the largest
# absolute score, white → red for +, white → blue for -), and the tokens it cannot see stay white.
_SCRIPT = """
(function () {
  function colour(v) {
    v = Math.max(-1, Math.min(1, v));
    var end = v >= 0 ? [214, 39, 40] : [31, 119, 180], w = Math.abs(v);
    return 'rgb(' + end.map(function (c) { return Math.round(255 * (1 - w) + c * w); }).join(',') + ')';
  }
  document.querySelectorAll('.item').forEach(function (item) {
    var data = JSON.parse(item.querySelector('script.data').textContent);
    var context = item.querySelectorAll('.ctx .tok, .gen .tok');
    var info = item.querySelector('.info');
    function choose(step) {
      var scores = data.steps[step].scores;
      var largest = 0;
      scores.forEach(function (s) { largest = Math.max(largest, Math.abs(s)); });
      context.forEach(function (el, i) {
        var v = (i < scores.length && largest > 0) ? scores[i] / largest : 0;
        el.style.background = i < scores.length ? colour(v) : '#fff';
        el.dataset.value = i < scores.length ? v.toFixed(4) : '';
        el.classList.toggle('chosen', i === data.prompt + step);
      });
      info.textContent = 'step ' + step + ': ' + JSON.stringify(data.steps[step].token) + ' p=' +
        data.steps[step].probability.toFixed(3);
    }
    item.querySelectorAll('.step:not(.plain)').forEach(function (el) {
      el.addEventListener('click', function () { choose(Number(el.dataset.step)); });
    });
    if (data.first >= 0) { choose(data.first); }
  });
})();
"""


def html_generation_page(items: Sequence[tuple[str, Generation | Exception]], title: str = "Generation") -> str:
    """A self-contained HTML page (inline CSS, one small inline script, no external resources): per prompt, its
    tokens and the generated tokens; choosing (clicking) an explained generated token colours the context tokens by
    its scores. The first explained token is chosen when the page opens."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for label, result in items:
        parts.append('<div class="item">')
        parts.append(f'<div class="info">{html.escape(label)}</div>')
        if not isinstance(result, Generation):
            parts.append(f'<div class="info">{html.escape(str(result))}</div></div>')
            continue
        prompt = [
            f'<span class="tok{" special" if special else ""}">{html.escape(_clean(token))}</span>'
            for token, special in zip(result.prompt_tokens, result.prompt_special_tokens, strict=True)
        ]
        parts.append('<div class="ctx">' + "".join(prompt) + "</div>")
        generated = []
        for index, step in enumerate(result.steps):
            kind = "step" if step.explained else "step plain"
            generated.append(
                f'<span class="tok {kind}" data-step="{index}" title="p={step.probability:.3f}">'
                f"{html.escape(_clean(step.token))}</span>"
            )
        parts.append('<div class="gen">' + "".join(generated) + "</div>")
        parts.append('<div class="info"></div>')
        data = {
            "prompt": len(result.prompt_tokens),
            "first": next((index for index, step in enumerate(result.steps) if step.explained), -1),
            "steps": [
                {"token": step.token, "probability": step.probability, "scores": list(step.scores or ())}
                for step in result.steps
            ],
        }
        payload = json.dumps(data).replace("</", "<\\/")
        parts.append(f'<script type="application/json" class="data">{payload}</script>')
        parts.append("</div>")
    parts.append(f'<p class="note">{html.escape(LEGEND)}</p>')
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(parts)


def generation_png(generation: Generation, cell: int = 18) -> bytes:
    """The step × context matrix as a PNG: one row per generated token, one column per sequence token (prompt, then
    generated), each explained row coloured by its normalised scores; what a step cannot see is grey. Needs the
    ``pictures`` extra (Pillow, NumPy)."""
    from PIL import Image, ImageDraw

    tokens = [*generation.prompt_tokens, *(step.token for step in generation.steps)]
    rows = len(generation.steps)
    label = 110
    top = 110
    image = Image.new("RGB", (label + cell * len(tokens) + 4, top + cell * rows + 4), "white")
    draw = ImageDraw.Draw(image)
    for column, token in enumerate(tokens):
        text = Image.new("RGB", (top - 4, cell), "white")
        ImageDraw.Draw(text).text((2, 2), _clean(token).strip()[:14], fill=(0, 0, 0))
        image.paste(text.rotate(90, expand=True), (label + column * cell, 2))
    for row, step in enumerate(generation.steps):
        draw.text((2, top + row * cell + 3), f"{row}: {_clean(step.token).strip()[:12]}", fill=(0, 0, 0))
        values = normalise(list(step.scores)) if step.scores is not None else []
        for column in range(len(tokens)):
            if column < len(values):
                fill = score_rgb(values[column])
            elif column < len(generation.prompt_tokens) + row and step.scores is None:
                fill = (245, 245, 245)
            else:
                fill = (200, 200, 200)
            left, upper = label + column * cell, top + row * cell
            draw.rectangle([left, upper, left + cell - 1, upper + cell - 1], fill=fill, outline=(230, 230, 230))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()
