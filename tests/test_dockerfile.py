"""The image's ``COPY`` lines against what its commands import, read from the Dockerfile and the code (no Docker
needed).

``tests/test_container.py`` builds the image with ``BUILD_MODELS=false``, so the model-build stage
(``python -m model_store.build``) never runs in the tests; it once failed in the image only, with
``ModuleNotFoundError: No module named 'supervise'``. These tests compute the project modules a command imports
statically (every ``import`` of a module, function-level ones included, following project modules, as
tests/test_layout.py reads them) and check that the ``COPY`` lines before that command put each one where the image's
``WORKDIR`` expects it:

- the model-build stage: what ``python -m model_store.build`` imports for the default models (the image builds only
  :data:`model_store.build.DEFAULT_NAMES`, so the opt-in writer's modules are left out) and the handler entry files
  their archives carry;
- the final stage: what the service's commands import — the launcher and every door (``python -m doors``, the
  image's ``CMD``), the deprecated aliases, the auth-proxy sidecar and the console scripts of pyproject.toml.
"""

from __future__ import annotations

import ast
import fnmatch
import shlex
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from model_store.build import DEFAULT_NAMES, model_specs

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
#: The opt-in writer's modules: imported by ``model_store.build`` only when the writer is built, which the image never
#: does (it builds :data:`~model_store.build.DEFAULT_NAMES`).
WRITER_MODULES = frozenset({"model_store.train_writer", "model_store.writer_data"})
#: What the final image runs besides the launcher and the doors: the aliases kept for one release and the sidecar.
SERVICE_ENTRY_FILES = ("handlers", "servers", "model_store/serving", "deploy/auth_proxy.py")


@dataclass(frozen=True)
class Copy:
    """One ``COPY`` of the build context: ``source`` (a path of the repository) to ``target`` (a path under the
    image's ``WORKDIR``)."""

    source: str
    target: str


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions in order, as ``(KEYWORD, arguments)``: continuation lines joined, comments and
    blank lines dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        found.append((keyword.upper(), arguments.strip()))
        pending = ""
    return found


def last_stage_until(steps: list[tuple[str, str]], marker: str) -> list[tuple[str, str]]:
    """The instructions of the stage that runs the first ``RUN`` containing ``marker``, from its ``FROM`` up to that
    ``RUN`` (excluded); ``marker=""`` takes the last stage whole."""
    end = len(steps)
    if marker:
        end = next(index for index, (keyword, words) in enumerate(steps) if keyword == "RUN" and marker in words)
    start = max(index for index, (keyword, _) in enumerate(steps[:end]) if keyword == "FROM")
    return steps[start + 1 : end]


def copies(stage: list[tuple[str, str]]) -> list[Copy]:
    """The stage's copies of the build context (``COPY --from=...`` copies another stage's files and is left out),
    each source to its target relative to the stage's ``WORKDIR``."""
    workdir = "/"
    found: list[Copy] = []
    for keyword, arguments in stage:
        if keyword == "WORKDIR":
            workdir = arguments.rstrip("/") + "/"
        if keyword != "COPY":
            continue
        words = shlex.split(arguments)
        if any(word.startswith("--from") for word in words):
            continue
        *sources, destination = [word for word in words if not word.startswith("--")]
        if not destination.startswith("/"):
            destination = workdir + destination
        for source in sources:
            source = source.removeprefix("./").rstrip("/")
            target = destination.rstrip("/") + "/" + Path(source).name if destination.endswith("/") else destination
            if len(sources) > 1 and not destination.endswith("/"):
                raise ValueError(f"COPY of several sources to {destination!r}, which is not a folder")
            if not target.startswith(workdir):
                continue
            found.append(Copy(source, target.removeprefix(workdir).removeprefix("./").rstrip("/")))
    return found


def image_path(path: str, copied: Iterable[Copy]) -> str | None:
    """Where the repository's ``path`` lands under the image's ``WORKDIR`` (the last copy of it wins), or None."""
    landed = None
    for copy in copied:
        if path == copy.source or path.startswith(copy.source + "/"):
            landed = copy.target + path[len(copy.source) :]
    return landed


def module_file(module: str) -> Path | None:
    """The repository file of the dotted ``module`` (``a/b.py`` or ``a/b/__init__.py``), or None."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_name(path: Path) -> str:
    """The dotted module name of a repository file."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The modules the file imports, anywhere in it (function-level imports too; relative imports resolved): for
    ``from a import b`` both ``a`` and ``a.b`` (``b`` may be a module)."""
    module = module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            origin = ".".join([*base, node.module] if node.module else base)
            names.add(origin)
            names.update(f"{origin}.{alias.name}" for alias in node.names)
    return names


def imported_files(starts: Iterable[str], leave_out: frozenset[str] = frozenset()) -> set[str]:
    """Every project file that importing the modules ``starts`` imports (the modules, their packages'
    ``__init__.py`` and, following project modules, what they import), as repository paths; the modules of
    ``leave_out`` are neither taken nor followed."""
    seen: set[str] = set()
    files: set[str] = set()
    pending = list(starts)
    while pending:
        module = pending.pop()
        if module in seen or module in leave_out:
            continue
        seen.add(module)
        parts = module.split(".")
        # importing a.b.c runs a/__init__.py and a/b/__init__.py first
        pending.extend(".".join(parts[:end]) for end in range(1, len(parts)))
        path = module_file(module)
        if path is None:
            continue  # not a project module: a library, or a name imported from a module (``from a import NAME``)
        files.add(path.relative_to(ROOT).as_posix())
        pending.extend(imports(path))
    return files


def ignored(path: str, patterns: Iterable[str]) -> bool:
    """Whether ``.dockerignore``'s ``patterns`` keep ``path`` out of the build context: the last pattern that matches
    the path or one of its folders decides, ``!`` excepts."""
    parts = path.split("/")
    candidates = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
    out = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        if any(fnmatch.fnmatchcase(candidate, pattern.removeprefix("!")) for candidate in candidates):
            out = not keep
    return out


def dockerignore(text: str) -> list[str]:
    """The patterns of a ``.dockerignore`` file, in order."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def missing(needed: Iterable[str], copied: list[Copy], patterns: Iterable[str] = ()) -> list[str]:
    """The files of ``needed`` that the copies leave out, or put elsewhere than at their own path, or that
    ``.dockerignore``'s ``patterns`` keep out of the build context."""
    patterns = list(patterns)
    return sorted(path for path in needed if image_path(path, copied) != path or ignored(path, patterns))


def test_the_model_stage_copies_what_the_default_build_imports() -> None:
    stage = last_stage_until(instructions(DOCKERFILE.read_text(encoding="utf-8")), "model_store.build")
    needed = imported_files(["model_store.build"], leave_out=WRITER_MODULES)
    handlers = {model_specs()[name].handler.relative_to(ROOT).as_posix() for name in DEFAULT_NAMES}
    # the scan does reach the build's own imports, the working-directory rules among them
    assert {"model_store/build.py", "model_store/recipes.py", "supervise/workdir.py"} <= needed
    assert not needed & {f"{module.replace('.', '/')}.py" for module in WRITER_MODULES}
    assert missing(needed | handlers, copies(stage), dockerignore(DOCKERIGNORE.read_text(encoding="utf-8"))) == []


def test_the_final_stage_copies_every_project_module_the_service_imports() -> None:
    stage = last_stage_until(instructions(DOCKERFILE.read_text(encoding="utf-8")), "")
    assert ("CMD", '["python", "-m", "doors", "serve"]') in stage
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    starts = [module_name(path) for path in (ROOT / "doors").rglob("*.py")]
    starts += [module_name(path) for entry in SERVICE_ENTRY_FILES for path in _python_files(ROOT / entry)]
    starts += [target.partition(":")[0] for target in scripts.values()]
    needed = imported_files(starts)
    packages = {path.split("/")[0] for path in needed}
    assert {"doors", "serving_core", "explainers", "explain_client", "supervise", "forwarding"} <= packages
    assert missing(needed, copies(stage), dockerignore(DOCKERIGNORE.read_text(encoding="utf-8"))) == []


def _python_files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def test_the_reading_finds_a_missing_copy(tmp_path: Path) -> None:
    """The Dockerfile reading on a small one (a folder copied elsewhere, a file of several sources, another stage's
    files and a continued RUN line), and the ``.dockerignore`` reading (a folder left out, an exception, a glob)."""
    text = (
        "FROM base AS requirements\nCOPY pkg /tmp/pkg\n"
        "FROM base\nWORKDIR /srv/app\n# a comment\nCOPY --from=requirements /tmp/pkg ./other\n"
        "COPY model_store ./model_store\nCOPY doors/a.py doors/b.py ./doors/\nCOPY supervise ./elsewhere\n"
        "RUN echo \\\n  python -m model_store.build\nCOPY explainers ./explainers\n"
    )
    stage = last_stage_until(instructions(text), "model_store.build")
    copied = copies(stage)
    assert copied == [
        Copy("model_store", "model_store"),
        Copy("doors/a.py", "doors/a.py"),
        Copy("doors/b.py", "doors/b.py"),
        Copy("supervise", "elsewhere"),
    ]
    assert missing(["model_store/x/y.py", "doors/a.py", "doors/c.py", "supervise/w.py", "explainers/e.py"], copied) == [
        "doors/c.py",
        "explainers/e.py",
        "supervise/w.py",
    ]
    assert [copy.source for copy in copies(last_stage_until(instructions(text), ""))][-1] == "explainers"
    patterns = dockerignore("# comment\ntests\ndeploy\n!deploy/auth_proxy.py\n**/__pycache__\n")
    assert missing(["model_store/tests/t.py", "model_store/x/y.py"], copied, ["model_store/tests"]) == [
        "model_store/tests/t.py"
    ]
    assert [ignored(path, patterns) for path in ("tests/a.py", "deploy/auth_proxy.py", "deploy/engine.py")] == [
        True,
        False,
        True,
    ]
    assert ignored("doors/__pycache__/a.pyc", patterns) and not ignored("doors/a.py", patterns)
