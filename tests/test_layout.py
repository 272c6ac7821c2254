"""The house's boundaries, read from the code (every import, function-level ones included): the serving core imports
no server, no door imports another door's glue, every registered task has its TorchServe entry file and its OIP
codec, and no module but the registry keeps a table of tasks.

A task is one module and one record, in fact: :data:`LENGTH` is a throw-away task defined here (it answers how many
tokens a text has, with a text classifier checkpoint's tokenizer), registered by no project module — its archive's
``handler.task`` is the import path of its record, :data:`LENGTH_FACTS` — and served through TorchServe's handler and
the KServe door (``slow``: real servers).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from explainers import Deadline
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.registry import TASKS, Examples, TaskFacts, TorchServeCall, task_facts
from serving_core.task import BatchTimings, Task, get_task
from serving_core.wire import Body, Encoding

ROOT = Path(__file__).resolve().parent.parent
#: Top-level packages that are servers (or a server's SDK): the serving core must import none of them.
SERVERS = ("ts", "kserve", "ray", "fastapi", "uvicorn", "starlette")


def imported(package: str) -> dict[str, set[str]]:
    """Each module file of ``package`` → the top-level-qualified modules it imports (relative imports resolved)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if "_generated" in path.parts or "build" in path.parts:
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        package_parts = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package_parts[: len(package_parts) - node.level + 1]
                    names.add(".".join([*base, node.module] if node.module else base))
                elif node.module:
                    names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{file}: {name}"
        for file, names in imported(package).items()
        for name in names
        if name.split(".")[0] in forbidden
    )


#: The deprecated aliases kept for one release (CHANGELOG): old module paths that archives, manifests and scripts name.
ALIASES = ("handlers", "servers", "model_store/serving")


def test_the_core_imports_no_server_and_no_door() -> None:
    assert offenders("serving_core", (*SERVERS, "doors", "handlers", "servers", "model_store")) == []


def test_every_door_lives_under_doors_and_imports_no_other_door() -> None:
    """Each door is a folder of ``doors/``; none imports another's modules (the launcher and the table may import
    every door's launch module, by name, through :data:`doors.DOORS`)."""
    from doors import DOORS

    folders = sorted({door.module.split(".")[1] for door in DOORS.values()})
    assert folders == sorted(path.name for path in (ROOT / "doors").iterdir() if (path / "__init__.py").is_file())
    for folder in folders:
        others = tuple(f"doors.{other}" for other in folders if other != folder)
        found = [
            f"{file}: {name}"
            for file, names in imported(f"doors/{folder}").items()
            for name in names
            if name.startswith(others)
        ]
        assert found == [], f"doors/{folder} imports another door"
    assert offenders("doors/kserve", ("ts",)) == [] and offenders("bench", ("ts",)) == []


def test_the_launcher_has_one_home() -> None:
    """No module re-executes another launcher (``os.execve``/``os.execv``); the folders that are not doors import no
    door, except the deprecated aliases that point at them."""
    for package in ("doors", "model_store", "supervise", "forwarding", "serving_core", "explainers"):
        for path in (ROOT / package).rglob("*.py"):
            assert "os.exec" not in path.read_text(encoding="utf-8"), f"{path.relative_to(ROOT)} re-executes"
    for package in ("model_store", "supervise", "forwarding", "explainers", "explain_client", "monitoring"):
        found = [
            item for item in offenders(package, ("doors", "handlers", "servers")) if "model_store/serving" not in item
        ]
        assert found == [], f"{package} imports a door"
    for alias in ALIASES:
        for path in (ROOT / alias).glob("*.py"):
            assert len(path.read_text(encoding="utf-8").splitlines()) <= 12, f"{path.relative_to(ROOT)} is an alias"


def test_the_served_tasks_import_the_library_through_its_public_surface() -> None:
    """The task services call ``explainers`` by the names of ``explainers/__init__.py`` only (its planner among them),
    never a module behind it."""
    deep = sorted(
        f"{file}: {name}"
        for file, names in imported("serving_core").items()
        if file.startswith("serving_core/tasks/")
        for name in names
        if name.startswith("explainers.")
    )
    assert deep == []


def test_the_scan_sees_function_level_and_relative_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    import ts.torch_handler\n    from .b import x\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert imported("pkg")["pkg/a.py"] == {"ts.torch_handler", "pkg.b"}
    assert offenders("pkg", ("ts",)) == ["pkg/a.py: ts.torch_handler"]


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_has_its_entry_file_and_its_codec(name: str) -> None:
    """A registered task's record names its TorchServe entry file (the one file in doors/torchserve/ that names the
    task; archives already built name it), and the task has its own OIP codec."""
    from doors.kserve.oip import CODECS

    task = get_task(name)
    assert task.name == name and name in CODECS
    entries = [
        path for path in (ROOT / "doors" / "torchserve").glob("*_handler.py") if f'task = "{name}"' in path.read_text()
    ]
    assert entries == [ROOT / "doors" / "torchserve" / TASKS[name].entry_file], (
        f"one TorchServe entry file in doors/torchserve/ names task {name!r}: its record's entry_file"
    )


def test_a_task_without_an_entry_file_or_a_codec_gets_the_generic_ones() -> None:
    """The generic TorchServe entry file serves the archive's ``handler.task`` (it names no task); the KServe door
    serves a task without a codec of its own with the generic codec of JSON documents."""
    from doors.kserve.oip import CODECS, DocumentCodec, codec_for
    from doors.torchserve.entry import TaskExplanationHandler
    from model_store.archive import entry_file

    assert TaskExplanationHandler.task == "" and entry_file(LENGTH_TASK) == ROOT / "doors" / "torchserve" / "entry.py"
    assert LENGTH_TASK not in CODECS and codec_for(_config()) == DocumentCodec(LENGTH_TASK)


def _task_tables(path: Path) -> list[str]:
    """The literal tables (dict keys, tuples, lists, sets, ``Literal[...]``) of ``path`` that name two or more
    registered tasks. ``text`` and ``image`` alone are also the request's input kinds and fields, and a module's
    ``__all__`` names modules: neither is a table of tasks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    exported = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set) and id(node) not in exported:
            elements: list[Any] = list(node.elts)
        elif isinstance(node, ast.Dict):
            elements = [key for key in node.keys if key is not None]
        else:
            continue
        names = {e.value for e in elements if isinstance(e, ast.Constant) and e.value in TASKS}
        if len(names) >= 2 and not names <= {"text", "image"}:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {sorted(names)}")
    return found


def test_no_module_but_the_registry_keeps_a_table_of_tasks() -> None:
    """The facts about tasks (their library task, model class, head suffixes, entry file, budgets, examples) are
    asked of the task's record, :data:`serving_core.registry.TASKS`; no other production module lists tasks."""
    packages = ("serving_core", "doors", "model_store", "explainers", "supervise", "forwarding", "explain_client",
                "batch", "records", "monitoring", "explain_eval", "bench", "scripts", *ALIASES)  # fmt: skip
    found = [
        table
        for package in packages
        for path in sorted((ROOT / package).rglob("*.py"))
        if "_generated" not in path.parts and path != ROOT / "serving_core" / "registry.py"
        for table in _task_tables(path)
    ]
    assert found == []
    assert _task_tables(ROOT / "serving_core" / "registry.py") == [], "the registry holds records, not tables"


# -- a throw-away task, served without editing any project module -------------------------------------------------


@dataclass(frozen=True)
class LengthRow:
    """A row of the length task: its text."""

    encoding: Encoding
    text: str


@dataclass(frozen=True)
class LengthOutcome:
    """The answer to a length row: its text's token count (or the row's error)."""

    encoding: Encoding
    error: RowError | None = None
    tokens: int = 0
    method: str | None = None
    attribution_seconds: float = 0.0


class LengthService:
    """Counts each row's tokens with the checkpoint's tokenizer."""

    head_type = "length"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def run(
        self, rows: Sequence[LengthRow | RowError], encodings: Sequence[Encoding]
    ) -> tuple[list[LengthOutcome], BatchTimings]:
        outcomes = [
            LengthOutcome(encoding, error=row)
            if isinstance(row, RowError)
            else LengthOutcome(encoding, tokens=len(self.tokenizer(row.text)["input_ids"]))
            for row, encoding in zip(rows, encodings, strict=True)
        ]
        return outcomes, BatchTimings()


class LengthTask(Task[LengthRow, LengthOutcome]):
    """How many tokens a text has (JSON rows only: ``{"text": ...}`` or a text body)."""

    name = "length"
    main_input = "text"

    def load(self, config: HandlerConfig, model_dir: Path, device: Any) -> LengthService:
        from transformers import AutoTokenizer

        return LengthService(AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True))

    def decode(self, body: Body, explain_header: bool, config: HandlerConfig) -> LengthRow:
        if body.message is not None or body.binary is not None:
            raise RowError("unsupported_input", "the length task takes a JSON body {'text': ...}")
        text = body.text if body.document is None else body.document.get("text")
        if not isinstance(text, str):
            raise RowError("missing_text", "missing 'text': send {'text': ...}")
        return LengthRow(body.encoding, text)

    def requested_method(self, row: LengthRow) -> str | None:
        return None

    def with_explanation(self, row: LengthRow, config: HandlerConfig) -> LengthRow:
        return row  # nothing to explain: a count

    def with_deadline(self, row: LengthRow, deadline: Deadline | None) -> LengthRow:
        return row  # a count is never late

    def to_dict(self, outcome: LengthOutcome, config: HandlerConfig) -> dict[str, Any]:
        return {"tokens": outcome.tokens}

    def to_proto(self, outcome: LengthOutcome, response: Any, config: HandlerConfig) -> None:
        raise AssertionError("protobuf rows are refused by decode: no row is answered in protobuf")


LENGTH = LengthTask()
#: The length task's ``handler.task``: its record's import path.
LENGTH_TASK = f"{__name__}:LENGTH_FACTS"
LENGTH_FACTS = TaskFacts(
    name="length",
    task=f"{__name__}:LENGTH",
    explained_as="sequence_classification",
    model_class="AutoModelForSequenceClassification",
    head_suffixes=(),
    examples=Examples(
        torchserve=(TorchServeCall("predictions", '-d \'{"text": "what a lovely day"}\''),),
        oip='{"inputs": [{"name": "document", "datatype": "BYTES", "shape": [1], "data": ["{\\"text\\": \\"hi\\"}"]}]}',
        v1='{"instances": [{"text": "what a lovely day"}]}',
    ),
    labelled=False,
    time_budget=False,
)


def _config() -> HandlerConfig:
    return HandlerConfig.from_model_yaml({"handler": {"task": LENGTH_TASK, "max_length": 64}})


class _Context:
    """What TorchServe's handler reads of its context, for one batch."""

    def __init__(self, model_yaml: Mapping[str, Any], model_dir: Path) -> None:
        self.model_yaml_config = model_yaml
        self.system_properties = {"model_dir": str(model_dir)}
        self.model_name = "length"
        self.statuses: dict[int, int] = {}
        self.request_id_headers: dict[int, str] = {}

    def get_request_header(self, index: int, name: str) -> str | None:
        return None

    def get_all_request_header(self, index: int) -> dict[str, str]:
        return {}

    def set_response_content_type(self, index: int, content_type: str) -> None:
        pass

    def set_response_status(self, status: int, phrase: str, index: int) -> None:
        self.statuses[index] = status

    def set_response_header(self, index: int, name: str, value: str) -> None:
        if name == "X-Request-Id":
            self.request_id_headers[index] = value


@pytest.fixture(scope="module")
def length_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The length task's archive over a tiny text classifier's checkpoint, packaged with the generic entry file."""
    from model_store.archive import ServingConfig, entry_file, make_archive
    from tests.checkpoints import multi_label

    folder = tmp_path_factory.mktemp("length")
    checkpoint = multi_label(folder / "checkpoint")
    config = ServingConfig(task=LENGTH_TASK, labels=(), max_length=64, batch_size=4)
    return make_archive("length", entry_file(LENGTH_TASK), checkpoint, config, folder / "store" / "length")


def test_the_throw_away_task_is_found_by_its_record_and_served_by_the_generic_handler(length_archive: Path) -> None:
    import yaml

    from doors.torchserve.entry import TaskExplanationHandler
    from model_store.archive import MANIFEST_PATH

    assert task_facts(LENGTH_TASK) is LENGTH_FACTS and get_task(LENGTH_TASK) is LENGTH
    config = _config()
    assert config.task == LENGTH_TASK and config.labels == () and config.time_budget_s is None
    manifest = json.loads((length_archive / MANIFEST_PATH).read_text())
    assert manifest["model"]["handler"] == "entry.py"
    model_yaml = yaml.safe_load((length_archive / "model-config.yaml").read_text())
    assert model_yaml["handler"]["task"] == LENGTH_TASK and "labels" not in model_yaml["handler"]
    handler = TaskExplanationHandler()
    context = _Context(model_yaml, length_archive)
    handler.initialize(context)
    rows: list[dict[str, Any]] = [{"body": {"text": "a b c"}}, {"body": b"{}"}, {"body": "a b"}, {"request": b""}]
    answers = handler.handle(rows, context)
    tokenizer = handler.service.tokenizer  # type: ignore[union-attr]
    ids = context.request_id_headers
    assert json.loads(answers[0]) == {"id": ids[0], "tokens": len(tokenizer("a b c")["input_ids"])}
    assert json.loads(answers[2]) == {"id": ids[2], "tokens": len(tokenizer("a b")["input_ids"])}
    assert context.statuses == {1: 400, 3: 415}  # missing_text; unsupported_input (a protobuf row)


@pytest.fixture(scope="module")
def length_doors(length_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """TorchServe and, with the extras, the KServe door serving the length archive: door → its REST URL (and
    ``token``: TorchServe's inference key)."""
    from doors.torchserve.config import Ports
    from doors.torchserve.process import start, stop
    from tests.doors_support import missing_extras

    run_dir = tmp_path_factory.mktemp("length-torchserve")
    server = start(run_dir, length_archive.parent, {"length": "length"}, Ports.free(), timeout=300)
    urls = {"torchserve": server.inference_url, "token": server.keys["inference"]}
    kserve_dir = tmp_path_factory.mktemp("length-kserve")
    try:
        if missing_extras() is None:
            from doors.kserve import launch

            ports = Ports.free()
            models = {"length": length_archive}
            door = launch.start("kserve", models, kserve_dir, ports.inference, ports.grpc_inference, replicas=1,
                                timeout=400, env={"OMP_NUM_THREADS": "1"})  # fmt: skip
            urls["kserve"] = door.url
        yield urls
    finally:
        stop(run_dir)
        if "kserve" in urls:
            from doors.kserve import launch

            launch.stop(kserve_dir)


@pytest.mark.slow
def test_the_throw_away_task_is_served_by_torchserve_and_the_kserve_door(length_doors: dict[str, str]) -> None:
    from tests.doors_support import missing_extras
    from tests.serving_support import http_post

    text = "the service was quick and the staff were lovely"
    status, answer = http_post(
        f"{length_doors['torchserve']}/predictions/length", json.dumps({"text": text}).encode(), length_doors["token"]
    )
    assert status == 200 and isinstance(answer, dict) and answer["tokens"] > 3, answer
    assert isinstance(answer["id"], str) and answer["id"]  # each door's answer has its own id: compared without
    answer = {key: value for key, value in answer.items() if key != "id"}
    if missing_extras() is not None:
        pytest.skip(missing_extras() or "")
    url = length_doors["kserve"]
    infer = {
        "inputs": [{"name": "document", "datatype": "BYTES", "shape": [2], "data": [json.dumps({"text": text}), "{}"]}]
    }
    status, reply = http_post(f"{url}/v2/models/length/infer", json.dumps(infer).encode(), None)
    assert status == 200, reply
    outputs = {output["name"]: output["data"] for output in reply["outputs"]}
    document = json.loads(outputs["document"][0])
    assert {key: value for key, value in document.items() if key != "id"} == answer and outputs["document"][1] == ""
    assert outputs["error_code"] == ["", "missing_text"]
    status, reply = http_post(
        f"{url}/v1/models/length:predict", json.dumps({"instances": [{"text": text}]}).encode(), None
    )
    assert status == 200 and reply == {"id": reply["id"], "ids": [reply["id"]], "predictions": [answer]}, reply


def test_batch_jobs_are_door_neutral() -> None:
    """batch/ serves through the serving core like a door, but is none: it imports no door and no server, Ray only in
    its Ray runner."""
    found = offenders("batch", (*SERVERS, "doors", "handlers", "servers"))
    assert [item for item in found if item != "batch/ray_job.py: ray"] == []


def test_the_records_store_is_door_neutral() -> None:
    """``records`` imports no server, no door and no torch (only the error table of the serving core), so the
    doors, the router and ``explain-records`` can all use it."""
    forbidden = (*SERVERS, "doors", "handlers", "servers", "model_store", "torch", "transformers", "explainers")
    assert offenders("records", forbidden) == []
    core = {name for names in imported("records").values() for name in names if name.startswith("serving_core")}
    assert core <= {"serving_core.errors"}


def test_the_router_and_the_launcher_import_no_torch() -> None:
    """The router restarts in a fraction of a second after a kill (its supervisor starts it again under load), and
    ``make serve`` answers ``--help`` at once: neither imports torch (the Batch API's job runner is imported only by a
    router that serves batches)."""
    import subprocess
    import sys

    for module in ("doors.torchserve.router", "doors.launch", "doors.explain_serve"):
        probe = f"import sys, {module}; print('torch' in sys.modules)"
        found = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
        assert found.stdout.strip() == "False", f"{module} imports torch"
