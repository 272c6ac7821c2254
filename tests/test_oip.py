"""The OIP explain extension's pure functions (doors/kserve/oip/, doors/kserve/v1.py), without a server or the extras:
rows decoded from tensors and parameters (per-row overrides, request-level errors), outputs padded and named, failed
rows reported beside good ones, the codec registry (every task has a codec: classifiers, token classifiers,
generation)."""

from __future__ import annotations

import base64
import json

import pytest

from doors.kserve import oip, v1
from explainers import StepSum
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.registry import TASKS
from serving_core.tasks.classify_schema import DecodedRow, RowOutcome
from serving_core.tasks.generation_schema import GenerationOutcome, GenerationRow, GenerationStepOutcome
from serving_core.tasks.token_schema import EntityOutcome, TokenOutcome, token_outcome_to_dict
from serving_core.wire import Encoding
from tests.serving_support import png_bytes

TEXT = HandlerConfig(task="text", labels=("negative", "neutral", "positive"))
IMAGE = HandlerConfig(task="image", labels=("a", "b"), image_size=(16, 16))
TOKENS = HandlerConfig(task="token_classification", labels=("O", "B-PER", "I-PER"))
GENERATION = HandlerConfig(task="generation", labels=())


def request(inputs: dict[str, tuple[str, list]], **parameters: object) -> oip.OipRequest:
    tensors = {name: oip.Tensor(name, kind, (len(data),), data) for name, (kind, data) in inputs.items()}
    return oip.OipRequest(tensors, parameters)


def test_parameters_apply_to_every_row_and_per_row_inputs_override_them() -> None:
    rows = oip.decode_request(
        request({"text": ("BYTES", ["one", b"two", "three"]), "explain_method": ("BYTES", ["", "rollout", "default"]),
                 "explain_option_start_layer": ("INT64", [-1, 1, -1])},
                explain_method="gae", explain_target=2),
        TEXT,
    )  # fmt: skip
    assert all(isinstance(row, DecodedRow) for row in rows)
    asks = [(row.request.method, row.request.target, dict(row.request.options)) for row in rows]
    assert asks == [("gae", 2, {}), ("rollout", 2, {"start_layer": 1}), ("attnlrp", 2, {})]
    rows = oip.decode_request(
        request({"text": ("BYTES", ["one", "two"]), "explain_method": ("BYTES", ["rollout", ""])}, explain_target=0),
        TEXT,
    )
    assert [row.request.method for row in rows] == ["rollout", None]
    assert rows[1].request.target is None


def test_bad_rows_get_their_own_error_and_bad_requests_raise() -> None:
    rows = oip.decode_request(request({"text": ("BYTES", ["fine", "  ", b"\xff\xfe"])}, explain_method="gae"), TEXT)
    assert isinstance(rows[0], DecodedRow)
    assert [row.code for row in rows[1:]] == ["missing_text", "non_utf8"]
    for bad, code in [
        (request({"txt": ("BYTES", ["x"])}), "missing_text"),
        (request({"text": ("BYTES", ["x"]), "colour": ("BYTES", ["red"])}), "invalid_request"),
        (request({"text": ("INT64", [1])}), "invalid_request"),
        (request({"text": ("BYTES", ["x"])}, explain_colour="red"), "invalid_request"),
        (request({"text": ("BYTES", ["x"])}, explain_method="gae", explain_option_steps=True), "invalid_option"),
        (request({"text": ("BYTES", ["x"] * (oip.MAX_ROWS + 1))}), "invalid_request"),
        (request({"image": ("BYTES", ["x"])}), "unsupported_input"),
    ]:
        with pytest.raises(RowError) as refused:
            oip.decode_request(bad, TEXT)
        assert refused.value.code == code, bad
    alone = oip.decode_request(request({"text": ("BYTES", ["x"])}, explain_target=1), TEXT)  # a target, no method
    assert isinstance(alone[0], RowError) and alone[0].code == "invalid_request"


def test_images_raw_or_base64() -> None:
    image = png_bytes()
    rows = oip.decode_request(request({"image": ("BYTES", [image, base64.b64encode(image).decode(), "!!"])}), IMAGE)
    assert rows[0].image == image and rows[1].image == image
    assert isinstance(rows[2], RowError) and rows[2].code == "invalid_image"


def _outcome(tokens: list[str] | None, method: str | None = "gae", error: RowError | None = None) -> RowOutcome:
    return RowOutcome(encoding=Encoding.JSON, error=error, label_id=2, probabilities=[0.1, 0.2, 0.7],
                      method=method, target=2, tokens=tokens, special_tokens=[False] * len(tokens or []),
                      scores=[0.5] * len(tokens or []))  # fmt: skip


def test_outputs_are_padded_and_failed_rows_named() -> None:
    failed = _outcome(None, error=RowError("missing_text", "x"))
    outcomes = [_outcome(["a", "b", "c"]), _outcome(None, method=None), failed]
    outputs = {tensor.name: tensor for tensor in oip.encode_response(outcomes, TEXT)}
    assert outputs["tokens"].shape == (3, 3) and list(outputs["tokens"].data) == ["a", "b", "c"] + [""] * 6
    assert list(outputs["scores"].data) == [0.5] * 3 + [0.0] * 6
    assert list(outputs["explain_method"].data) == ["gae", "", ""] and list(outputs["label"].data)[2] == ""
    assert list(outputs["error_code"].data) == ["", "", "missing_text"]
    assert outputs["probabilities"].shape == (3, 3)
    only = {tensor.name for tensor in oip.encode_response([_outcome(None, method=None)], TEXT)}
    assert "tokens" not in only and "error_code" not in only and "explain_method" not in only
    with pytest.raises(RowError) as refused:
        oip.encode_response([_outcome(None, error=RowError("unknown_method", "no"))], TEXT)
    assert refused.value.code == "unknown_method"


def test_tensor_checks_and_registry() -> None:
    with pytest.raises(ValueError):
        oip.Tensor("x", "FP32", (2, 2), [1.0])
    with pytest.raises(ValueError):
        oip.Tensor("x", "UINT8", (1,), [1])
    with pytest.raises(ValueError):
        oip.register_codec(oip.TextCodec())
    assert set(oip.CODECS) >= {"text", "image"}


def test_v1_instances() -> None:
    rows = v1.decode_instances({"instances": ["a text", {"text": "b", "explain": {"method": "rollout"}}]}, TEXT, False)
    assert [row.request.method for row in rows] == [None, "rollout"]
    rows = v1.decode_instances(b'{"instances": ["a text"]}', TEXT, True)
    assert rows[0].request.method == "attnlrp"
    with pytest.raises(RowError):
        v1.decode_instances({"instances": "a text"}, TEXT, False)
    answer = v1.encode_predictions([_outcome(["a"]), _outcome(None, error=RowError("missing_text", "x"))],
                                   TEXT, explain=True)  # fmt: skip
    assert answer["explanations"][0]["method"] == "gae" and answer["explanations"][1] is None
    assert answer["predictions"][1]["error"]["code"] == "missing_text"


def test_every_task_has_a_codec() -> None:
    assert set(oip.CODECS) == set(TASKS)
    for name in TASKS:
        config = TOKENS if name == "token_classification" else GENERATION if name == "generation" else TEXT
        codec = oip.CODECS[name]
        assert codec.task == name
        assert codec.input_specs(config) and codec.output_specs(config, "single_label")


def test_token_classification_rows_and_outputs() -> None:
    rows = oip.decode_request(
        request({"text": ("BYTES", ["Ada met Bob", "  "])}, explain_method="default", explain_option_start_layer=1),
        TOKENS,
    )
    assert isinstance(rows[0], DecodedRow) and rows[0].text == "Ada met Bob"
    assert rows[0].request.method == "attnlrp" and dict(rows[0].request.options) == {"start_layer": 1}
    assert isinstance(rows[1], RowError) and rows[1].code == "missing_text"
    with pytest.raises(RowError) as refused:
        oip.decode_request(request({"image": ("BYTES", ["x"])}), TOKENS)
    assert refused.value.code == "unsupported_input"
    entity = EntityOutcome("Ada", "PER", "B-PER", 1, 0, 3, 1, 2, 0.9, [0.1, 0.7, 0.2])
    served = TokenOutcome(Encoding.JSON, tokens=["[CLS]", "ada", "[SEP]"], entities=[entity], method="gae")
    plain = TokenOutcome(Encoding.JSON, tokens=["[CLS]", "x", "y", "[SEP]"])
    failed = TokenOutcome(Encoding.JSON, error=RowError("missing_text", "x"))
    outputs = {tensor.name: tensor for tensor in oip.encode_response([served, plain, failed], TOKENS)}
    entities = [json.loads(value) for value in outputs["entities"].data]
    assert entities[0] == [token_outcome_to_dict(served)["entities"][0]] and entities[1:] == [[], []]
    assert entities[0][0]["scores"] == [0.1, 0.7, 0.2]
    assert outputs["tokens"].shape == (3, 4) and list(outputs["tokens"].data)[:4] == ["[CLS]", "ada", "[SEP]", ""]
    assert list(outputs["explain_method"].data) == ["gae", "", ""]
    assert list(outputs["error_code"].data) == ["", "", "missing_text"]


def test_generation_rows_carry_the_rest_request() -> None:
    rows = oip.decode_request(
        request({"prompt": ("BYTES", ["the flight", "the crew", ""])}, max_new_tokens=3, explain_method="gae",
                explain_steps="0,-1", seed=7, do_sample=True),
        GENERATION,
    )  # fmt: skip
    first = rows[0]
    assert isinstance(first, GenerationRow) and first.prompt == "the flight" and first.max_new_tokens == 3
    assert first.ask is not None and first.ask.method == "gae" and first.ask.steps == (0, -1)
    assert dict(first.sampling) == {"seed": 7, "do_sample": True}
    assert isinstance(rows[2], RowError) and rows[2].code == "missing_prompt"
    summed = oip.decode_request(request({"prompt": ("BYTES", ["x"])}, explain_method="gae", explain_steps="sum"),
                                GENERATION)[0]  # fmt: skip
    assert isinstance(summed, GenerationRow) and summed.ask is not None and summed.ask.steps == StepSum()
    given = oip.decode_request(request({"prompt": ("BYTES", ["x"]), "continuation": ("BYTES", [" was late"])}),
                               GENERATION)[0]  # fmt: skip
    assert isinstance(given, GenerationRow) and given.continuation == " was late" and given.ask is None
    for bad, code in [
        (request({"prompt": ("BYTES", ["x"])}, explain_method="gae", explain_steps="first"), "invalid_target"),
        (request({"prompt": ("BYTES", ["x"])}, max_new_tokens=10_000), "too_many_tokens"),
        (request({"text": ("BYTES", ["x"])}), "unsupported_input"),
        (request({"promptt": ("BYTES", ["x"])}), "missing_prompt"),
    ]:
        try:
            decoded = oip.decode_request(bad, GENERATION)
        except RowError as error:
            assert error.code == code, bad
        else:
            assert isinstance(decoded[0], RowError) and decoded[0].code == code, bad
    targeted = oip.decode_request(request({"prompt": ("BYTES", ["x"])}, explain_method="gae", explain_target=1),
                                  GENERATION)[0]  # fmt: skip
    assert isinstance(targeted, RowError) and targeted.code == "invalid_target"


def _generated(tokens: list[str], scores: list[list[float]] | None, method: str | None = "gae") -> GenerationOutcome:
    steps = [GenerationStepOutcome(token, index, 0.5) for index, token in enumerate(tokens)]
    for step, values in zip(steps, scores or [], strict=False):
        step.explained, step.scores = True, values
    return GenerationOutcome(Encoding.JSON, text="".join(tokens), stop_reason="length", prompt_tokens=["<s>", "hi"],
                             steps=steps, method=method)  # fmt: skip


def test_generation_outputs_are_steps_by_context() -> None:
    explained = _generated(["a", "b", "c"], [[0.1, 0.2], [0.1, 0.2, 0.3], [0.1, 0.2, 0.3, 0.4]])
    plain = _generated(["z"], None, method=None)
    outputs = {t.name: t for t in oip.encode_response([explained, plain], GENERATION)}
    assert outputs["generated_tokens"].shape == (2, 3) and list(outputs["text"].data) == ["abc", "z"]
    assert list(outputs["context_tokens"].data) == ["<s>", "hi", "a", "b", "", "", "", ""]
    assert outputs["scores"].shape == (2, 3, 4)
    assert list(outputs["scores"].data)[:12] == [0.1, 0.2, 0, 0, 0.1, 0.2, 0.3, 0, 0.1, 0.2, 0.3, 0.4]
    assert set(list(outputs["scores"].data)[12:]) == {0.0}
    assert list(outputs["explained"].data) == [True, True, True, False, False, False]
    assert list(outputs["explain_method"].data) == ["gae", ""]
    only = {t.name for t in oip.encode_response([plain], GENERATION)}
    assert only == {"text", "generated_tokens", "probabilities", "stop_reason"}
    summed = _generated(["a", "b"], None)
    summed.summed, summed.sum_scores = (0, 2), [0.5, 0.25, 0.25]
    outputs = {t.name: t for t in oip.encode_response([summed], GENERATION)}
    assert outputs["scores"].shape == (1, 1, 3) and list(outputs["scores"].data) == [0.5, 0.25, 0.25]
