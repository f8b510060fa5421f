"""Tracing end to end: a real server exporting over OTLP/HTTP to a real receiver."""

from __future__ import annotations

import json
import socket

from conftest import SAMPLES, free_port, reward_body
from llm_stub import LLMStub
from otlp_receiver import OTLPReceiver

SERVER, CLIENT, INTERNAL = 2, 3, 1  # SpanKind in OTLP
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
IDS = {
    "agentic_rl.job_id": "job-1",
    "agentic_rl.sample_id": "s-2",
    "agentic_rl.rollout_id": "ro-2",
    "agentic_rl.attempt_id": "a-1",
}


def tracing_env(receiver: OTLPReceiver, **extra: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        **extra,
    }


def rollout(start_server, receiver: OTLPReceiver, llm: LLMStub, **env: str):  # type: ignore[no-untyped-def]
    """The sample rollout served with --tracing, and its sample request, calling ``llm``."""
    server = start_server(
        "functions.rollout.rollout:DemoRolloutProcessor",
        "--tracing",
        workspace=SAMPLES,
        env=tracing_env(receiver, **env),
    )
    body = json.loads((SAMPLES / "requests" / "rollout.json").read_text())
    body["model_resource"]["base_url"] = llm.base_url
    return server, body


def test_rollout_trace_has_the_processor_llm_and_tool_spans(start_server, receiver):
    with LLMStub(free_port()) as llm:
        capture = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
        server, body = rollout(start_server, receiver, llm, **capture)
        response = server.post(
            body,
            headers={
                "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
                "x-request-id": "req-42",
                "baggage": "tenant=acme",
            },
        )
        assert response.json()["status"] == "success"
        spans = receiver.wait_for(4)
    assert len(spans) == 4
    assert {s["trace_id"] for s in spans} == {CALLER_TRACE}  # the caller's trace
    (processor,) = receiver.named("rollout ")
    assert processor["name"] == "rollout DemoRolloutProcessor"
    assert processor["kind"] == SERVER
    assert processor["parent_span_id"] == CALLER_SPAN
    assert processor["attributes"]["agentic_rl.request_id"] == "req-42"
    assert processor["status"] == 0  # UNSET: the output's status was success
    llm_spans = receiver.named("chat ")
    assert [s["name"] for s in llm_spans] == ["chat demo-model", "chat demo-model"]
    for span in llm_spans:
        assert span["kind"] == CLIENT
        assert span["parent_span_id"] == processor["span_id"]
        attributes = span["attributes"]
        assert attributes["gen_ai.provider.name"] == "openai"
        assert attributes["gen_ai.request.temperature"] == 0.7
        assert attributes["gen_ai.request.max_tokens"] == 256
        assert attributes["gen_ai.response.model"] == "demo-model"
        assert attributes["gen_ai.response.id"].startswith("chatcmpl-")
        assert (
            attributes["gen_ai.usage.input_tokens"],
            attributes["gen_ai.usage.output_tokens"],
        ) == (20, 10)
    assert [s["attributes"]["gen_ai.response.finish_reasons"] for s in llm_spans] == [
        ["tool_calls"],
        ["stop"],
    ]
    (tool,) = receiver.named("execute_tool ")
    assert tool["name"] == "execute_tool calculator"
    assert tool["kind"] == INTERNAL
    assert tool["parent_span_id"] == processor["span_id"]
    assert tool["attributes"]["gen_ai.tool.call.id"].startswith("call_")
    assert tool["attributes"]["gen_ai.tool.call.result"] == '"391"'
    for span in spans:  # the request's ids on every span, from baggage
        assert {k: span["attributes"].get(k) for k in IDS} == IDS
        assert "tenant" not in span["attributes"]  # foreign baggage is not copied
    assert processor["resource"]["service.name"] == "DemoRolloutProcessor"
    assert processor["resource"]["agentic_rl.func_type"] == "rollout"
    assert processor["resource"]["process.pid"] == server.proc.pid
    # content was captured (asked for), and the api key is nowhere in what was exported
    assert "What is 17 * 23?" in processor["attributes"]["agentic_rl.input"]
    assert b"sk-demo-not-a-real-key" not in receiver.raw


def test_a_request_with_no_caller_span_and_no_ids_is_a_root_with_children(start_server, receiver):
    # the common case (no traceparent, no request_metadata, nothing captured) takes the
    # runtime's short way to the processor span: the same span on the wire
    with LLMStub(free_port()) as llm:
        server, body = rollout(start_server, receiver, llm)
        del body["request_metadata"]
        assert server.post(body).json()["status"] == "success"
        spans = receiver.wait_for(4)
    (processor,) = receiver.named("rollout ")
    assert processor["name"] == "rollout DemoRolloutProcessor"
    assert processor["kind"] == SERVER
    assert processor["parent_span_id"] == ""  # a root
    assert processor["status"] == 0
    assert processor["end"] > processor["start"] > 0
    assert len(processor["trace_id"]) == 32 and int(processor["trace_id"], 16)
    assert len(processor["span_id"]) == 16 and int(processor["span_id"], 16)
    children = [s for s in spans if s is not processor]
    assert sorted(s["name"] for s in children) == [
        "chat demo-model",
        "chat demo-model",
        "execute_tool calculator",
    ]
    for span in children:
        assert span["trace_id"] == processor["trace_id"]
        assert span["parent_span_id"] == processor["span_id"]
        assert not any(k in span["attributes"] for k in IDS)


def test_processor_failure_is_an_error_span_without_the_key(start_server, receiver):
    server = start_server(
        "workspace.fns:LeakyRollout",
        env=tracing_env(
            receiver,
            ENABLE_TRAJECTORY="true",
            AGENTIC_RL_FORCE_FLUSH_MODE="request",
            OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
        ),
    )
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "rollout_extra": {"fail": True},
        "model_resource": {
            "model_name": "m",
            "base_url": "http://127.0.0.1:9/v1",
            "api_key": "sk-SECRET-777",
        },
    }
    assert server.post(body).status_code == 500
    (span,) = receiver.wait_for(1)
    assert span["name"] == "rollout LeakyRollout"
    assert span["status"] == 2  # ERROR
    assert span["events"] == ["exception"]  # recorded once
    assert "sk-SECRET-777" not in span["status_message"]
    assert b"sk-SECRET-777" not in receiver.raw


def test_spans_are_flushed_on_graceful_stop(start_server, receiver):
    env = tracing_env(receiver, OTEL_BSP_SCHEDULE_DELAY="60000")  # nothing leaves on its own
    server = start_server("workspace.fns:EchoReward", "--tracing", env=env)
    for _ in range(3):
        assert server.post(reward_body()).status_code == 200
    assert receiver.spans == []  # held for the 60 s schedule
    assert server.terminate() == 0
    assert [s["name"] for s in receiver.wait_for(3)] == ["reward EchoReward"] * 3
    # the export ran in a runtime thread, not user code: nothing is "still running" after it
    assert "threads still running" not in server.output()


def test_otel_sdk_disabled_wins(start_server, receiver):
    server = start_server(
        "workspace.fns:EchoReward",
        "--tracing",
        env=tracing_env(receiver, OTEL_SDK_DISABLED="true", AGENTIC_RL_FORCE_FLUSH_MODE="request"),
    )
    assert server.post(reward_body()).status_code == 200
    assert server.terminate() == 0
    assert receiver.spans == []
    assert "tracing=off" in server.output()


def test_exporter_down_never_fails_a_request(start_server):
    # a collector that takes connections and never answers: each export waits its 60 s
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(64)
        server = start_server(
            "workspace.fns:EchoReward",
            "--tracing",
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{blackhole.getsockname()[1]}",
                "OTEL_BSP_SCHEDULE_DELAY": "50",
                "OTEL_EXPORTER_OTLP_TIMEOUT": "60",
            },
        )
        for _ in range(50):
            # a request that waited on the exporter would outlast this client's timeout
            response = server.post(reward_body(messages=2), timeout=20)
            assert response.status_code == 200
            assert response.json()["reward"]["reward_score"] == 2.0
    assert server.client.get("/health").status_code == 200
    assert server.terminate() == 0


def test_samplers_decide_which_request_spans_leave(start_server, receiver):
    # the request span asks a configured sampler, as the SDK's tracer would; only what it
    # samples is exported, under the caller's trace
    def traceparent(trace_id: str, flags: str = "01") -> dict[str, str]:
        return {"traceparent": f"00-{trace_id}-{CALLER_SPAN}-{flags}"}

    low, high = "0" * 31 + "1", "0" * 16 + "f" * 16  # under and over a ratio of 0.5
    env = tracing_env(receiver, OTEL_TRACES_SAMPLER="parentbased_always_off")
    server = start_server("workspace.fns:EchoReward", "--tracing", env=env)
    assert server.post(reward_body()).status_code == 200  # a root: off
    assert server.post(reward_body(), headers=traceparent(low, "00")).status_code == 200
    assert server.post(reward_body(), headers=traceparent(CALLER_TRACE)).status_code == 200
    assert server.terminate() == 0  # flushes what was sampled
    (span,) = receiver.spans
    assert (span["trace_id"], span["parent_span_id"]) == (CALLER_TRACE, CALLER_SPAN)
    assert span["name"] == "reward EchoReward" and span["kind"] == SERVER

    receiver.spans.clear()
    env = tracing_env(receiver, OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.5")
    server = start_server("workspace.fns:EchoReward", "--tracing", env=env)
    for trace_id in (high, low, high):
        assert server.post(reward_body(), headers=traceparent(trace_id)).status_code == 200
    assert server.terminate() == 0
    assert [(s["trace_id"], s["parent_span_id"]) for s in receiver.spans] == [(low, CALLER_SPAN)]
