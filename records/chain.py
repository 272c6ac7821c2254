"""The hash chain that makes a store's records tamper-evident, and its verification.

Each stored record is a link: its sequence number ``seq`` (1, 2, 3, ... in the order written), its body (the event's
canonical JSON, :func:`records.event.canonical_json`), ``body_hash = sha256(body)``, the previous link's hash
``prev_hash`` (:data:`GENESIS` for the first) and its own ``hash = sha256("<prev_hash>:<seq>:<body_hash>")``. The
store also keeps two marks: the **head** (the last link's ``seq`` and ``hash``, written in the same transaction as the
links) and the **anchor** (the ``seq`` and ``hash`` of the last link retention removed; ``0`` and :data:`GENESIS`
before any).

:func:`verify_links` walks the links in order from the anchor and names every record that does not fit:

- a body changed in place: its ``sha256`` is not its ``body_hash`` (``changed``);
- a ``body_hash`` or ``prev_hash`` rewritten to match: the link's ``hash`` no longer covers them (``changed``);
- a record deleted: its ``seq`` is missing, and the next link's ``prev_hash`` is not the hash before it
  (``missing``, naming the sequence numbers); records deleted at the end: the head is past the last link;
- a record replaced or re-chained: its ``prev_hash`` is not the previous link's hash (``broken``);
- a body whose ``id`` is not the record's id column (``changed``).

Erasure (GDPR) replaces a body by a tombstone that keeps only the envelope, and keeps ``body_hash`` and ``hash``:
the chain still verifies, the erased body is no longer checked, and the verification counts the erased records.
Retention deletes a prefix of the chain (the oldest records) and moves the anchor to the last deleted link, so the
first kept link follows the anchor. What a chain cannot show on its own is a rewrite of the whole chain from some
point with the head updated to match: record the head ``verify`` prints (``seq`` and ``hash``) somewhere else, and a
later rewrite before that point no longer matches it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

#: The ``prev_hash`` of the first link.
GENESIS = "0" * 64


def body_hash(body: str) -> str:
    """The SHA-256 (hex) of a record's canonical JSON body."""
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def link_hash(prev_hash: str, seq: int, body_digest: str) -> str:
    """A link's hash: ``sha256("<prev_hash>:<seq>:<body_hash>")`` in hex."""
    return hashlib.sha256(f"{prev_hash}:{seq}:{body_digest}".encode("ascii")).hexdigest()


@dataclass(frozen=True)
class Mark:
    """A position in the chain: a sequence number and the hash of the link there.

    Attributes:
        seq: The link's sequence number (0 before the first).
        hash: The link's hash (:data:`GENESIS` before the first).
    """

    seq: int
    hash: str


#: The mark before the first record.
START = Mark(0, GENESIS)


@dataclass(frozen=True)
class Link:
    """One stored record as the chain sees it.

    Attributes:
        seq: Its sequence number.
        id: Its record id (the store's id column).
        body: Its canonical JSON body (a tombstone when erased).
        body_hash: The stored SHA-256 of its original body.
        prev_hash: The stored hash of the link before it.
        hash: Its stored link hash.
        erased: Whether its body was erased (the tombstone is not checked against ``body_hash``).
    """

    seq: int
    id: str
    body: str
    body_hash: str
    prev_hash: str
    hash: str
    erased: bool = False


@dataclass(frozen=True)
class Problem:
    """One record that does not fit the chain.

    Attributes:
        seq: The sequence number of the record (the first missing one for ``missing``).
        id: Its record id, or None for missing records.
        kind: ``changed``, ``missing``, ``broken`` or ``unexpected``.
        message: What is wrong, naming the record.
    """

    seq: int
    id: str | None
    kind: str
    message: str


@dataclass
class Verification:
    """The result of verifying a store's chain.

    Attributes:
        checked: Records walked.
        erased: Erased records among them (their links checked, not their bodies).
        anchor: Where the chain starts (after retention: the last removed link).
        head: The store's head mark.
        problems: Every record that does not fit, in chain order.
    """

    checked: int = 0
    erased: int = 0
    anchor: Mark = START
    head: Mark = START
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no record is changed or missing."""
        return not self.problems

    def summary(self) -> str:
        """One line: ``ok`` or the number of problems, the records checked, and the head to note elsewhere."""
        state = "ok" if self.ok else f"{len(self.problems)} problem(s)"
        return (
            f"{state}: {self.checked} record(s) checked ({self.erased} erased), chain from seq {self.anchor.seq}, "
            f"head seq {self.head.seq} hash {self.head.hash}"
        )


def _body_id(body: str) -> str | None:
    try:
        value = json.loads(body).get("id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def verify_links(links: Iterable[Link], anchor: Mark, head: Mark) -> Verification:
    """Walk ``links`` (in ``seq`` order) from ``anchor`` and check each one and the ``head``.

    Args:
        links: Every stored link, ordered by ``seq``.
        anchor: The store's anchor mark.
        head: The store's head mark.

    Returns:
        The :class:`Verification`, naming every record that does not fit.
    """
    result = Verification(anchor=anchor, head=head)
    expected = anchor
    previous: Link | None = None
    for link in links:
        result.checked += 1
        result.erased += link.erased
        name = f"record {link.seq} (id {link.id})"
        if link.seq > expected.seq + 1:
            first, last = expected.seq + 1, link.seq - 1
            span = f"record {first}" if first == last else f"records {first}-{last}"
            result.problems.append(
                Problem(first, None, "missing", f"{span} missing: the chain jumps from {expected.seq} to {link.seq}")
            )
        elif link.seq <= expected.seq:
            result.problems.append(
                Problem(link.seq, link.id, "unexpected", f"{name} is out of order (after {expected.seq})")
            )
        elif link.prev_hash != expected.hash:
            if previous is None:
                message = f"{name} does not follow the chain's start (seq {expected.seq}): its previous hash differs"
                result.problems.append(Problem(link.seq, link.id, "broken", message))
            else:
                message = (
                    f"record {previous.seq} (id {previous.id}) was changed or replaced: the record after it "
                    f"({link.seq}) holds another hash for it"
                )
                result.problems.append(Problem(previous.seq, previous.id, "broken", message))
        if not link.erased and body_hash(link.body) != link.body_hash:
            result.problems.append(
                Problem(link.seq, link.id, "changed", f"{name} was changed: its body does not match its hash")
            )
        elif link_hash(link.prev_hash, link.seq, link.body_hash) != link.hash:
            result.problems.append(
                Problem(link.seq, link.id, "changed", f"{name} was changed: its link hash does not cover its content")
            )
        elif _body_id(link.body) != link.id:
            result.problems.append(
                Problem(link.seq, link.id, "changed", f"{name} was changed: its body names another id")
            )
        expected = Mark(link.seq, link.hash)
        previous = link
    if head.seq > expected.seq:
        first = expected.seq + 1
        span = f"record {first}" if first == head.seq else f"records {first}-{head.seq}"
        result.problems.append(
            Problem(first, None, "missing", f"{span} missing: the store's head is {head.seq}, its last record "
                    f"{expected.seq}")
        )  # fmt: skip
    elif head.seq < expected.seq:
        result.problems.append(
            Problem(head.seq + 1, None, "unexpected", f"records after the store's head ({head.seq}) up to "
                    f"{expected.seq} were added outside the store")
        )  # fmt: skip
    elif head.hash != expected.hash:
        result.problems.append(
            Problem(expected.seq, None, "changed", f"record {expected.seq} does not match the store's head hash")
        )
    return result


__all__ = ["GENESIS", "START", "Link", "Mark", "Problem", "Verification", "body_hash", "link_hash", "verify_links"]
