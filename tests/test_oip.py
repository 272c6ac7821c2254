"""The OIP explain extension's pure functions (servers/oip.py, servers/v1.py), without a server or the extras: rows
decoded from tensors and parameters (per-row overrides, request-level errors), outputs padded and named, failed rows
reported beside good ones, the codec registry."""

from __future__ import annotations

import base64

import pytest

from handlers.config import HandlerConfig
from handlers.errors import RowError
from handlers.schema import DecodedRow, Encoding, RowOutcome
from servers import oip, v1
from tests.serving_support import png_bytes

TEXT = HandlerConfig(task="text", labels=("negative", "neutral", "positive"))
IMAGE = HandlerConfig(task="image", labels=("a", "b"), image_size=(16, 16))


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
    asks = [(row.request.method, row.request.target, dict(row.request.options)) for row in rows]  # type: ignore[union-attr]
    assert asks == [("gae", 2, {}), ("rollout", 2, {"start_layer": 1}), ("attnlrp", 2, {})]
    rows = oip.decode_request(
        request({"text": ("BYTES", ["one", "two"]), "explain_method": ("BYTES", ["rollout", ""])}, explain_target=0),
        TEXT,
    )
    assert [row.request.method for row in rows] == ["rollout", None]  # type: ignore[union-attr]
    assert rows[1].request.target is None  # type: ignore[union-attr]


def test_bad_rows_get_their_own_error_and_bad_requests_raise() -> None:
    rows = oip.decode_request(request({"text": ("BYTES", ["fine", "  ", b"\xff\xfe"])}, explain_method="gae"), TEXT)
    assert isinstance(rows[0], DecodedRow)
    assert [row.code for row in rows[1:]] == ["missing_text", "non_utf8"]  # type: ignore[union-attr]
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
    assert rows[0].image == image and rows[1].image == image  # type: ignore[union-attr]
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
    assert [row.request.method for row in rows] == [None, "rollout"]  # type: ignore[union-attr]
    rows = v1.decode_instances(b'{"instances": ["a text"]}', TEXT, True)
    assert rows[0].request.method == "attnlrp"  # type: ignore[union-attr]
    with pytest.raises(RowError):
        v1.decode_instances({"instances": "a text"}, TEXT, False)
    answer = v1.encode_predictions([_outcome(["a"]), _outcome(None, error=RowError("missing_text", "x"))],
                                   TEXT.labels, explain=True)  # fmt: skip
    assert answer["explanations"][0]["method"] == "gae" and answer["explanations"][1] is None
    assert answer["predictions"][1]["error"]["code"] == "missing_text"


def test_doors_leave_out_models_of_tasks_without_a_codec() -> None:
    from servers.launcher import servable
    from tests.serving_support import tiny_archives

    archives = tiny_archives()
    assert set(servable(archives)) == {name for name in archives if name in ("sentiment", "digits")}
    token_only = {name: path for name, path in archives.items() if name not in ("sentiment", "digits")}
    if token_only:
        with pytest.raises(RuntimeError, match="has a task"):
            servable(token_only)
