"""The token classification task (``token_classification``: NER, PII detection): a row is a text; its answer is the
entities found, each with its character offsets and, when asked, its own attribution over the row's tokens.

Requests are decoded as a classifier's (:func:`~serving_core.tasks.classify_schema.decode_body`; what a token classifier
does not take — a pair, a target, ``below`` — is refused when the batch is served), the answer's fields are
:mod:`~serving_core.tasks.token_schema`'s, serving is
:class:`~serving_core.tasks.token_service.TokenClassificationService`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from explainers import Deadline

from .. import wire
from ..config import HandlerConfig
from ..task import Task
from .classification import TEXT
from .classify_schema import DecodedRow, decode_body, read_row
from .token_schema import TokenOutcome, fill_token_response, token_outcome_to_dict
from .token_service import TokenClassificationService


class TokenClassificationTask(Task[DecodedRow, TokenOutcome]):
    """Token classification (:data:`TOKEN_CLASSIFICATION`)."""

    name = "token_classification"
    main_input = "text"

    def load(self, config: HandlerConfig, model_dir: Path, device: torch.device) -> TokenClassificationService:
        """The token classifier and its fast tokenizer."""
        return TokenClassificationService(config, model_dir, device)

    def read(self, row: Mapping[str, Any], config: HandlerConfig) -> wire.Body:
        """The envelope, as a text classifier takes it."""
        return read_row(row, config)

    def decode(self, body: wire.Body, explain_header: bool, config: HandlerConfig) -> DecodedRow:
        """A JSON/text/protobuf request, as a text classifier's."""
        return decode_body(body, explain_header, config)

    def requested_method(self, row: DecodedRow) -> str | None:
        """The method the row asks for."""
        return row.request.method

    def with_explanation(self, row: DecodedRow, config: HandlerConfig) -> DecodedRow:
        """The row, with the default method if it asks for none."""
        return TEXT.with_explanation(row, config)

    def with_deadline(self, row: DecodedRow, deadline: Deadline | None) -> DecodedRow:
        """The row due by the earlier of its own deadline and ``deadline``."""
        return TEXT.with_deadline(row, deadline)

    def to_dict(self, outcome: TokenOutcome, config: HandlerConfig) -> dict[str, Any]:
        """The JSON answer (docs/SERVING.md, "Token classification")."""
        return token_outcome_to_dict(outcome)

    def to_proto(self, outcome: TokenOutcome, response: Any, config: HandlerConfig) -> None:
        """The ``ExplainResponse`` answer (its ``token_classification`` field)."""
        fill_token_response(outcome, response)


TOKEN_CLASSIFICATION = TokenClassificationTask()
