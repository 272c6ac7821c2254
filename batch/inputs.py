"""A job's input lines: the OpenAI Batch API's JSONL, or a Parquet table of texts or image paths.

Every input becomes a stream of :class:`Request` (one line to answer) and :class:`LineError` (a line that cannot be
sent: not JSON, no ``custom_id``, a ``custom_id`` seen before, a ``method`` other than ``POST``, a ``url`` the job does
not serve), in input order, so that the job answers the first and writes the second to its error file and goes on.

- JSONL (:func:`read_jsonl`): ``{"custom_id", "method": "POST", "url", "body"}`` per line, ``url`` one of
  ``/predictions/<model>`` and ``/explanations/<model>`` (the body is the REST door's JSON) or, for causal LMs,
  ``/v1/chat/completions`` and ``/v1/completions`` (the body is the OpenAI request, its ``model`` a job's model);
- Parquet (:func:`read_parquet`): one row per line, its id in ``id_column``, its input in ``text_column`` (texts; a
  causal LM's prompts) or ``image_column`` (image file paths, relative to the table's folder, or the images' bytes),
  sent as the REST door's body ``{"text"|"prompt"|"image": ..., "explain": EXPLAIN}`` to ``/predictions/<model>``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The OpenAI routes of causal LMs, by ``url``.
OPENAI_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
#: The REST door's routes, by their first path segment (the second is the model's name).
REST_ROUTES = {"predictions": False, "explanations": True}


@dataclass(frozen=True)
class Route:
    """Where a line is sent.

    Attributes:
        kind: ``rest`` (``/predictions/<model>``, ``/explanations/<model>``), ``chat`` or ``completion``.
        model: the model's name (OpenAI routes: the body's ``model``).
        explain: a REST explanations route (an absent ``explain`` means the model's default method).
    """

    kind: str
    model: str
    explain: bool = False


@dataclass(frozen=True)
class Request:
    """One line to answer.

    Attributes:
        custom_id: the caller's id of the line (unique in the input).
        url: the line's ``url``.
        route: where it goes.
        body: the JSON body, as the online route takes it.
        line: its line (JSONL) or row (Parquet) number, from 1.
        parent: the stored record it explains again (``explain-batch --from-records``), written in its lines.
    """

    custom_id: str
    url: str
    route: Route
    body: Any
    line: int
    parent: str | None = None


@dataclass(frozen=True)
class LineError:
    """A line that cannot be sent: written to the error file, the job goes on.

    Attributes:
        line: its line (row) number, from 1.
        custom_id: its ``custom_id`` when it had one.
        code: what is wrong (``invalid_json``, ``invalid_line``, ``duplicate_custom_id``, ``invalid_url``,
            ``model_not_found``).
        message: what is wrong, and what to change.
        parent: the stored record it was to explain again (``explain-batch --from-records``).
    """

    line: int
    custom_id: str | None
    code: str
    message: str
    parent: str | None = None


class RouteError(ValueError):
    """A line's ``url`` (or OpenAI body's ``model``) the job does not serve."""

    def __init__(self, code: str, message: str) -> None:
        """``code``: ``invalid_url`` or ``model_not_found``."""
        super().__init__(message)
        self.code = code
        self.message = message


def parse_route(url: Any, body: Any, models: Mapping[str, Any]) -> Route:
    """The route of a line's ``url`` (and, for the OpenAI routes, its body's ``model``).

    Raises:
        RouteError: ``invalid_url`` for a url the job does not serve, ``model_not_found`` for a model not given with
            ``--model``.
    """
    if not isinstance(url, str):
        raise RouteError("invalid_url", "'url' must be a string such as /predictions/<model> or /v1/chat/completions")
    if url in OPENAI_ROUTES:
        model = body.get("model") if isinstance(body, Mapping) else None
        if not isinstance(model, str) or model not in models:
            raise RouteError("model_not_found", f"{url}: body 'model' {model!r} is not one of the job's models")
        return Route(OPENAI_ROUTES[url], model)
    parts = url.strip("/").split("/")
    if len(parts) == 2 and parts[0] in REST_ROUTES:
        if parts[1] not in models:
            served = ", ".join(models)
            raise RouteError("model_not_found", f"{url}: no model {parts[1]!r} in this job (models: {served})")
        return Route("rest", parts[1], REST_ROUTES[parts[0]])
    routes = ", ".join(["/predictions/<model>", "/explanations/<model>", *OPENAI_ROUTES])
    raise RouteError("invalid_url", f"url {url!r} is not served by explain-batch; one of: {routes}")


def parse_line(text: str, number: int, models: Mapping[str, Any]) -> Request | LineError:
    """One JSONL line of the Batch API (module docstring); duplicates are the caller's to find."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        return LineError(
            number, None, "invalid_json", f"line {number} is not JSON: {error.msg} at column {error.colno}"
        )
    if not isinstance(document, dict):
        return LineError(number, None, "invalid_line", f"line {number} must be a JSON object")
    custom_id = document.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(number, None, "invalid_line", f"line {number}: 'custom_id' must be a non-empty string")
    method = document.get("method", "POST")
    if method != "POST":
        return LineError(number, custom_id, "invalid_line", f"line {number}: 'method' must be POST, got {method!r}")
    if "body" not in document:
        return LineError(number, custom_id, "invalid_line", f"line {number}: the line has no 'body'")
    try:
        route = parse_route(document.get("url"), document["body"], models)
    except RouteError as error:
        return LineError(number, custom_id, error.code, f"line {number}: {error.message}")
    return Request(custom_id, document["url"], route, document["body"], number)


def unique(lines: Iterator[Request | LineError]) -> Iterator[Request | LineError]:
    """The lines, a request whose ``custom_id`` was seen before (in a request or an error) turned into a
    ``duplicate_custom_id`` error."""
    seen: set[str] = set()
    for item in lines:
        if item.custom_id is not None:
            if item.custom_id in seen:
                yield LineError(
                    item.line,
                    item.custom_id,
                    "duplicate_custom_id",
                    f"line {item.line}: custom_id {item.custom_id!r} is used by an earlier line",
                    item.parent,
                )
                continue
            seen.add(item.custom_id)
        yield item


def count_jsonl(path: Path) -> int:
    """The number of non-blank lines of a JSONL file."""
    with path.open("rb") as file:
        return sum(1 for raw in file if raw.strip())


def read_jsonl(path: Path, models: Mapping[str, Any]) -> Iterator[Request | LineError]:
    """The lines of a Batch API input file (blank lines skipped), in order, duplicates refused."""

    def lines() -> Iterator[Request | LineError]:
        with path.open("rb") as file:
            for number, raw in enumerate(file, start=1):
                if not raw.strip():
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    yield LineError(number, None, "invalid_json", f"line {number} is not UTF-8")
                    continue
                yield parse_line(text, number, models)

    return unique(lines())


@dataclass(frozen=True)
class TableColumns:
    """How a Parquet table's rows become requests.

    Attributes:
        model: the model every row is sent to.
        id_column: the column of the rows' ids (their ``custom_id``).
        text_column: the column of texts (prompts for a causal LM); or
        image_column: the column of image paths (relative to the table's folder) or image bytes.
        explain: the body's ``explain`` (``None``: none; a model of an explanation method's route gets its default).
    """

    model: str
    id_column: str = "id"
    text_column: str | None = None
    image_column: str | None = None
    explain: Any = None

    def describe(self) -> dict[str, Any]:
        """What of the columns changes the answers (for the job's manifest)."""
        return {"text_column": self.text_column, "image_column": self.image_column, "explain": self.explain}


def parquet_rows(path: Path) -> int:
    """The number of rows of a Parquet file (from its metadata)."""
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def read_parquet(path: Path, columns: TableColumns, main_input: str) -> Iterator[Request | LineError]:
    """The rows of a Parquet table as requests to ``/predictions/<columns.model>``, in order, duplicates refused.

    Args:
        path: the table.
        columns: which columns hold the ids and the inputs.
        main_input: the body field of the model's input (the task's ``main_input``: ``text``, ``image``, ``prompt``).

    Raises:
        ValueError: if a named column is missing, or not exactly one of the text and image columns is given.
    """
    import pyarrow.parquet as pq

    if (columns.text_column is None) == (columns.image_column is None):
        raise ValueError("give exactly one of --text-column and --image-column")
    column = columns.text_column or columns.image_column
    assert column is not None
    table = pq.ParquetFile(path)
    names = table.schema_arrow.names
    for wanted in (columns.id_column, column):
        if wanted not in names:
            raise ValueError(f"{path}: no column {wanted!r} (columns: {', '.join(names)})")
    route = Route("rest", columns.model)
    url = f"/predictions/{columns.model}"

    def rows() -> Iterator[Request | LineError]:
        number = 0
        for batch in table.iter_batches(columns=[columns.id_column, column]):
            for row_id, value in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                number += 1
                if row_id is None or isinstance(row_id, bytes):
                    yield LineError(number, None, "invalid_line", f"row {number}: the id is missing or not text")
                    continue
                custom_id = str(row_id)
                try:
                    content = _row_input(value, columns, path.parent)
                except ValueError as error:
                    yield LineError(number, custom_id, "invalid_line", f"row {number}: {error}")
                    continue
                body: dict[str, Any] = {main_input: content}
                if columns.explain is not None:
                    body["explain"] = columns.explain
                yield Request(custom_id, url, route, body, number)

    return unique(rows())


def _row_input(value: Any, columns: TableColumns, folder: Path) -> str:
    """A row's input as the REST body carries it: the text, or the image as base64.

    Raises:
        ValueError: for a missing value, or an image file that cannot be read.
    """
    if value is None:
        raise ValueError("the input is missing")
    if columns.text_column is not None:
        if not isinstance(value, str):
            raise ValueError(f"column {columns.text_column!r} must hold text, got {type(value).__name__}")
        return value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    image = Path(str(value))
    image = image if image.is_absolute() else folder / image
    try:
        return base64.b64encode(image.read_bytes()).decode("ascii")
    except OSError as error:
        raise ValueError(f"cannot read image {str(value)!r}: {error.strerror}") from None
