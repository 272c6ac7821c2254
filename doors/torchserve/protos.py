"""The Python protobuf/gRPC stubs the server side uses.

- ``proto/explain.proto`` (the explanation messages) and the inference part of TorchServe's API
  (``proto/torchserve_inference.proto``): the client package's stubs (:mod:`explain_client.protos`), so that one
  copy of each message is loaded in a process and the handlers decode exactly what the client encodes.
- TorchServe's ``management.proto``, read from inside the installed TorchServe package (never copied into the
  repository): generated here. ``python -m doors.torchserve.protos [--out DIR]`` (``make protos``) generates it (and
  refreshes the client's stubs); :func:`management_stubs` generates it on first use if missing, into
  ``build/protos`` of the working directory (:mod:`supervise.workdir`; git-ignored in a clone; ``EXPLAIN_PROTO_DIR``
  overrides).
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import logging
import os
import sys
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType

from explain_client import protos as explain_client_protos
from supervise.workdir import protos_dir

logger = logging.getLogger(__name__)

#: Generated here from TorchServe's jar. Its inference.proto is not: the client's own description of it is used
#: (tests/test_client_package.py checks the two are wire-compatible), and both in one process would clash.
TORCHSERVE_PROTOS = ("management.proto",)
_STAMP = ".generated"


def output_dir() -> Path:
    """Where the stubs live: ``$EXPLAIN_PROTO_DIR``, else ``build/protos`` of the working directory."""
    value = os.environ.get("EXPLAIN_PROTO_DIR")
    return Path(value) if value else protos_dir()


def torchserve_jar() -> Path:
    """The installed TorchServe frontend jar, which holds TorchServe's ``proto/*.proto``."""
    import ts

    jar = Path(ts.__file__).resolve().parent / "frontend" / "model-server.jar"
    if not jar.is_file():
        raise FileNotFoundError(f"TorchServe's frontend jar not found at {jar}; is torchserve==0.12.0 installed?")
    return jar


def _include_dirs() -> list[str]:
    import grpc_tools

    dirs = [str(Path(grpc_tools.__file__).resolve().parent / "_proto")]
    import google.rpc.status_pb2 as status  # googleapis-common-protos ships google/rpc/status.proto next to it

    dirs.append(str(Path(status.__file__).resolve().parent.parent.parent))
    return dirs


def generate(out: Path | None = None) -> Path:
    """Generate TorchServe's management stubs into ``out`` (atomically per file set), refresh the client's stubs
    if a ``.proto`` changed, and return ``out``.

    Raises:
        RuntimeError: if ``protoc`` fails.
    """
    from grpc_tools import protoc

    out = out or output_dir()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".protos-", dir=out) as work:
        source = Path(work) / "src"
        source.mkdir()
        with zipfile.ZipFile(torchserve_jar()) as jar:
            for name in TORCHSERVE_PROTOS:
                (source / name).write_bytes(jar.read(f"proto/{name}"))
        generated = Path(work) / "gen"
        generated.mkdir()
        args = ["grpc_tools.protoc", f"-I{source}", *[f"-I{d}" for d in _include_dirs()]]
        args += [f"--python_out={generated}", f"--pyi_out={generated}", f"--grpc_python_out={generated}"]
        args += [str(source / name) for name in TORCHSERVE_PROTOS]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        for path in generated.iterdir():
            os.replace(path, out / path.name)
    (out / _STAMP).write_text(" ".join(TORCHSERVE_PROTOS), encoding="utf-8")
    logger.info("generated TorchServe's management stubs in %s", out)
    explain_client_protos.explain_messages()  # regenerates the client's stubs when a .proto changed
    return out


def _current(stamp: Path) -> bool:
    return stamp.is_file() and stamp.read_text(encoding="utf-8") == " ".join(TORCHSERVE_PROTOS)


def _import(name: str) -> ModuleType:
    out = output_dir()
    stamp = out / _STAMP
    if not _current(stamp):
        out.mkdir(parents=True, exist_ok=True)
        with (out.parent / f".{out.name}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _current(stamp):
                generate(out)
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module(name)


def explain_messages() -> ModuleType:
    """The ``explain_pb2`` module (``ExplainRequest``, ``ExplainResponse``, ...): the client package's."""
    return explain_client_protos.explain_messages()


def inference_stubs() -> tuple[ModuleType, ModuleType]:
    """The inference messages and service stub of TorchServe's gRPC API (``PredictionsRequest``,
    ``PredictionResponse``, ``InferenceAPIsServiceStub``): the client package's, from
    ``proto/torchserve_inference.proto``."""
    return explain_client_protos.inference_stubs()


def management_stubs() -> tuple[ModuleType, ModuleType]:
    """TorchServe's ``management_pb2`` and ``management_pb2_grpc``."""
    return _import("management_pb2"), _import("management_pb2_grpc")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m doors.torchserve.protos", description="generate the gRPC stubs")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: $EXPLAIN_PROTO_DIR, else build/protos of the working directory)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
