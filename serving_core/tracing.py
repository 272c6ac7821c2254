"""OpenTelemetry traces of the service's requests, exported over OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, and nothing at all otherwise.

Off (no endpoint, or ``OTEL_SDK_DISABLED=true``): every function here returns a shared no-op at the cost of one
environment lookup per process; the OpenTelemetry SDK is not even imported. On: this module sets up its own
``TracerProvider`` once per process (service name ``OTEL_SERVICE_NAME``, default ``explain-service``; spans sent in
batches by the OTLP/HTTP exporter, which reads the other ``OTEL_EXPORTER_OTLP_*`` and ``OTEL_BSP_*`` settings) and
never the process-wide one, so that nothing else in the process changes.

The spans of one request, in the caller's trace (its W3C ``traceparent``, carried through the router and TorchServe
or the KServe door):

- the door's **request span** (:func:`start_request_span`, kind SERVER; for a batch of rows from several callers,
  one :func:`start_row_span` per row, current only ``with`` :func:`within`), with ``decode`` and ``encode``
  (:func:`stage`) and one ``explanation`` span per explained row (:func:`record_explanation`: ``explain.method``,
  ``explain.targets``, ``explain.seconds``); an OpenAI request's span carries the GenAI attributes
  (:func:`generation_attributes`: ``gen_ai.operation.name``, ``gen_ai.request.model``,
  ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``; ``gen_ai.request.model`` is a served model's name);
- rows of several requests are served in one batch: the **batch span** (:func:`batch_span`) is its own trace,
  linked to every row's request span, with the batch's stages (``forward``: the shared forward and backward and the
  attributions) as children.

A proxy in front (the router) continues the caller's trace and passes its own span on (:func:`outgoing_headers`).
Attribute values never come from request text: model and method names, counts and seconds only.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The W3C Trace Context headers (gRPC metadata keys): read from requests, written to the requests sent on.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
PROPAGATED = (TRACEPARENT, TRACESTATE)
#: A W3C ``traceparent`` (version 00's four fields; a later version may add fields after them).
_TRACEPARENT_FORM = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-[0-9a-z._-]*)?")
#: A W3C ``tracestate``: at most 32 ``key=value`` members of printable ASCII, 512 characters in all.
_TRACESTATE_FORM = re.compile(r"[\x20-\x7e]{0,512}")
#: Where spans go: either variable turns tracing on (the traces one wins, as in OpenTelemetry's exporters).
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
DEFAULT_SERVICE_NAME = "explain-service"
#: The instrumentation scope of the spans.
SCOPE = "explain-service"


class NoSpan:
    """The span every function yields while tracing is off: records nothing, costs nothing."""

    def set_attribute(self, key: str, value: Any) -> None:
        """Do nothing."""

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Do nothing."""

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """Do nothing."""

    def is_recording(self) -> bool:
        """Always ``False``."""
        return False


NO_SPAN = NoSpan()


class _NoContext(contextlib.AbstractContextManager[Any]):
    """The context manager every function returns while tracing is off: one shared object, yielding
    :data:`NO_SPAN`."""

    def __enter__(self) -> NoSpan:
        return NO_SPAN

    def __exit__(self, *exc_info: object) -> None:
        return None


_NO_CONTEXT = _NoContext()


def _no_span() -> contextlib.AbstractContextManager[Any]:
    return _NO_CONTEXT


class _State:
    """This process's tracer (``None``: tracing off), made on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid: int | None = None
        self.tracer: Any = None
        self.provider: Any = None
        self.propagator: Any = None


_STATE = _State()


def enabled() -> bool:
    """Whether spans are exported: an OTLP endpoint is set and the SDK is not disabled."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(os.environ.get(name) for name in ENDPOINT_VARIABLES)


def active() -> bool:
    """Whether this process records spans (:func:`enabled` when it first asked)."""
    return _tracer() is not None


def _tracer() -> Any:
    """This process's tracer, set up on the first call (``None`` while tracing is off)."""
    if _STATE.pid == os.getpid():
        return _STATE.tracer
    with _STATE.lock:
        if _STATE.pid != os.getpid():  # first use here (a forked child sets up its own)
            _STATE.tracer = _STATE.provider = _STATE.propagator = None
            if enabled():
                _set_up()
            _STATE.pid = os.getpid()
    return _STATE.tracer


def _set_up() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    name = os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))  # flushed at exit
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _STATE.provider = provider
    _STATE.tracer = provider.get_tracer(SCOPE)
    _STATE.propagator = TraceContextTextMapPropagator()


def shutdown() -> None:
    """Send the spans still queued and stop exporting (a later call of this module sets tracing up again, as the
    environment then says). Also done at the process's exit."""
    with _STATE.lock:
        if _STATE.provider is not None:
            _STATE.provider.shutdown()
        _STATE.pid = None
        _STATE.tracer = _STATE.provider = _STATE.propagator = None


def _text(value: Any) -> str:
    return bytes(value).decode("latin-1") if isinstance(value, bytes | bytearray) else str(value)


def trace_headers(headers: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None) -> dict[str, str]:
    """The Trace Context entries of request headers or gRPC metadata (a mapping or pairs; ``str`` or ``bytes``; any
    case), keyed in lower case."""
    if headers is None:
        return {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    found: dict[str, str] = {}
    for key, value in pairs:
        name = _text(key).lower()
        if name in PROPAGATED and value is not None:
            found[name] = _text(value)
    return found


def valid_traceparent(value: str | None) -> str | None:
    """``value`` when it is a well-formed W3C ``traceparent`` (lower-case hex fields, not version ``ff``, no all-zero
    trace or parent id; at most 256 characters), else None: what a door keeps of a caller's value (a record, an entry
    it carries on), so that nothing else rides along."""
    if value is None or len(value) > 256:
        return None
    match = _TRACEPARENT_FORM.fullmatch(value)
    if match is None or match[1] == "ff" or not match[2].strip("0") or not match[3].strip("0"):
        return None
    if match[1] == "00" and match[4]:
        return None  # version 00 has exactly four fields
    return value


def valid_trace_headers(headers: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None) -> dict[str, str]:
    """:func:`trace_headers` keeping only a well-formed ``traceparent`` (:func:`valid_traceparent`) and, with it, a
    ``tracestate`` of at most 512 printable ASCII characters: what a proxy may copy into a request's body."""
    found = trace_headers(headers)
    traceparent = valid_traceparent(found.get(TRACEPARENT))
    if traceparent is None:
        return {}
    valid = {TRACEPARENT: traceparent}
    state = found.get(TRACESTATE)
    if state and _TRACESTATE_FORM.fullmatch(state):
        valid[TRACESTATE] = state
    return valid


def start_request_span(
    headers: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None,
    name: str,
    attributes: Mapping[str, Any] | None = None,
) -> contextlib.AbstractContextManager[Any]:
    """A context manager around one request: the current span while it runs, in the caller's trace when
    ``headers`` (HTTP headers or gRPC metadata) carry a valid ``traceparent``, else a new trace.

    Args:
        headers: the request's headers or metadata.
        name: the span's name, bounded (a route or RPC, never request text).
        attributes: the span's attributes.

    Returns:
        A context manager yielding the span (:data:`NO_SPAN` while tracing is off). An exception leaving it is
        recorded on the span.
    """
    tracer = _tracer()
    if tracer is None:
        return _no_span()
    from opentelemetry.trace import SpanKind

    parent = _STATE.propagator.extract(trace_headers(headers))
    return tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)


def start_row_span(
    headers: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None,
    name: str,
    attributes: Mapping[str, Any] | None = None,
) -> Any:
    """One row's request span, started but not made current: for a door that receives a batch of rows from several
    callers at once (TorchServe's handler), each row in its own caller's trace. Work for the row runs
    ``with within(span):``; :func:`end_span` ends it.

    Returns:
        The span (:data:`NO_SPAN` while tracing is off).
    """
    tracer = _tracer()
    if tracer is None:
        return NO_SPAN
    from opentelemetry.trace import SpanKind

    parent = _STATE.propagator.extract(trace_headers(headers))
    return tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)


def within(span: Any) -> contextlib.AbstractContextManager[Any]:
    """A context manager making a :func:`start_row_span` span current (its :func:`stage` and
    :func:`record_explanation` spans become its children) without ending it."""
    if span is NO_SPAN or _tracer() is None:
        return _no_span()
    from opentelemetry import trace

    return trace.use_span(span, end_on_exit=False)


def end_span(span: Any) -> None:
    """End a :func:`start_row_span` span."""
    if span is not NO_SPAN:
        span.end()


def span_context(span: Any) -> Any:
    """A span's context, for :func:`batch_span` to link to (``None`` for :data:`NO_SPAN`)."""
    return None if span is NO_SPAN else span.get_span_context()


def current_span_context() -> Any:
    """The current span's context, for a batch to link to (``None`` while tracing is off or outside a span)."""
    if _tracer() is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return context if context.is_valid else None


def remote_span_context(traceparent: str | None) -> Any:
    """The span context a W3C ``traceparent`` names (a span of another process: the door's request span that a Ray
    Serve replica's batch links to), for :func:`batch_span`; ``None`` while tracing is off or for an invalid one."""
    if _tracer() is None or not traceparent:
        return None
    from opentelemetry import trace

    context = trace.get_current_span(_STATE.propagator.extract({TRACEPARENT: traceparent})).get_span_context()
    return context if context.is_valid else None


def batch_span(
    links: Iterable[Any], name: str = "batch", attributes: Mapping[str, Any] | None = None
) -> contextlib.AbstractContextManager[Any]:
    """A context manager around one batch of rows, from one or several requests: a new trace, linked to each row's
    request span (``links``: their :func:`current_span_context`, ``None`` entries skipped). The batch's
    :func:`stage` spans are its children.

    Returns:
        A context manager yielding the span (:data:`NO_SPAN` while tracing is off).
    """
    tracer = _tracer()
    if tracer is None:
        return _no_span()
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, SpanKind

    unique = {(context.trace_id, context.span_id): context for context in links if context is not None}
    return tracer.start_as_current_span(
        name,
        context=Context(),  # a root: the batch belongs to no single request
        kind=SpanKind.INTERNAL,
        links=[Link(context) for context in unique.values()],
        attributes=attributes,
    )


def stage(name: str, attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A context manager around one stage (``decode``, ``forward``, ``encode``, ...) of the current request or
    batch span: its child. Outside any span (a door that starts none) and while tracing is off: a no-op, so that no
    stray one-span traces are sent."""
    tracer = _tracer()
    if tracer is None:
        return _no_span()
    from opentelemetry import trace

    if not trace.get_current_span().is_recording():
        return _no_span()
    return tracer.start_as_current_span(name, attributes=attributes)


def record_explanation(method: str, targets: int, seconds: float) -> None:
    """An ``explanation`` span under the current request span for one explained row, ending now and lasting the
    row's attribution time: ``explain.method``, ``explain.targets`` (how many targets the explanation covers: 1 for
    a classifier's label, the entities of a token classifier, the explained steps of a generation) and
    ``explain.seconds``. Nothing while tracing is off or outside a span."""
    tracer = _tracer()
    if tracer is None:
        return
    from opentelemetry import trace

    if not trace.get_current_span().is_recording():
        return
    end = time.time_ns()
    span = tracer.start_span(
        "explanation",
        start_time=end - int(max(seconds, 0.0) * 1e9),
        attributes={"explain.method": method, "explain.targets": int(targets), "explain.seconds": float(seconds)},
    )
    span.end(end_time=end)


def explained_targets(outcome: Any) -> int:
    """How many targets one served row's explanation covers, for any task's outcome: a token classifier's entities,
    a generation's steps (1 when they are summed into one), else 1 (a classifier's label)."""
    if hasattr(outcome, "entities"):
        return len(outcome.entities)
    if hasattr(outcome, "steps"):
        return 1 if getattr(outcome, "summed", None) is not None else len(outcome.steps)
    return 1


def record_explanations(outcomes: Sequence[Any]) -> None:
    """:func:`record_explanation` for each explained row of ``outcomes`` (any task's: an outcome with no error and
    a ``method``; its ``attribution_seconds``)."""
    if _tracer() is None:
        return
    for outcome in outcomes:
        method = getattr(outcome, "method", None)
        if getattr(outcome, "error", None) is None and method:
            record_explanation(method, explained_targets(outcome), float(getattr(outcome, "attribution_seconds", 0.0)))


#: The GenAI conventions' ``gen_ai.operation.name`` of each OpenAI request kind (:class:`Translated`'s ``kind``).
GEN_AI_OPERATIONS = {"chat": "chat", "completion": "text_completion"}


def generation_attributes(kind: str, model: str, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The OpenTelemetry GenAI attributes of a generation request of ``kind`` (``chat`` or ``completion``) to
    ``model`` that read ``input_tokens`` prompt tokens and wrote ``output_tokens``."""
    return {
        "gen_ai.operation.name": GEN_AI_OPERATIONS.get(kind, kind),
        "gen_ai.request.model": model,
        "gen_ai.usage.input_tokens": int(input_tokens),
        "gen_ai.usage.output_tokens": int(output_tokens),
    }


def set_attributes(attributes: Mapping[str, Any]) -> None:
    """Set ``attributes`` on the current span (nothing while tracing is off)."""
    if _tracer() is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(attributes)


def outgoing_headers(incoming: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None) -> dict[str, str]:
    """The Trace Context headers for a request a proxy sends on: the current span's while tracing is on (the next
    hop's spans become its children), else the incoming request's own, unchanged (the caller's trace goes on
    through a proxy that does not trace)."""
    if _tracer() is None:
        return trace_headers(incoming)
    carrier: dict[str, str] = {}
    _STATE.propagator.inject(carrier)
    return carrier or trace_headers(incoming)
