"""Property-based fuzz (hypothesis) of the request path: no input crashes a worker or gets a 5xx.

In-process (many cases, fast): every decoder input (JSON documents of any shape, raw bytes and text, PNG-looking
bytes, protobuf bytes and well-formed ``ExplainRequest`` messages with fuzzed fields) either decodes or raises a
:class:`~serving_core.errors.RowError` with a 4xx status; decoded batches then go through the real
:class:`~serving_core.tasks.classify_service.ExplanationService` on the tiny models and every row is answered, none
with ``internal``.

Against the real TorchServe (fewer cases): fuzzed REST bodies, content types and routes, and fuzzed gRPC input maps,
get no 5xx and no failing gRPC status, and the workers are the same processes afterwards.

``FUZZ_EXAMPLES`` scales the in-process case counts (default 1); the cases tried are logged and appended to
``build/ops-figures.jsonl``.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image

from doors.torchserve.process import Server
from explain_client import protos
from explainers import available_methods
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.tasks.classify_schema import DecodedRow, decode_row, encode_outcome
from serving_core.tasks.classify_service import ExplanationService
from serving_core.wire import row_encoding
from tests.ops_support import GrpcCaller, log_figures, ops_server, worker_pids
from tests.serving_support import REPO_ROOT, b64, http_post, png_bytes, tiny_archives

SCALE = max(1, int(os.environ.get("FUZZ_EXAMPLES", "1")))
FIGURES = REPO_ROOT / "build" / "ops-figures.jsonl"
CASES: Counter[str] = Counter()

OPTION_NAMES = ("start_layer", "layer", "n_steps", "internal_batch_size")
LABELS = ("negative", "neutral", "positive")

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2, 3, 7, 1024, 1025, 2**31, 2**63]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
option_values = st.one_of(st.sampled_from([0, 1, -1, 2, 3, 4, 8, 1024, 1025, 2**40]), json_scalars)
explain_objects = st.one_of(
    st.booleans(),
    st.none(),
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "method": st.one_of(st.sampled_from(available_methods()), st.text(max_size=12), json_scalars),
            "target": st.one_of(st.sampled_from(LABELS), st.integers(-3, 12), json_scalars),
            **{name: option_values for name in OPTION_NAMES},
            "colour": json_values,
        },
    ),
)


def _png(width: int, height: int, seed: int) -> bytes:
    image = Image.new("RGB", (width, height), ((seed * 37) % 256, (seed * 91) % 256, seed % 256))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` × ``height`` pixels and whose data is one empty chunk (a bomb)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    ihdr = struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    idat_body = b"IDAT" + zlib.compress(b"\0" * 16)
    idat = struct.pack(">I", len(idat_body) - 4) + idat_body + struct.pack(">I", zlib.crc32(idat_body))
    return b"\x89PNG\r\n\x1a\n" + ihdr + idat


images = st.one_of(
    st.builds(_png, st.integers(1, 48), st.integers(1, 48), st.integers(0, 255)),
    st.binary(max_size=64).map(lambda tail: b"\x89PNG\r\n\x1a\n" + tail),
    st.binary(max_size=64).map(lambda tail: b"\xff\xd8\xff" + tail),
    st.builds(_png_header_only, st.sampled_from([1, 5000, 70000]), st.sampled_from([1, 5000, 70000])),
    st.binary(max_size=64),
)
plausible_explain = st.fixed_dictionaries(
    {"method": st.sampled_from(available_methods())},
    optional={
        "target": st.one_of(st.sampled_from(LABELS), st.integers(-1, 3)),
        "start_layer": st.integers(-1, 3),
        "layer": st.integers(-3, 3),
        "n_steps": st.integers(0, 12),
        "internal_batch_size": st.integers(0, 9),
    },
)
plausible_documents = st.one_of(
    st.fixed_dictionaries(
        {"text": st.text(min_size=1, max_size=300)},
        optional={"explain": st.one_of(st.booleans(), plausible_explain)},
    ),
    st.fixed_dictionaries(
        {"image": st.builds(_png, st.integers(1, 48), st.integers(1, 48), st.integers(0, 255)).map(b64)},
        optional={"explain": st.one_of(st.booleans(), plausible_explain)},
    ),
)
documents = st.one_of(
    plausible_documents,
    plausible_documents,
    st.fixed_dictionaries(
        {},
        optional={
            "text": st.one_of(st.text(max_size=200), json_values),
            "image": st.one_of(images.map(b64), st.text(max_size=40), json_values),
            "explain": explain_objects,
            "extra": json_values,
        },
    ),
    json_values,
)


@st.composite
def protobuf_requests(draw: st.DrawFn) -> bytes:
    """A serialized ExplainRequest with fuzzed fields (or fuzzed bytes)."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=80))
    messages = protos.explain_messages()
    request = messages.ExplainRequest()
    kind = draw(st.sampled_from(["text", "image", "none"]))
    if kind == "text":
        request.text = draw(st.text(max_size=200))
    elif kind == "image":
        request.image = draw(images)
    if draw(st.booleans()):
        explain = request.explain
        explain.method = draw(st.one_of(st.sampled_from(available_methods()), st.text(max_size=12)))
        target = draw(st.sampled_from(["label", "id", "none"]))
        if target == "label":
            explain.target_label = draw(st.one_of(st.sampled_from(LABELS), st.text(max_size=8)))
        elif target == "id":
            explain.target_id = draw(st.integers(-(2**31), 2**31 - 1))
        for name, value in draw(
            st.dictionaries(
                st.one_of(st.sampled_from(OPTION_NAMES), st.text(max_size=8)),
                st.integers(-(2**63), 2**63 - 1),
                max_size=3,
            )
        ).items():
            explain.options[name] = value
    return bytes(request.SerializeToString())


rows = st.one_of(
    documents.map(lambda document: {"body": document}),
    documents.map(lambda document: {"body": json.dumps(document).encode()}),
    documents.map(lambda document: {"body": bytearray(json.dumps(document).encode())}),
    st.binary(max_size=200).map(lambda raw: {"body": raw}),
    st.text(max_size=200).map(lambda text: {"data": text}),
    images.map(lambda raw: {"body": raw}),
    protobuf_requests().map(lambda raw: {"request": raw}),
    st.dictionaries(st.text(max_size=8), st.binary(max_size=20), max_size=2),
)


@pytest.fixture(scope="module")
def services() -> dict[str, ExplanationService]:
    """The real service on each tiny archive, in-process."""
    built = {}
    for name, archive in tiny_archives().items():
        config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / "model-config.yaml").read_text()))
        built[name] = ExplanationService(config, archive / config.model_dir, torch.device("cpu"))
    return built


@pytest.fixture(scope="module", autouse=True)
def _report_cases() -> Iterator[None]:
    yield
    if CASES:
        log_figures("fuzz_cases", dict(CASES), FIGURES)


def _decode(row: dict[str, Any], header: bool, config: HandlerConfig) -> DecodedRow | RowError:
    try:
        return decode_row(row, header, config)
    except RowError as error:
        assert error.http_status < 500, (error.code, error.message)
        return error


@pytest.mark.parametrize("model", ["sentiment", "digits"])
def test_decoders_never_crash_or_5xx(services: dict[str, ExplanationService], model: str) -> None:
    config = services[model].config

    @settings(max_examples=1000 * SCALE, deadline=None, suppress_health_check=list(HealthCheck))
    @given(row=rows, header=st.booleans())
    @example(row={"body": _png_header_only(70000, 70000)}, header=True)
    @example(
        row={"body": {"text": "hi", "explain": {"method": "integrated_gradients", "n_steps": 2**63}}}, header=False
    )
    def check(row: dict[str, Any], header: bool) -> None:
        CASES[f"decode_{model}"] += 1
        decoded = _decode(row, header, config)
        CASES[f"decode_{model}_{'valid' if isinstance(decoded, DecodedRow) else 'refused'}"] += 1
        if isinstance(decoded, DecodedRow):
            assert (decoded.text is None) != (decoded.image is None)
        assert row_encoding(row) is not None

    check()


@pytest.mark.parametrize("model", ["sentiment", "digits"])
def test_service_answers_every_fuzzed_row_without_internal_errors(
    services: dict[str, ExplanationService], model: str
) -> None:
    service = services[model]

    @settings(max_examples=100 * SCALE, deadline=None, suppress_health_check=list(HealthCheck))
    @given(batch=st.lists(st.tuples(rows, st.booleans()), min_size=1, max_size=4))
    def check(batch: list[tuple[dict[str, Any], bool]]) -> None:
        CASES[f"service_{model}"] += 1
        decoded = [_decode(row, header, service.config) for row, header in batch]
        encodings = [row_encoding(row) for row, _ in batch]
        outcomes, _ = service.run(decoded, encodings)
        assert len(outcomes) == len(batch)
        CASES[f"service_{model}_rows"] += len(batch)
        for outcome in outcomes:
            CASES[f"service_{model}_rows_{'error' if outcome.error else 'served'}"] += 1
            if outcome.error is not None:
                assert outcome.error.code != "internal" and outcome.error.http_status < 500, outcome.error.message
            assert encode_outcome(outcome, service.config.labels)

    check()


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Server:
    return ops_server(request)


_CONTENT_TYPES = ("application/json", "text/plain", "application/octet-stream", "image/png", "application/x-www-form")
_BAD_GRPC = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN}


def _reply_status(raw: bytes, encoding_protobuf: bool) -> int:
    """The row status carried in a gRPC reply body (200 when it holds no error)."""
    if encoding_protobuf:
        reply = protos.explain_messages().ExplainResponse.FromString(raw)
        return int(reply.error.http_status) if reply.HasField("error") else 200
    try:
        document = json.loads(raw)
    except ValueError:
        return 200 if raw else 500
    return int(document["error"]["http_status"]) if isinstance(document, dict) and "error" in document else 200


def test_fuzzed_requests_to_the_real_server_get_no_5xx(server: Server) -> None:
    pids = {model: worker_pids(server, model) for model in server.models}
    key = server.keys["inference"]
    caller = GrpcCaller(server)
    seen: Counter[str] = Counter()

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        model=st.sampled_from(sorted(server.models)),
        route=st.sampled_from(["predictions", "explanations"]),
        content_type=st.sampled_from(_CONTENT_TYPES),
        protocol=st.sampled_from(["rest", "grpc"]),
        row=rows,
    )
    def check(model: str, route: str, content_type: str, protocol: str, row: dict[str, Any]) -> None:
        CASES["server"] += 1
        if "request" in row:
            inputs = {"request": row["request"]}
            body = row["request"]
        else:
            raw = row.get("body", row.get("data", b""))
            body = raw if isinstance(raw, bytes | bytearray) else (raw.encode() if isinstance(raw, str) else b"")
            if isinstance(raw, dict | list) or raw is None or isinstance(raw, int | float | bool):
                body = json.dumps(raw).encode()
            inputs = {"body": bytes(body)} if row else {}
        if protocol == "rest":
            status, reply = http_post(f"{server.inference_url}/{route}/{model}", bytes(body), key, content_type)
            seen[f"rest_{status // 100}xx"] += 1
            assert status < 500, (status, reply)
            return
        try:
            raw_reply = caller.predict(model, inputs, timeout=60)
        except grpc.RpcError as error:
            seen[f"grpc_{error.code().name}"] += 1
            assert error.code() not in _BAD_GRPC, (error.code(), error.details())
            return
        status = _reply_status(raw_reply, "request" in inputs)
        seen[f"grpc_row_{status // 100}xx"] += 1
        assert status < 500, raw_reply[:300]

    try:
        check()
    finally:
        caller.close()
    log_figures("fuzz_server_outcomes", dict(seen), FIGURES)
    assert {model: worker_pids(server, model) for model in server.models} == pids, "a worker died or restarted"
    # And the service still answers correctly.
    status, reply = http_post(
        f"{server.inference_url}/predictions/digits", json.dumps({"image": b64(png_bytes())}).encode(), key
    )
    assert status == 200 and "label" in reply


def test_png_bomb_header_is_refused_not_decoded(services: dict[str, ExplanationService], tmp_path: Path) -> None:
    """A 70,000 × 70,000 header with no real data gets 413 from the service, without allocating the pixels."""
    service = services["digits"]
    decoded = decode_row({"body": _png_header_only(70000, 70000)}, True, service.config)
    outcomes, _ = service.run([decoded], [row_encoding({"body": b""})])
    assert outcomes[0].error is not None and outcomes[0].error.code == "image_too_large"
