"""The runtime's side of tracing: the tracer provider, and a processor span per request.

On with ``--tracing`` or ``ENABLE_TRAJECTORY=true``; ``OTEL_SDK_DISABLED=true`` wins.
Spans go out over OTLP/HTTP, configured only by the standard ``OTEL_EXPORTER_OTLP_*``
variables, which the exporter resolves itself. The batch processor bounds everything:
an exporter that is down or slow costs a request nothing but a queue append, and spans
beyond the queue are dropped rather than waited for.

Per request: the caller's ``traceparent``/``tracestate``/``baggage`` are extracted, so
the processor span is a child of the caller's span; request_metadata's ids become
baggage, copied onto every span of the request (also spans made in worker threads,
which inherit the context); ``x-request-id`` is an attribute of the processor span.

Cost: spans are encoded and exported in a child process (runtime.tracing.export), and the
processor span, made on every request, is a lean span of our own (``_RequestSpan``)
rather than the SDK's: same ids, sampling, attributes, events and status on the wire,
without the SDK span's locks, limits and per-span processor calls. Spans that user code
makes (LLM and tool calls) are ordinary SDK spans, children of it.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Mapping, Sequence
from contextvars import Token
from random import getrandbits
from time import time_ns
from typing import Any

from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import DEFAULT_ON
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    TraceFlags,
    TraceState,
    get_current_span,
)
from opentelemetry.trace.status import Status, StatusCode

from processors_base.observability.runtime_hooks import (
    BAGGAGE_KEYS,
    SPAN_KEY,
    capture,
    capture_enabled,
    processor_context,
    record_error,
    runtime_opens_processor_spans,
)
from processors_base.redaction import redact
from runtime.tracing.export import SCALAR_TYPES, PipeSpanProcessor, SpanRecord, builtin_value

__all__ = ["Tracing"]

log = logging.getLogger("runtime")

_HEADERS = {  # what begin reads: the propagators' (by their names) and x-request-id
    b"traceparent": "traceparent",
    b"tracestate": "tracestate",
    b"baggage": "baggage",
    b"x-request-id": "x-request-id",
}
_SCOPE = ("agentic-rl-runtime", None)
_SAMPLED, _NOT_SAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)
_UNSET: tuple[StatusCode, str | None] = (StatusCode.UNSET, None)
_SERVER = SpanKind.SERVER.value  # (an enum's .value is slow to read per request)
_IDS = tuple((key, key.rsplit(".", 1)[1]) for key in BAGGAGE_KEYS)  # (baggage key, field)


class _BaggageToAttributes(SpanProcessor):
    """Copies the request's ids from baggage onto every span as it starts."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        entries = baggage.get_all(parent_context)
        for key in BAGGAGE_KEYS:
            value = entries.get(key)
            if value is not None:
                span.set_attribute(key, str(value))


class Tracing:
    def __init__(self, func_type: str, processor: str, flush_each_request: bool = False) -> None:
        from opentelemetry import trace
        from opentelemetry.baggage.propagation import W3CBaggagePropagator
        from opentelemetry.propagators.composite import CompositePropagator
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        attributes: dict[str, Any] = {
            "process.pid": os.getpid(),
            "agentic_rl.func_type": func_type,
            "agentic_rl.processor": processor,
        }
        if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        ):
            attributes["service.name"] = processor
        self.provider = TracerProvider(resource=Resource.create(attributes))
        self.provider.add_span_processor(_BaggageToAttributes())
        self._span_name = f"{func_type} {processor}"
        self._export = PipeSpanProcessor(attributes, plain=(self._span_name, _SERVER, _SCOPE))
        self.provider.add_span_processor(self._export)
        self._tracer = _RequestTracer(self.provider, self._export, self._span_name)
        trace.set_tracer_provider(self.provider)  # what user code's instrumentation records to
        runtime_opens_processor_spans()  # begin() opens them
        self._propagator = CompositePropagator(
            [TraceContextTextMapPropagator(), W3CBaggagePropagator()]
        )
        self.flush_each_request = flush_each_request  # --flush-spans request

    def begin(self, scope: Mapping[str, Any], input_data: Any) -> tuple[Span, Token[Context]]:
        """Start the request's processor span, a child of the caller's, and make it current;
        the span, and what ``end`` needs. (Explicit, not a context manager: this is on
        every request's path.)"""
        carrier: dict[str, str] = {}
        request_id = None
        for name, value in scope["headers"]:
            if name in _HEADERS:
                if name == b"x-request-id":
                    request_id = value.decode("latin-1")
                else:
                    carrier[_HEADERS[name]] = value.decode("latin-1")
        metadata = getattr(input_data, "request_metadata", None)
        if not carrier and metadata is None and not request_id and not capture_enabled():
            # Most requests: no caller's span or baggage, no ids, nothing captured. The
            # span is a root unless the task's context has one (an ASGI middleware's).
            current = otel_context.get_current()
            tracer = self._tracer
            if tracer.roots_only and SPAN_KEY not in current:
                span: Span = tracer.root()
            else:
                span = tracer.start_span(current)
            return span, otel_context.attach(processor_context(span, current))
        context = self._propagator.extract(carrier) if carrier else None
        attributes: dict[str, Any] = {}
        if metadata is not None:
            for key, name in _IDS:
                value = getattr(metadata, name)
                if value is not None:
                    # the request's secrets (bound by the app) never leave in an id
                    value = redact(str(value), credentials=False)
                    context = baggage.set_baggage(key, value, context)
                    attributes[key] = value
        if request_id:
            attributes["agentic_rl.request_id"] = redact(request_id, credentials=False)
        if capture_enabled():
            attributes["agentic_rl.input"] = capture(input_data)
        parent = context if context is not None else otel_context.get_current()
        span = self._tracer.start_span(parent, attributes)
        return span, otel_context.attach(processor_context(span, parent))

    @staticmethod
    def end(span: Span, entered: Token[Context], error: BaseException | None = None) -> None:
        """End what ``begin`` started; ``error``, raised meanwhile, marks the span."""
        if error is not None:
            record_error(span, error)
        otel_context.detach(entered)  # (begin's token, in begin's task)
        span.end()

    def flush(self) -> None:
        self.provider.force_flush(timeout_millis=5000)

    def shutdown(self) -> None:
        self.provider.shutdown()
        runtime_opens_processor_spans(False)


class _RequestTracer:
    """Starts the request's processor span as a ``_RequestSpan`` (see the module doc), with
    the provider's sampler and id generator, as the SDK's tracer would."""

    def __init__(self, provider: Any, export: PipeSpanProcessor, name: str) -> None:
        self._sampler = provider.sampler
        # The default sampler samples every span without a parent, with no attributes or
        # trace state of its own: asking it per request is a cost with a known answer.
        self.roots_only = provider.sampler is DEFAULT_ON
        self._ids = ids = provider.id_generator
        # the default generator's ids, without its method calls (0, never drawn in
        # practice, is not a valid id: the generator's own loop draws again)
        self._bits = getrandbits if type(ids) is RandomIdGenerator else None
        self._export = export
        self._name = name

    def root(self) -> _RequestSpan:
        """A sampled root span (what DEFAULT_ON answers for a span without a parent)."""
        bits, ids = self._bits, self._ids
        if bits is not None:
            trace_id = bits(128) or ids.generate_trace_id()
            span_id = bits(64) or ids.generate_span_id()
        else:  # (exact ints: a plain span's travel marshalled, and the encoder wants them)
            trace_id, span_id = int(ids.generate_trace_id()), int(ids.generate_span_id())
        return _RequestSpan(self._name, trace_id, span_id, self._export)

    def start_span(self, context: Any, attributes: dict[str, Any] | None = None) -> Span:
        found = get_current_span(context).get_span_context()
        parent = found if found.is_valid else None
        if parent is None and self.roots_only:
            span = self.root()
            if attributes:
                span.set_attributes(attributes)
            return span
        name, ids = self._name, self._ids
        trace_id = parent.trace_id if parent is not None else int(ids.generate_trace_id())
        sampling = self._sampler.should_sample(context, trace_id, name, SpanKind.SERVER, attributes)
        span_id = int(ids.generate_span_id())
        flags = _SAMPLED if sampling.decision.is_sampled() else _NOT_SAMPLED
        if not sampling.decision.is_recording():
            return NonRecordingSpan(
                SpanContext(trace_id, span_id, False, flags, sampling.trace_state)
            )
        span = _RequestSpan(name, trace_id, span_id, self._export)
        span.trace_flags, span.trace_state, span._parent = flags, sampling.trace_state, parent
        span._plain = False
        if sampling.attributes:  # the sampler's: it echoes the given ones, or filters them
            span.set_attributes(sampling.attributes)
        return span


class _RequestSpan(Span):
    """A recording SERVER span that, once ended, goes to the export queue as a SpanRecord,
    or a PlainRecord's four ints while it is ``plain`` (a sampled root with nothing set on
    it, as most are).
    What few spans have (a parent, a trace state, attributes, events, a status) stays at
    the class's default until set, and its SpanContext is made only when asked for (by a
    child span, or user code)."""

    __slots__ = ("_end", "_export", "_name", "_plain", "_start", "span_id", "trace_id")

    trace_flags: TraceFlags = _SAMPLED
    trace_state: TraceState | None = None
    _parent: SpanContext | None = None
    _attributes: dict[str, Any] | None = None
    _events: list[tuple[str, dict[str, Any], int]] | None = None
    _status: tuple[StatusCode, str | None] = _UNSET
    _context: SpanContext | None = None

    def __init__(self, name: str, trace_id: int, span_id: int, export: PipeSpanProcessor) -> None:
        self._name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self._export = export
        self._plain = True
        self._start = time_ns()
        self._end = 0

    def get_span_context(self) -> SpanContext:
        context = self._context
        if context is None:
            context = self._context = SpanContext(
                self.trace_id, self.span_id, False, self.trace_flags, self.trace_state
            )
        return context

    def is_recording(self) -> bool:
        return not self._end

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def set_attribute(self, key: str, value: Any) -> None:
        if self._end:
            return
        if type(key) is not str or not key:
            log.warning("span attribute key %r left out: not a non-empty str", key)
            return
        if type(value) not in _SCALARS:
            value = _attribute_value(key, value)
            if value is None:
                return
        if self._attributes is None:
            self._attributes = {}
            self._plain = False
        self._attributes[key] = value

    def add_event(
        self,
        name: str,
        attributes: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
    ) -> None:
        if not self._end:
            if self._events is None:
                self._events = []
                self._plain = False
            when = _nanoseconds(timestamp) if timestamp else time_ns()
            self._events.append((name, _kept(attributes or {}), when))

    def update_name(self, name: str) -> None:
        if not self._end:
            self._name = name
            self._plain = False

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._end or self._status[0] is StatusCode.OK:
            return  # OK is final, as in the SDK
        if isinstance(status, Status):
            description = status.description
            status = status.status_code
        if not isinstance(status, StatusCode):  # what user code gives never fails a request
            log.warning("span status %r left out: not a Status or StatusCode", status)
            return
        if not isinstance(description, str) or status is not StatusCode.ERROR:
            description = None  # (as the SDK's Status keeps only a str, and only for ERROR)
        self._status = (status, description)
        self._plain = False

    def record_exception(
        self,
        exception: BaseException,
        attributes: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        event = {
            "exception.type": type(exception).__qualname__,
            "exception.escaped": str(escaped),
        }
        given = attributes or {}
        if "exception.message" not in given:
            event["exception.message"] = str(exception)
        if "exception.stacktrace" not in given:
            event["exception.stacktrace"] = "".join(traceback.format_exception(exception))
        event.update(given)
        self.add_event("exception", event, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end:
            return
        self._end = end = _nanoseconds(end_time) if end_time else time_ns()
        if self.trace_flags is _NOT_SAMPLED:
            return  # recorded, never exported (a RECORD_ONLY sampler's), as in the SDK
        export = self._export
        if self._plain:
            export.put((self.trace_id, self.span_id, self._start, end))  # most requests
            return
        parent, state, status = self._parent, self.trace_state, self._status
        export.put(
            SpanRecord(
                name=self._name,
                trace_id=self.trace_id,
                span_id=self.span_id,
                flags=1,
                trace_state=tuple(state.items()) if state else (),
                parent_span_id=0 if parent is None else parent.span_id,
                parent_is_remote=False if parent is None else parent.is_remote,
                kind=_SERVER,
                start_ns=self._start,
                end_ns=end,
                attributes=self._attributes,
                events=self._events or (),
                links=(),
                status_code=0 if status is _UNSET else status[0].value,
                status_description=None if status is _UNSET else status[1],
                scope=_SCOPE,
            )
        )


def _nanoseconds(time: Any) -> int:
    """A time user code gave, as the exact int of nanoseconds the encoder writes."""
    try:
        return int(time)
    except (TypeError, ValueError, OverflowError):
        log.warning("span end time %r left out: not a number of nanoseconds", time)
        return time_ns()


_SCALARS = frozenset((str, bool, int, float))


def _kept(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """``attributes`` with each value as ``_attribute_value`` keeps it."""
    kept = {}
    for key, value in attributes.items():
        if type(value) not in _SCALARS:
            value = _attribute_value(key, value)
        if value is not None:
            kept[key] = value
    return kept


def _attribute_value(key: str, value: Any) -> Any:
    """A value the SDK would keep, copied (a scalar, or a sequence of one scalar type,
    None allowed); else None, with a warning: what user code sets must never stop the
    export (an object that cannot be pickled) nor change after it was set (a list)."""
    if isinstance(value, SCALAR_TYPES):
        return builtin_value(value)
    if isinstance(value, Sequence):
        kinds = {type(item) for item in value if item is not None}
        if len(kinds) <= 1 and kinds <= set(SCALAR_TYPES):
            return tuple(value)
    log.warning(
        "span attribute %r left out: a %s is no attribute value (a str, bool, int, float, "
        "bytes, or a sequence of one of them)",
        key,
        type(value).__name__,
    )
    return None
