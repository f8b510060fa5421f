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
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import baggage
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import Span

from processors_base.observability._core import BAGGAGE_KEYS, request_secrets
from processors_base.observability.processor import processor_span

__all__ = ["Tracing"]

log = logging.getLogger("runtime")

_HEADERS = {b"traceparent": "traceparent", b"tracestate": "tracestate", b"baggage": "baggage"}
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
    def __init__(self, func_type: str, processor: str) -> None:
        from opentelemetry import trace
        from opentelemetry.baggage.propagation import W3CBaggagePropagator
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.propagators.composite import CompositePropagator
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
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
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(self.provider)  # what user code's instrumentation records to
        # loongsuite warns about optional multimodal extras we do not use
        logging.getLogger("opentelemetry.util.genai").setLevel(logging.ERROR)
        self._propagator = CompositePropagator(
            [TraceContextTextMapPropagator(), W3CBaggagePropagator()]
        )
        self._func_type = func_type
        self._processor = processor
        self.flush_each_request = (
            os.environ.get("AGENTIC_RL_FORCE_FLUSH_MODE", "").strip().lower() == "request"
        )

    @contextmanager
    def request(self, scope: dict[str, Any], input_data: Any) -> Iterator[Span]:
        carrier: dict[str, str] = {}
        request_id = None
        for name, value in scope["headers"]:
            if name in _HEADERS:
                carrier[_HEADERS[name]] = value.decode("latin-1")
            elif name == b"x-request-id":
                request_id = value.decode("latin-1")
        context = self._propagator.extract(carrier) if carrier else None
        metadata = getattr(input_data, "request_metadata", None)
        if metadata is not None:
            for key, name in _IDS:
                context = baggage.set_baggage(key, getattr(metadata, name), context)
        api_key = getattr(getattr(input_data, "model_resource", None), "api_key", None)
        secrets = request_secrets.set((api_key.get_secret_value(),) if api_key is not None else ())
        attributes = {"agentic_rl.request_id": request_id} if request_id else None
        try:
            with processor_span(
                self.provider,
                self._func_type,
                self._processor,
                input_data,
                context=context,
                attributes=attributes,
            ) as span:
                yield span
        finally:
            request_secrets.reset(secrets)

    def flush(self) -> None:
        self.provider.force_flush(timeout_millis=5000)

    def shutdown(self) -> None:
        self.provider.shutdown()
