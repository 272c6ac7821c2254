"""Pictures of generated text: the terminal view, the HTML page checked in headless Chromium (choosing a generated
token colours its context tokens by its scores; tokens it cannot see stay white), the PNG of the step × context
matrix, and the client's JSON/protobuf round trip of a generation answer."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
from PIL import Image

from explain_client import Generation, GenerationCall, GenerationStep
from explain_client.generation_cli import parse_steps
from explain_client.generation_render import generation_png, html_generation_page, terminal_generation
from explain_client.protos import explain_messages
from explain_client.render import normalise, score_rgb
from tests.test_cli_html import run_chromium

ANSWER = Generation(
    text=" late again",
    stop_reason="length",
    prompt_tokens=("<s>", "the", "flight", "was"),
    prompt_special_tokens=(True, False, False, False),
    steps=(
        GenerationStep("Ġlate", 11, 0.61, (0.1, 0.3, -0.9, 0.45), 3.2),
        GenerationStep("Ġagain", 12, 0.22, None),
        GenerationStep("!", 13, 0.4, (0.0, 0.2, 0.5, -0.1, 1.0, 0.3), 1.5, foil="?", foil_id=14),
    ),
    method="attnlrp",
    options={},
)

CLICK = """<script>
document.querySelector('.gen .tok[data-step="%d"]').click();
const colours = [...document.querySelectorAll('.ctx .tok, .gen .tok')].map(el => getComputedStyle(el).backgroundColor);
const pre = document.createElement('pre'); pre.id = 'colours'; pre.textContent = JSON.stringify(colours);
document.body.appendChild(pre);
</script>"""


def _colours_after_choosing(page: str, step: int, tmp_path: Path) -> list[tuple[int, ...]]:
    probe = tmp_path / f"probe{step}.html"
    probe.write_text(page.replace("</body>", (CLICK % step) + "</body>"), encoding="utf-8")
    dom = run_chromium("--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="colours">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stderr[-2000:]
    values = json.loads(found.group(1).replace("&quot;", '"'))
    return [tuple(int(part) for part in re.findall(r"\d+", value)[:3]) for value in values]


def test_choosing_a_token_colours_its_context_in_chromium(tmp_path: Path) -> None:
    page = html_generation_page([("the flight was", ANSWER)], "writer")
    assert "<script src" not in page and "http" not in page.split("<script>")[0]
    for step in (0, 2):
        colours = _colours_after_choosing(page, step, tmp_path)
        scores = ANSWER.steps[step].scores
        assert scores is not None
        expected = [score_rgb(value) for value in normalise(list(scores))]
        for got, want in zip(colours, expected, strict=False):  # JS rounds halves up, Python to even: ±1
            assert all(abs(a - b) <= 1 for a, b in zip(got, want, strict=True)), (step, got, want)
        assert all(colour == (255, 255, 255) for colour in colours[len(expected) :])  # unseen tokens stay white


def test_terminal_view_names_each_tokens_top_context() -> None:
    text = terminal_generation(ANSWER, color=False, top=2)
    assert "generated (length):  late again" in text
    assert "flight[-1.00] was[+0.50]" in text  # step 0: the two largest |scores| among non-special tokens
    assert "vs '?'" in text and "p=0.220" in text


def test_png_has_one_row_per_step(tmp_path: Path) -> None:
    image = np.asarray(Image.open(io.BytesIO(generation_png(ANSWER, cell=10))).convert("RGB"))
    top, label = 110, 110
    cell = image[top + 0 * 10 + 5, label + 2 * 10 + 5]  # step 0, context token "flight": -0.9 / 0.9 = -1 (blue)
    assert tuple(int(c) for c in cell) == score_rgb(-1.0)
    assert image.shape[0] == top + 3 * 10 + 4


def test_answers_round_trip_through_json_and_protobuf() -> None:
    assert Generation.from_dict(ANSWER.to_dict()) == ANSWER
    messages = explain_messages()
    response = messages.ExplainResponse()
    result = response.generation
    result.text, result.stop_reason, result.method = ANSWER.text, ANSWER.stop_reason, "attnlrp"
    result.prompt_tokens.extend(ANSWER.prompt_tokens)
    result.prompt_special_tokens.extend(ANSWER.prompt_special_tokens)
    for step in ANSWER.steps:
        proto = result.steps.add(token=step.token, token_id=step.token_id, probability=step.probability)
        if step.scores is not None:
            proto.explained, proto.value = True, step.value or 0.0
            proto.scores.extend(step.scores)
        if step.foil is not None:
            proto.foil, proto.foil_id = step.foil, step.foil_id or 0
    parsed = Generation.from_protobuf(messages.ExplainResponse.FromString(response.SerializeToString()))
    assert [step.token_id for step in parsed.steps] == [11, 12, 13]
    assert parsed.steps[0].scores == tuple(np.float32(v) for v in (0.1, 0.3, -0.9, 0.45))
    assert parsed.steps[2].foil_id == 14 and parsed.steps[1].scores is None


def test_requests_carry_steps_sums_and_foils() -> None:
    call = GenerationCall("p", 4, {"do_sample": True, "seed": 3}, method="rollout", steps=("sum", 1, 3), contrast=7)
    assert call.to_json()["explain"] == {"method": "rollout", "steps": {"sum": [1, 3]}, "contrast": 7}
    message = call.fill_message(explain_messages().ExplainRequest())
    assert message.generation.explain.sum and message.generation.explain.sum_stop == 3
    assert list(message.generation.explain.contrast_ids) == [7] and message.generation.sampling.seed == 3
    assert parse_steps("0,2,-1") == [0, 2, -1] and parse_steps("sum:1:") == ("sum", 1, None)
