"""ExplainClient and the ``explain`` CLI on the models beyond single-label classifiers (tests/checkpoints.py, served
by the launcher as in tests/integration/test_own_models.py): a sentence pair (``text_pair=``, segment ids), a
multi-label head (``labels``, ``threshold``), a regression head (``value``) and a decoder classifier (``pooled``),
the same results over REST and gRPC."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from doors.torchserve.process import Server
from explain_client import ExplainClient, Prediction, Request
from explain_client.cli import main
from tests.integration.test_own_models import HYPOTHESIS, PREMISE, own, own_server  # noqa: F401

pytestmark = pytest.mark.slow
TRANSPORTS = ("rest", "grpc")


def _clients(server: Server) -> list[ExplainClient]:
    return [ExplainClient.from_run_dir(server.run_dir, transport) for transport in TRANSPORTS]  # type: ignore[arg-type]


def _same(rest: Prediction, grpc: Prediction) -> None:
    """REST and gRPC answers agree (gRPC carries float32 and an unordered probability map; REST rounds to 6
    significant digits; rows batched differently differ in the last digits)."""
    assert (rest.head_type, rest.label, rest.label_id, rest.labels) == (grpc.head_type, grpc.label, grpc.label_id,
                                                                        grpc.labels)  # fmt: skip
    assert dict(rest.probabilities) == pytest.approx(dict(grpc.probabilities), rel=1e-4, abs=1e-5)
    assert (rest.value is None) == (grpc.value is None)
    if rest.value is not None and grpc.value is not None:
        assert rest.value == pytest.approx(grpc.value, rel=1e-4, abs=1e-5)
    if rest.explanation is not None or grpc.explanation is not None:
        assert rest.explanation is not None and grpc.explanation is not None
        ours, theirs = rest.explanation, grpc.explanation
        assert (ours.method, ours.tokens, ours.segments, ours.pooled) == (
            theirs.method, theirs.tokens, theirs.segments, theirs.pooled
        )  # fmt: skip
        assert ours.scores == pytest.approx(theirs.scores, rel=1e-3, abs=1e-5)


def test_a_sentence_pair_over_both_transports(own_server: tuple[Server, Path, str]) -> None:  # noqa: F811
    server = own_server[0]
    answers: list[list[Any]] = []
    for client in _clients(server):
        with client:
            explained = client.explain("pairs", PREMISE, text_pair=HYPOTHESIS, method="relevance")
            single = client.explain("pairs", PREMISE, method="relevance")
            many = client.explain_many(
                "pairs", [(PREMISE, HYPOTHESIS), Request(text=PREMISE, method="relevance")], method="relevance"
            )
            answers.append([explained, single, *many])
    for rest, grpc in zip(*answers, strict=True):
        _same(rest, grpc)
    explained, single, many_pair, many_single = answers[0]
    explanation = explained.explanation
    assert explanation is not None and explanation.tokens is not None and explanation.segments is not None
    assert explanation.tokens.count("[SEP]") == 2 and set(explanation.segments) == {-1, 0, 1}
    assert [segment for segment, special in zip(explanation.segments, explanation.special_tokens or (), strict=True)
            if special] == [-1, -1, -1]  # fmt: skip
    assert single.explanation is not None and single.explanation.segments is None
    assert many_pair.explanation is not None and many_pair.explanation.scores == pytest.approx(
        explanation.scores, rel=1e-3, abs=1e-6
    )
    assert many_single.explanation is not None and many_single.explanation.scores == pytest.approx(
        single.explanation.scores, rel=1e-3, abs=1e-6
    )


def test_multi_label_regression_and_decoder_heads(own_server: tuple[Server, Path, str]) -> None:  # noqa: F811
    server = own_server[0]
    text = "the food was cold"
    answers: list[list[Prediction]] = []
    for client in _clients(server):
        with client:
            answers.append(
                [
                    client.explain("topics", text, method="rollout"),
                    client.predict("rating", text),
                    client.explain("rating", text, method="grad_x_input"),
                    client.explain("decoder", text, method="rollout"),
                ]
            )
    for rest, grpc in zip(*answers, strict=True):
        _same(rest, grpc)
    topics, rating, rating_explained, decoder = answers[0]
    assert topics.head_type == "multi_label" and topics.threshold == 0.5
    assert topics.labels == tuple(name for name, value in topics.probabilities.items() if value >= 0.5)
    assert rating.head_type == "regression" and rating.label is None and rating.label_id is None
    assert rating.value is not None and rating.probabilities == {} and rating.explanation is None
    assert rating_explained.value == pytest.approx(rating.value, abs=1e-5)
    assert decoder.explanation is not None and decoder.explanation.pooled == "last"


def test_the_cli_shows_a_pair_and_the_heads(own_server: tuple[Server, Path, str]) -> None:  # noqa: F811
    server = own_server[0]
    common = ["--run-dir", str(server.run_dir), "--color", "never", "--no-progress"]
    for transport in ([], ["--grpc"]):
        out = io.StringIO()
        status = main([PREMISE, "--text-pair", HYPOTHESIS, "--model", "pairs", *transport, *common], stdout=out)
        assert status == 0, out.getvalue()
        assert out.getvalue().startswith("label: ") and "staff[" in out.getvalue() and "quick[" in out.getvalue()
        out = io.StringIO()
        assert main(["the food was cold", "--model", "rating", "--method", "rollout", *transport, *common],
                    stdout=out) == 0  # fmt: skip
        assert out.getvalue().startswith("value: "), out.getvalue()
        out = io.StringIO()
        assert main(["the food was cold", "--model", "topics", *transport, *common], stdout=out) == 0
        assert out.getvalue().startswith("labels: ") and "(p ≥ 0.5)" in out.getvalue(), out.getvalue()
