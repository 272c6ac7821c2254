"""The client's token-classification answers: parsing (JSON and protobuf), the terminal and the HTML renderings (the
text with its entities marked; choosing an entity shows its attribution, in a real browser for the page)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from explain_client import Entity, Prediction, TokenClassification
from explain_client.cli import _write_entities
from explain_client.entities import marked_text, terminal_entities
from explain_client.protos import explain_messages
from explain_client.render import html_page, score_rgb
from explain_client.wire import prediction_from_protobuf

from .test_cli_html import BOX_SCRIPT, box_colour, close, render, run_chromium

#: tests.test_cli_html's box script, run at the load event: the fragment's :target applies once the page has loaded.
BOX_SCRIPT_ON_LOAD = BOX_SCRIPT.replace("<script>", "<script>window.addEventListener('load', () => {").replace(
    "</script>", "});</script>"
)

TEXT = "Angela Merkel met Macron in Berlin"
TOKENS = ("[CLS]", "angela", "merkel", "met", "macron", "in", "berlin", "[SEP]")
OFFSETS = ((0, 0), (0, 6), (7, 13), (14, 17), (18, 24), (25, 27), (28, 34), (0, 0))
SPECIAL = (True, False, False, False, False, False, False, True)


def _document(explained: bool) -> dict:
    entities = [
        {"text": "Angela Merkel", "label": "PER", "tag": "B-PER", "label_id": 1, "start": 0, "end": 13,
         "token_start": 1, "token_end": 3, "score": 0.9},
        {"text": "Macron", "label": "PER", "tag": "B-PER", "label_id": 1, "start": 18, "end": 24,
         "token_start": 4, "token_end": 5, "score": 0.8},
        {"text": "Berlin", "label": "LOC", "tag": "B-LOC", "label_id": 3, "start": 28, "end": 34,
         "token_start": 6, "token_end": 7, "score": 0.7},
    ]  # fmt: skip
    scores = [
        [0.0, 1.0, 1.0, 0.0, 0.0, 0.0, -0.5, 0.0],
        [0.0, 0.0, 0.0, 0.5, 2.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0],
    ]
    document = {
        "head_type": "token_classification",
        "scheme": "BIO",
        "entities": entities,
        "tokens": list(TOKENS),
        "special_tokens": list(SPECIAL),
        "offsets": [list(offset) for offset in OFFSETS],
        "truncated": False,
    }
    if explained:
        for entity, row in zip(entities, scores, strict=True):
            entity["scores"] = row
        document["explanation"] = {"method": "attnlrp", "options": {}, "seconds": 0.01}
    return document


def test_json_answer_round_trips_and_gives_each_entity_an_explanation() -> None:
    prediction = Prediction.from_dict(_document(True))
    assert prediction.head_type == "token_classification" and prediction.label is None
    assert [entity.text for entity in prediction.entities] == ["Angela Merkel", "Macron", "Berlin"]
    assert all(TEXT[entity.start : entity.end] == entity.text for entity in prediction.entities)
    assert Prediction.from_dict(prediction.to_dict()) == prediction
    answer = prediction.token_classification
    assert answer is not None and answer.method == "attnlrp"
    explanation = answer.explanation(2)
    assert explanation.tokens == TOKENS and explanation.scores[6] == 2.0 and explanation.target_label == "B-LOC"
    unexplained = Prediction.from_dict(_document(False))
    assert unexplained.entities[0].scores is None
    with pytest.raises(ValueError, match="no attribution"):
        unexplained.token_classification.explanation(0)  # type: ignore[union-attr]


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="offsets"):
        TokenClassification("BIO", (), TOKENS, SPECIAL, OFFSETS[:-1])
    entity = Entity("x", "PER", "B-PER", 1, 0, 1, 1, 2, 0.5, (1.0,))
    with pytest.raises(ValueError, match="1 scores for 8 tokens"):
        TokenClassification("BIO", (entity,), TOKENS, SPECIAL, OFFSETS)


def test_protobuf_answer_equals_the_json_one() -> None:
    document = _document(True)
    response = explain_messages().ExplainResponse()
    response.head_type = "token_classification"
    answer = response.token_classification
    answer.scheme = "BIO"
    answer.tokens.extend(TOKENS)
    answer.special_tokens.extend(SPECIAL)
    for start, end in OFFSETS:
        answer.offsets.add(start=start, end=end)
    for entity in document["entities"]:
        answer.entities.add(**entity)
    answer.method = "attnlrp"
    answer.seconds = 0.01
    parsed = prediction_from_protobuf(explain_messages().ExplainResponse.FromString(response.SerializeToString()))
    expected = Prediction.from_dict(document)
    assert parsed.entities == expected.entities  # float32 on the wire: these scores are exact in float32
    assert parsed.token_classification is not None and parsed.token_classification.offsets == OFFSETS


def test_terminal_marks_the_entities_and_shows_the_chosen_one() -> None:
    prediction = Prediction.from_dict(_document(True))
    assert marked_text(TEXT, prediction.entities, color=False) == (
        "[Angela Merkel](#1 PER) met [Macron](#2 PER) in [Berlin](#3 LOC)"
    )
    shown = terminal_entities(prediction, TEXT, color=False, chosen=2)
    assert "attnlrp for #3 'Berlin' (B-LOC):" in shown and "#1 'Angela Merkel'" not in shown
    assert "in[+0.50] berlin[+1.00]" in shown  # pieces merged into words, normalised by the largest
    every = terminal_entities(prediction, TEXT, color=False)
    assert every.count("attnlrp for #") == 3
    out = io.StringIO()
    assert _write_entities(out, [prediction], TEXT, False, 4) == 1 and "there is no entity #4" in out.getvalue()
    coloured = terminal_entities(prediction, TEXT, color=True, chosen=0)
    assert "\x1b[48;2;" in coloured and "[#1 PER]" in coloured


def test_html_page_shows_an_entity_attribution_when_it_is_chosen(tmp_path: Path) -> None:
    prediction = Prediction.from_dict(_document(True))
    page = tmp_path / "page.html"
    page.write_text(html_page([(TEXT, [prediction])], "entities"), encoding="utf-8")
    content = page.read_text()
    assert "<script" not in content and 'href="#item1-entity-3"' in content
    pixels, boxes = render(page, tmp_path)
    visible = [box for box in boxes if float(box["w"]) > 0]
    assert visible == []  # nothing chosen: no attribution row shown
    pixels, boxes = render_fragment(page, tmp_path, "item1-entity-3")
    visible = [box for box in boxes if float(box["w"]) > 0]
    assert [box["text"] for box in visible] == ["angela", "merkel", "met", "macron", "in", "berlin"]
    expected = {"berlin": score_rgb(1.0), "in": score_rgb(0.5), "met": (255, 255, 255)}
    for box in visible:
        if box["text"] in expected:
            colour = box_colour(pixels, box)
            assert close(colour, expected[str(box["text"])]), f"{box['text']}: {colour}"


def render_fragment(page: Path, tmp_path: Path, fragment: str) -> tuple[np.ndarray, list[dict[str, float | str]]]:
    """The screenshot and token boxes of ``page`` opened at ``#fragment`` (an entity chosen), as
    :func:`tests.test_cli_html.render` takes them."""
    probe = tmp_path / "probe-fragment.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", BOX_SCRIPT_ON_LOAD + "</body>"), "utf-8")
    shot = tmp_path / "shot-fragment.png"
    uri = f"{probe.as_uri()}#{fragment}"
    result = run_chromium(f"--screenshot={shot}", uri)
    assert shot.is_file(), f"no screenshot: {result.stderr[-2000:]}"
    dom = run_chromium("--dump-dom", uri)
    found = re.search(r'<pre id="boxes">(.*?)</pre>', dom.stdout, re.S)
    assert found, f"no boxes in the DOM dump: {dom.stderr[-2000:]}"
    boxes = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return np.asarray(Image.open(shot).convert("RGB"), dtype=int), boxes
