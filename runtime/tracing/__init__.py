"""The runtime's tracing: the tracer provider and a processor span per request (spans),
the exporter process (export) and its OTLP encoder (otlp)."""
