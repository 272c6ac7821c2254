"""The three doors for the contract tests: TorchServe, the KServe model server and Ray Serve (behind the KServe door),
each serving the same archive folders (the tiny ``sentiment`` and ``digits`` archives and the packages of the tiny
own checkpoints of :mod:`tests.checkpoints` — classifiers, a token classifier — and of
:mod:`tests.generation_checkpoint`'s causal LM: every task), started once per test session on free loopback ports the
first time a test asks for that door, and stopped by their pids when the session ends, also when tests fail.

Each door is called through a :class:`DoorClient` for one transport that sends one row and returns an
:class:`Answer` in one shape, so a test asserts the same thing on every door. The KServe and Ray doors need the
``kserve`` and ``ray`` extras: where they are not installed their tests are skipped with one message (:data:`EXTRAS`).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from doors.torchserve.config import Ports
from doors.torchserve.process import Server
from doors.torchserve.process import start as start_torchserve
from doors.torchserve.process import stop as stop_torchserve
from explain_client import protos
from tests import checkpoints
from tests.generation_checkpoint import causal_lm
from tests.serving_support import REPO_ROOT, http_post, tiny_archives

DOORS = ("torchserve", "kserve", "ray")
TRANSPORTS = ("rest", "grpc")
#: The own checkpoints the doors serve besides sentiment and digits (``entities``: a token classifier).
OWN = ("pairs", "topics", "rating", "decoder", "entities")
#: The causal LM the doors serve (the generation task).
WRITER = "writer"
EXTRAS_LOG = REPO_ROOT / "build" / "extras.log"


def missing_extras() -> str | None:
    """Why the KServe/Ray doors cannot run here (``None``: they can)."""
    missing = [name for name in ("kserve", "ray") if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (
        f"the {' and '.join(missing)} extra(s) are not installed, so the KServe and Ray Serve doors are not tested "
        f"(`make extras` installs them; its log: {EXTRAS_LOG})"
    )


#: Skip marker of the tests that need the kserve and ray extras (one message, the same everywhere).
EXTRAS = pytest.mark.skipif(missing_extras() is not None, reason=missing_extras() or "")


def door_param(door: str) -> Any:
    """A ``pytest.param`` of the door, skipped with :data:`EXTRAS`'s message when it needs the extras."""
    return pytest.param(door, marks=[] if door == "torchserve" else [EXTRAS], id=door)


@dataclass(frozen=True)
class Answer:
    """One row's answer, as every door gives it."""

    label_id: int
    probabilities: list[float]
    value: float | None = None
    predicted: list[int] | None = None
    method: str | None = None
    target: int = -1
    tokens: list[str] | None = None
    scores: list[float] | None = None
    grid: tuple[int, int] | None = None
    segments: list[int] | None = None


class DoorCallError(Exception):
    """An error answer: the error table's code and the status the transport carried (HTTP status or gRPC code)."""

    def __init__(self, code: str, status: int | str, message: str) -> None:
        """Create the error."""
        super().__init__(f"{code} ({status}): {message}")
        self.code, self.status, self.message = code, status, message


@dataclass
class Started:
    """A running door: its REST/gRPC addresses and how it is stopped."""

    name: str
    rest_port: int
    grpc_port: int
    labels: Mapping[str, tuple[str, ...]]
    torchserve: Server | None = None
    pid: int = 0


_DOORS: dict[str, Started] = {}
_STOPS: dict[str, Any] = {}
_LOCK = threading.Lock()


def stop_doors() -> None:
    """Stop every door started so far (the last module that uses them calls it, so that the servers do not take the
    machine's memory and CPU from the tests after them; the session's clean-up calls it too)."""
    with _LOCK:
        stops = list(_STOPS.values())
        _STOPS.clear()
        _DOORS.clear()
    for stop in stops:
        stop()


def _packaged_own(store: Path) -> dict[str, Path]:
    from model_store.package import package, validate

    folders = store / "checkpoints"
    archives: dict[str, Path] = {}
    builders = {**{name: checkpoints.BUILDERS[name] for name in OWN}, WRITER: causal_lm}
    for name, build in builders.items():
        folder = build(folders / name)
        result = package(folder, name, store / "packages", None, validate(folder, name))
        archives[name] = result.archive
    return archives


def door_models(request: pytest.FixtureRequest) -> dict[str, Path]:
    """The archive folders every door serves (built once per session)."""
    with _LOCK:
        cached = request.config.stash.get(_MODELS_KEY, None)
        if cached is not None:
            return cached
        store = request.getfixturevalue("tmp_path_factory").mktemp("door-models")
        tiny = tiny_archives()
        models = {"sentiment": tiny["sentiment"], "digits": tiny["digits"], **_packaged_own(store)}
        request.config.stash[_MODELS_KEY] = models
        return models


_MODELS_KEY = pytest.StashKey[dict[str, Path]]()


def _labels(models: Mapping[str, Path]) -> dict[str, tuple[str, ...]]:
    import yaml

    return {
        name: tuple(yaml.safe_load((path / "model-config.yaml").read_text())["handler"].get("labels", []))
        for name, path in models.items()
    }


def _quiet(stop: Any, run_dir: Path) -> None:
    stop(run_dir)


def start_door(request: pytest.FixtureRequest, name: str) -> Started:
    """The door ``name`` serving :func:`door_models` (started on first use; stopped at the end of the session)."""
    with _LOCK:
        if name in _DOORS:
            return _DOORS[name]
    models = door_models(request)
    run_dir = request.getfixturevalue("tmp_path_factory").mktemp(f"door-{name}")
    ports = Ports.free()
    if name == "torchserve":
        store = REPO_ROOT
        relative = {model: str(path.resolve()) for model, path in models.items()}
        server = start_torchserve(run_dir, store, relative, ports, timeout=300)
        started = Started(name, ports.inference, ports.grpc_inference, _labels(models), torchserve=server)
        _STOPS[name] = lambda: _quiet(stop_torchserve, run_dir)
        request.session.config.add_cleanup(stop_doors)
    else:
        from doors.kserve import launch as launcher

        door = launcher.start(name, models, run_dir, ports.inference, ports.grpc_inference, replicas=1,
                              timeout=400, env={"OMP_NUM_THREADS": "1"})  # fmt: skip
        _STOPS[name] = lambda: _quiet(launcher.stop, run_dir)
        request.session.config.add_cleanup(stop_doors)
        started = Started(name, ports.inference, ports.grpc_inference, _labels(models), pid=door.pid)
    with _LOCK:
        _DOORS[name] = started
    return started


# -- one row through each door ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One request row: its input and what it asks for."""

    text: str | None = None
    text_pair: str | None = None
    image: bytes | None = None
    method: str | None = None
    target: int | None = None
    options: Mapping[str, int] | None = None


class DoorClient:
    """Sends one row to a door over one transport."""

    def __init__(self, door: Started, transport: str) -> None:
        """Remember where to send."""
        self.door = door
        self.transport = transport

    def call(self, model: str, row: Row) -> Answer:
        """The row's answer.

        Raises:
            DoorCallError: with the error table's code and the transport's status.
        """
        if self.door.name == "torchserve":
            return self._torchserve(model, row)
        return self._oip(model, row)

    # TorchServe: the JSON document on REST, an ExplainRequest on gRPC.
    def _torchserve(self, model: str, row: Row) -> Answer:
        server = self.door.torchserve
        assert server is not None
        labels = self.door.labels[model]
        if self.transport == "rest":
            document: dict[str, Any] = {}
            if row.text is not None:
                document["text"] = row.text
            if row.text_pair is not None:
                document["text_pair"] = row.text_pair
            if row.image is not None:
                document["image"] = base64.b64encode(row.image).decode()
            if row.method is not None:  # "default": TorchServe's {"explain": {}}
                explain = {"method": row.method, **(row.options or {})} if row.method != "default" else {}
                if row.target is not None:
                    explain["target"] = row.target
                document["explain"] = explain
            status, reply = http_post(f"{server.inference_url}/predictions/{model}", json.dumps(document).encode(),
                                      server.keys["inference"])  # fmt: skip
            if "error" in reply:
                raise DoorCallError(reply["error"]["code"], status, reply["error"]["message"])
            return _from_json(reply, labels)
        messages = protos.explain_messages()
        request = messages.ExplainRequest()
        if row.text is not None:
            request.text = row.text
        if row.text_pair is not None:
            request.text_pair = row.text_pair
        if row.image is not None:
            request.image = row.image
        if row.method is not None:
            request.explain.SetInParent()
            request.explain.method = row.method if row.method != "default" else ""  # "": the default method
            if row.target is not None:
                request.explain.target_id = row.target
            for key, value in (row.options or {}).items():
                request.explain.options[key] = value
        inference_pb2, inference_grpc = protos.inference_stubs()
        metadata = [("authorization", f"Bearer {server.keys['inference']}")]
        with grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}") as channel:
            stub = inference_grpc.InferenceAPIsServiceStub(channel)
            reply = stub.Predictions(
                inference_pb2.PredictionsRequest(model_name=model, input={"request": request.SerializeToString()}),
                metadata=metadata, timeout=120,
            )  # fmt: skip
        answer = messages.ExplainResponse.FromString(reply.prediction)
        if answer.HasField("error"):
            raise DoorCallError(answer.error.code, answer.error.grpc_code, answer.error.message)
        return _from_protobuf(answer, labels)

    # KServe and Ray: the OIP with the explain extension.
    def _oip(self, model: str, row: Row) -> Answer:
        from bench.oip_client import GrpcOip, Input, OipCallError, RestOip

        inputs = []
        if row.text is not None:
            inputs.append(Input("text", "BYTES", [row.text]))
        if row.text_pair is not None:
            inputs.append(Input("text_pair", "BYTES", [row.text_pair]))
        if row.image is not None:
            image: Any = base64.b64encode(row.image).decode() if self.transport == "rest" else row.image
            inputs.append(Input("image", "BYTES", [image]))
        parameters: dict[str, Any] = {}
        if row.method is not None:
            parameters["explain_method"] = row.method
            if row.target is not None:
                parameters["explain_target"] = row.target
            parameters.update({f"explain_option_{key}": value for key, value in (row.options or {}).items()})
        client: Any = (
            RestOip("127.0.0.1", self.door.rest_port) if self.transport == "rest"
            else GrpcOip(f"127.0.0.1:{self.door.grpc_port}")
        )  # fmt: skip
        try:
            outputs = client.infer(model, inputs, parameters)
        except OipCallError as error:
            code = error.message.split("]")[0].lstrip("[") if error.message.startswith("[") else "?"
            raise DoorCallError(code, error.status, error.message) from None
        finally:
            client.close()
        return from_oip(outputs, 0)


def _from_json(reply: Mapping[str, Any], labels: tuple[str, ...]) -> Answer:
    explanation = reply.get("explanation")
    probabilities = [reply["probabilities"][label] for label in labels] if "probabilities" in reply else []
    grid = tuple(explanation["grid"]) if explanation and "grid" in explanation else None
    scores = explanation["scores"] if explanation else None
    if grid is not None and scores is not None:
        scores = [value for line in scores for value in line]
    return Answer(
        label_id=int(reply.get("label_id", -1)),
        probabilities=probabilities,
        value=reply.get("value"),
        predicted=[labels.index(name) for name in reply["labels"]] if "labels" in reply else None,
        method=explanation["method"] if explanation else None,
        target=int(explanation["target"]) if explanation else -1,
        tokens=explanation.get("tokens") if explanation else None,
        scores=scores,
        grid=grid,
        segments=explanation.get("segments") if explanation else None,
    )


def _from_protobuf(answer: Any, labels: tuple[str, ...]) -> Answer:
    explained = answer.HasField("explanation")
    explanation = answer.explanation
    return Answer(
        label_id=int(answer.label_id) if answer.head_type != "regression" else -1,
        probabilities=[answer.probabilities[label] for label in labels] if answer.head_type != "regression" else [],
        value=float(answer.value) if answer.HasField("value") else None,
        predicted=[labels.index(name) for name in answer.labels] if answer.head_type == "multi_label" else None,
        method=explanation.method if explained else None,
        target=int(explanation.target) if explained else -1,
        tokens=list(explanation.tokens) if explained and explanation.tokens else None,
        scores=list(explanation.scores) if explained else None,
        grid=(int(explanation.grid[0]), int(explanation.grid[1])) if explained and explanation.grid else None,
        segments=list(explanation.segments) if explained and explanation.segments else None,
    )


def from_oip(outputs: Mapping[str, tuple[list[int], list[Any]]], row: int) -> Answer:
    """Row ``row`` of an OIP answer (padding of ``tokens``/``scores`` removed)."""

    def line(name: str) -> list[Any] | None:
        if name not in outputs:
            return None
        shape, data = outputs[name]
        width = 1
        for size in shape[1:]:
            width *= size
        return list(data[row * width : (row + 1) * width])

    method = line("explain_method")
    explained = bool(method and method[0])
    tokens = line("tokens") if explained else None
    scores = line("scores") if explained else None
    segments = line("segments") if explained else None
    grid = None
    if explained and tokens is not None and scores is not None:
        real = sum(1 for token in tokens if token != "")
        tokens, scores = tokens[:real], scores[:real]
        segments = segments[:real] if segments is not None else None
    elif explained and "scores" in outputs:
        shape = outputs["scores"][0]
        grid = (int(shape[1]), int(shape[2]))
    probabilities = line("probabilities") or []
    predicted = line("predicted")
    value = line("value")
    return Answer(
        label_id=int((line("label_id") or [-1])[0]),
        probabilities=[float(v) for v in probabilities],
        value=float(value[0]) if value else None,
        predicted=[index for index, flag in enumerate(predicted) if flag] if predicted is not None else None,
        method=method[0] if explained and method else None,
        target=int((line("explain_target") or [-1])[0]) if explained else -1,
        tokens=tokens,
        scores=[float(v) for v in scores] if scores is not None else None,
        grid=grid,
        segments=[int(v) for v in segments] if segments is not None else None,
    )
