"""``ExplainClient``: the explanation service over REST or gRPC, with one API and one set of result types. This
module is the facade: argument checks, retries of calls that failed in a retryable way (:func:`is_retryable`), a
re-read of the token file when the service refuses the token, and concurrent :meth:`ExplainClient.explain_many`.
The rest is in its own modules: the request and its wire forms (:mod:`~explain_client.wire`), the token
(:mod:`~explain_client.auth`), the two transports (:mod:`~explain_client.transport`) and input files
(:mod:`~explain_client.inputs`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .auth import read_token_file, resolve_token, token_file_in_use, token_hint
from .generation import DocumentInput, Generation, GenerationCall, Message, Steps

# load_requests lived in this module; it stays importable from here.
from .inputs import load_requests as load_requests
from .records import RecordsClient, read_records_key
from .results import Prediction, ServiceError
from .streams import GenerationStream
from .transport import DEFAULT_GRPC_ADDRESS, DEFAULT_REST_URL, Backend, GrpcBackend, RestBackend, Transport
from .wire import SERVICE_DEFAULT, PlainInput, Request, Target

logger = logging.getLogger(__name__)

#: Seconds before the first retry; doubled before each further one.
RETRY_BACKOFF_S = 0.2


def is_retryable(error: ServiceError) -> bool:
    """Whether a call that failed with ``error`` may succeed if sent again unchanged: no answer in time
    (``timeout``: TorchServe 0.12 can drop the requests it was gathering into a batch for a worker that dies, and
    never answers them), the service unreachable or its queue full (``unavailable``), or the worker that ran the
    batch died (REST 507/500 and gRPC ``RESOURCE_EXHAUSTED``/``INTERNAL`` with "Worker died."). Row errors (4xx:
    a bad input, method, target or option) are not: the same request fails the same way."""
    return error.code in ("timeout", "unavailable") or "worker died" in error.message.lower()


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
        records_key: the records key (:attr:`records`); default: the ``records`` entry of ``token_file``.
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
        records_key: str | None = None,
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
        self._backend: Backend = (
            GrpcBackend(grpc_address, resolved) if transport == "grpc" else RestBackend(url, resolved)
        )
        self._url = url
        self._records_key = records_key
        self._records: RecordsClient | None = None

    @property
    def records(self) -> RecordsClient:
        """The service's records over REST, whatever the transport (:class:`~explain_client.records.RecordsClient`:
        ``list``, ``iterate``, ``get``, ``page``, ``explain``, ``erase``), with the records key given or read from
        the token file's ``records`` entry."""
        if self._records is None:
            key = self._records_key
            if key is None and self._token_file is not None:
                key = read_records_key(self._token_file)
            self._records = RecordsClient(self._url, key, self.timeout)
        return self._records

    @classmethod
    def from_run_dir(cls, run_dir: str | Path, transport: Transport = "rest", **kwargs: Any) -> ExplainClient:
        """A client of the server started from ``run_dir`` by ``make start`` or ``python -m doors
        start`` (its ``ports.json`` and ``key_file.json``).

        Args:
            run_dir: the server's run folder (``run/`` of the folder it was started from).
            transport: ``rest`` or ``grpc``.
            **kwargs: the other arguments of :class:`ExplainClient` (an explicit ``url``, ``grpc_address`` or
                ``token`` wins over what the run folder says).

        Raises:
            FileNotFoundError: when the folder has no ``ports.json`` (no server was started from it).
        """
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
        if self._records is not None:
            self._records.close()

    def call(self, model: str, request: Request, timeout: float | None = None) -> Prediction:
        """Send one :class:`Request`, again up to ``retries`` times while it fails in a retryable way.

        Args:
            model: the served model's name.
            request: the row to send (text or image, and what to explain).
            timeout: seconds to wait for the answer (``None``: the client's ``timeout``).

        Returns:
            The :class:`Prediction`.

        Raises:
            ServiceError: the row's error (code and message from the service's error table) or a transport error
                (the last attempt's).
        """
        return self._retrying(lambda: self._backend.call(model, request, timeout or self.timeout))

    def generate(
        self,
        model: str,
        prompt: str | None = None,
        *,
        messages: Sequence[Message] | None = None,
        documents: Sequence[DocumentInput] | None = None,
        max_new_tokens: int | None = None,
        sampling: Mapping[str, Any] | None = None,
        continuation: str | Sequence[int] | None = None,
        method: str | None = None,
        steps: Steps = None,
        contrast: str | int | Sequence[str | int] | None = None,
        granularity: str | None = None,
        span: tuple[int, int] | None = None,
        timeout: float | None = None,
        **options: int | float,
    ) -> Generation:
        """A generation model's continuation of ``prompt`` (or of a chat, ``messages``) and, with ``method``, the
        attribution of its tokens, its sentences or a span of it.

        Args:
            model: the served generation model.
            prompt: the prompt (or give ``messages``).
            messages: chat messages ``{"role", "content"}``, rendered with the model's chat template.
            documents: documents given to the model (strings or ``{"title", "text"}``); with ``method``, each sentence
                of the answer comes back with the documents ranked by attribution (``Generation.sentences``).
            max_new_tokens: new tokens to write (``None``: the model's default; at most its configured maximum).
            sampling: ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``seed`` (``None``: greedy).
            continuation: explain this continuation (text, or token ids) instead of generating.
            method: the attribution method; ``None``: the generation and each step's probability only.
            steps: ``None`` (every step), step indices, ``"sum"`` or ``("sum", start, stop)``.
            contrast: a foil token (text of one token, or an id) for every step, or one per step.
            granularity: ``token`` (default), ``word`` or ``sentence``: the units of ``Generation.context`` that every
                score is over (each unit's score the sum of its tokens').
            span: ``(start, end)`` characters of the answer to explain as one summed objective (with
                ``continuation``, or characters of the answer a generation will write).
            timeout: seconds for this call (default: the client's).
            **options: method options.

        Raises:
            ServiceError: see :meth:`call`.
        """
        request = _generation_call(prompt, messages, documents, max_new_tokens, sampling, continuation, method, steps,
                                   contrast, granularity, span, options)  # fmt: skip
        backend: Any = self._backend  # both backends generate (RestBackend.generate, GrpcBackend.generate)
        return self._retrying(lambda: backend.generate(model, request, timeout or self.timeout))

    def generate_stream(
        self,
        model: str,
        prompt: str | None = None,
        *,
        messages: Sequence[Message] | None = None,
        documents: Sequence[DocumentInput] | None = None,
        max_new_tokens: int | None = None,
        sampling: Mapping[str, Any] | None = None,
        method: str | None = None,
        steps: Steps = None,
        contrast: str | int | Sequence[str | int] | None = None,
        granularity: str | None = None,
        span: tuple[int, int] | None = None,
        timeout: float | None = None,
        **options: int | float,
    ) -> GenerationStream:
        """:meth:`generate`, streamed: iterate the answer for its tokens as the service writes them
        (:class:`~explain_client.streams.TokenEvent`), then read its ``generation`` (the same answer as
        :meth:`generate`'s, with its explanation). REST: chunked JSON lines; gRPC: TorchServe's
        ``StreamPredictions``. Not retried (tokens may already have been shown).

        Args:
            model: the served generation model.
            prompt: the prompt (or give ``messages``).
            messages: chat messages, as :meth:`generate`'s.
            documents: documents given to the model, as :meth:`generate`'s.
            max_new_tokens: new tokens to write (``None``: the model's default).
            sampling: ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``seed`` (``None``: greedy).
            method: the attribution method of the answer's explanation; ``None``: none.
            steps: the steps to explain, as :meth:`generate`'s.
            contrast: foil tokens, as :meth:`generate`'s.
            granularity: the units of the explanation's context, as :meth:`generate`'s.
            span: characters of the answer to explain as one objective.
            timeout: seconds the stream may take (default: the client's).
            **options: method options.

        Raises:
            ServiceError: an error before the first token (as :meth:`generate`); while iterating, one after it.
        """
        request = _generation_call(prompt, messages, documents, max_new_tokens, sampling, None, method, steps,
                                   contrast, granularity, span, options)  # fmt: skip
        backend: Any = self._backend  # both backends stream (RestBackend.stream, GrpcBackend.stream)
        return GenerationStream(backend.stream(model, request, timeout or self.timeout))

    def chat(
        self,
        model: str,
        messages: Sequence[Message],
        *,
        documents: Sequence[DocumentInput] | None = None,
        method: str | None = SERVICE_DEFAULT,
        granularity: str | None = "word",
        **kwargs: Any,
    ) -> Generation:
        """A chat model's reply to ``messages`` explained the way its users read it: in words (``granularity``), and
        with ``documents`` each sentence with the documents it rests on (``Generation.sentences``, their
        :meth:`~explain_client.generation.AnswerSpan.cited`). The other arguments are :meth:`generate`'s
        (``method=None``: the reply only).

        Args:
            model: the served chat model.
            messages: the chat, ``{"role", "content"}`` mappings, rendered with the model's chat template.
            documents: documents given to the model (strings or ``{"title", "text"}``).
            method: the attribution method (default: the model's own default method); ``None``: the reply only.
            granularity: ``token``, ``word`` (default) or ``sentence``.
            **kwargs: the other arguments of :meth:`generate`.

        Raises:
            ServiceError: see :meth:`call`.
        """
        return self.generate(
            model,
            messages=messages,
            documents=documents,
            method=method,
            granularity=granularity if method is not None else None,
            **kwargs,
        )

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
                    raise token_hint(error, used, self._token_file) from None
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
        granularity: str | None = None,
        **options: int | float,
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
            granularity: ``word`` or ``sentence``: the explanation over the text's words or sentences (each scored by
                the sum of its tokens' scores; ``explanation.context`` has their characters); ``None``: tokens.
            **options: method options (``start_layer``, ``layer``, ``n_steps``).

        Raises:
            ServiceError: see :meth:`call`.
        """
        request = Request(
            text=text, image=image, method=method, target=target, options=options, text_pair=text_pair, below=below,
            always=always, granularity=granularity,
        )  # fmt: skip
        return self.call(model, request)

    def explain_many(
        self,
        model: str,
        requests: Iterable[Request | PlainInput],
        *,
        method: str | None = SERVICE_DEFAULT,
        target: Target = None,
        options: Mapping[str, int | float] | None = None,
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
        options: Mapping[str, int | float],
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


def _generation_call(
    prompt: str | None,
    messages: Sequence[Message] | None,
    documents: Sequence[DocumentInput] | None,
    max_new_tokens: int | None,
    sampling: Mapping[str, Any] | None,
    continuation: str | Sequence[int] | None,
    method: str | None,
    steps: Steps,
    contrast: str | int | Sequence[str | int] | None,
    granularity: str | None,
    span: tuple[int, int] | None,
    options: Mapping[str, int | float],
) -> GenerationCall:
    """The :class:`GenerationCall` of :meth:`ExplainClient.generate`'s arguments."""
    text = continuation if isinstance(continuation, str) else None
    ids = None if continuation is None or isinstance(continuation, str) else list(continuation)
    return GenerationCall(
        prompt, max_new_tokens, sampling, text, ids, method, steps, contrast, dict(options),
        None if messages is None else list(messages), None if documents is None else list(documents),
        granularity, span,
    )  # fmt: skip
