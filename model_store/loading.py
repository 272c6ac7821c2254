"""Turn transformers' "LOAD REPORT" table about a freshly initialised classification head into one plain sentence.

``AutoModelForSequenceClassification.from_pretrained(base, num_labels=3)`` on a base checkpoint (the default
sentiment recipe starts from MiniLM this way) logs a warning table listing ``classifier.weight | MISSING``, which reads
like an error to a newcomer although the recipe trains that head next. :func:`new_head_notice` replaces exactly that
report, for the duration of a ``with`` block, by one INFO line; any other report (unexpected or mismatched keys,
missing weights outside the head) is logged unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

logger = logging.getLogger(__name__)

#: The logger transformers writes its load reports to.
REPORT_LOGGER = "transformers.modeling_utils"
#: Parameter name prefixes of classification heads (BERT family, RoBERTa, decoders, DistilBERT).
HEAD_PREFIXES = ("classifier.", "score.", "pre_classifier.")
_ROW = re.compile(r"^\s*([\w.]+)\s*\|\s*([A-Z]+)\s*\|")


def missing_head_keys(message: str) -> list[str] | None:
    """The keys of a load report whose only entries are MISSING classification-head parameters, else ``None``."""
    if "LOAD REPORT" not in message:
        return None
    rows = [match.groups() for line in message.splitlines() if (match := _ROW.match(line)) and match[1] != "Key"]
    if not rows or any(status != "MISSING" or not key.startswith(HEAD_PREFIXES) for key, status in rows):
        return None
    return [key for key, _ in rows]


class _NewHeadFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.announced = False

    def filter(self, record: logging.LogRecord) -> bool:
        keys = missing_head_keys(record.getMessage())
        if keys is None:
            return True
        if not self.announced:
            logger.info("initialising a new classification head (%s); the recipe trains it", ", ".join(sorted(keys)))
            self.announced = True
        return False


@contextlib.contextmanager
def new_head_notice() -> Iterator[None]:
    """Inside the block, say once that a new head is initialised instead of transformers' MISSING-keys report."""
    report_logger = logging.getLogger(REPORT_LOGGER)
    head_filter = _NewHeadFilter()
    report_logger.addFilter(head_filter)
    try:
        yield
    finally:
        report_logger.removeFilter(head_filter)
