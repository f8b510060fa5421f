"""Canaries for the OTLP exporter internals the exporter process leans on.

runtime.tracing.export has the OTLP/HTTP exporter send the runtime's own encoding of span
records (runtime.tracing.otlp) by replacing its module's ``encode_spans``, which
``OTLPSpanExporter.export`` looks up when it runs and whose result it asks for its bytes.
pyproject.toml bounds the exporter to the tested minor; CI also runs these against its
newest release: a release that encodes some other way fails here, not as spans exported
through the slow path, or not at all.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.exporter.otlp.proto.http import trace_exporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExportResult

from runtime.tracing import export
from runtime.tracing.otlp import RecordEncoder

RECORD = (
    "reward EchoReward", 7, 9, 1, (), 0, False, 1, 1_000, 2_000,
    {"agentic_rl.status": "failed"}, (), (), 2, "boom", ("agentic-rl-runtime", None),
)  # fmt: skip


@pytest.fixture
def posted() -> Iterator[tuple[str, list[bytes]]]:
    """An OTLP/HTTP endpoint that keeps each body posted to it: (its URL, the bodies)."""
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1/traces", bodies
    finally:
        server.shutdown()
        thread.join()


def test_the_exporter_still_encodes_through_its_modules_encode_spans(
    monkeypatch: pytest.MonkeyPatch, posted: tuple[str, list[bytes]]
) -> None:
    url, bodies = posted
    resource = Resource.create({"service.name": "canary"})
    monkeypatch.setattr(trace_exporter, "encode_spans", trace_exporter.encode_spans)  # restored
    assert export._encode_directly(trace_exporter, resource)  # the fast path is taken
    exporter = OTLPSpanExporter(endpoint=url)
    try:
        assert exporter.export([RECORD]) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    # what went out is our encoding, byte for byte (no second encoding, no compression)
    assert bodies == [RecordEncoder(resource).encode([RECORD])]
