"""The HTML heatmap page, rendered by headless Chromium (Debian ``chromium``): the screenshot's pixels at each
token's box have the colour of that token's score. Token boxes come from the same page laid out by the same
browser (``--dump-dom`` after a script appended to the *end* of the body writes every token's bounding box, so the
tokens' layout is unchanged). Fails, never skips, when Chromium is missing: ``make test`` installs it."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from doors.torchserve.process import Server
from explain_client import Explanation, Prediction
from explain_client.cli import main
from explain_client.render import html_page, score_rgb

WIDTH, HEIGHT = 1100, 700
BOX_SCRIPT = """<script>
const boxes = [...document.querySelectorAll('.tok')].map(el => {
  const r = el.getBoundingClientRect();
  return {text: el.textContent, x: r.left, y: r.top, w: r.width, h: r.height};
});
const pre = document.createElement('pre'); pre.id = 'boxes'; pre.textContent = JSON.stringify(boxes);
document.body.appendChild(pre);
</script>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is missing: `make test` installs it through scripts/system_setup.py")


def run_chromium(*args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        command = [
            chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
            "--force-device-scale-factor=1", f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", *args,
        ]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=120)


def render(page: Path, tmp_path: Path) -> tuple[np.ndarray, list[dict[str, float | str]]]:
    """Screenshot of the page and the token boxes (CSS px = screenshot px at scale factor 1)."""
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", BOX_SCRIPT + "</body>"), encoding="utf-8")
    shot = tmp_path / "shot.png"
    result = run_chromium(f"--screenshot={shot}", probe.as_uri())
    assert shot.is_file(), f"no screenshot: {result.stderr[-2000:]}"
    dom = run_chromium("--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="boxes">(.*?)</pre>', dom.stdout, re.S)
    assert found, f"no boxes in the DOM dump: {dom.stderr[-2000:]}"
    boxes = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return np.asarray(Image.open(shot).convert("RGB"), dtype=int), boxes


def box_colour(pixels: np.ndarray, box: dict[str, float | str]) -> tuple[int, int, int]:
    """The most common colour inside a token's box (its background; the glyphs are a minority)."""
    x, y, w, h = (round(float(box[key])) for key in ("x", "y", "w", "h"))
    region = pixels[y + 2 : y + h - 2, x + 2 : x + w - 2].reshape(-1, 3)
    assert len(region), f"empty box {box}"
    (colour, _count), *_ = Counter(map(tuple, region.tolist())).most_common(1)
    return colour


def close(colour: tuple[int, int, int], expected: tuple[int, int, int], tolerance: int = 6) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(colour, expected, strict=True))


def test_html_token_colours_in_a_real_browser(tmp_path: Path) -> None:
    tokens = ["[CLS]", "awful", "fl", "##ight", "neutral", "lovely", "[SEP]"]
    scores = [7.0, 2.0, 0.5, 0.5, 0.0, -2.0, 7.0]  # flight = 0.5 + 0.5 = half of awful
    explanation = Explanation(
        "relevance", 0, "negative", {}, tuple(scores), tuple(tokens), (True,) + (False,) * 5 + (True,)
    )
    prediction = Prediction("negative", 0, {"negative": 0.8, "neutral": 0.15, "positive": 0.05}, False, explanation)
    page = tmp_path / "page.html"
    page.write_text(html_page([("awful flight neutral lovely", [prediction])], "test page"), encoding="utf-8")
    assert "<script" not in page.read_text() and "http" not in page.read_text().split("<body>")[0]
    pixels, boxes = render(page, tmp_path)
    assert [box["text"] for box in boxes] == ["awful", "flight", "neutral", "lovely"]
    expected = {
        "awful": score_rgb(1.0),
        "flight": score_rgb(0.5),
        "neutral": (255, 255, 255),
        "lovely": score_rgb(-1.0),
    }
    for box in boxes:
        colour = box_colour(pixels, box)
        assert close(colour, expected[str(box["text"])]), f"{box['text']}: screenshot {colour}, expected {expected}"


@pytest.mark.slow
def test_cli_html_page_from_the_server(server: Server, tmp_path: Path) -> None:
    page = tmp_path / "out.html"
    text = "the crew was rude and the flight late"
    jsonl = tmp_path / "out.jsonl"
    out = io.StringIO()
    status = main(
        [text, "--compare", "attention,relevance", "--html", str(page), "--jsonl", str(jsonl),
         "--run-dir", str(server.run_dir), "--no-progress"],
        stdout=out,
    )  # fmt: skip
    assert status == 0, out.getvalue()
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    pixels, boxes = render(page, tmp_path)
    assert [box["text"] for box in boxes] == text.split() * 2
    for record, row_boxes in zip(records, (boxes[:8], boxes[8:]), strict=True):
        explanation = record["explanation"]
        # the served tokens merged by the stated rule: every word's score is the sum of its pieces
        words: list[float] = []
        for token, score, special in zip(
            explanation["tokens"], explanation["scores"], explanation["special_tokens"], strict=True
        ):
            if special:
                continue
            if token.startswith("##"):
                words[-1] += score
            else:
                words.append(score)
        largest = max(abs(score) for score in words)
        for box, score in zip(row_boxes, words, strict=True):
            colour = box_colour(pixels, box)
            assert close(colour, score_rgb(score / largest)), f"{record['method']} {box['text']}: {colour}"
