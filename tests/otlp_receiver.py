"""A real OTLP/HTTP trace receiver on loopback: decodes what exporters send with
opentelemetry-proto and keeps the spans (and the raw bytes, to search for secrets)."""

from __future__ import annotations

import gzip
import time
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from threaded_server import ThreadedServer


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class OTLPReceiver(ThreadedServer):
    def __init__(self, port: int) -> None:
        self.endpoint = f"http://127.0.0.1:{port}"
        self.spans: list[dict[str, Any]] = []
        self.raw = b""
        super().__init__(port, [Route("/v1/traces", self._traces, methods=["POST"])])

    async def _traces(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        self.raw += body
        message = ExportTraceServiceRequest.FromString(body)
        for resource_spans in message.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        {
                            "name": span.name,
                            "kind": span.kind,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "status": span.status.code,
                            "status_message": span.status.message,
                            "events": [e.name for e in span.events],
                            "scope": scope_spans.scope.name,
                            "resource": resource,
                        }
                    )
        return Response(
            ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf"
        )

    def wait_for(self, count: int, timeout: float = 15) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.spans) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.spans

    def named(self, prefix: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["name"].startswith(prefix)]
