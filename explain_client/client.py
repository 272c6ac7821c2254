"""``ExplainClient``: the explanation service over REST or gRPC, with one API and one set of result types.

REST posts the JSON document of docs/SERVING.md to ``/predictions/{model}`` (the ``explain`` field says what to
explain, so the route never decides it). gRPC calls TorchServe's ``Predictions`` RPC with ``input["request"]`` = a
serialized ``ExplainRequest`` (proto/explain.proto) and reads the ``ExplainResponse``; TorchServe answers ``OK`` for
a row that failed, so the row's ``error`` field is turned into the same :class:`ServiceError` a REST caller gets.

The token (TorchServe's inference key) comes from, in order: the ``token`` argument, ``$EXPLAIN_TOKEN``, the
``token_file`` argument, ``$EXPLAIN_TOKEN_FILE``. A token file is either TorchServe's ``key_file.json`` (the
``inference`` key is used) or a text file holding the token.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol

import urllib3
from urllib3.exceptions import ProtocolError

from .generation import Generation, GenerationCall, Steps
from .results import Entity, Explanation, Prediction, ServiceError, Skipped, TokenClassification

logger = logging.getLogger(__name__)

TOKEN_ENV = "EXPLAIN_TOKEN"
TOKEN_FILE_ENV = "EXPLAIN_TOKEN_FILE"
DEFAULT_REST_URL = "http://127.0.0.1:8080"
DEFAULT_GRPC_ADDRESS = "127.0.0.1:7070"
#: TorchServe's default max_request_size / max_response_size (bytes).
MAX_MESSAGE_BYTES = 6_553_500

Transport = Literal["rest", "grpc"]
Target = str | int | None
#: A plain input of :meth:`ExplainClient.explain_many`: a text, a ``(text, text_pair)`` sentence pair, or image bytes.
PlainInput = str | bytes | tuple[str, str]
#: ``method=SERVICE_DEFAULT``: explain with the model's own default method (its ``default_method``, ``attnlrp`` for
#: the default models), chosen by the service; the answer's ``explanation.method`` says which it was.
SERVICE_DEFAULT = ""
#: Seconds before the first retry; doubled before each further one.
RETRY_BACKOFF_S = 0.2


def is_retryable(error: ServiceError) -> bool:
    """Whether a call that failed with ``error`` may succeed if sent again unchanged: no answer in time
    (``timeout``: TorchServe 0.12 can drop the requests it was gathering into a batch for a worker that dies, and
    never answers them), the service unreachable or its queue full (``unavailable``), or the worker that ran the
    batch died (REST 507/500 and gRPC ``RESOURCE_EXHAUSTED``/``INTERNAL`` with "Worker died."). Row errors (4xx:
    a bad input, method, target or option) are not: the same request fails the same way."""
    return error.code in ("timeout", "unavailable") or "worker died" in error.message.lower()


@dataclass(frozen=True)
class Request:
    """One input and what to ask about it.

    Attributes:
        text: the text, for a text model.
        image: PNG or JPEG bytes, for an image model.
        text_pair: the second text of a sentence pair (NLI, question/passage, …), for a text model that takes
            pairs; ``None`` = a single text.
        method: the attribution method; :data:`SERVICE_DEFAULT` (``""``) = the model's default method, chosen by
            the service; ``None`` asks for the prediction only.
        target: the class to explain (label name or index); ``None`` = the predicted class.
        options: method options (``start_layer``, ``layer``, ``n_steps``, …).
        below: explain only when the prediction's confidence is below this probability in (0, 1] (the answer's
            ``explained`` and ``skipped`` say what happened); ``None`` = the model's ``explain_below`` setting
            (none: always).
        always: explain whatever the confidence, overriding the model's ``explain_below``.
    """

    text: str | None = None
    image: bytes | None = None
    method: str | None = None
    target: Target = None
    options: Mapping[str, int] = field(default_factory=dict)
    text_pair: str | None = None
    below: float | None = None
    always: bool = False

    def __post_init__(self) -> None:
        """Exactly one input; a pair only with a text; ``below`` a probability, not with ``always``."""
        if (self.text is None) == (self.image is None):
            raise ValueError("give exactly one of text= or image=")
        if self.text_pair is not None and self.text is None:
            raise ValueError("text_pair= goes with text= (the second text of a sentence pair)")
        if self.below is not None and (isinstance(self.below, bool) or not 0 < self.below <= 1):
            raise ValueError(f"below= must be a probability in (0, 1], got {self.below!r}")
        if self.below is not None and self.always:
            raise ValueError("give below= (explain only when unsure) or always=True, not both")

    def to_json(self) -> dict[str, Any]:
        """The REST/JSON request document."""
        document: dict[str, Any] = {}
        if self.text is not None:
            document["text"] = self.text
            if self.text_pair is not None:
                document["text_pair"] = self.text_pair
        else:
            document["image"] = base64.b64encode(self.image or b"").decode("ascii")
        if self.method is None:
            document["explain"] = False
        else:
            explain: dict[str, Any] = {"method": self.method} if self.method else {}
            explain.update(self.options)
            if self.target is not None:
                explain["target"] = self.target
            if self.always:
                explain["below"] = None
            elif self.below is not None:
                explain["below"] = self.below
            document["explain"] = explain
        return document


def read_token_file(path: Path) -> str:
    """Read a token from TorchServe's ``key_file.json`` (its ``inference`` key) or from a plain text file.

    Raises:
        ValueError: if the file is empty or a JSON file without an inference key.
    """
    text = path.read_text(encoding="utf-8").strip()
    if text.startswith("{"):
        document = json.loads(text)
        try:
            return str(document["inference"]["key"])
        except (KeyError, TypeError):
            raise ValueError(f"{path}: a JSON token file needs {{'inference': {{'key': ...}}}}") from None
    if not text:
        raise ValueError(f"{path} is empty: expected a token")
    return text


def token_file_in_use(token: str | None = None, token_file: str | Path | None = None) -> Path | None:
    """The token file :func:`resolve_token` reads (``None`` when the token comes from ``token`` or
    ``$EXPLAIN_TOKEN``, or when there is none)."""
    if token or os.environ.get(TOKEN_ENV):
        return None
    path = token_file or os.environ.get(TOKEN_FILE_ENV)
    return Path(path) if path else None


def resolve_token(token: str | None = None, token_file: str | Path | None = None) -> str | None:
    """The token to send: ``token``, else ``$EXPLAIN_TOKEN``, else the token file (argument, then
    ``$EXPLAIN_TOKEN_FILE``); ``None`` when none is given (a server with token auth off)."""
    if token:
        return token
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    path = token_file_in_use(token, token_file)
    return read_token_file(path) if path else None


TOKEN_SOURCES = (
    "TorchServe writes its keys to key_file.json in the folder it was started from (run/key_file.json for "
    "`make start`); give its inference key as token_file=/token= (CLI: --token-file FILE, --token=KEY, or "
    f"--run-dir), or in ${TOKEN_FILE_ENV} / ${TOKEN_ENV}"
)


def _token_hint(error: ServiceError, sent: str | None, token_file: Path | None) -> ServiceError:
    """The service's refusal of a call's token, with what was sent and where a token comes from."""
    if sent is None:
        what = "no token was sent"
    elif token_file is not None:
        what = f"the token from {token_file} was refused (a key of another or restarted server?)"
    else:
        what = "the token sent was refused (a key of another or restarted server?)"
    return ServiceError(error.code, f"{error.message}: {what}. {TOKEN_SOURCES}", error.http_status, error.grpc_code)


class _Backend(Protocol):
    token: str | None

    def call(self, model: str, request: Request, timeout: float) -> Prediction: ...

    def close(self) -> None: ...


_HTTP_CODES = {404: "model_not_found", 413: "request_too_large", 500: "internal", 503: "unavailable"}


def _refused_token(message: str) -> bool:
    """Whether TorchServe refused the call for its token ("Token Authorization failed", 400 on REST)."""
    return "token" in message.lower()


class ResendOnDroppedConnection(urllib3.Retry):
    """urllib3's retry rule for the REST pool: send a request once more when its connection broke before an answer
    came back (``ProtocolError``: the server closed a kept-alive connection just as it was reused, a connection
    reset); raise every other failure at once. urllib3 already replaces a pooled connection it can see was closed;
    this covers the moment between that check and the server's close. A timeout, a refused connection or an HTTP
    status is never retried here: whether to try those again is the client's policy (:func:`is_retryable`)."""

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: Any = None,
        error: Exception | None = None,
        _pool: Any = None,
        _stacktrace: TracebackType | None = None,
    ) -> ResendOnDroppedConnection:
        """The next retry state for a broken connection; any other ``error`` is raised as it is."""
        if error is not None and not isinstance(error, ProtocolError):
            raise error
        return super().increment(method, url, response, error, _pool, _stacktrace)


#: One resend, of a broken connection only (any method: every call is a pure function of its request).
_RESEND = ResendOnDroppedConnection(
    total=1, connect=0, read=1, other=0, status=0, redirect=False, allowed_methods=None, raise_on_status=False
)


class _RestBackend:
    """JSON over HTTP/1.1 with urllib3's connection pool: kept-alive connections reused across calls and threads,
    a pooled connection the server has closed replaced by a new one (:class:`ResendOnDroppedConnection`)."""

    #: Connections kept for reuse; more concurrent calls open more, and close the surplus when they finish.
    MAX_IDLE = 64

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://host[:port][/path], got {url!r}")
        self._path = parts.path
        self.pool = urllib3.connection_from_url(self.url, maxsize=self.MAX_IDLE, block=False, retries=_RESEND)
        self.token = token

    def call(self, model: str, request: Request, timeout: float) -> Prediction:
        return Prediction.from_dict(self._exchange(model, request.to_json(), timeout))  # raises a row error

    def generate(self, model: str, call: GenerationCall, timeout: float) -> Generation:
        return Generation.from_dict(self._exchange(model, call.to_json(), timeout))

    def _exchange(self, model: str, document: dict[str, Any], timeout: float) -> dict[str, Any]:
        """POST one JSON document; the answer row's document (which may carry a row ``error``)."""
        body = json.dumps(document).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            response = self.pool.urlopen(
                "POST",
                f"{self._path}/predictions/{model}",
                body=body,
                headers=headers,
                timeout=urllib3.Timeout(connect=timeout, read=timeout),
                redirect=False,
            )
        except urllib3.exceptions.NewConnectionError as error:  # refused, unresolvable (a ConnectTimeoutError too)
            raise ServiceError("unavailable", f"cannot reach {self.url}: {error}") from error
        except urllib3.exceptions.TimeoutError as error:
            raise ServiceError("timeout", f"no answer from {self.url} within {timeout:g} s") from error
        except (OSError, urllib3.exceptions.HTTPError) as error:  # incl. MaxRetryError: broken again on the resend
            raise ServiceError("unavailable", f"cannot reach {self.url}: {error}") from error
        status, payload = int(response.status), response.data
        try:
            answer = json.loads(payload)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and ("error" in answer or status == 200):
            return answer
        message = payload.decode("utf-8", "replace")[:500]
        if isinstance(answer, dict) and "message" in answer:
            message = str(answer["message"])
        code = _HTTP_CODES.get(status, f"http_{status}")
        if status in (400, 401) and _refused_token(message):
            code = "unauthorized"
        raise ServiceError(code, message, http_status=status)

    def close(self) -> None:
        self.pool.close()


class _GrpcBackend:
    """Protobuf ``ExplainRequest`` inside TorchServe's ``Predictions`` RPC (one channel, shared by threads); the
    stubs are the client's own (:mod:`explain_client.protos`)."""

    def __init__(self, address: str, token: str | None) -> None:
        import grpc

        from .protos import explain_messages, inference_stubs

        self._grpc = grpc
        self.address = address
        self.messages = explain_messages()
        self.inference_pb2, inference_grpc = inference_stubs()
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ]
        self.channel = grpc.insecure_channel(address, options=options)
        self.stub = inference_grpc.InferenceAPIsServiceStub(self.channel)
        self.token = token

    def _message(self, request: Request) -> Any:
        message = self.messages.ExplainRequest()
        if request.text is not None:
            message.text = request.text
            if request.text_pair is not None:
                message.text_pair = request.text_pair
        else:
            message.image = request.image or b""
        if request.method is not None:
            message.explain.SetInParent()  # present, even empty: explain (with the model's default method)
            message.explain.method = request.method
            if request.always:
                message.explain.always = True
            elif request.below is not None:
                message.explain.below = request.below
            if isinstance(request.target, str):
                message.explain.target_label = request.target
            elif request.target is not None:
                message.explain.target_id = int(request.target)
            for key, value in request.options.items():
                message.explain.options[key] = int(value)
        return message

    def call(self, model: str, request: Request, timeout: float) -> Prediction:
        return _from_protobuf(self._predict(model, self._message(request), timeout))

    def generate(self, model: str, call: GenerationCall, timeout: float) -> Generation:
        return Generation.from_protobuf(
            self._predict(model, call.fill_message(self.messages.ExplainRequest()), timeout)
        )

    def _predict(self, model: str, message: Any, timeout: float) -> Any:
        """One ``Predictions`` call carrying ``message`` (an ``ExplainRequest``); the ``ExplainResponse``."""
        grpc = self._grpc
        payload = message.SerializeToString()
        predictions_request = self.inference_pb2.PredictionsRequest(model_name=model, input={"request": payload})
        try:
            metadata = [("authorization", f"Bearer {self.token}")] if self.token else []
            reply = self.stub.Predictions(predictions_request, metadata=metadata, timeout=timeout)
        except grpc.RpcError as error:
            status = error.code()
            details = error.details() or str(status)
            if status == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ServiceError(
                    "timeout", f"no answer from {self.address} within {timeout:g} s", None, "DEADLINE_EXCEEDED"
                ) from None
            if status == grpc.StatusCode.UNAVAILABLE:
                raise ServiceError(
                    "unavailable", f"cannot reach {self.address}: {details}", None, status.name
                ) from None
            code = "unauthorized" if _refused_token(details) else status.name.lower()
            if "not found" in details.lower():
                code = "model_not_found"
            raise ServiceError(code, details, None, status.name) from None
        return self.messages.ExplainResponse.FromString(reply.prediction)

    def close(self) -> None:
        self.channel.close()


def _float32(value: float) -> float:
    return float(f"{value:.7g}")


def _token_classification(proto: Any) -> TokenClassification:
    """An ``ExplainResponse.token_classification`` → :class:`TokenClassification`."""
    explained = bool(proto.method)
    return TokenClassification(
        scheme=proto.scheme or "none",
        entities=tuple(
            Entity(
                text=entity.text,
                label=entity.label,
                tag=entity.tag or entity.label,
                label_id=int(entity.label_id),
                start=int(entity.start),
                end=int(entity.end),
                token_start=int(entity.token_start),
                token_end=int(entity.token_end),
                # float32 on the wire: shown with float32's precision (0.9, not 0.8999999761581421)
                score=_float32(entity.score),
                scores=tuple(_float32(value) for value in entity.scores) if explained else None,
            )
            for entity in proto.entities
        ),
        tokens=tuple(proto.tokens),
        special_tokens=tuple(bool(flag) for flag in proto.special_tokens),
        offsets=tuple((int(offset.start), int(offset.end)) for offset in proto.offsets),
        method=proto.method or None,
        options={str(key): int(value) for key, value in proto.options.items()},
        seconds=float(proto.seconds),
    )


def _from_protobuf(response: Any) -> Prediction:
    """An ``ExplainResponse`` → :class:`Prediction` (or raise its row error)."""
    if response.HasField("error"):
        error = response.error
        raise ServiceError(error.code, error.message, int(error.http_status) or None, error.grpc_code or None)
    if response.HasField("token_classification"):
        return Prediction(
            label=None,
            label_id=None,
            probabilities={},
            truncated=bool(response.truncated),
            head_type="token_classification",
            token_classification=_token_classification(response.token_classification),
        )
    explanation: Explanation | None = None
    if response.HasField("explanation"):
        proto = response.explanation
        grid = tuple(int(value) for value in proto.grid)
        explanation = Explanation(
            method=proto.method,
            target=int(proto.target),
            target_label=proto.target_label,
            options={str(key): int(value) for key, value in proto.options.items()},
            scores=tuple(float(value) for value in proto.scores),
            tokens=None if grid else tuple(proto.tokens),
            special_tokens=None if grid else tuple(bool(flag) for flag in proto.special_tokens),
            grid=(grid[0], grid[1]) if grid else None,
            seconds=float(proto.seconds),
            pooled=proto.pooled or "first",
            segments=tuple(int(value) for value in proto.segments) if proto.segments and not grid else None,
        )
    head_type = response.head_type or "single_label"
    regression = head_type == "regression"
    # A protobuf map has no order (REST keeps the class order); compare probabilities as a mapping.
    return Prediction(
        label=None if regression else response.label,
        label_id=None if regression else int(response.label_id),
        probabilities={str(key): float(value) for key, value in response.probabilities.items()},
        truncated=bool(response.truncated),
        explanation=explanation,
        head_type=head_type,
        labels=tuple(response.labels),
        # float32 on the wire: shown with float32's precision (0.3, not 0.30000001192092896)
        threshold=float(f"{response.threshold:.7g}") if head_type == "multi_label" else None,
        value=float(response.value) if response.HasField("value") else None,
        explained=bool(response.explained) if response.HasField("explained") else None,
        below=float(f"{response.below:.7g}") if response.HasField("below") else None,
        confidence=float(f"{response.confidence:.7g}") if response.HasField("confidence") else None,
        skipped=Skipped(response.skipped.reason, response.skipped.method, response.skipped.message)
        if response.HasField("skipped")
        else None,
    )


ResultOrError = Prediction | ServiceError


class ExplainClient:
    """A client of the explanation service, over REST or gRPC, with the same methods and results on both.

    Example::

        with ExplainClient(token_file="run/key_file.json") as client:
            prediction = client.explain("sentiment", "the crew was rude", method="relevance")
            print(prediction.label, prediction.explanation.tokens, prediction.explanation.scores)

    Args:
        transport: ``"rest"`` or ``"grpc"``.
        url: REST base URL (default ``http://127.0.0.1:8080``).
        grpc_address: gRPC inference ``host:port`` (default ``127.0.0.1:7070``).
        token: the inference token; see :func:`resolve_token` for the other sources.
        token_file: a file holding it (TorchServe's ``key_file.json`` or plain text).
        timeout: seconds per attempt (REST socket timeout, gRPC deadline).
        concurrency: parallel calls of :meth:`explain_many`.
        retries: further attempts of a call that failed in a retryable way (see :func:`is_retryable`), after
            ``RETRY_BACKOFF_S`` s, doubled each time. Safe because a prediction or explanation is a pure function of
            the request. ``0`` turns retrying off.
    """

    def __init__(
        self,
        transport: Transport = "rest",
        *,
        url: str = DEFAULT_REST_URL,
        grpc_address: str = DEFAULT_GRPC_ADDRESS,
        token: str | None = None,
        token_file: str | Path | None = None,
        timeout: float = 60.0,
        concurrency: int = 8,
        retries: int = 1,
    ) -> None:
        """Create the client (a gRPC channel is opened lazily by gRPC on the first call)."""
        if transport not in ("rest", "grpc"):
            raise ValueError(f"transport must be 'rest' or 'grpc', got {transport!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if retries < 0:
            raise ValueError(f"retries must be 0 or more, got {retries}")
        self.transport: Transport = transport
        self.retries = retries
        self.timeout = timeout
        self.concurrency = concurrency
        resolved = resolve_token(token, token_file)
        self._token_file = token_file_in_use(token, token_file)
        self._token_lock = threading.Lock()
        self._backend: _Backend = (
            _GrpcBackend(grpc_address, resolved) if transport == "grpc" else _RestBackend(url, resolved)
        )

    @classmethod
    def from_run_dir(cls, run_dir: str | Path, transport: Transport = "rest", **kwargs: Any) -> ExplainClient:
        """A client of the server started from ``run_dir`` by ``python -m model_store.serving start`` (its
        ``ports.json`` and ``key_file.json``)."""
        run_dir = Path(run_dir)
        ports_file = run_dir / "ports.json"
        if not ports_file.is_file():
            raise FileNotFoundError(f"{ports_file} not found: is a server running from {run_dir}? (make start)")
        ports = json.loads(ports_file.read_text(encoding="utf-8"))
        kwargs.setdefault("url", f"http://127.0.0.1:{ports['inference']}")
        kwargs.setdefault("grpc_address", f"127.0.0.1:{ports['grpc_inference']}")
        if "token" not in kwargs:
            kwargs.setdefault("token_file", run_dir / "key_file.json")
        return cls(transport, **kwargs)

    def __enter__(self) -> ExplainClient:
        """Use as a context manager; the channel is closed on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the client."""
        self.close()

    def close(self) -> None:
        """Close the gRPC channel or the pooled REST connections."""
        self._backend.close()

    def call(self, model: str, request: Request, timeout: float | None = None) -> Prediction:
        """Send one :class:`Request`, again up to ``retries`` times while it fails in a retryable way.

        Raises:
            ServiceError: the row's error (code and message from the service's error table) or a transport error
                (the last attempt's).
        """
        return self._retrying(lambda: self._backend.call(model, request, timeout or self.timeout))

    def generate(
        self,
        model: str,
        prompt: str,
        *,
        max_new_tokens: int | None = None,
        sampling: Mapping[str, Any] | None = None,
        continuation: str | Sequence[int] | None = None,
        method: str | None = None,
        steps: Steps = None,
        contrast: str | int | Sequence[str | int] | None = None,
        timeout: float | None = None,
        **options: int,
    ) -> Generation:
        """A generation model's continuation of ``prompt`` and, with ``method``, the attribution of its tokens.

        Args:
            model: the served generation model.
            prompt: the prompt.
            max_new_tokens: new tokens to write (``None``: the model's default; at most its configured maximum).
            sampling: ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``seed`` (``None``: greedy).
            continuation: explain this continuation (text, or token ids) instead of generating.
            method: the attribution method; ``None``: the generation and each step's probability only.
            steps: ``None`` (every step), step indices, ``"sum"`` or ``("sum", start, stop)``.
            contrast: a foil token (text of one token, or an id) for every step, or one per step.
            timeout: seconds for this call (default: the client's).
            **options: method options.

        Raises:
            ServiceError: see :meth:`call`.
        """
        text = continuation if isinstance(continuation, str) else None
        ids = None if continuation is None or isinstance(continuation, str) else list(continuation)
        request = GenerationCall(prompt, max_new_tokens, sampling, text, ids, method, steps, contrast, dict(options))
        backend: Any = self._backend  # both backends generate (_RestBackend.generate, _GrpcBackend.generate)
        return self._retrying(lambda: backend.generate(model, request, timeout or self.timeout))

    def _retrying(self, send: Callable[[], Any]) -> Any:
        """``send()``, again up to ``retries`` times while it fails in a retryable way (and once with a re-read token
        file when the token is refused)."""
        delay, attempt, reread = RETRY_BACKOFF_S, 0, False
        while True:
            used = self._backend.token
            try:
                return send()
            except ServiceError as error:
                if error.code == "unauthorized":
                    if not reread and self._reread_token(used):
                        reread = True  # the server's keys were renewed: once more with the token file's new key
                        continue
                    raise _token_hint(error, used, self._token_file) from None
                if attempt >= self.retries or not is_retryable(error):
                    raise
                attempt += 1
                logger.warning("%s (attempt %d of %d); retrying in %.1f s", error, attempt, self.retries + 1, delay)
            time.sleep(delay)
            delay *= 2

    def _reread_token(self, refused: str | None) -> bool:
        """Read the token file again after the service refused the token ``refused`` (TorchServe rewrites
        ``key_file.json`` when its keys are renewed); whether the file holds another token, which calls use from
        now on."""
        if self._token_file is None:
            return False
        try:
            token = read_token_file(self._token_file)
        except (OSError, ValueError):
            return False
        if token == refused:
            return False
        with self._token_lock:
            if self._backend.token != token:
                logger.warning("the service refused the token; using the new one in %s", self._token_file)
                self._backend.token = token
        return True

    def predict(
        self, model: str, text: str | None = None, *, image: bytes | None = None, text_pair: str | None = None
    ) -> Prediction:
        """The prediction only (no explanation).

        Args:
            model: the served model name.
            text: the text, for a text model.
            image: PNG/JPEG bytes, for an image model.
            text_pair: the second text of a sentence pair, for a model that takes pairs.

        Raises:
            ServiceError: see :meth:`call`.
        """
        return self.call(model, Request(text=text, image=image, text_pair=text_pair))

    def explain(
        self,
        model: str,
        text: str | None = None,
        *,
        image: bytes | None = None,
        text_pair: str | None = None,
        method: str = SERVICE_DEFAULT,
        target: Target = None,
        below: float | None = None,
        always: bool = False,
        **options: int,
    ) -> Prediction:
        """The prediction and one explanation of it.

        Args:
            model: the served model name (``sentiment``, ``digits``).
            text: the text, for a text model.
            image: PNG/JPEG bytes, for an image model.
            text_pair: the second text of a sentence pair (the explanation then covers the tokens of both texts;
                ``Explanation.segments`` says which text each token came from).
            method: the attribution method; by default the model's own default method, chosen by the service
                (``explanation.method`` of the answer says which).
            target: the class to explain (name or index); ``None`` = the predicted class.
            below: explain only when the prediction's confidence is below this probability (the answer's
                ``explained``/``skipped`` say what happened); ``None`` = the model's ``explain_below`` (none: always).
            always: explain whatever the confidence, overriding the model's ``explain_below``.
            **options: method options (``start_layer``, ``layer``, ``n_steps``).

        Raises:
            ServiceError: see :meth:`call`.
        """
        request = Request(
            text=text, image=image, method=method, target=target, options=options, text_pair=text_pair, below=below,
            always=always,
        )  # fmt: skip
        return self.call(model, request)

    def explain_many(
        self,
        model: str,
        requests: Iterable[Request | PlainInput],
        *,
        method: str | None = SERVICE_DEFAULT,
        target: Target = None,
        options: Mapping[str, int] | None = None,
        on_result: Callable[[int, ResultOrError], None] | None = None,
        below: float | None = None,
        always: bool = False,
    ) -> list[ResultOrError]:
        """Send many inputs as concurrent calls (``concurrency`` at a time; TorchServe batches them).

        Args:
            model: the served model name.
            requests: :class:`Request` objects, or plain inputs (``str`` = text, ``(text, text_pair)`` = a sentence
                pair, ``bytes`` = image) that get ``method``, ``target`` and ``options``.
            method: for plain inputs; by default the model's default method (chosen by the service); ``None`` =
                prediction only.
            target: for plain inputs.
            options: for plain inputs.
            below: for plain inputs: explain only when unsure (see :meth:`explain`).
            always: for plain inputs: explain whatever the model's ``explain_below``.
            on_result: called with ``(index, result)`` as each call finishes (from a worker thread), e.g. to
                advance a progress bar.

        Returns:
            One :class:`Prediction` or :class:`ServiceError` per input, in input order: a failed input does not
            stop the others.
        """
        condition = {"below": below, "always": always}
        items = [self._as_request(item, method, target, options or {}, condition) for item in requests]
        results: list[ResultOrError | None] = [None] * len(items)
        lock = threading.Lock()

        def run(index: int) -> None:
            try:
                result: ResultOrError = self.call(model, items[index])
            except ServiceError as error:
                result = error
            with lock:
                results[index] = result
            if on_result is not None:
                on_result(index, result)

        if len(items) <= 1 or self.concurrency == 1:
            for index in range(len(items)):
                run(index)
        else:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(items))) as pool:
                for future in [pool.submit(run, index) for index in range(len(items))]:
                    future.result()
        return [result for result in results if result is not None]

    @staticmethod
    def _as_request(
        item: Request | PlainInput,
        method: str | None,
        target: Target,
        options: Mapping[str, int],
        condition: Mapping[str, Any],
    ) -> Request:
        if isinstance(item, Request):
            return item
        asks: dict[str, Any] = {"method": method, "target": target, "options": dict(options), **condition}
        if isinstance(item, str):
            return Request(text=item, **asks)
        if isinstance(item, tuple) and len(item) == 2 and all(isinstance(part, str) for part in item):
            return Request(text=item[0], text_pair=item[1], **asks)
        if isinstance(item, bytes | bytearray):
            return Request(image=bytes(item), **asks)
        raise TypeError(
            f"expected a Request, str (text), (text, text_pair) or bytes (image), got {type(item).__name__}"
        )


def load_requests(lines: Sequence[str], *, image_base: Path | None = None) -> list[PlainInput]:
    """Turn input lines into plain inputs for :meth:`ExplainClient.explain_many`.

    A line is either plain text, or a JSON object (JSON lines) with ``"text"`` (and optionally ``"text_pair"``, the
    second text of a sentence pair) or ``"image"`` (a file path, relative to ``image_base``, or base64 PNG/JPEG
    bytes). Blank lines are skipped.

    Raises:
        ValueError: for a JSON line without ``text``/``image`` or with a ``text_pair`` that is not a string, naming
            the line number.
    """
    inputs: list[PlainInput] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                document = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"line {number}: invalid JSON ({error.msg})") from None
            pair = document.get("text_pair")
            if pair is not None and not (isinstance(pair, str) and isinstance(document.get("text"), str)):
                raise ValueError(f"line {number}: 'text_pair' must be a string, next to a 'text' string")
            if isinstance(document.get("text"), str):
                inputs.append(document["text"] if pair is None else (document["text"], pair))
            elif isinstance(document.get("image"), str):
                inputs.append(_image_bytes(document["image"], image_base))
            else:
                raise ValueError(f"line {number}: a JSON line needs a 'text' or 'image' string")
        else:
            inputs.append(line)
    return inputs


def _image_bytes(value: str, base: Path | None) -> bytes:
    path = Path(value)
    if base is not None and not path.is_absolute():
        path = base / path
    if path.is_file():
        return path.read_bytes()
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ValueError(f"image {value!r} is neither a file nor base64") from None
