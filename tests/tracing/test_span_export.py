"""The span exporter process: spans leave through it, and it neither outlives its
worker nor loses spans when it is killed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from conftest import descendants, reward_body, wait_gone
from otlp_receiver import OTLPReceiver


def _exporters(server_pid: int, timeout: float = 15) -> set[int]:
    """The span-exporter children of a worker (started with the first spans)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {pid for pid in descendants(server_pid) if b"spawn_main" in _cmdline(pid)}
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("no span exporter process appeared")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _env(receiver: OTLPReceiver) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}


def test_spans_are_encoded_outside_the_worker(start_server, receiver):
    server = start_server("workspace.fns:EchoReward", "--tracing", env=_env(receiver))
    assert server.post(reward_body()).status_code == 200
    assert [s["name"] for s in receiver.wait_for(1)] == ["reward EchoReward"]
    (exporter,) = _exporters(server.proc.pid)
    assert exporter != server.proc.pid
    assert server.terminate() == 0
    assert wait_gone({exporter}, 10) == set()


def test_a_plain_request_span_arrives_whole(start_server, receiver):
    # A request span with nothing set on it leaves the worker as four ints; the exporter
    # process fills in the rest. One with an attribute leaves as a whole record.
    server = start_server("workspace.fns:EchoReward", "--tracing", env=_env(receiver))
    assert server.post(reward_body()).status_code == 200
    assert server.post(reward_body(), headers={"x-request-id": "r-1"}).status_code == 200
    plain, marked = sorted(receiver.wait_for(2), key=lambda span: len(span["attributes"]))
    assert marked["attributes"] == {"agentic_rl.request_id": "r-1"}
    for span in (plain, marked):
        assert span["name"] == "reward EchoReward"
        assert span["kind"] == 2  # SERVER
        assert span["scope"] == "agentic-rl-runtime"
        assert span["parent_span_id"] == ""
        assert (span["status"], span["status_message"], span["events"]) == (0, "", [])
        assert span["end"] > span["start"] > 1.7e18
        assert int(span["trace_id"], 16) and int(span["span_id"], 16)
    assert plain["attributes"] == {}
    assert plain["trace_id"] != marked["trace_id"]
    assert server.terminate() == 0


def test_a_killed_exporter_is_replaced_and_later_spans_still_arrive(start_server, receiver):
    server = start_server("workspace.fns:EchoReward", "--tracing", env=_env(receiver))
    assert server.post(reward_body()).status_code == 200
    receiver.wait_for(1)
    (first,) = _exporters(server.proc.pid)
    os.kill(first, signal.SIGKILL)
    assert wait_gone({first}, 10) == set()
    for _ in range(3):
        assert server.post(reward_body()).status_code == 200
    assert len(receiver.wait_for(4)) == 4
    assert first not in _exporters(server.proc.pid)
    server.wait_output("span exporter process stopped")
    assert server.terminate() == 0


def test_the_exporter_does_not_outlive_a_killed_worker(start_server, receiver):
    server = start_server("workspace.fns:EchoReward", "--tracing", env=_env(receiver))
    assert server.post(reward_body()).status_code == 200
    receiver.wait_for(1)
    exporters = _exporters(server.proc.pid)
    server.proc.kill()
    server.proc.wait()
    assert wait_gone(exporters, 15) == set()


def _records() -> list[tuple]:
    """Span records of every shape the encoder meets, lengths around the one-byte limit."""
    import random

    rng = random.Random(7)
    records = []
    for i in range(120):
        attributes = {
            "s": f"x{i}",
            "empty": "",
            "b": bool(i % 2),
            "i": -i,
            "big": 2**40 + i,
            "f": 1.5 * i,
            "texts": ("a", "b"),
            "ints": [1, -2],
            "bytes": b"\x00\xff",
            "mapping": {"k": 1, "n": None},
            "k" * (i % 130): "é中" * (i % 70),
        }
        events = [("exception", {"exception.type": "ValueError"}, 10**18 + i)] if i % 7 == 0 else []
        links = [(rng.getrandbits(128), rng.getrandbits(64), {"l": i})] if i % 6 == 0 else []
        records.append(
            (
                "reward EchoReward" if i % 3 else "",
                rng.getrandbits(128),
                rng.getrandbits(64),
                1,
                (("vendor", f"v{i}"),) if i % 5 == 0 else (),
                rng.getrandbits(64) if i % 2 else 0,
                bool(i % 4),
                i % 5,
                10**18 + i,
                10**18 + 1000 + i,
                attributes,
                events,
                links,
                i % 3,
                "judge failed: " + "x" * i if i % 3 == 2 else None,
                ("agentic-rl-runtime", None) if i % 4 else ("user.scope", "1.2"),
            )
        )
    return records


def test_direct_encoding_is_what_the_sdk_encoder_makes() -> None:
    # The exporter process encodes span records straight to OTLP protobuf; parsed, its
    # bytes must be the message the SDK's own encoder makes from the rebuilt spans.
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.sdk.resources import Resource

    from runtime.tracing.export import _rebuild
    from runtime.tracing.otlp import RecordEncoder

    resource = Resource.create({"service.name": "EchoReward", "process.pid": 1})
    records = _records()
    ours = ExportTraceServiceRequest.FromString(RecordEncoder(resource).encode(records))
    sdk = encode_spans(_rebuild(records, resource)).SerializePartialToString()
    assert ours == ExportTraceServiceRequest.FromString(sdk)
    assert sum(len(s.spans) for s in ours.resource_spans[0].scope_spans) == len(records)


def test_an_attribute_otlp_cannot_carry_is_left_out_not_the_batch() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.sdk.resources import Resource

    from runtime.tracing.otlp import RecordEncoder

    record = list(_records()[1])
    record[10] = {"kept": "yes", "odd": object()}
    encoded = RecordEncoder(Resource.create({})).encode([tuple(record)] * 2)
    spans = ExportTraceServiceRequest.FromString(encoded).resource_spans[0].scope_spans[0].spans
    assert len(spans) == 2
    assert [(a.key, a.value.string_value) for a in spans[0].attributes] == [("kept", "yes")]


def test_a_lone_surrogate_cannot_spoil_the_batch() -> None:
    # A string OTLP must carry as UTF-8: a lone surrogate (from bad input) is replaced, so
    # that the receiver can parse the batch at all.
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.sdk.resources import Resource

    from runtime.tracing.otlp import RecordEncoder

    record = list(_records()[1])
    record[0] = "reward \ud800"
    record[10] = {"answer": "x\udfffy"}
    encoded = RecordEncoder(Resource.create({})).encode([tuple(record)])
    span = ExportTraceServiceRequest.FromString(encoded).resource_spans[0].scope_spans[0].spans[0]
    assert span.name == "reward ?"
    assert span.attributes[0].value.string_value == "x?y"


def test_values_otlp_cannot_carry_are_left_out_and_nothing_else_is_lost(start_server, receiver):
    # An unpicklable object once stopped the export for good; an int outside int64, or a
    # list that holds itself, lost the whole batch. Now only those attributes are left out.
    server = start_server("workspace.fns:OddAttributesReward", "--tracing", env=_env(receiver))
    for _ in range(3):
        assert server.post(reward_body()).status_code == 200
    spans = receiver.wait_for(6)
    assert sorted(s["name"] for s in spans) == ["judge"] * 3 + ["reward OddAttributesReward"] * 3
    for span in receiver.named("reward"):
        assert span["attributes"] == {"ok": "yes", "status": "success", "shared": ["before"]}
    for span in receiver.named("judge"):
        assert span["attributes"] == {"ok": "yes", "status": "failed"}
    assert server.post(reward_body()).status_code == 200  # the export still runs
    assert len(receiver.wait_for(8)) == 8
    server.wait_output("left out")
    assert server.terminate() == 0


def test_careless_tracing_loses_only_what_cannot_travel(start_server, receiver):
    server = start_server("workspace.fns:CarelessTracingReward", "--tracing", env=_env(receiver))
    assert server.post(reward_body()).json()["reward"]["reward_score"] == 0.75
    assert server.post(reward_body()).status_code == 200
    assert server.terminate() == 0  # flushes everything
    names = sorted(s["name"] for s in receiver.spans)
    assert names == ["reward CarelessTracingReward"] * 2 + ["user-np"] * 2
    for span in receiver.named("reward"):  # numpy values as numbers and text, not bytes
        assert span["attributes"] == {"score": 0.75, "label": "gpt-4o"}
        assert span["status"] == 0  # "error" is no status
    for span in receiver.named("user-np"):
        assert span["attributes"] == {"score": 0.75, "two": "a"}
        assert span["status"] == 0
    for line in (  # (lines may trail the spans: the server writes them from a thread)
        "span status 'error' left out",
        "span attribute key ['k'] left out",
        "span 'unpicklable' left out",
        "span 'negative end' left out",
        "span 'bad scope' left out",
    ):
        server.wait_output(line)


def test_an_id_that_is_the_api_key_leaves_blanked(start_server, receiver):
    key = "sk-test-1234567890abcdef"
    server = start_server("workspace.fns:LeakyRollout", "--tracing", env=_env(receiver))
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "model_resource": {"model_name": "m", "base_url": "http://127.0.0.1:9", "api_key": key},
        "request_metadata": {"job_id": key, "sample_id": "s", "rollout_id": "r", "attempt_id": "a"},
    }
    assert server.post(body, headers={"x-request-id": key}).status_code == 200
    (span,) = receiver.wait_for(1)
    assert span["attributes"]["agentic_rl.sample_id"] == "s"
    assert key not in span["attributes"]["agentic_rl.job_id"]
    assert key not in span["attributes"]["agentic_rl.request_id"]
    assert key.encode() not in receiver.raw
    assert server.terminate() == 0


def test_long_span_names_and_keys_are_not_kept_by_the_encoder() -> None:
    # a name or key made of a prompt or a URL, new on every span, must not pile up in the
    # exporter process; the short ones that recur are kept
    from opentelemetry.sdk.resources import Resource

    from runtime.tracing import otlp as otlp_encoding

    encoder = otlp_encoding.RecordEncoder(Resource.create({"service.name": "x"}))
    records = [
        (f"chat {i} " + "x" * 1000, 1, 2, 1, (), 0, False, 1, 10, 20,
         {f"k{i}" + "y" * 1000: "v", "short": "v"}, [], [], 0, None, ("s", None))
        for i in range(50)
    ]  # fmt: skip
    encoder.encode(records)
    assert not any(len(name) > 1000 for name in otlp_encoding._NAMES)
    assert not any(len(key) > 1000 for key in otlp_encoding._KEYS)
    assert "short" in otlp_encoding._KEYS
