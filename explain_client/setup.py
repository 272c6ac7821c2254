"""Build hook of the ``transformer-explain-client`` distribution (metadata in ``pyproject.toml``): before setuptools
collects the package, generate the gRPC/protobuf stubs from ``../proto/*.proto`` into ``_generated/``
(:mod:`explain_client.protos`, loaded on its own: the build environment has grpcio-tools but not the client's
runtime dependencies). A source distribution carries the generated stubs and builds without ``proto/``.

The folder is the package itself (``package-dir = {"explain_client" = "."}``), so this file is left out of the
built package."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_explain_client_protos", HERE / "protos.py")
assert _spec is not None and _spec.loader is not None
_protos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_protos)
_protos.build_stubs(HERE.parent / "proto", HERE / "_generated")


class BuildPy(build_py):
    """``build_py`` without this build script among the package's modules."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        """The package's modules, ``explain_client.setup`` left out."""
        modules = super().find_package_modules(package, package_dir)
        return [entry for entry in modules if not (package == "explain_client" and entry[1] == "setup")]


setup(cmdclass={"build_py": BuildPy})
