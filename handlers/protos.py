"""Generate and import the Python protobuf/gRPC stubs: ours (``proto/explain.proto``) and TorchServe's
``inference.proto`` / ``management.proto``, read from inside the installed TorchServe package (never copied into the
repository).

``python -m handlers.protos [--out DIR]`` (``make protos``) generates them; :func:`load` generates them on first use
if missing, into the same git-ignored folder (default ``build/protos``; ``EXPLAIN_PROTO_DIR`` overrides).
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

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
OWN_PROTO = REPO_ROOT / "proto" / "explain.proto"
DEFAULT_OUT = REPO_ROOT / "build" / "protos"
TORCHSERVE_PROTOS = ("inference.proto", "management.proto")
_STAMP = ".generated"


def output_dir() -> Path:
    """Where the stubs live: ``$EXPLAIN_PROTO_DIR`` or ``build/protos`` in the repository."""
    return Path(os.environ.get("EXPLAIN_PROTO_DIR", DEFAULT_OUT))


def _torchserve_jar() -> Path:
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
    """Generate all stubs into ``out`` (atomically per file set) and return the folder.

    Raises:
        RuntimeError: if ``protoc`` fails.
    """
    from grpc_tools import protoc

    out = out or output_dir()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".protos-", dir=out) as work:
        source = Path(work) / "src"
        source.mkdir()
        with zipfile.ZipFile(_torchserve_jar()) as jar:
            for name in TORCHSERVE_PROTOS:
                (source / name).write_bytes(jar.read(f"proto/{name}"))
        (source / OWN_PROTO.name).write_bytes(OWN_PROTO.read_bytes())
        generated = Path(work) / "gen"
        generated.mkdir()
        args = ["grpc_tools.protoc", f"-I{source}", *[f"-I{d}" for d in _include_dirs()]]
        args += [f"--python_out={generated}", f"--pyi_out={generated}", f"--grpc_python_out={generated}"]
        args += [str(source / name) for name in (*TORCHSERVE_PROTOS, OWN_PROTO.name)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        for path in generated.iterdir():
            os.replace(path, out / path.name)
    (out / _STAMP).write_text(OWN_PROTO.read_text(encoding="utf-8"), encoding="utf-8")
    logger.info("generated gRPC stubs in %s", out)
    return out


def _import(name: str) -> ModuleType:
    out = output_dir()
    stamp = out / _STAMP
    if not stamp.is_file() or stamp.read_text(encoding="utf-8") != OWN_PROTO.read_text(encoding="utf-8"):
        out.mkdir(parents=True, exist_ok=True)
        with (out.parent / f".{out.name}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not stamp.is_file() or stamp.read_text(encoding="utf-8") != OWN_PROTO.read_text(encoding="utf-8"):
                generate(out)
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module(name)


def explain_messages() -> ModuleType:
    """The ``explain_pb2`` module (``ExplainRequest``, ``ExplainResponse``, ...)."""
    return _import("explain_pb2")


def inference_stubs() -> tuple[ModuleType, ModuleType]:
    """TorchServe's ``inference_pb2`` and ``inference_pb2_grpc``."""
    return _import("inference_pb2"), _import("inference_pb2_grpc")


def management_stubs() -> tuple[ModuleType, ModuleType]:
    """TorchServe's ``management_pb2`` and ``management_pb2_grpc``."""
    return _import("management_pb2"), _import("management_pb2_grpc")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m handlers.protos", description="generate the gRPC stubs")
    parser.add_argument("--out", type=Path, default=None, help=f"output folder (default: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
