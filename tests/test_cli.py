"""The ``explain`` CLI and the renderers: the sub-word merge rule, terminal colours, the side-by-side comparison,
and the CLI against a real TorchServe (text, --compare, --grpc, many inputs from a file/stdin, --jsonl, --png)."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from doors.torchserve.process import Server
from explain_client import Explanation, Prediction
from explain_client.cli import build_parser, join_dash_values, main, make_client
from explain_client.pictures import overlay_image
from explain_client.render import (
    NEGATIVE_RGB,
    POSITIVE_RGB,
    merge_pieces,
    normalise,
    score_rgb,
    terminal_compare,
    terminal_prediction,
)
from tests.serving_support import png_bytes

TEXT = "the crew was rude and the flight late"
ANSI_BACKGROUND = re.compile(r"\x1b\[48;2;(\d+);(\d+);(\d+)m\x1b\[38;2;0;0;0m([^\x1b]*)\x1b\[0m")


def text_prediction(tokens: list[str], scores: list[float], method: str = "relevance") -> Prediction:
    special = [token in ("[CLS]", "[SEP]", "<s>", "</s>") for token in tokens]
    explanation = Explanation(method, 0, "negative", {}, tuple(scores), tuple(tokens), tuple(special))
    return Prediction("negative", 0, {"negative": 0.7, "neutral": 0.2, "positive": 0.1}, False, explanation)


def test_wordpiece_pieces_are_merged_and_scores_summed() -> None:
    tokens = ["[CLS]", "the", "fl", "##ig", "##ht", "was", "un", "##bear", "##able", "!", "[SEP]"]
    scores = [5.0, 0.1, 0.2, 0.3, 0.4, 0.0, -0.1, 0.5, 0.1, 0.05, 3.0]
    words = merge_pieces(tokens, scores, [True] + [False] * 9 + [True])
    assert [word.text for word in words] == ["the", "flight", "was", "unbearable", "!"]
    assert [word.score for word in words] == pytest.approx([0.1, 0.9, 0.0, 0.5, 0.05])
    assert words[1].pieces == ("fl", "##ig", "##ht")


def test_word_start_marked_pieces_are_merged() -> None:
    tokens = ["<s>", "The", "Ġfl", "ight", "Ġwas", "Ġlate", "</s>"]
    words = merge_pieces(tokens, [9, 1, 2, 3, 4, 5, 9], [True, False, False, False, False, False, True])
    assert [(word.text, word.score) for word in words] == [("The", 1), ("flight", 5), ("was", 4), ("late", 5)]
    words = merge_pieces(["▁un", "believ", "able", "▁day"], [1, 1, 1, 2])
    assert [(word.text, word.score) for word in words] == [("unbelievable", 3), ("day", 2)]
    with pytest.raises(ValueError):
        merge_pieces(["a"], [1.0, 2.0])


def test_colours_and_normalisation() -> None:
    assert normalise([0.5, -1.0, 2.0]) == [0.25, -0.5, 1.0]
    assert normalise([0.0, 0.0]) == [0.0, 0.0]
    assert score_rgb(0.0) == (255, 255, 255)
    assert score_rgb(1.0) == POSITIVE_RGB and score_rgb(-1.0) == NEGATIVE_RGB
    assert score_rgb(5.0) == POSITIVE_RGB
    red, green, blue = score_rgb(0.5)
    assert red > green and red > blue and (green, blue) == (round((255 + 39) / 2), round((255 + 40) / 2))


def test_terminal_colours_follow_the_scores() -> None:
    prediction = text_prediction(["[CLS]", "rude", "crew", "fine", "[SEP]"], [9.0, 2.0, 1.0, -2.0, 9.0])
    rendered = terminal_prediction(prediction, color=True)
    assert "label: negative" in rendered and "negative 0.700" in rendered
    cells = {text: (int(r), int(g), int(b)) for r, g, b, text in ANSI_BACKGROUND.findall(rendered)}
    assert cells == {"rude": POSITIVE_RGB, "crew": score_rgb(0.5), "fine": NEGATIVE_RGB}
    plain = terminal_prediction(prediction, color=False)
    assert "rude[+1.00] crew[+0.50] fine[-1.00]" in plain and "\x1b" not in plain and "[CLS]" not in plain


def test_compare_is_side_by_side() -> None:
    tokens = ["[CLS]", "rude", "crew", "[SEP]"]
    predictions = [
        text_prediction(tokens, [0, 1.0, 0.0, 0], "attention"),
        text_prediction(tokens, [0, 0.0, 3.0, 0], "relevance"),
    ]
    table = terminal_compare(predictions, color=False).splitlines()
    header = next(line for line in table if line.startswith("word"))
    assert header.index("attention") < header.index("relevance")
    rude = next(line for line in table if line.startswith("rude"))
    crew = next(line for line in table if line.startswith("crew"))
    assert re.findall(r"[+-]\d\.\d\d", rude) == ["+1.00", "+0.00"]
    assert re.findall(r"[+-]\d\.\d\d", crew) == ["+0.00", "+1.00"]
    with pytest.raises(ValueError, match="same tokens"):
        terminal_compare([predictions[0], text_prediction(["[CLS]", "other", "[SEP]"], [0, 1, 0])], color=False)


def test_overlay_puts_the_heat_on_the_relevant_patch() -> None:
    scores = [0.0] * 16
    scores[4 * 1 + 2] = 1.0  # row 1, column 2 of a 4x4 grid
    explanation = Explanation("relevance", 3, "3", {}, tuple(scores), grid=(4, 4))
    grey = Image.new("L", (8, 8), 128)
    buffer = io.BytesIO()
    grey.save(buffer, "PNG")
    overlay = np.asarray(overlay_image(buffer.getvalue(), explanation, side=64), dtype=int)
    assert overlay.shape == (64, 64, 3)
    hot = overlay[16 + 8, 32 + 8]  # centre of patch (1, 2)
    cold = overlay[48 + 8, 8]
    assert hot[0] - hot[2] > 60 and abs(int(cold[0]) - int(cold[2])) < 5


# ------------------------------------------------------------------------------------------------ against a server


def run_cli(server: Server, *args: str, stdin: str = "") -> tuple[int, str]:
    out = io.StringIO()
    status = main([*args, "--run-dir", str(server.run_dir), "--no-progress"], stdin=io.StringIO(stdin), stdout=out)
    return status, out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("transport", [[], ["--grpc"]], ids=["rest", "grpc"])
def test_cli_prints_label_probabilities_and_coloured_words(server: Server, transport: list[str]) -> None:
    status, output = run_cli(server, TEXT, "--method", "relevance", "--color", "always", *transport)
    assert status == 0, output
    label_line = output.splitlines()[0]
    assert re.match(r"label: (negative|neutral|positive) +\((\w+ \d\.\d{3} *){3}\)", label_line), label_line
    cells = ANSI_BACKGROUND.findall(output)
    assert [cell[3] for cell in cells] == TEXT.split()  # tiny vocab pieces merged back into the words
    assert max(int(cell[0]) - int(cell[2]) for cell in cells) > 100  # the top word is strongly red
    assert "sum of its pieces' scores" in output and "Colour = score" in output


@pytest.mark.slow
def test_cli_compare_and_errors(server: Server) -> None:
    status, output = run_cli(server, TEXT, "--compare", "attention,rollout,relevance", "--color", "never")
    assert status == 0, output
    header = next(line for line in output.splitlines() if line.startswith("word"))
    assert [name for name in header.split("|")[1:]] and all(
        name in header for name in ("attention", "rollout", "relevance")
    )
    for word in TEXT.split():
        assert any(line.startswith(word) and line.count("|") == 3 for line in output.splitlines())
    assert "Colour" not in output and "score / max |word score|" in output  # no colour legend without colours
    status, output = run_cli(server, TEXT, "--method", "lime")
    assert status == 1 and "error (lime): unknown_method" in output


@pytest.mark.slow
def test_cli_many_inputs_from_stdin_and_file(server: Server, tmp_path: Path) -> None:
    lines = [TEXT, json.dumps({"text": "what a lovely day"}), "", "thanks for nothing"]
    status, output = run_cli(
        server, "--method", "rollout", "--jsonl", str(tmp_path / "out.jsonl"), stdin="\n".join(lines)
    )
    assert status == 0, output
    assert output.count("\n== ") == 3 and output.count("label: ") == 3
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [record["input"] for record in records] == [TEXT, "what a lovely day", "thanks for nothing"]
    assert all(record["explanation"]["method"] == "rollout" for record in records)
    source = tmp_path / "inputs.txt"
    source.write_text("\n".join(lines))
    status, from_file = run_cli(server, "--input", str(source), "--method", "rollout", "--grpc")
    assert status == 0 and from_file.count("label: ") == 3


@pytest.mark.slow
def test_cli_png_for_an_image(server: Server, tmp_path: Path) -> None:
    image = tmp_path / "digit.png"
    image.write_bytes(png_bytes((32, 32), seed=3))
    out = tmp_path / "out.png"
    status, output = run_cli(
        server, "--model", "digits", "--image", str(image), "--compare", "rollout,relevance", "--png", str(out)
    )
    assert status == 0, output
    panel = Image.open(out)
    assert panel.width > 3 * 256 and panel.height > 256  # input + two overlays of 256 px
    assert "rollout:" in output and "relevance:" in output


@pytest.mark.slow
def test_console_script_is_installed(server: Server) -> None:
    script = shutil.which("explain", path=str(Path(sys.executable).parent))
    assert script is not None, "the `explain` console script is not installed: pip install -e ./explain_client"
    result = subprocess.run(
        [script, TEXT, "--run-dir", str(server.run_dir), "--color", "never"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("label: ") and "rude[" in result.stdout


def test_usage_errors_exit_2(tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["x", "--option", "start_layer"], stdin=io.StringIO(""))
    assert caught.value.code == 2
    with pytest.raises(SystemExit) as caught:
        main(["--url", "http://127.0.0.1:9"], stdin=io.StringIO(""))
    assert caught.value.code == 2 and "no input" in capsys.readouterr().err


def test_html_page_embeds_image_overlays_and_errors() -> None:
    from explain_client import ServiceError
    from explain_client.render import html_page

    explanation = Explanation("rollout", 3, "3", {}, tuple(float(i) for i in range(16)), grid=(4, 4))
    prediction = Prediction("3", 3, {"3": 0.9, "5": 0.1}, False, explanation)
    page = html_page([("digit.png", [prediction, ServiceError("unknown_method", "no such method: lime")])],
                     images=[png_bytes((8, 8))])  # fmt: skip
    uri = re.search(r'src="data:image/png;base64,([^"]+)"', page)
    assert uri is not None and "unknown_method: no such method: lime" in page
    overlay = Image.open(io.BytesIO(base64.b64decode(uri.group(1))))
    assert overlay.size == (256, 256)


def test_a_token_that_begins_with_a_dash_is_a_value() -> None:
    parser = build_parser()
    assert join_dash_values(["x", "--token", "-UzNKxHY", "--grpc"], parser) == ["x", "--token=-UzNKxHY", "--grpc"]
    assert parser.parse_args(join_dash_values(["--token", "-UzNKxHY"], parser)).token == "-UzNKxHY"
    assert parser.parse_args(["--token=-UzNKxHY"]).token == "-UzNKxHY"  # the form that always works
    # A following option stays an option (also abbreviated), so a forgotten key is still a usage error.
    assert join_dash_values(["--token", "--grpc"], parser) == ["--token", "--grpc"]
    assert join_dash_values(["--token", "--gr"], parser) == ["--token", "--gr"]
    assert join_dash_values(["--token", "--", "x"], parser) == ["--token", "--", "x"]


def _write_run_dir(run_dir: Path, key: str) -> None:
    run_dir.mkdir()
    (run_dir / "key_file.json").write_text(json.dumps({"inference": {"key": key}, "management": {"key": "m"}}))


@pytest.mark.parametrize("transport", [[], ["--grpc"]], ids=["rest", "grpc"])
def test_an_explicit_address_uses_the_run_folders_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transport: list[str]
) -> None:
    monkeypatch.delenv("EXPLAIN_TOKEN", raising=False)
    monkeypatch.delenv("EXPLAIN_TOKEN_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    address = ["--url", "http://127.0.0.1:9"] if not transport else ["--grpc", "--grpc-address", "127.0.0.1:9"]
    parser = build_parser()
    with make_client(parser.parse_args(["x", *address])) as client:
        assert client._backend.token is None  # no run folder here: nothing to send
    _write_run_dir(tmp_path / "run", "-UzNKxHY")
    with make_client(parser.parse_args(["x", *address])) as client:
        assert client._backend.token == "-UzNKxHY"  # ./run's key, for an explicit address too
    _write_run_dir(tmp_path / "other", "other-key")
    with make_client(parser.parse_args(["x", *address, "--run-dir", "other"])) as client:
        assert client._backend.token == "other-key"
    arguments = join_dash_values(["x", *address, "--token", "-given"], parser)
    with make_client(parser.parse_args(arguments)) as client:
        assert client._backend.token == "-given"  # a token given wins over the run folder's
    monkeypatch.setenv("EXPLAIN_TOKEN", "from-env")
    with make_client(parser.parse_args(["x", *address])) as client:
        assert client._backend.token == "from-env"


@pytest.mark.slow
def test_cli_without_a_token_says_none_was_sent_and_where_to_get_one(server: Server, tmp_path: Path) -> None:
    out = io.StringIO()
    status = main([TEXT, "--url", server.inference_url, "--no-progress", "--run-dir", str(tmp_path)], stdout=out)
    assert status == 1
    assert "no token was sent" in out.getvalue() and "key_file.json" in out.getvalue(), out.getvalue()
    key = server.keys["inference"]
    out = io.StringIO()
    status = main([TEXT, "--url", server.inference_url, "--no-progress", "--token", key], stdout=out)
    assert status == 0, out.getvalue()
