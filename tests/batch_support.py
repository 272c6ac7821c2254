"""What the batch job tests share: tiny models of every task as checkpoint folders and as an archive, the online
answer of a line (what the REST door and the OpenAI routes answer, computed here from the serving core alone), and
the comparison of two answers (timings left out, scores to float rounding), and a records store to re-explain."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from batch.models import BatchModel
from records import Payload, build_record
from records.sqlite_store import SqliteStore
from serving_core.errors import RowError
from serving_core.loading import worker_device
from serving_core.openai_api import OpenAIError, chat_request, completion_answer, completion_request
from serving_core.task import get_task
from serving_core.wire import Encoding
from tests.checkpoints import multi_label, token_classifier, vision
from tests.generation_checkpoint import causal_lm
from tests.serving_support import png_bytes

#: The tiny checkpoints of each task, by model name.
BUILDERS = {"topics": multi_label, "animals": vision, "entities": token_classifier, "writer": causal_lm}


def tiny_models(root: Path) -> dict[str, Path]:
    """Write the tiny checkpoint folders under ``root``; the ``topics`` one also as an archive folder
    (``model-config.yaml`` beside ``model/``), as ``topics-archive``."""
    folders = {name: build(root / name) for name, build in BUILDERS.items()}
    archive = root / "topics-archive"
    (archive / "model").mkdir(parents=True)
    for file in folders["topics"].iterdir():
        (archive / "model" / file.name).symlink_to(file)
    settings = {"batchSize": 3, "handler": {**_handler_section(folders["topics"]), "model_dir": "model"}}
    (archive / "model-config.yaml").write_text(yaml.safe_dump(settings), encoding="utf-8")
    folders["topics-archive"] = archive
    return folders


def _handler_section(folder: Path) -> dict[str, Any]:
    from model_store.package import Settings, serving_config, validate

    return dict(serving_config(validate(folder, "topics"), Settings()).to_dict()["handler"])


def image_b64(seed: int = 0) -> str:
    """A 16×16 PNG as base64 (the vision model's input size)."""
    return base64.b64encode(png_bytes((16, 16), seed)).decode("ascii")


def line(custom_id: str, url: str, body: Any) -> dict[str, Any]:
    """One Batch API input line."""
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    """Write lines (documents, or raw strings written as they are) as JSONL."""
    path.write_text("".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in lines))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The lines of a JSONL file."""
    return [json.loads(text) for text in path.read_text().splitlines() if text.strip()]


class Online:
    """The online answers of one model, from its own service (loaded once), each request served alone."""

    def __init__(self, model: BatchModel) -> None:
        self.model = model
        self.task = get_task(model.config.task)
        self.service = self.task.load(model.config, model.model_dir, worker_device(model.config))

    def rest(self, body: Any, explain_route: bool = False, request_id: str | None = None) -> tuple[int, dict[str, Any]]:
        """What ``/predictions/<model>`` (``/explanations/<model>``) answers a request of id ``request_id`` (its
        ``X-Request-Id``; None: the body without its ``id``): status and JSON body."""
        try:
            row: Any = self.task.decode_row({"body": body}, explain_route, self.model.config)
        except RowError as error:
            row = error
        (outcome,), _ = self.service.run([row], [Encoding.JSON])
        status = outcome.error.http_status if outcome.error is not None else 200
        return status, json.loads(self.task.encode(outcome, self.model.config, request_id))

    def openai(self, url: str, body: Any, answer_id: str) -> tuple[int, dict[str, Any]]:
        """What ``/v1/chat/completions`` or ``/v1/completions`` answers (the answer's ``id`` set to ``answer_id``)."""
        try:
            translated = (chat_request if url.endswith("chat/completions") else completion_request)(body)
            translated = dataclasses.replace(translated, id=answer_id)
            documents, index = translated.distinct()
            answered = [self.rest(document)[1] for document in documents]
            return 200, completion_answer(translated, [answered[position] for position in index])
        except OpenAIError as error:
            return error.status, error.to_dict()


def normalized(value: Any) -> Any:
    """A body without what differs between two runs of the same answer: timings (``seconds``) and ``created``."""
    if isinstance(value, Mapping):
        return {key: normalized(item) for key, item in value.items() if key not in ("seconds", "created")}
    if isinstance(value, list):
        return [normalized(item) for item in value]
    return value


def assert_same(left: Any, right: Any, where: str = "body") -> None:
    """Two answers are the same but for timings and the last digits of their scores (batched rows are padded)."""
    left, right = normalized(left), normalized(right)
    if isinstance(left, float) or isinstance(right, float):
        assert isinstance(left, int | float) and isinstance(right, int | float), f"{where}: {left!r} != {right!r}"
        assert math.isclose(left, right, rel_tol=1e-3, abs_tol=1e-5), f"{where}: {left!r} != {right!r}"
    elif isinstance(left, dict) and isinstance(right, dict):
        assert left.keys() == right.keys(), f"{where}: keys {sorted(left)} != {sorted(right)}"
        for key in left:
            assert_same(left[key], right[key], f"{where}.{key}")
    elif isinstance(left, list) and isinstance(right, list):
        assert len(left) == len(right), f"{where}: {len(left)} items != {len(right)}"
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    else:
        assert left == right, f"{where}: {left!r} != {right!r}"


def by_custom_id(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Lines keyed by ``custom_id`` (each id must appear once)."""
    keyed = {item["custom_id"]: item for item in lines}
    assert len(keyed) == len(lines), "a custom_id is written twice"
    return keyed


#: The texts of :func:`records_store`'s good records.
RECORD_TEXTS = ("the service was quick", "a slow rude waiter", "food cold not warm good", "the staff were lovely")


#: The ``text/plain`` body of the records store's ``plain-body`` row.
PLAIN_BODY = "a plain text body, sent as text/plain"


def records_store(path: Path, version: str | None) -> str:
    """A SQLite records store of ``topics`` rows as the doors write them (``payload: full``, each at its own
    minute of 2026-12-01 from 10:00: ``early`` at 10:00, ``good-0`` to ``good-3`` (the tests' four texts) from 10:01,
    ``late`` at 10:30), a row whose input is a ``text/plain`` body (``plain-body``: explained again as its text), and
    rows it cannot explain again (``other-version``, ``erased``, ``hashed``, ``oip-row``: the OIP request of a row,
    which only the KServe door reads, and one of ``entities``); its URL."""

    def record(
        request: str, minute: int, text: str, model: str = "topics", row_version: str | None = version, raw: Any = None
    ) -> Any:
        return build_record(
            model=model,
            version=row_version,
            task="classification",
            door="torchserve",
            request_id=request,
            index=None,
            answer={"label": "a", "label_id": 0},
            input={"text": text, "explain": {"method": "attnlrp"}} if raw is None else raw,
            time=datetime(2026, 12, 1, 10, minute, tzinfo=UTC),
        )

    with SqliteStore(path, Payload.FULL) as full:
        full.write([record("early", 0, "before the window")])
        full.write([record(f"good-{index}", 1 + index, text) for index, text in enumerate(RECORD_TEXTS)])
        full.write([record("other-version", 6, RECORD_TEXTS[0], row_version="sha256:another")])
        full.write([record("entities-row", 7, RECORD_TEXTS[1], model="entities")])
        full.write([record("erased", 8, "gone")])
        full.erase("erased")
        full.write([record("plain-body", 10, "", raw=PLAIN_BODY.encode())])
        oip = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [RECORD_TEXTS[2]]}]}
        full.write([record("oip-row", 11, "", raw=oip)])
    with SqliteStore(path, Payload.HASH) as hashed:
        hashed.write([record("hashed", 9, "kept as a hash")])
    with SqliteStore(path, Payload.FULL) as full:
        full.write([record("late", 30, "after the window")])
    return f"sqlite://{path}"  # path is absolute: sqlite:///tmp/...
