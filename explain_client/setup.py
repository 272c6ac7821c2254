"""Build hook of the ``transformer-explain-client`` distribution (metadata in ``pyproject.toml``): before setuptools
collects the package, generate the gRPC/protobuf stubs from ``../proto/*.proto`` into ``_generated/``
(:mod:`explain_client.protos`, loaded on its own: the build environment has grpcio-tools but not the client's
runtime dependencies). A source distribution carries the generated stubs and builds without ``proto/``."""

import importlib.util
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_explain_client_protos", HERE / "protos.py")
assert _spec is not None and _spec.loader is not None
_protos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_protos)
_protos.build_stubs(HERE.parent / "proto", HERE / "_generated")

setup()
