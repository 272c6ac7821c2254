"""Real-valued method options (smoothgrad's ``stdev``) on every wire: the registry's float kind validates them and
names the range; REST JSON, the protobuf ``float_options`` maps, the OIP double parameter and FP64 per-row inputs, the
generation document (which the OpenAI door's ``explain`` extension becomes) and the client all carry them; integer
options stay integers."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
import yaml

from doors.kserve import oip
from doors.kserve.oip.classification import explained_outputs
from explain_client import Request, protos
from explain_client.cli import _options as cli_options
from explain_client.results import options_from_json
from explainers import explain
from explainers.architectures.description import describe
from explainers.errors import InvalidOptionError
from explainers.methods import SMOOTHGRAD_MAX_STDEV, SMOOTHGRAD_STDEV, Option, get_method
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.tasks.classify_schema import DecodedRow, RowOutcome, decode_row, encode_outcome
from serving_core.tasks.classify_service import ExplanationService
from serving_core.tasks.generation_schema import GenerationOutcome, decode_generation_row, fill_generation_response
from serving_core.tasks.token_schema import EntityOutcome, TokenOutcome, fill_token_response, token_outcome_to_dict
from serving_core.wire import Encoding
from tests.arch_zoo import VARIANTS, batch_for
from tests.serving_support import tiny_archives

TEXT = HandlerConfig(task="text", labels=("negative", "positive"))
GENERATION = HandlerConfig(task="generation", labels=())


def _bert() -> tuple[Any, dict[str, torch.Tensor]]:
    variant = next(variant for variant in VARIANTS if variant.name == "bert")
    model = variant.build()
    return model, batch_for(variant, model)


# ---- the registry ----------------------------------------------------------------------------------------------


def test_smoothgrad_declares_stdev_as_a_float_option_and_no_percent() -> None:
    options = {option.name: option for option in get_method("smoothgrad").options}
    assert "stdev_percent" not in options
    stdev = options["stdev"]
    assert stdev.kind == "float" and all(option.kind == "int" for name, option in options.items() if name != "stdev")
    model, _ = _bert()
    arch = describe(model)
    assert stdev.default(arch) == SMOOTHGRAD_STDEV == 0.15
    assert (stdev.minimum(arch), stdev.maximum(arch)) == (0.0, SMOOTHGRAD_MAX_STDEV)


def test_a_float_option_takes_numbers_in_range_and_names_the_range_otherwise() -> None:
    model, _ = _bert()
    arch = describe(model)
    option = Option.fixed_float("stdev", "noise", 0.15, 0.0, 1.0)
    assert option.resolve(None, arch) == 0.15
    assert option.resolve(0.25, arch) == 0.25
    resolved = option.resolve(1, arch)
    assert resolved == 1.0 and isinstance(resolved, float)
    for bad in (1.5, -0.01, float("nan"), float("inf"), True, "0.2", [0.1]):
        with pytest.raises(InvalidOptionError, match=r"\[0\.0, 1\.0\]"):
            option.resolve(bad, arch)
    integer = Option.fixed("n_samples", "copies", 4, 1, 8)
    with pytest.raises(InvalidOptionError, match=r"integer in \[1, 8\]"):
        integer.resolve(2.0, arch)
    with pytest.raises(ValueError, match="kind"):
        Option("x", "x", lambda arch: 0, lambda arch: 0, lambda arch: 1, kind="complex")


def test_smoothgrad_stdev_scales_the_noise() -> None:
    model, batch = _bert()
    plain = explain(model, batch, method="grad_x_input").scores
    still = explain(model, batch, method="smoothgrad", n_samples=2, stdev=0.0).scores
    torch.testing.assert_close(still, plain, rtol=1e-10, atol=1e-12)
    small = explain(model, batch, method="smoothgrad", n_samples=2, stdev=0.01).scores
    large = explain(model, batch, method="smoothgrad", n_samples=2, stdev=0.5).scores
    assert float((small - plain).abs().max()) < float((large - plain).abs().max())
    result = explain(model, batch, method="smoothgrad", n_samples=2, stdev=0.5)
    assert result.options["stdev"] == 0.5 and isinstance(result.options["stdev"], float)
    with pytest.raises(InvalidOptionError, match=r"\[0\.0, 10\.0\]"):
        explain(model, batch, method="smoothgrad", stdev=11.0)


# ---- the server's decoders and encoders ------------------------------------------------------------------------


def test_rest_json_and_protobuf_requests_carry_a_float_option() -> None:
    json_row = decode_row({"body": {"text": "hi", "explain": {"method": "smoothgrad", "stdev": 0.15}}}, False, TEXT)
    assert isinstance(json_row, DecodedRow) and dict(json_row.request.options) == {"stdev": 0.15}
    messages = protos.explain_messages()
    options = messages.ExplainOptions(method="smoothgrad", options={"n_samples": 3}, float_options={"stdev": 0.15})
    proto_row = decode_row({"request": messages.ExplainRequest(text="hi", explain=options).SerializeToString()},
                           False, TEXT)  # fmt: skip
    assert dict(proto_row.request.options) == {"n_samples": 3, "stdev": 0.15}
    assert isinstance(proto_row.request.options["n_samples"], int)
    twice = messages.ExplainOptions(method="smoothgrad", options={"stdev": 0}, float_options={"stdev": 0.1})
    with pytest.raises(RowError) as refused:
        decode_row({"request": messages.ExplainRequest(text="hi", explain=twice).SerializeToString()}, False, TEXT)
    assert refused.value.code == "invalid_option" and "stdev" in refused.value.message


def test_answers_give_float_options_as_numbers_in_json_and_in_float_options_in_protobuf() -> None:
    outcome = RowOutcome(Encoding.JSON, label_id=1, probabilities=[0.2, 0.8], tokens=["[CLS]", "hi", "[SEP]"],
                         method="smoothgrad", target=1, options={"n_samples": 2, "stdev": 0.15, "seed": 0},
                         scores=[0.0, 0.5, 0.0])  # fmt: skip
    document = json.loads(encode_outcome(outcome, TEXT.labels))
    assert document["explanation"]["options"] == {"n_samples": 2, "stdev": 0.15, "seed": 0}
    outcome.encoding = Encoding.PROTOBUF
    reply = protos.explain_messages().ExplainResponse.FromString(encode_outcome(outcome, TEXT.labels))
    assert dict(reply.explanation.options) == {"n_samples": 2, "seed": 0}
    assert dict(reply.explanation.float_options) == {"stdev": 0.15}
    assert protos.read_options(reply.explanation) == {"n_samples": 2, "seed": 0, "stdev": 0.15}


def test_generation_asks_carry_a_float_option_in_json_and_protobuf() -> None:
    row = decode_generation_row(
        {"body": {"prompt": "hi", "explain": {"method": "smoothgrad", "stdev": 0.2, "n_samples": 2}}}, False, GENERATION
    )
    assert row.ask is not None and dict(row.ask.options) == {"stdev": 0.2, "n_samples": 2}
    messages = protos.explain_messages()
    ask = messages.GenerationExplain(method="smoothgrad", float_options={"stdev": 0.2})
    request = messages.ExplainRequest(generation=messages.GenerationRequest(prompt="hi", explain=ask))
    decoded = decode_generation_row({"request": request.SerializeToString()}, False, GENERATION)
    assert decoded.ask is not None and dict(decoded.ask.options) == {"stdev": 0.2}


def test_oip_takes_a_double_parameter_and_fp64_rows_and_answers_fp64() -> None:
    tensors = {
        "text": oip.Tensor("text", "BYTES", (3,), ["one", "two", "three"]),
        "explain_option_stdev": oip.Tensor("explain_option_stdev", "FP64", (3,), [-1.0, 0.3, -1.0]),
    }
    rows = oip.decode_request(
        oip.OipRequest(tensors, {"explain_method": "smoothgrad", "explain_option_stdev": 0.15}), TEXT
    )
    assert [dict(row.request.options) for row in rows if isinstance(row, DecodedRow)] == [
        {"stdev": 0.15}, {"stdev": 0.3}, {"stdev": 0.15}
    ]  # fmt: skip
    with pytest.raises(RowError) as refused:
        oip.decode_request(oip.OipRequest({"text": tensors["text"]}, {"explain_option_stdev": "wide"}), TEXT)
    assert refused.value.code == "invalid_option"
    explained = RowOutcome(Encoding.JSON, label_id=1, tokens=["hi"], method="smoothgrad", target=1,
                           options={"n_samples": 2, "stdev": 0.15}, scores=[0.5])  # fmt: skip
    plain = RowOutcome(Encoding.JSON, label_id=0, tokens=["hi"])
    outputs = {tensor.name: tensor for tensor in explained_outputs([explained, plain])}
    assert outputs["explain_option_stdev"].datatype == "FP64"
    assert outputs["explain_option_stdev"].data == [0.15, -1.0]
    assert outputs["explain_option_n_samples"].datatype == "INT64"
    assert outputs["explain_option_n_samples"].data == [2, -1]


# ---- the client ------------------------------------------------------------------------------------------------


def test_the_client_sends_floats_in_float_options_and_reads_them_back() -> None:
    request = Request(text="hi", method="smoothgrad", options={"stdev": 0.15, "n_samples": 4})
    assert request.to_json()["explain"] == {"method": "smoothgrad", "stdev": 0.15, "n_samples": 4}
    message = request.fill_message(protos.explain_messages().ExplainRequest())
    assert dict(message.explain.float_options) == {"stdev": 0.15} and dict(message.explain.options) == {"n_samples": 4}
    assert options_from_json({"stdev": 0.15, "n_samples": 4}) == {"stdev": 0.15, "n_samples": 4}
    assert isinstance(options_from_json({"n_samples": 4})["n_samples"], int)
    assert cli_options(["stdev=0.15", "n_samples=4", "baseline_token_id=-1", "stdev=1e-1"]) == {
        "stdev": 0.1, "n_samples": 4, "baseline_token_id": -1
    }  # fmt: skip
    for bad in ("stdev=wide", "stdev=nan", "stdev"):
        with pytest.raises(Exception, match="option"):
            cli_options([bad])


def test_a_served_row_resolves_stdev_and_other_rows_still_answer() -> None:
    archive = tiny_archives()["sentiment"]
    config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / "model-config.yaml").read_text()))
    service = ExplanationService(config, archive / "model", torch.device("cpu"))
    raw = [
        {"body": {"text": "good food", "explain": {"method": "smoothgrad", "stdev": 0.15, "n_samples": 2}}},
        {"body": {"text": "cold food", "explain": {"method": "smoothgrad", "stdev": 20.0, "n_samples": 2}}},
        {"body": {"text": "fine", "explain": {"method": "smoothgrad", "n_samples": 2}}},
    ]
    rows = [decode_row(row, False, config) for row in raw]
    outcomes, _ = service.run(rows, [Encoding.JSON] * len(rows))
    assert outcomes[0].error is None and outcomes[0].options["stdev"] == 0.15
    assert outcomes[1].error is not None and outcomes[1].error.code == "invalid_option"
    assert "[0.0, 10.0]" in outcomes[1].error.message
    assert outcomes[2].error is None and outcomes[2].options["stdev"] == SMOOTHGRAD_STDEV
    assert all(math.isfinite(value) for value in outcomes[0].scores or [])


def test_token_and_generation_answers_split_their_options_in_protobuf() -> None:
    messages = protos.explain_messages()
    options = {"n_samples": 2, "stdev": 0.15}
    entity = EntityOutcome("Ada", "PER", "B-PER", 1, 0, 3, 1, 2, 0.9, [0.1, 0.7, 0.2])
    tokens = TokenOutcome(Encoding.PROTOBUF, tokens=["[CLS]", "ada", "[SEP]"], entities=[entity], method="smoothgrad",
                          options=options)  # fmt: skip
    response = messages.ExplainResponse()
    fill_token_response(tokens, response)
    answer = response.token_classification
    assert dict(answer.options) == {"n_samples": 2} and dict(answer.float_options) == {"stdev": 0.15}
    assert token_outcome_to_dict(tokens)["explanation"]["options"] == options
    generation = GenerationOutcome(Encoding.PROTOBUF, text="x", stop_reason="length", method="smoothgrad",
                                   options=options)  # fmt: skip
    response = messages.ExplainResponse()
    fill_generation_response(generation, response)
    assert protos.read_options(response.generation) == options
    assert isinstance(protos.read_options(response.generation)["n_samples"], int)
