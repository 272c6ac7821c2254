"""``explain records ...``: the service's records over its ``/v1/records`` routes (:mod:`explain_client.records`).

::

    explain records list --model sentiment --since 2026-12-01 --limit 50     # one line per record
    explain records list --json --cursor 50                                  # the next page, one event per line
    explain records show 7d42fd44-...-1                                      # the record as JSON
    explain records page 7d42fd44-...-1 -o record.html                       # the page explain --html draws
    explain records explain 7d42fd44-...-1 --method grad_x_input         # the stored input explained again
    explain records erase 7d42fd44-...-1

Where the server is: ``--url`` (``$EXPLAIN_URL``), else the run folder's ports (``--run-dir``, as ``explain``); the
records key: ``--records-key=KEY``, ``$EXPLAIN_RECORDS_KEY``, else the ``records`` entry of ``--token-file`` or the
run folder's ``key_file.json``. Exit status: 0 done, 1 the service refused (its code and message on stderr), 2 bad
usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from .records import RecordsClient, read_records_key
from .results import ServiceError
from .transport import DEFAULT_REST_URL

#: The environment variable of the records key.
RECORDS_KEY_ENV = "EXPLAIN_RECORDS_KEY"


def build_parser() -> argparse.ArgumentParser:
    """The ``explain records`` argument parser."""
    parser = argparse.ArgumentParser(prog="explain records", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("EXPLAIN_URL"), help=f"REST base URL ({DEFAULT_REST_URL})")
    parser.add_argument("--run-dir", type=Path, help="the server's run folder (its ports.json and key_file.json)")
    parser.add_argument("--records-key", help=f"the records key (else ${RECORDS_KEY_ENV}, else the key file's)")
    parser.add_argument("--token-file", type=Path, help="a key_file.json with a 'records' entry")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per call (default 60)")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="a page of records, oldest first")
    listing.add_argument("--model")
    listing.add_argument("--since", help="ISO 8601, inclusive")
    listing.add_argument("--until", help="ISO 8601, exclusive")
    listing.add_argument("--limit", type=int)
    listing.add_argument("--cursor", help="the next page's cursor (printed on stderr)")
    listing.add_argument("--json", action="store_true", help="one event per line")
    for name, text in (("show", "one record as JSON"), ("erase", "erase a record")):
        commands.add_parser(name, help=text).add_argument("id")
    page = commands.add_parser("page", help="a record's HTML page")
    page.add_argument("id")
    page.add_argument("-o", "--output", type=Path, help="write it here (default: stdout)")
    again = commands.add_parser("explain", help="explain a record's stored input again by another method")
    again.add_argument("id")
    again.add_argument("--method", required=True)
    again.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a method option (JSON)")
    return parser


def _run_dir(args: argparse.Namespace) -> Path:
    """``--run-dir``, else the run folder ``explain`` uses: ``$EXPLAIN_WORKDIR/run``, else ``./run``."""
    return Path(args.run_dir) if args.run_dir else Path(os.environ.get("EXPLAIN_WORKDIR") or ".") / "run"


def make_records_client(args: argparse.Namespace) -> RecordsClient:
    """The records client the arguments describe (see the module docstring)."""
    run_dir = _run_dir(args)
    url = args.url
    ports = run_dir / "ports.json"
    if not url and ports.is_file():
        url = f"http://127.0.0.1:{json.loads(ports.read_text(encoding='utf-8'))['inference']}"
    key = args.records_key or os.environ.get(RECORDS_KEY_ENV)
    if not key:
        key_file = args.token_file or run_dir / "key_file.json"
        key = read_records_key(key_file)
    return RecordsClient(url or DEFAULT_REST_URL, key, args.timeout)


def _option(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--option {text!r}: write KEY=VALUE")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def _summary(event: dict[str, Any]) -> str:
    data = event.get("data") or {}
    if data.get("erased"):
        return f"{event['id']}  {event['time']}  (erased)"
    error = data.get("error")
    prediction = data.get("prediction") or {}
    said = f"error {error.get('code')}" if isinstance(error, dict) else str(prediction.get("label", "answered"))
    parent = f"  parent {data['parent']}" if data.get("parent") else ""
    model = data.get("model") or {}
    return f"{event['id']}  {event['time']}  {model.get('name')}  {data.get('method') or '-'}  {said}{parent}"


def main(argv: Sequence[str], stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run ``explain records``; the exit status (0 done, 1 refused, 2 bad usage)."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    parser = build_parser()
    args = parser.parse_args(list(argv))
    try:
        options = dict(_option(text) for text in getattr(args, "option", []))
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    client = make_records_client(args)
    try:
        if args.command == "list":
            page = client.list(args.model, args.since, args.until, args.limit, args.cursor)
            for event in page.records:
                print(json.dumps(event, ensure_ascii=False) if args.json else _summary(event), file=out)
            if page.next_cursor is not None:
                print(f"more: --cursor {page.next_cursor}", file=err)
        elif args.command == "show":
            print(json.dumps(client.get(args.id), indent=2, ensure_ascii=False), file=out)
        elif args.command == "page":
            html = client.page(args.id)
            if args.output:
                args.output.write_text(html, encoding="utf-8")
            else:
                out.write(html)
        elif args.command == "explain":
            done = client.explain(args.id, args.method, **options)
            print(json.dumps({"id": done.id, "parent": done.parent, "answer": done.answer}, ensure_ascii=False),
                  file=out)  # fmt: skip
        else:
            print(f"erased {client.erase(args.id)} record(s) {args.id}", file=out)
    except ServiceError as error:
        print(f"explain records: {error.code}: {error.message}", file=err)
        return 1
    finally:
        client.close()
    return 0


__all__ = ["RECORDS_KEY_ENV", "build_parser", "main", "make_records_client"]
