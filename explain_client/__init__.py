"""Python client of the explanation service: :class:`ExplainClient` over REST or gRPC, the ``explain`` CLI and the
renderers (terminal and HTML in :mod:`~explain_client.render`; image overlays in :mod:`~explain_client.pictures`,
with the ``pictures`` extra). Its own distribution (``pip install ./explain_client``): urllib3, grpcio and protobuf,
no torch and no server code; the gRPC stubs are generated when it is built (:mod:`~explain_client.protos`)."""

from .auth import read_token_file, resolve_token
from .client import ExplainClient, is_retryable
from .generation import AnswerSpan, Citation, Generation, GenerationCall, GenerationStep, PromptPart
from .results import ContextUnit, Entity, Explanation, Prediction, ServiceError, Skipped, TokenClassification
from .streams import GenerationStream, TokenEvent
from .wire import SERVICE_DEFAULT, Request

__all__ = [
    "SERVICE_DEFAULT",
    "AnswerSpan",
    "Citation",
    "ContextUnit",
    "Entity",
    "ExplainClient",
    "Explanation",
    "Generation",
    "GenerationCall",
    "GenerationStep",
    "GenerationStream",
    "Prediction",
    "PromptPart",
    "Request",
    "ServiceError",
    "Skipped",
    "TokenClassification",
    "TokenEvent",
    "is_retryable",
    "read_token_file",
    "resolve_token",
]
