"""Span export out of the worker process: OTLP encoding and HTTP happen in a child.

Encoding a span to OTLP protobuf costs more CPU than the request it describes, and in
the worker it would share the GIL with the event loop. So the worker only turns each
finished span into a plain tuple and appends it to a bounded queue; a sender thread
ships batches of them through a pipe (plain spans' ints marshalled, other records
pickled) to one exporter process per worker, which rebuilds the spans and exports them
with the standard OTLP/HTTP exporter (configured by the ``OTEL_EXPORTER_OTLP_*``
variables, which it inherits). The split follows the OpenTelemetry Collector: the worker
is the client, the child is receiver plus exporter.

Guarantees: a request never waits on export (``on_end`` is a deque append). An exporter
that is down or slow backs up the pipe, then the queue; spans beyond the queue
(``OTEL_BSP_MAX_QUEUE_SIZE``) are dropped and counted, never waited for. ``force_flush``
and ``shutdown`` hand every queued span to the child and wait, within their timeout, for
its export: nothing is lost on a graceful stop. A child that dies is restarted.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import multiprocessing
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace.status import StatusCode

__all__ = [
    "SCALAR_TYPES",
    "PipeSpanProcessor",
    "PlainRecord",
    "PlainSpan",
    "SpanRecord",
    "builtin_value",
    "span_record",
]

log = logging.getLogger("runtime")


class SpanRecord(NamedTuple):
    """A finished span as plain data: cheap to build, to pickle (it crosses the pipe to the
    exporter process, which imports this module) and to rebuild. Its fields are in the
    order the encoder (runtime.tracing.otlp) unpacks them."""

    name: str
    trace_id: int
    span_id: int
    flags: int
    trace_state: tuple[tuple[str, str], ...]
    parent_span_id: int  # 0: no parent
    parent_is_remote: bool
    kind: int  # SpanKind's value
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] | None
    events: Sequence[tuple[str, dict[str, Any], int]]  # (name, attributes, time_ns) each
    links: Sequence[tuple[int, int, dict[str, Any]]]  # (trace_id, span_id, attributes) each
    status_code: int  # StatusCode's value
    status_description: str | None
    scope: tuple[str, str | None]  # (name, version)


# A sampled root span of the PlainSpan's name, kind and scope with nothing set on it: a
# plain tuple of four exact ints, (trace_id, span_id, start_ns, end_ns); told from a
# SpanRecord by its type.
PlainRecord = tuple[int, int, int, int]

# What most spans of a request have in common: (name, kind, scope). A sampled root span of
# that name, kind and scope with nothing set on it (attributes, events, status, trace
# state) may travel as a PlainRecord: marshal writes its four exact ints in a quarter of
# the time pickle takes for a whole record, on the worker's GIL. (Only those: marshal
# would write a numpy value as its bytes, without a word.)
PlainSpan = tuple[str, int, tuple[str, str | None]]


SCALAR_TYPES = (bool, str, int, float, bytes)  # what an attribute value is, or a sequence of


def builtin_value(value: Any) -> Any:
    """A value of a subclass of a builtin scalar (numpy's float64, an enum) as the builtin
    itself, and sequences of them: what the exporter process can unpickle without user
    code's modules, and encode; anything else as it is."""
    kind = type(value)
    if kind in SCALAR_TYPES:
        return value
    builtin: type[Any]  # each of SCALAR_TYPES, called on a value of a subclass of it
    for builtin in SCALAR_TYPES:
        if isinstance(value, builtin):
            return builtin(value) if builtin is not str else str.__str__(value)
    if kind in (list, tuple):
        return tuple(builtin_value(item) for item in value)
    return value


def _builtins(attributes: Any) -> dict[str, Any]:
    return {key: builtin_value(value) for key, value in (attributes or {}).items()}


def span_record(span: ReadableSpan) -> SpanRecord:
    """An SDK span as a ``SpanRecord`` (runtime.tracing.spans builds its own spans' in place)."""
    context, parent, scope = span.context, span.parent, span.instrumentation_scope
    code, description = span.status.status_code, span.status.description
    return SpanRecord(
        name=span.name,
        trace_id=context.trace_id,
        span_id=context.span_id,
        flags=int(context.trace_flags),
        trace_state=tuple(context.trace_state.items()) if context.trace_state else (),
        parent_span_id=parent.span_id if parent is not None else 0,
        parent_is_remote=parent.is_remote if parent is not None else False,
        kind=span.kind.value,
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        attributes=_builtins(span.attributes),
        events=[(e.name, _builtins(e.attributes), e.timestamp) for e in span.events],
        links=[
            (link.context.trace_id, link.context.span_id, _builtins(link.attributes))
            for link in span.links
        ],
        status_code=code.value if isinstance(code, StatusCode) else 0,  # (user code's: never fails)
        status_description=description if isinstance(description, str) else None,
        scope=(scope.name, scope.version) if scope is not None else ("", None),
    )


def _env_number(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, "")))
    except ValueError:
        return default


class PipeSpanProcessor(SpanProcessor):
    """Hands finished spans to the exporter process; see the module's docstring."""

    def __init__(
        self, resource_attributes: Mapping[str, Any], plain: PlainSpan | None = None
    ) -> None:
        self._resource = dict(resource_attributes)
        self.plain = plain
        self._delay = _env_number("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self._batch = _env_number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)
        self._queue: deque[SpanRecord | PlainRecord] = deque()
        self._max_queue = _env_number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self.dropped = 0
        self._wake = threading.Event()
        self._lock = threading.Lock()  # one pipe conversation at a time
        self._stopped = False
        self._child: Any = None
        self._conn: Connection | None = None
        self._sequence = 0
        self._thread = threading.Thread(target=self._run, name="span-export", daemon=True)
        self._thread.start()

    # --- the request path: one tuple, one append -------------------------------------

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        self.put(span_record(span))

    def put(self, record: SpanRecord | PlainRecord) -> None:
        """Queue a finished span: a SpanRecord, or a PlainRecord of the ``PlainSpan``."""
        queue = self._queue
        if len(queue) >= self._max_queue:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10000 == 0:
                log.warning("span export is behind: %d spans dropped so far", self.dropped)
            return
        queue.append(record)
        if len(queue) >= self._batch:
            self._wake.set()

    # --- the sender thread -----------------------------------------------------------

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self._delay)
            self._wake.clear()
            with self._lock:
                if not self._stopped:
                    self._send_queued()

    def _send_queued(self) -> bool:
        """Ship everything queued; False when the exporter process cannot be reached."""
        queue = self._queue
        while queue:
            batch = [queue.popleft() for _ in range(min(len(queue), self._batch))]
            for message in self._messages(batch):
                if not self._send(message):
                    return False
        return True

    def _messages(self, batch: list[SpanRecord | PlainRecord]) -> list[bytes]:
        plain = [record for record in batch if not isinstance(record, SpanRecord)]
        records = [record for record in batch if isinstance(record, SpanRecord)]
        messages = [_MARSHAL + marshal.dumps(plain)] if plain else []
        if records:
            try:
                messages.append(_PICKLE + pickle.dumps(records, pickle.HIGHEST_PROTOCOL))
            except Exception:  # a value that cannot be pickled: only its span is left out
                kept = [record for record in records if _picklable(record)]
                self.dropped += len(records) - len(kept)
                if kept:
                    messages.append(_PICKLE + pickle.dumps(kept, pickle.HIGHEST_PROTOCOL))
        return messages

    def _send(self, message: bytes) -> bool:
        for attempt in range(2):  # a dead child is replaced once per message
            conn = self._conn or self._start_child()
            if conn is None:
                return False
            try:
                conn.send_bytes(message)
                return True
            except (OSError, EOFError, ValueError):
                self._forget_child(f"the span exporter process stopped (attempt {attempt + 1})")
        return False

    def _start_child(self) -> Connection | None:
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        child = context.Process(
            target=_exporter_main,
            args=(theirs, self._resource, self.plain),
            name="span-exporter",
            daemon=True,  # never outlives the worker
        )
        try:
            child.start()
        except Exception as exc:  # never the end of the sender thread
            log.warning("cannot start the span exporter process: %s", exc)
            return None
        theirs.close()
        self._child, self._conn = child, ours
        return ours

    def _forget_child(self, reason: str) -> None:
        log.warning("%s; starting a new one", reason)
        if self._conn is not None:
            self._conn.close()
        if self._child is not None:
            self._child.kill()
            self._child.join(1)
        self._child = self._conn = None

    def _roundtrip(self, kind: str, timeout: float) -> bool:
        """Send everything queued, then ``kind``; wait for the child's answer."""
        deadline = time.monotonic() + timeout
        if not self._lock.acquire(timeout=timeout):
            return False
        try:
            if not self._send_queued():
                return False
            self._sequence += 1
            message = _CONTROL + pickle.dumps((kind, self._sequence))
            if self._conn is None or not self._send(message):
                return False
            conn = self._conn
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not conn.poll(left):
                    return False
                answer = conn.recv()
                if answer == (kind, self._sequence):
                    return True
        except (OSError, EOFError):
            return False
        finally:
            self._lock.release()

    # --- flush and stop --------------------------------------------------------------

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        if not self._queue and self._conn is None:
            return True
        return self._roundtrip("flush", timeout_millis / 1000)

    def shutdown(self) -> None:
        if self._stopped:
            return
        done = True
        if self._queue or self._conn is not None:
            done = self._roundtrip("stop", 10.0)
        self._stopped = True
        self._wake.set()
        child = self._child
        if child is not None:
            child.join(1 if done else 0.1)
            if child.is_alive():
                child.kill()
                child.join()
        if self._conn is not None:
            self._conn.close()
        if not done or self._queue:
            log.warning("span export stopped before every span was exported")


# --- the pipe's messages: a tag byte, then the body -------------------------------------

_MARSHAL, _PICKLE, _CONTROL = b"m", b"p", b"c"  # plain spans, records, (kind, sequence)


def _picklable(record: SpanRecord) -> bool:
    try:
        pickle.dumps(record, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        log.warning(
            "span %r left out: it cannot be sent to the exporter: %s: %s",
            record.name,
            type(exc).__name__,
            exc,
        )
        return False
    return True


def _decode(message: bytes, plain: PlainSpan | None) -> tuple[bytes, Any]:
    """The tag, and the body: SpanRecords for spans, (kind, sequence) for control."""
    tag, body = message[:1], memoryview(message)[1:]
    if tag != _MARSHAL:
        return tag, pickle.loads(body)
    assert plain is not None  # the worker sends plain spans only with their PlainSpan
    name, kind, scope = plain
    return tag, [
        SpanRecord(
            name=name,
            trace_id=trace_id,
            span_id=span_id,
            flags=1,
            trace_state=(),
            parent_span_id=0,
            parent_is_remote=False,
            kind=kind,
            start_ns=start,
            end_ns=end,
            attributes=None,
            events=(),
            links=(),
            status_code=0,
            status_description=None,
            scope=scope,
        )
        for trace_id, span_id, start, end in marshal.loads(body)
    ]


# --- the exporter process ----------------------------------------------------------------


def _exporter_main(
    conn: Connection, resource_attributes: dict[str, Any], plain: PlainSpan | None = None
) -> None:
    """Receives span records, exports them over OTLP/HTTP, answers flush and stop."""
    import signal

    # Ctrl-C reaches the whole process group: the worker, draining, decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s span-exporter: %(message)s")

    from opentelemetry.exporter.otlp.proto.http import trace_exporter
    from opentelemetry.sdk.resources import Resource

    exporter = trace_exporter.OTLPSpanExporter()
    resource = Resource.create(resource_attributes)
    direct = _encode_directly(trace_exporter, resource)
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):  # the worker is gone
            break
        try:
            tag, body = _decode(message, plain)
        except Exception as exc:  # (a value that pickles but will not unpickle): this batch
            logging.warning(
                "a batch of spans left out: it cannot be read: %s: %s", type(exc).__name__, exc
            )
            continue
        if tag != _CONTROL:
            exporter.export(body if direct else _rebuild(body, resource))
        else:
            exporter.force_flush()
            with contextlib.suppress(OSError):
                conn.send(body)  # (kind, sequence): done
            if body[0] == "stop":
                break
    exporter.shutdown()


def _encode_directly(trace_exporter: Any, resource: Any) -> bool:
    """Make the OTLP exporter send our own encoding of the records (runtime.tracing.otlp,
    about 5 us a span) instead of rebuilding SDK spans for its encoder (about 30): its
    endpoint, headers, compression, timeout and retries stay the exporter's. Done only in
    this process, which does nothing else, and only where ``export()`` encodes through
    the module's ``encode_spans``, as its releases do; otherwise False, and the records
    are rebuilt. (tests/tracing/test_otlp_exporter_canaries.py fails when a release changes
    this; pyproject.toml bounds the exporter to the releases it passed on.)"""
    code = getattr(trace_exporter.OTLPSpanExporter.export, "__code__", None)
    names = getattr(code, "co_names", ())
    if "encode_spans" not in names or not hasattr(trace_exporter, "encode_spans"):
        return False
    from runtime.tracing.otlp import RecordEncoder

    encoder = RecordEncoder(resource)
    trace_exporter.encode_spans = lambda records: _Encoded(encoder.encode(records))
    return True


class _Encoded:
    """What ``encode_spans`` returns, as far as the exporter uses it: its bytes."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializePartialToString(self) -> bytes:  # protobuf's name
        return self.data

    SerializeToString = SerializePartialToString


def _rebuild(records: Sequence[SpanRecord], resource: Any) -> list[ReadableSpan]:
    from opentelemetry.sdk.trace import Event
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
    from opentelemetry.trace.status import Status, StatusCode

    spans = []
    for record in records:
        record = SpanRecord(*record)  # (a plain tuple in the field order reads as one too)
        trace_id, flags = record.trace_id, TraceFlags(record.flags)
        state = TraceState(list(record.trace_state))
        context = SpanContext(trace_id, record.span_id, False, flags, state)
        parent = (
            SpanContext(trace_id, record.parent_span_id, record.parent_is_remote, flags, state)
            if record.parent_span_id
            else None
        )
        spans.append(
            ReadableSpan(
                record.name,
                context=context,
                parent=parent,
                resource=resource,
                attributes=record.attributes,
                events=[Event(n, a, timestamp=t) for n, a, t in record.events],
                links=[Link(SpanContext(t, s, False), a) for t, s, a in record.links],
                kind=SpanKind(record.kind),
                status=Status(StatusCode(record.status_code), record.status_description),
                start_time=record.start_ns,
                end_time=record.end_ns,
                instrumentation_scope=InstrumentationScope(*record.scope),
            )
        )
    return spans
