"""Span records have a type: a SpanRecord (any span) or a PlainRecord (four ints of a plain
request span), told apart by type on their way to the exporter process."""

from __future__ import annotations

import pickle

from runtime.tracing import export
from runtime.tracing.export import PipeSpanProcessor, SpanRecord

PLAIN = ("reward EchoReward", 2, ("agentic-rl-runtime", None))


def _record(**fields: object) -> SpanRecord:
    base = dict(
        name="judge",
        trace_id=7,
        span_id=8,
        flags=1,
        trace_state=(),
        parent_span_id=0,
        parent_is_remote=False,
        kind=1,
        start_ns=10,
        end_ns=20,
        attributes={"k": "v"},
        events=(),
        links=(),
        status_code=0,
        status_description=None,
        scope=("user.scope", "1.0"),
    )
    base.update(fields)
    return SpanRecord(**base)  # type: ignore[arg-type]


def test_a_record_pickles_as_itself() -> None:
    record = _record()
    back = pickle.loads(pickle.dumps(record, pickle.HIGHEST_PROTOCOL))
    assert type(back) is SpanRecord and back == record


def test_plain_and_full_records_travel_apart_by_type() -> None:
    processor = PipeSpanProcessor({"service.name": "x"}, plain=PLAIN)
    try:
        # a record with 4 attributes is no plain span, nor is a plain span a record
        full = _record(attributes={"a": 1, "b": 2, "c": 3, "d": 4})
        batch = [(1, 2, 3, 4), full, (5, 6, 7, 8)]
        decoded = [export._decode(m, PLAIN) for m in processor._messages(batch)]
    finally:
        processor.shutdown()
    assert [tag for tag, _ in decoded] == [b"m", b"p"]
    plain, records = decoded[0][1], decoded[1][1]
    assert records == [full]
    assert all(type(r) is SpanRecord for r in plain)
    assert [(r.name, r.trace_id, r.span_id, r.start_ns, r.end_ns) for r in plain] == [
        ("reward EchoReward", 1, 2, 3, 4),
        ("reward EchoReward", 5, 6, 7, 8),
    ]
    assert plain[0].scope == PLAIN[2] and plain[0].attributes is None
