"""The token_classification task through a real TorchServe (the tiny ``entities`` archive): entities with character
offsets over REST and gRPC, each entity's attribution equal to the in-process explain_tokens, per-row methods in one
concurrent batch, and the error table's codes."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from transformers import AutoModelForTokenClassification, AutoTokenizer

from doors.torchserve.process import Server
from explain_client import ExplainClient, Prediction, ServiceError, protos
from explainers import explain_tokens

from .test_serving import grpc_call, rest

TEXT = "john smith flew from london to paris with mary"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(archives: dict[str, Path]) -> tuple[Any, Any]:
    """The tiny entities model and its tokenizer, loaded in-process."""
    model_dir = archives["entities"] / "model"
    model = AutoModelForTokenClassification.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(str(model_dir))


def in_process(reference: tuple[Any, Any], text: str, method: str) -> Any:
    model, tokenizer = reference
    batch = tokenizer(text, return_tensors="pt", truncation=True, max_length=128, return_special_tokens_mask=True)
    return explain_tokens(model, dict(batch), method=method)


@pytest.mark.parametrize("method", ["attnlrp", "rollout", "relevance"])
def test_rest_entities_and_their_attributions_match_in_process(server: Server, reference: Any, method: str) -> None:
    status, document = rest(server, "predictions", "entities", {"text": TEXT, "explain": {"method": method}})
    assert status == 200, document
    assert document["head_type"] == "token_classification" and document["scheme"] == "BIO"
    expected = in_process(reference, TEXT, method)
    entities = document["entities"]
    assert [(e["token_start"], e["token_end"], e["label_id"]) for e in entities] == expected.spans[0]
    for number, entity in enumerate(entities):
        assert TEXT[entity["start"] : entity["end"]] == entity["text"]
        scores = torch.tensor(entity["scores"])
        reference_scores = expected.scores[0, number, : scores.shape[0]].float()
        tolerance = 1e-4 * float(reference_scores.abs().max()) + 1e-7
        torch.testing.assert_close(scores, reference_scores, atol=tolerance, rtol=0)
    assert document["explanation"]["method"] == method


def test_grpc_and_the_client_read_the_same_entities(server: Server) -> None:
    messages = protos.explain_messages()
    request = messages.ExplainRequest(text=TEXT)
    request.explain.method = "gae"
    reply = messages.ExplainResponse.FromString(grpc_call(server, "entities", {"request": request.SerializeToString()}))
    assert reply.head_type == "token_classification" and not reply.HasField("error")
    spans = [(e.start, e.end, e.tag) for e in reply.token_classification.entities]
    status, document = rest(server, "predictions", "entities", {"text": TEXT, "explain": {"method": "gae"}})
    assert status == 200 and spans == [(e["start"], e["end"], e["tag"]) for e in document["entities"]]
    transports: tuple[Literal["rest", "grpc"], ...] = ("rest", "grpc")
    for transport in transports:
        with ExplainClient.from_run_dir(server.run_dir, transport) as client:
            prediction = client.explain("entities", TEXT, method="gae")
        assert [(e.start, e.end, e.tag) for e in prediction.entities] == spans
        assert all(entity.scores is not None for entity in prediction.entities)


def test_per_row_methods_in_one_concurrent_batch(server: Server) -> None:
    documents: list[dict[str, Any]] = [
        {"text": TEXT, "explain": {"method": "attnlrp"}},
        {"text": TEXT},
        {"text": TEXT, "explain": {"method": "grad_x_input"}},
        {"text": TEXT, "explain": {"method": "no_such_method"}},
        {"text": TEXT, "explain": {"method": "integrated_gradients", "n_steps": 4}},
        {"text": "paris", "explain": {"method": "attention"}},
    ] * 2
    answers: list[tuple[int, Any]] = [(0, None)] * len(documents)

    def call(index: int) -> None:
        answers[index] = rest(server, "predictions", "entities", documents[index])

    threads = [threading.Thread(target=call, args=(index,)) for index in range(len(documents))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for document, (status, answer) in zip(documents, answers, strict=True):
        method = (document.get("explain") or {}).get("method")
        if method == "no_such_method":
            assert status == 400 and answer["error"]["code"] == "unknown_method"
            continue
        assert status == 200, answer
        assert ("explanation" in answer) == (method is not None)
        if method is not None:
            assert answer["explanation"]["method"] == method
            assert all(len(entity["scores"]) == len(answer["tokens"]) for entity in answer["entities"])


@pytest.mark.parametrize(
    ("document", "code", "status"),
    [
        ({"text": "a b", "text_pair": "c"}, "invalid_request", 400),
        ({"text": TEXT, "explain": {"method": "attention", "target": "B-PER"}}, "invalid_target", 400),
        ({"text": TEXT, "explain": {"method": "rollout", "start_layer": 99}}, "invalid_option", 400),
        ({"text": TEXT, "explain": {"method": "attention", "below": 0.5}}, "invalid_request", 400),
        ({"image": "aGk="}, "unsupported_input", 415),
        ({"text": ""}, "missing_text", 400),
    ],
)
def test_bad_input_gets_its_code(server: Server, document: Any, code: str, status: int) -> None:
    got, answer = rest(server, "predictions", "entities", document)
    assert got == status and answer["error"]["code"] == code, answer
    body = json.dumps(document).encode()
    with pytest.raises(ServiceError) as raised:  # gRPC answers OK: the row's error is in its body
        Prediction.from_dict(json.loads(grpc_call(server, "entities", {"body": body})))
    assert raised.value.code == code
