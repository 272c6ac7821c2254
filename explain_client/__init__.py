"""Python client of the explanation service: :class:`ExplainClient` over REST or gRPC, the ``explain`` CLI, the
renderers (terminal, HTML, image overlays) and the faithfulness evaluation (``explain-eval``)."""

from .client import ExplainClient, Request, is_retryable, read_token_file, resolve_token
from .results import Explanation, Prediction, ServiceError

__all__ = [
    "ExplainClient",
    "Explanation",
    "Prediction",
    "Request",
    "ServiceError",
    "is_retryable",
    "read_token_file",
    "resolve_token",
]
