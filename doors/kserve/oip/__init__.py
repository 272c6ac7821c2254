"""The Open Inference Protocol (OIP, "v2") with this service's **explain extension**, as pure functions: one codec
per task (docs/SERVING.md, "Open Inference Protocol").

- :mod:`~doors.kserve.oip.tensors`: tensors, metadata, requests and the padding helpers;
- :mod:`~doors.kserve.oip.asks`: the explain parameters and per-row inputs every codec reads;
- :mod:`~doors.kserve.oip.codecs`: the codec contract, its registry by task (:data:`CODECS`), :func:`decode_request` and
  :func:`encode_response`;
- :mod:`~doors.kserve.oip.documents`: the generic codec of JSON documents, for a task without a codec of its own;
- the codecs: :mod:`~doors.kserve.oip.classification` (``text``, ``image``),
:mod:`~doors.kserve.oip.token_classification`,
  :mod:`~doors.kserve.oip.generation`.

OIP tensors and parameters come in, each task's decoded rows (or a per-row :class:`~serving_core.errors.RowError`) go
out to the serving core; the outcomes come back and become output tensors. Nothing here imports a server.
"""

from . import classification, documents, generation, token_classification
from .asks import DEFAULT_METHOD, EXPLAIN_METHOD, EXPLAIN_TARGET, OPTION_PREFIX, RowAsk, row_asks
from .classification import ImageCodec, TextCodec
from .codecs import CODECS, TaskCodec, codec_for, decode_request, encode_response, register_codec
from .documents import DocumentCodec
from .generation import GenerationCodec
from .tensors import DATATYPES, MAX_ROWS, OipRequest, Tensor, TensorSpec, row_requests
from .token_classification import TokenClassificationCodec

#: The name this extension has in the server metadata's ``extensions`` list.
EXTENSION = "explain"

__all__ = [
    "CODECS",
    "DATATYPES",
    "DEFAULT_METHOD",
    "EXPLAIN_METHOD",
    "EXPLAIN_TARGET",
    "EXTENSION",
    "MAX_ROWS",
    "OPTION_PREFIX",
    "DocumentCodec",
    "GenerationCodec",
    "ImageCodec",
    "OipRequest",
    "RowAsk",
    "TaskCodec",
    "Tensor",
    "TensorSpec",
    "TextCodec",
    "TokenClassificationCodec",
    "classification",
    "codec_for",
    "decode_request",
    "documents",
    "encode_response",
    "generation",
    "register_codec",
    "row_asks",
    "row_requests",
    "token_classification",
]
