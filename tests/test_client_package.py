"""The client as its own distribution (``explain_client/pyproject.toml``).

- Its stubs come from the project's own ``.proto`` files, and its description of TorchServe's inference API
  (``proto/torchserve_inference.proto``) is wire-compatible with TorchServe's ``inference.proto`` from the installed
  jar: both are compiled here, each into its own descriptor pool, and every field of the client's messages is
  serialized with one and parsed with the other, both ways; the server uses the client's stubs (one copy).
- In a fresh virtualenv holding only ``pip install ./explain_client`` (built from a copy of the checkout, as a new
  user would), torch is absent, no server package or heavy library is imported, and the client calls the real
  TorchServe over REST and gRPC, retrying a call whose worker is killed. The install's seconds and size are logged
  and appended to ``build/client-figures.jsonl``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from doors.torchserve.process import Server
from explain_client import protos as client_protos
from tests.ops_support import log_figures, wait_for_worker, worker_pids
from tests.serving_support import png_bytes

REPO = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).with_name("client_venv_probe.py")
FIGURES = REPO / "build" / "client-figures.jsonl"
PACKAGE = "org.pytorch.serve.grpc.inference"
TEXT = "the crew was rude and the flight late"
LABELS = ("negative", "neutral", "positive")


# ------------------------------------------------------------------------------------------ wire compatibility


def _include_dirs() -> list[str]:
    import google.rpc.status_pb2 as status
    from grpc_tools import protoc

    return [
        str(Path(protoc.__file__).resolve().parent / "_proto"),  # google/protobuf/*.proto
        str(Path(status.__file__).resolve().parent.parent.parent),  # google/rpc/status.proto
    ]


def _compile(source_dir: Path, name: str, out: Path) -> descriptor_pool.DescriptorPool:
    """``source_dir/name`` and its imports compiled by protoc into a pool of their own."""
    from grpc_tools import protoc

    target = out / f"{name}.pb"
    args = ["grpc_tools.protoc", f"-I{source_dir}", *(f"-I{path}" for path in _include_dirs())]
    args += ["--include_imports", f"--descriptor_set_out={target}", str(source_dir / name)]
    assert protoc.main(args) == 0, args
    files = descriptor_pb2.FileDescriptorSet.FromString(target.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:  # dependencies first (protoc's order)
        pool.AddSerializedFile(file.SerializeToString())
    return pool


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    import zipfile

    from doors.torchserve.protos import torchserve_jar

    work = tmp_path_factory.mktemp("protos")
    jar_dir = work / "torchserve"
    jar_dir.mkdir()
    with zipfile.ZipFile(torchserve_jar()) as jar:
        (jar_dir / "inference.proto").write_bytes(jar.read("proto/inference.proto"))
    theirs = _compile(jar_dir, "inference.proto", work)
    ours = _compile(REPO / "proto", "torchserve_inference.proto", work)
    return ours, theirs


def _message_class(pool: Any, name: str) -> Any:
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))


def _values(message: Any, fields: Any) -> dict[str, Any]:
    return {
        field.name: dict(getattr(message, field.name))
        if field.message_type is not None and field.message_type.GetOptions().map_entry
        else getattr(message, field.name)
        for field in fields
    }


def test_the_client_description_of_torchserve_matches_its_inference_proto(pools: tuple[Any, Any]) -> None:
    ours, theirs = pools
    our_file = ours.FindFileByName("torchserve_inference.proto")
    their_file = theirs.FindFileByName("inference.proto")
    assert our_file.package == their_file.package == PACKAGE
    assert set(our_file.message_types_by_name) == {"PredictionsRequest", "PredictionResponse"}
    for name, message in our_file.message_types_by_name.items():
        ours_proto, theirs_proto = descriptor_pb2.DescriptorProto(), descriptor_pb2.DescriptorProto()
        message.CopyToProto(ours_proto)
        their_file.message_types_by_name[name].CopyToProto(theirs_proto)
        their_fields = {field.number: field for field in theirs_proto.field}
        for field in ours_proto.field:  # name, number, label, type, type name (the map entry) of each field
            other = their_fields[field.number]
            assert (field.name, field.label, field.type, field.type_name) == (
                other.name, other.label, other.type, other.type_name
            ), (name, field.name)  # fmt: skip
        their_nested = {nested.name: nested for nested in theirs_proto.nested_type}
        for nested in ours_proto.nested_type:  # map<string, bytes>: the same entry message and options
            assert nested == their_nested[nested.name], (name, nested.name)
    our_service = our_file.services_by_name["InferenceAPIsService"]
    their_service = their_file.services_by_name["InferenceAPIsService"]
    for method in our_service.methods:
        other = their_service.methods_by_name[method.name]
        ours_proto, theirs_proto = descriptor_pb2.MethodDescriptorProto(), descriptor_pb2.MethodDescriptorProto()
        method.CopyToProto(ours_proto)
        other.CopyToProto(theirs_proto)
        assert method.full_name == other.full_name == f"{PACKAGE}.InferenceAPIsService.{method.name}"
        assert (ours_proto.input_type, ours_proto.output_type) == (theirs_proto.input_type, theirs_proto.output_type)
        assert (ours_proto.client_streaming, ours_proto.server_streaming) == (False, False)
        assert (theirs_proto.client_streaming, theirs_proto.server_streaming) == (False, False)


def test_every_field_of_the_client_messages_crosses_to_torchserve_and_back(pools: tuple[Any, Any]) -> None:
    ours, theirs = pools
    request_values = {
        "model_name": "sentiment",
        "model_version": "2.0",
        "input": {"request": b"\x00\x01\xfe\xff serialized", "body": b'{"text": "hi"}'},
    }
    response_values = {"prediction": b"\x0a\x08negative\x10\x00"}
    for name, values in (("PredictionsRequest", request_values), ("PredictionResponse", response_values)):
        Ours, Theirs = _message_class(ours, name), _message_class(theirs, name)
        fields = Ours.DESCRIPTOR.fields
        assert {field.name for field in fields} == set(values), "set every field of the client's message"
        sent = Ours(**values)
        received = Theirs.FromString(sent.SerializeToString())
        assert _values(received, fields) == values
        back = Ours.FromString(Theirs(**values).SerializeToString())
        assert _values(back, fields) == values
    # What TorchServe sends beyond the client's fields is kept, not lost, when the client re-serializes a message.
    Theirs = _message_class(theirs, "PredictionResponse")
    extra = Theirs(prediction=b"x", sequence_id="seq-1")
    relayed = Theirs.FromString(_message_class(ours, "PredictionResponse").FromString(extra.SerializeToString())
                                .SerializeToString())  # fmt: skip
    assert relayed.sequence_id == "seq-1" and relayed.prediction == b"x"


def test_the_stubs_in_use_come_from_the_shipped_protos_and_the_server_shares_them(pools: tuple[Any, Any]) -> None:
    from doors.torchserve import protos as server_protos

    ours, _ = pools
    inference_pb2, inference_grpc = client_protos.inference_stubs()
    compiled = ours.FindFileByName("torchserve_inference.proto")
    for name, message in compiled.message_types_by_name.items():
        generated = inference_pb2.DESCRIPTOR.message_types_by_name[name]
        assert [(f.name, f.number, f.type) for f in generated.fields] == [
            (f.name, f.number, f.type) for f in message.fields
        ]
    assert hasattr(inference_grpc, "InferenceAPIsServiceStub")
    assert client_protos.is_current(REPO / "proto")  # regenerated whenever a .proto changes
    explain_pb2 = client_protos.explain_messages()
    assert (REPO / "proto" / "explain.proto").read_bytes() == (
        client_protos.GENERATED_DIR / "explain.proto"
    ).read_bytes()
    assert server_protos.explain_messages() is explain_pb2
    assert server_protos.inference_stubs() == (inference_pb2, inference_grpc)


def _documented_program() -> str:
    text = (REPO / "docs" / "CLIENT.md").read_text(encoding="utf-8")
    after = text.split("<!-- plain-grpc-program", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_documented_plain_grpcio_program_works(server: Server, tmp_path: Path) -> None:
    """docs/CLIENT.md's program, with stubs compiled from the shipped protos by the documented protoc command, in
    a folder of its own (it imports only grpc and the generated modules)."""
    from grpc_tools import protoc

    args = ["grpc_tools.protoc", f"-I{REPO / 'proto'}", f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}"]
    assert (
        protoc.main([*args, str(REPO / "proto" / "explain.proto"), str(REPO / "proto" / "torchserve_inference.proto")])
        == 0
    )
    program = _documented_program()
    assert '"run/key_file.json"' in program and '"127.0.0.1:7070"' in program
    program = program.replace('"run/key_file.json"', repr(str(server.run_dir / "key_file.json")))
    program = program.replace('"127.0.0.1:7070"', repr(f"127.0.0.1:{server.ports.grpc_inference}"))
    (tmp_path / "program.py").write_text(program, encoding="utf-8")
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    shown = subprocess.run(
        [sys.executable, "program.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=environment
    )
    assert shown.returncode == 0, shown.stderr
    label, pairs = shown.stdout.split(" ", 1)
    assert label in LABELS and "('rude', " in pairs


# ------------------------------------------------------------------------------------------- fresh virtualenv


def _client_only_environment() -> dict[str, str]:
    """This process's environment without ``PYTHON*``/``VIRTUAL_ENV``: a ``PYTHONPATH`` naming the checkout would put
    the server's packages and the checkout's ``explain_client`` before the virtualenv's own."""
    return {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}


def _tree_bytes(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file() and not item.is_symlink())


@pytest.fixture(scope="session")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtualenv with only the client installed from a copy of the checkout (``explain_client/`` and
    ``proto/``, what the documented ``pip install ./explain_client`` reads); its Python."""
    root = tmp_path_factory.mktemp("client-venv")
    checkout = root / "checkout"
    ignore = shutil.ignore_patterns("_generated", "build", "*.egg-info", "__pycache__", ".*")
    shutil.copytree(REPO / "explain_client", checkout / "explain_client", ignore=ignore)
    shutil.copytree(REPO / "proto", checkout / "proto", ignore=ignore)
    venv = root / "venv"
    environment = _client_only_environment()
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=environment)
    created = time.perf_counter()
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "./explain_client"]
    completed = subprocess.run(install, cwd=checkout, env=environment, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    finished = time.perf_counter()
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True, text=True, check=True, env=environment,
    )  # fmt: skip
    packages = sorted(f"{item['name']}=={item['version']}" for item in json.loads(listing.stdout))
    site = next((venv / "lib").glob("python*/site-packages"))
    figures = {
        "venv_seconds": round(created - started, 1),
        "pip_install_seconds": round(finished - created, 1),
        "venv_mib": round(_tree_bytes(venv) / 2**20, 1),
        "site_packages_mib": round(_tree_bytes(site) / 2**20, 1),
        "packages": packages,
    }
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    log_figures("client_install", figures, FIGURES)
    yield python


def _probe(python: Path, command: str, config: dict[str, Any] | None = None, timeout: float = 600) -> Any:
    args = [str(python), str(PROBE), command] + ([json.dumps(config)] if config is not None else [])
    completed = subprocess.run(
        args, cwd=python.parent, capture_output=True, text=True, timeout=timeout, env=_client_only_environment()
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return json.loads(completed.stdout.splitlines()[-1])


def _config(server: Server, tmp_path: Path) -> dict[str, Any]:
    png = tmp_path / "digit.png"
    png.write_bytes(png_bytes())
    return {
        "url": server.inference_url,
        "grpc": f"127.0.0.1:{server.ports.grpc_inference}",
        "key_file": str(server.run_dir / "key_file.json"),
        "png": str(png),
    }


@pytest.mark.slow
def test_a_client_only_virtualenv_has_no_torch_and_imports_no_server_code(client_venv: Path) -> None:
    python = str(client_venv)
    for name in ("torch", "transformers", "ts", "handlers", "explainers", "model_store", "numpy", "PIL"):
        found = subprocess.run(
            [python, "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec('{name}') is not None)"],
            cwd=client_venv.parent,
            env=_client_only_environment(),
        )
        assert found.returncode == 0, f"{name} is importable in the client-only virtualenv"
    report = _probe(client_venv, "modules")
    assert report["forbidden_loaded"] == []
    assert {"explain_client.client", "explain_client.cli", "explain_client.protos", "explain_client.render"} <= set(
        report["imported"]
    )
    assert "explain_client._generated.torchserve_inference_pb2_grpc" in report["imported"]
    assert "explain_client.setup" not in report["imported"]  # the build script is not part of the package
    # Pictures need the extra, and say how to get it.
    assert set(report["refused"]) == {"explain_client.pictures"}, report["refused"]
    assert "explain_client[pictures]" in report["refused"]["explain_client.pictures"]


@pytest.mark.slow
def test_a_client_only_virtualenv_calls_the_service_over_rest_and_grpc(
    server: Server, client_venv: Path, tmp_path: Path
) -> None:
    from explainers import available_methods

    config = {**_config(server, tmp_path), "methods": available_methods()}
    results = _probe(client_venv, "call", config)
    assert results["forbidden_loaded"] == []
    rest, grpc = results["rest"], results["grpc"]
    for row in (rest, grpc):
        assert row["predict"]["label"] in LABELS and "explanation" not in row["predict"]
        for method, prediction in row["methods"].items():
            explanation = prediction["explanation"]
            assert explanation["method"] == method and len(explanation["scores"]) == len(explanation["tokens"]) > 2
        assert row["image"]["explanation"]["grid"] and row["image"]["explanation"]["method"] == "rollout"
        assert row["row_error"]["code"] == "unknown_method" and row["row_error"]["http_status"] == 400
        first, bad, last = row["many"]
        assert first["explanation"]["method"] == "attention" and last["label"] in LABELS
        assert bad["error"]["code"] == "unknown_method"
    assert rest["predict"]["label"] == grpc["predict"]["label"]
    for method in config["methods"]:
        ours, theirs = rest["methods"][method]["explanation"], grpc["methods"][method]["explanation"]
        assert ours["tokens"] == theirs["tokens"]
        assert ours["scores"] == pytest.approx(theirs["scores"], rel=1e-4, abs=1e-6)  # float32 over gRPC
    # The CLI of the client-only install, with the default extras absent: an explicit --url with the run folder's key.
    explain = client_venv.parent / "explain"
    shown = subprocess.run(
        [str(explain), TEXT, "--url", server.inference_url, "--run-dir", str(server.run_dir), "--color", "never"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_client_only_environment(),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "label: " in shown.stdout and "word[+0.42]" in shown.stdout and "Colour" not in shown.stdout
    picture = subprocess.run(
        [str(explain), "--model", "digits", "--image", config["png"], "--run-dir", str(server.run_dir), "--png",
         str(tmp_path / "out.png")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_client_only_environment(),
    )  # fmt: skip
    assert picture.returncode == 2 and "explain_client[pictures]" in picture.stderr, picture.stderr


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_a_client_only_virtualenv_retries_a_call_whose_worker_was_killed(
    server: Server, client_venv: Path, tmp_path: Path, transport: str
) -> None:
    """The worker is frozen (SIGSTOP) so the call is certainly in its hands, then killed: the first attempt fails
    (TorchServe's "Worker died.", or no answer within the client's deadline) and a retry is answered by the
    restarted worker."""
    (pid,) = worker_pids(server, "sentiment")
    config = {**_config(server, tmp_path), "transport": transport, "timeout": 20, "retries": 3}
    args = [str(client_venv), str(PROBE), "retry", json.dumps(config)]
    os.kill(pid, signal.SIGSTOP)
    try:
        environment = _client_only_environment()
        probe = subprocess.Popen(
            args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
        )
        assert probe.stdout is not None
        assert probe.stdout.readline().strip() == "calling"
        time.sleep(1.0)  # the request reaches the frozen worker
    finally:
        os.kill(pid, signal.SIGKILL)
    try:
        stdout, stderr = probe.communicate(timeout=180)
    finally:
        if probe.poll() is None:
            probe.kill()
        wait_for_worker(server, "sentiment", not_pid=pid, timeout=180)
    assert probe.returncode == 0, stdout + stderr
    result = json.loads(stdout.splitlines()[-1])
    assert result["label"] in LABELS and result["forbidden_loaded"] == []
    assert "retrying" in stderr, stderr  # the first attempt failed and was retried
