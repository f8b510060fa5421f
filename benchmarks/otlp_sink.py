"""A minimal OTLP/HTTP trace sink for the benchmark: accepts and discards every export,
so the exporting server pays its full cost while the sink costs next to nothing."""

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

OK = ExportTraceServiceResponse().SerializeToString()
HEADERS = [(b"content-type", b"application/x-protobuf"), (b"content-length", str(len(OK)).encode())]


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": OK})
