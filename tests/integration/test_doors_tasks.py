"""Every task through every door: the token classifier and the causal LM of :func:`tests.doors_support.door_models`
served by TorchServe (REST JSON, gRPC ``ExplainRequest``), by the KServe model server and by Ray Serve replicas behind
it (OIP v2 over REST and gRPC, and KServe v1), each answer equal to the same archive folder's checkpoint explained
in-process by the library (``explain_tokens``, ``explain_generation``), and bad input answered with the error table's
codes on every door and transport. (The classification tasks: tests/integration/test_doors.py.)"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from explain_client import protos
from explainers import explain_generation, explain_tokens
from serving_core.errors import ERROR_TABLE
from tests.doors_support import DOORS, EXTRAS, TRANSPORTS, WRITER, DoorCallError, door_models, door_param, start_door
from tests.generation_checkpoint import PROMPTS
from tests.serving_support import http_post

pytestmark = pytest.mark.slow
#: Words of the tiny tokenizers' vocabularies (tests.checkpoints.WORDS): the tiny token classifier finds entities.
SENTENCE = "the service was quick and the staff were lovely"
NEW_TOKENS = 4


@pytest.fixture(params=[door_param(door) for door in DOORS])
def door(request: pytest.FixtureRequest) -> Any:
    return start_door(request, request.param)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def models(request: pytest.FixtureRequest) -> dict[str, Path]:
    return door_models(request)


def _checkpoint(archive: Path) -> Path:
    handler = yaml.safe_load((archive / "model-config.yaml").read_text())["handler"]
    return archive / handler.get("model_dir", "model")


# -- the in-process references ----------------------------------------------------------------------------------


def entities_in_process(archive: Path, text: str, method: str) -> Any:
    """The archive's token classifier explained by the library, independently of every door."""
    folder = _checkpoint(archive)
    model = AutoModelForTokenClassification.from_pretrained(str(folder), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    batch = tokenizer(text, return_tensors="pt", truncation=True, max_length=128, return_special_tokens_mask=True)
    return explain_tokens(model, dict(batch), method=method)


def generation_in_process(archive: Path, prompt: str, method: str) -> tuple[Any, Any]:
    """The archive's causal LM: greedy generation and every step explained by the library."""
    folder = _checkpoint(archive)
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return explain_generation(
        model, tokenizer([prompt], return_tensors="pt"), method=method, max_new_tokens=NEW_TOKENS
    ), tokenizer


# -- one row through each door ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Generated:
    """One generation answer, as every door gives it."""

    text: str
    tokens: list[str]
    probabilities: list[float]
    method: str | None
    step_scores: list[list[float]]  # each explained step's scores over its context (prompt, earlier tokens)


def _oip_client(door: Any, transport: str) -> Any:
    from bench.oip_client import GrpcOip, RestOip

    if transport == "rest":
        return RestOip("127.0.0.1", door.rest_port)
    return GrpcOip(f"127.0.0.1:{door.grpc_port}")


def _oip(door: Any, transport: str, model: str, inputs: list[Any], parameters: dict[str, Any]) -> Any:
    from bench.oip_client import OipCallError

    client = _oip_client(door, transport)
    try:
        return client.infer(model, inputs, parameters)
    except OipCallError as error:
        code = error.message.split("]")[0].lstrip("[") if error.message.startswith("[") else "?"
        raise DoorCallError(code, error.status, error.message) from None
    finally:
        client.close()


def _torchserve_rest(door: Any, model: str, document: dict[str, Any]) -> dict[str, Any]:
    server = door.torchserve
    status, reply = http_post(
        f"{server.inference_url}/predictions/{model}", json.dumps(document).encode(), server.keys["inference"]
    )
    if "error" in reply:
        raise DoorCallError(reply["error"]["code"], status, reply["error"]["message"])
    return dict(reply)


def _torchserve_grpc(door: Any, model: str, request: Any) -> Any:
    server = door.torchserve
    inference_pb2, inference_grpc = protos.inference_stubs()
    with grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}") as channel:
        reply = inference_grpc.InferenceAPIsServiceStub(channel).Predictions(
            inference_pb2.PredictionsRequest(model_name=model, input={"request": request.SerializeToString()}),
            metadata=[("authorization", f"Bearer {server.keys['inference']}")],
            timeout=120,
        )
    answer = protos.explain_messages().ExplainResponse.FromString(reply.prediction)
    if answer.HasField("error"):
        raise DoorCallError(answer.error.code, answer.error.grpc_code, answer.error.message)
    return answer


def call_entities(
    door: Any, transport: str, text: str, method: str | None, target: int | None = None
) -> list[dict[str, Any]]:
    """The entities a door answers for one text (each as the REST answer writes it)."""
    if door.name == "torchserve":
        if transport == "rest":
            document: dict[str, Any] = {"text": text}
            if method is not None:
                document["explain"] = {"method": method, **({"target": target} if target is not None else {})}
            return list(_torchserve_rest(door, "entities", document)["entities"])
        request = protos.explain_messages().ExplainRequest(text=text)
        if method is not None:
            request.explain.method = method
            if target is not None:
                request.explain.target_id = target
        answer = _torchserve_grpc(door, "entities", request)
        fields = ("text", "label", "tag", "label_id", "start", "end", "token_start", "token_end", "score")
        return [
            {**{name: getattr(e, name) for name in fields}, **({"scores": list(e.scores)} if e.scores else {})}
            for e in answer.token_classification.entities
        ]
    from bench.oip_client import Input

    parameters: dict[str, Any] = {}
    if method is not None:
        parameters["explain_method"] = method
    if target is not None:
        parameters["explain_target"] = target
    outputs = _oip(door, transport, "entities", [Input("text", "BYTES", [text])], parameters)
    assert outputs["tokens"][0][0] == 1
    return list(json.loads(outputs["entities"][1][0]))


def call_generation(
    door: Any, transport: str, prompt: str, method: str | None, max_new_tokens: int = NEW_TOKENS
) -> Generated:
    """One prompt generated (greedy) and, with a method, every step explained, through a door."""
    if door.name == "torchserve":
        if transport == "rest":
            document: dict[str, Any] = {"prompt": prompt, "max_new_tokens": max_new_tokens}
            if method is not None:
                document["explain"] = {"method": method}
            reply = _torchserve_rest(door, WRITER, document)
            steps = reply["steps"]
            return Generated(
                reply["text"], [s["token"] for s in steps], [s["probability"] for s in steps],
                reply.get("explanation", {}).get("method"), [s["scores"] for s in steps if "scores" in s],
            )  # fmt: skip
        request = protos.explain_messages().ExplainRequest()
        request.generation.prompt = prompt
        request.generation.max_new_tokens = max_new_tokens
        if method is not None:
            request.generation.explain.method = method
        result = _torchserve_grpc(door, WRITER, request).generation
        return Generated(
            result.text, [s.token for s in result.steps], [s.probability for s in result.steps],
            result.method or None, [list(s.scores) for s in result.steps if s.explained],
        )  # fmt: skip
    from bench.oip_client import Input

    parameters: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    if method is not None:
        parameters["explain_method"] = method
    outputs = _oip(door, transport, WRITER, [Input("prompt", "BYTES", [prompt])], parameters)
    tokens = [token for token in outputs["generated_tokens"][1] if token != ""]
    probabilities = [float(p) for p in outputs["probabilities"][1][: len(tokens)]]
    explained_method = outputs["explain_method"][1][0] if "explain_method" in outputs else ""
    step_scores: list[list[float]] = []
    if explained_method:
        (_, steps, width), scores = outputs["scores"]
        context = [token for token in outputs["context_tokens"][1] if token != ""]
        prompt_length = len(context) - (len(tokens) - 1)
        for step in range(len(tokens)):
            row = [float(v) for v in scores[step * width : (step + 1) * width]]
            assert all(v == 0.0 for v in row[prompt_length + step :]), "scores beyond a step's context must be 0"
            step_scores.append(row[: prompt_length + step])
    return Generated(outputs["text"][1][0], tokens, probabilities, explained_method or None, step_scores)


# -- the contract -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["attnlrp", "rollout", "grad_x_input"])
def test_token_classifier_every_door(door: Any, transport: str, models: dict[str, Path], method: str) -> None:
    entities = call_entities(door, transport, SENTENCE, method)
    expected = entities_in_process(models["entities"], SENTENCE, method)
    assert expected.spans[0], "the tiny token classifier finds entities in the sentence"
    assert [(e["token_start"], e["token_end"], e["label_id"]) for e in entities] == expected.spans[0]
    for number, entity in enumerate(entities):
        assert SENTENCE[entity["start"] : entity["end"]] == entity["text"]
        scores = torch.tensor(entity["scores"])
        reference = expected.scores[0, number, : scores.shape[0]].float()
        torch.testing.assert_close(scores, reference, atol=1e-4 * float(reference.abs().max()) + 1e-6, rtol=0)
    plain = call_entities(door, transport, SENTENCE, None)
    assert [(e["start"], e["end"]) for e in plain] == [(e["start"], e["end"]) for e in entities]
    assert all("scores" not in e for e in plain)


@pytest.mark.parametrize("method", ["attnlrp", "attention"])
def test_causal_lm_every_door(door: Any, transport: str, models: dict[str, Path], method: str) -> None:
    answer = call_generation(door, transport, PROMPTS[0], method)
    expected, tokenizer = generation_in_process(models[WRITER], PROMPTS[0], method)
    steps = int(expected.generated_mask[0].sum())
    ids = expected.generated[0, :steps].tolist()
    assert answer.tokens == tokenizer.convert_ids_to_tokens(ids)
    assert answer.text == tokenizer.decode(ids, skip_special_tokens=True)
    assert answer.method == method and len(answer.step_scores) == steps
    for index in range(steps):
        assert answer.probabilities[index] == pytest.approx(float(expected.probabilities[0, index]), rel=1e-4)
        reference = expected.context_scores(0, index).tolist()
        assert answer.step_scores[index] == pytest.approx(reference, rel=1e-4, abs=1e-5)
    plain = call_generation(door, transport, PROMPTS[0], None)
    assert plain.tokens == answer.tokens and plain.method is None and plain.step_scores == []


BAD = [
    ("entities", {"text": SENTENCE, "method": "lime"}, "unknown_method"),
    ("entities", {"text": SENTENCE, "method": "attnlrp", "target": 1}, "invalid_target"),
    ("entities", {"text": "   ", "method": None}, "missing_text"),
    (WRITER, {"prompt": PROMPTS[0], "method": "lime"}, "unknown_method"),
    (WRITER, {"prompt": "  ", "method": None}, "missing_prompt"),
    (WRITER, {"prompt": PROMPTS[0], "method": None, "max_new_tokens": 10_000}, "too_many_tokens"),
]


@pytest.mark.parametrize(("model", "row", "code"), BAD, ids=[f"{case[0]}-{case[2]}" for case in BAD])
def test_bad_input_gets_the_error_tables_code(door: Any, transport: str, model: str, row: dict[str, Any],
                                              code: str) -> None:  # fmt: skip
    with pytest.raises(DoorCallError) as refused:
        if model == "entities":
            call_entities(door, transport, row["text"], row["method"], row.get("target"))
        else:
            call_generation(door, transport, row["prompt"], row["method"], row.get("max_new_tokens", NEW_TOKENS))
    kind = ERROR_TABLE[code]
    assert refused.value.code == code, refused.value.message
    if door.name != "torchserve" or transport == "rest":  # TorchServe's gRPC: in the body only
        assert refused.value.status == (kind.http_status if transport == "rest" else kind.grpc_code)


@EXTRAS
@pytest.mark.parametrize("server", ["kserve", "ray"])
def test_kserve_v1_serves_every_task(request: pytest.FixtureRequest, models: dict[str, Path], server: str) -> None:
    started = start_door(request, server)
    from bench.oip_client import RestOip

    client = RestOip("127.0.0.1", started.rest_port)
    try:
        status, answer = client.request(
            "POST", "/v1/models/entities:explain", {"instances": [{"text": SENTENCE}, SENTENCE]}
        )
        assert status == 200, answer
        expected = entities_in_process(models["entities"], SENTENCE, "attnlrp")
        for prediction, explanation in zip(answer["predictions"], answer["explanations"], strict=True):
            spans = [(e["token_start"], e["token_end"], e["label_id"]) for e in prediction["entities"]]
            assert spans == expected.spans[0] and explanation["method"] == "attnlrp"
        status, answer = client.request(
            "POST", f"/v1/models/{WRITER}:predict",
            {"instances": [{"prompt": PROMPTS[0], "max_new_tokens": NEW_TOKENS, "explain": {"method": "attention"}},
                           PROMPTS[1]]},
        )  # fmt: skip
        assert status == 200, answer
        explained, plain = answer["predictions"]
        reference, _ = generation_in_process(models[WRITER], PROMPTS[0], "attention")
        steps = int(reference.generated_mask[0].sum())
        assert [s["token_id"] for s in explained["steps"]] == reference.generated[0, :steps].tolist()
        assert explained["explanation"]["method"] == "attention" and "explanation" not in plain
        status, answer = client.request("POST", f"/v1/models/{WRITER}:predict", {"instances": [{"prompt": " "}]})
        assert status == 400 and "missing_prompt" in json.dumps(answer)
    finally:
        client.close()


@EXTRAS
def test_the_kserve_door_takes_a_deadline_from_headers_metadata_and_parameters(request: pytest.FixtureRequest) -> None:
    """Every task's rows on the KServe door answer a passed deadline with ``deadline_exceeded`` whichever way it came:
    the ``Explain-Deadline-Ms`` header (REST), the same gRPC metadata, or the ``explain_deadline_ms`` parameter; a
    deadline still ahead is served."""
    import time

    from bench.oip_client import GrpcOip, Input, OipCallError, RestOip

    started = start_door(request, "kserve")
    rest, grpc_client = RestOip("127.0.0.1", started.rest_port), GrpcOip(f"127.0.0.1:{started.grpc_port}")
    inputs = {"entities": [Input("text", "BYTES", [SENTENCE])], WRITER: [Input("prompt", "BYTES", [PROMPTS[0]])]}
    explain: dict[str, dict[str, Any]] = {
        "entities": {"explain_method": "attnlrp"},
        WRITER: {"explain_method": "attnlrp", "max_new_tokens": 2},
    }
    try:
        for model in ("entities", WRITER):
            passed = str(int(time.time() * 1000) - 1000)
            ahead = int(time.time() * 1000) + 120_000
            calls: tuple[tuple[Any, dict[str, Any], dict[str, str] | None, int | str], ...] = (
                (rest, explain[model], {"Explain-Deadline-Ms": passed}, 504),
                (grpc_client, explain[model], {"explain-deadline-ms": passed}, "DEADLINE_EXCEEDED"),
                (rest, {**explain[model], "explain_deadline_ms": int(passed)}, None, 504),
                (grpc_client, {**explain[model], "explain_deadline_ms": int(passed)}, None, "DEADLINE_EXCEEDED"),
            )
            for client, parameters, headers, status in calls:
                with pytest.raises(OipCallError) as refused:
                    client.infer(model, inputs[model], parameters, headers)
                assert refused.value.status == status and "deadline_exceeded" in refused.value.message, model
            served = rest.infer(model, inputs[model], {**explain[model], "explain_deadline_ms": ahead})
            assert served["explain_method"][1] == ["attnlrp"], served
    finally:
        rest.close()
        grpc_client.close()
