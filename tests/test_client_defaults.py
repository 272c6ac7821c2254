"""The client and the CLI leave the method to the service when none is given (on REST and gRPC) and show which one
was used; the legend comes once, under the results, and not after an error; explain when unsure (``below``) from
the client and the CLI, against the real TorchServe."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from doors.torchserve.process import Server
from explain_client import SERVICE_DEFAULT, ExplainClient, Prediction, Request
from explain_client.cli import main
from explain_client.protos import explain_messages
from explain_client.render import PIECES_RULE

TEXT = "the crew was rude and the flight late"
#: The tiny test model is nearly uniform over its three labels (confidence about 0.34).
CONFIDENT_BELOW, UNSURE_BELOW = 0.2, 0.95


def test_the_default_method_is_left_to_the_service_on_both_encodings() -> None:
    default = Request(text=TEXT, method=SERVICE_DEFAULT)
    assert default.to_json()["explain"] == {}, "no method named: the model's default_method"
    assert Request(text=TEXT).to_json()["explain"] is False, "method=None is still a prediction only"
    assert Request(text=TEXT, method="gae", below=0.8).to_json()["explain"] == {"method": "gae", "below": 0.8}
    assert Request(text=TEXT, method=SERVICE_DEFAULT, always=True).to_json()["explain"] == {"below": None}
    messages = explain_messages()
    message = default.fill_message(messages.ExplainRequest())
    assert message.HasField("explain") and message.explain.method == ""
    assert message.explain.WhichOneof("condition") is None
    gae = Request(text=TEXT, method="gae", below=0.8)
    assert gae.fill_message(messages.ExplainRequest()).explain.below == pytest.approx(0.8)
    always = Request(text=TEXT, method=SERVICE_DEFAULT, always=True)
    assert always.fill_message(messages.ExplainRequest()).explain.always
    assert not Request(text=TEXT).fill_message(messages.ExplainRequest()).HasField("explain")
    with pytest.raises(ValueError, match="not both"):
        Request(text=TEXT, method="gae", below=0.5, always=True)
    with pytest.raises(ValueError, match=r"probability in \(0, 1\]"):
        Request(text=TEXT, method="gae", below=1.5)


def _cli(server: Server, *args: str, stdin: str = "") -> tuple[int, str]:
    out = io.StringIO()
    arguments = [*args, "--run-dir", str(server.run_dir), "--no-progress", "--color", "never"]
    return main(arguments, stdin=io.StringIO(stdin), stdout=out), out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_the_client_uses_the_models_default_and_says_so(server: Server, transport: str) -> None:
    with ExplainClient.from_run_dir(server.run_dir, transport) as client:  # type: ignore[arg-type]
        answer = client.explain("sentiment", TEXT)
        many = client.explain_many("sentiment", [TEXT, "good"])
    assert answer.explanation is not None and answer.explanation.method == "attnlrp", "the archive's default_method"
    assert answer.explained is True and answer.skipped is None and answer.below is None
    methods = [result.explanation.method for result in many if isinstance(result, Prediction) and result.explanation]
    assert methods == ["attnlrp", "attnlrp"]


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_explain_when_unsure_from_the_client(server: Server, transport: str) -> None:
    with ExplainClient.from_run_dir(server.run_dir, transport) as client:  # type: ignore[arg-type]
        confident = client.explain("sentiment", TEXT, method="gae", below=CONFIDENT_BELOW)
        unsure = client.explain("sentiment", TEXT, method="gae", below=UNSURE_BELOW)
        always = client.explain("sentiment", TEXT, method="gae")
    assert confident.explained is False and confident.explanation is None and confident.label == always.label
    assert confident.skipped is not None and confident.skipped.reason == "confident"
    assert confident.skipped.method == "gae" and "is not below 0.2" in confident.skipped.message
    assert confident.below == pytest.approx(CONFIDENT_BELOW) and confident.confidence is not None
    assert confident.confidence == pytest.approx(max(always.probabilities.values()), abs=1e-4)
    assert unsure.explained is True and unsure.explanation is not None and unsure.skipped is None
    assert always.explanation is not None
    assert unsure.explanation.scores == pytest.approx(always.explanation.scores, abs=1e-5)
    assert unsure.below == pytest.approx(UNSURE_BELOW) and always.below is None


@pytest.mark.slow
@pytest.mark.parametrize("transport", [[], ["--grpc"]], ids=["rest", "grpc"])
def test_the_cli_names_the_method_used_and_prints_the_legend_once_under_the_results(
    server: Server, transport: list[str], tmp_path: Path
) -> None:
    status, output = _cli(server, TEXT, *transport)
    assert status == 0, output
    lines = output.splitlines()
    assert lines[1].startswith("attnlrp, the model's default method (explaining "), output
    assert output.count(PIECES_RULE) == 1 and lines[-1].startswith("(") and PIECES_RULE in lines[-1]
    status, output = _cli(server, "--jsonl", str(tmp_path / "out.jsonl"), *transport, stdin=f"{TEXT}\ngood\n")
    assert status == 0 and output.count(PIECES_RULE) == 1 and PIECES_RULE in output.splitlines()[-1]
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [record["method"] for record in records] == ["attnlrp", "attnlrp"], "the method used, not an empty name"
    status, output = _cli(server, TEXT, "--method", "lime", *transport)
    assert status == 1 and "error (lime): unknown_method" in output
    assert PIECES_RULE not in output, "no legend after an error: there is nothing coloured to explain"


@pytest.mark.slow
@pytest.mark.parametrize("transport", [[], ["--grpc"]], ids=["rest", "grpc"])
def test_the_cli_explains_only_when_unsure(server: Server, transport: list[str]) -> None:
    status, output = _cli(server, TEXT, "--below", str(CONFIDENT_BELOW), *transport)
    assert status == 0, output
    assert "attnlrp: not explained: the prediction's confidence" in output and "is not below 0.2" in output
    assert PIECES_RULE not in output, "nothing was coloured"
    status, output = _cli(server, TEXT, "--below", str(UNSURE_BELOW), "--method", "rollout", *transport)
    assert status == 0 and "rollout (explaining " in output and "< 0.95" in output, output
    status, output = _cli(server, TEXT, "--always", *transport)
    assert status == 0 and "attnlrp, the model's default method" in output
