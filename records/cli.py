"""``explain-records``: verify, list, show, erase and apply retention to a records store.

::

    explain-records verify STORE                       # exit 1 when a record is changed or missing (each is named)
    explain-records list STORE [--model M] [--since T] [--until T] [--limit N] [--cursor C] [--json]
    explain-records show STORE ID                      # the record as JSON
    explain-records erase STORE ID                     # its body becomes a tombstone; the chain still verifies
    explain-records retain STORE --days N              # delete records older than N days
    explain-records prove STORE ID INPUT [--bytes]     # exit 0 when the record saw that input (a JSON file, or bytes)

``STORE`` is a store URL (:mod:`records.stores`: ``sqlite``, ``sqlite:///path``, ``postgresql://...``); the HTTP
sink is write-only and cannot be read here. A SQLite store that does not exist is an error, never made. ``--since``
and ``--until`` are ISO 8601 dates or times (UTC when no zone is given); ``--since`` is inclusive, ``--until`` not.
``prove`` checks an input someone says was sent against a ``hash`` (or ``full``) record, with the store's salt.
Exit status: 0 done, 1 a problem found (verify), no such record (show, erase, prove) or another input (prove), 2 a
usage or store error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import RecordsError
from .event import input_matches, parse_time
from .store import DEFAULT_LIMIT, MAX_LIMIT, RecordStore, StoredRecord
from .stores import URL_FORMS, open_store


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="explain-records", description="Verify, list, show, erase and apply retention to a records store."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    store_help = f"the store: {URL_FORMS}"
    verify = commands.add_parser("verify", help="check the hash chain; name every changed or missing record")
    verify.add_argument("store", metavar="STORE", help=store_help)
    listing = commands.add_parser("list", help="list records, oldest first")
    listing.add_argument("store", metavar="STORE", help=store_help)
    listing.add_argument("--model", help="only this model's records")
    listing.add_argument("--since", type=parse_time, help="answered at or after this time (ISO 8601)")
    listing.add_argument("--until", type=parse_time, help="answered before this time (ISO 8601)")
    listing.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=f"the most records (1-{MAX_LIMIT})")
    listing.add_argument("--cursor", help="the cursor the previous page printed")
    listing.add_argument("--json", action="store_true", help="one event per line, as JSON")
    show = commands.add_parser("show", help="print one record as JSON")
    show.add_argument("store", metavar="STORE", help=store_help)
    show.add_argument("id", metavar="ID")
    erase = commands.add_parser("erase", help="erase a record's body (the chain stays verifiable)")
    erase.add_argument("store", metavar="STORE", help=store_help)
    erase.add_argument("id", metavar="ID")
    retain = commands.add_parser("retain", help="delete records older than --days")
    retain.add_argument("store", metavar="STORE", help=store_help)
    retain.add_argument("--days", type=float, required=True, help="how many days of records to keep")
    prove = commands.add_parser("prove", help="check that a record saw an input (its hash or its kept copy)")
    prove.add_argument("store", metavar="STORE", help=store_help)
    prove.add_argument("id", metavar="ID")
    prove.add_argument("input", metavar="INPUT", type=Path, help="the input: a JSON request body (or raw, --bytes)")
    prove.add_argument("--bytes", action="store_true", help="compare the file's bytes, not its JSON document")
    return parser


def _line(record: StoredRecord) -> str:
    data = record.event.get("data") or {}
    if record.erased:
        what = "erased"
    elif data.get("error"):
        what = f"error {data['error'].get('code')}"
    else:
        what = data.get("method") or "prediction"
    return f"{record.seq:>8}  {record.time:<27}  {record.model:<20}  {what:<22}  {record.id}"


def _run(args: argparse.Namespace, store: RecordStore) -> int:
    if args.command == "verify":
        result = store.verify()
        for problem in result.problems:
            print(problem.message)
        print(result.summary())
        return 0 if result.ok else 1
    if args.command == "list":
        page = store.list(model=args.model, since=args.since, until=args.until, limit=args.limit, cursor=args.cursor)
        for record in page.records:
            print(json.dumps(record.event, ensure_ascii=False) if args.json else _line(record))
        if page.next_cursor is not None:
            print(f"more: --cursor {page.next_cursor}", file=sys.stderr)
        return 0
    if args.command == "show":
        found = store.get(args.id)
        if found is None:
            print(f"explain-records: no record {args.id} in {store.location}", file=sys.stderr)
            return 1
        print(json.dumps(found.event, ensure_ascii=False, indent=2))
        return 0
    if args.command == "erase":
        erased = store.erase(args.id)
        if erased == 0:
            already = store.get(args.id)
            if already is None:
                print(f"explain-records: no record {args.id} in {store.location}", file=sys.stderr)
                return 1
            print(f"record {args.id} was erased already")
            return 0
        print(f"erased {erased} record(s) {args.id}")
        return 0
    if args.command == "prove":
        return _prove(args, store)
    removed = store.retain(args.days)
    print(f"removed {removed} record(s) older than {args.days:g} day(s)")
    return 0


def _prove(args: argparse.Namespace, store: RecordStore) -> int:
    found = store.get(args.id)
    if found is None:
        print(f"explain-records: no record {args.id} in {store.location}", file=sys.stderr)
        return 1
    raw = args.input.read_bytes()
    content = raw if args.bytes else json.loads(raw)
    if input_matches(found.event, content, store.salt):
        print(f"record {args.id} saw this input")
        return 0
    kept = ((found.event.get("data") or {}).get("input") or {}).get("payload", "erased" if found.erased else "none")
    print(f"record {args.id} did not see this input (it kept: {kept})")
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``explain-records`` with ``argv`` (default: the command line); returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        with open_store(args.store, create=False) as store:
            return _run(args, store)
    except (RecordsError, ValueError, OSError) as error:
        print(f"explain-records: {error}", file=sys.stderr)
        return 2


def entry_point() -> None:
    """The ``explain-records`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
