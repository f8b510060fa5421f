"""The tracing instrumentation in-process: real openai clients against the local LLM
stand-in, real langchain-core tools, a LangGraph ToolNode and MCP tools from
langchain-mcp-adapters, recorded by an SDK tracer provider given explicitly."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import openai
import pytest
from conftest import ROOT, free_port
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from llm_stub import LLMStub
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util.genai.extended_handler import ExtendedTelemetryHandler
from pydantic import SecretStr

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardOutput,
    observe_llm,
    observe_processor,
    observe_tool,
    trace_client,
    trace_tool,
    untrace_client,
)
from processors_base.observability._core import capture, capture_enabled, request_secrets

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def llm() -> Iterator[LLMStub]:
    with LLMStub(free_port()) as stub:
        yield stub


@pytest.fixture
def traced() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def spans(exporter: InMemorySpanExporter) -> list:
    return list(exporter.get_finished_spans())


def assert_llm_span(span, model: str = "m") -> dict:
    assert span.name == f"chat {model}"
    assert span.kind is SpanKind.CLIENT
    attributes = dict(span.attributes)
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == model
    return attributes


def test_sync_client_call_is_one_llm_span_with_usage(llm, traced):
    provider, exporter = traced
    client = trace_client(
        openai.OpenAI(base_url=llm.base_url, api_key="sk-x"), tracer_provider=provider
    )
    result = client.chat.completions.create(
        model="m", messages=MESSAGES, temperature=0.3, max_tokens=50, top_p=0.9
    )
    assert isinstance(result, openai.types.chat.ChatCompletion)
    (span,) = spans(exporter)
    attributes = assert_llm_span(span)
    assert attributes["gen_ai.request.temperature"] == 0.3
    assert attributes["gen_ai.request.max_tokens"] == 50
    assert attributes["gen_ai.request.top_p"] == 0.9
    assert attributes["gen_ai.response.model"] == "m"
    assert attributes["gen_ai.response.id"] == result.id
    assert attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
        20,
        10,
    )
    assert "gen_ai.input.messages" not in attributes  # content is off by default


def test_async_client_call(llm, traced):
    provider, exporter = traced
    client = trace_client(
        openai.AsyncOpenAI(base_url=llm.base_url, api_key="sk-x"), tracer_provider=provider
    )
    result = asyncio.run(client.chat.completions.create(model="m", messages=MESSAGES))
    assert isinstance(result, openai.types.chat.ChatCompletion)
    (span,) = spans(exporter)
    assert assert_llm_span(span)["gen_ai.usage.output_tokens"] == 10


def test_sync_stream_keeps_its_type_and_ends_the_span_when_exhausted(llm, traced):
    provider, exporter = traced
    client = trace_client(
        openai.OpenAI(base_url=llm.base_url, api_key="sk-x"), tracer_provider=provider
    )
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    assert isinstance(stream, openai.Stream)
    assert spans(exporter) == []  # still open while the stream is
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "The answer is 42."
    (span,) = spans(exporter)
    attributes = assert_llm_span(span)
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
        12,
        4,
    )


def test_sync_stream_as_context_manager_closed_early(llm, traced):
    provider, exporter = traced
    client = trace_client(
        openai.OpenAI(base_url=llm.base_url, api_key="sk-x"), tracer_provider=provider
    )
    with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
        first = next(stream)
        assert first.choices[0].delta.content == "The "
    (span,) = spans(exporter)
    assert span.status.status_code is not StatusCode.ERROR


def test_async_stream(llm, traced):
    provider, exporter = traced
    client = trace_client(
        openai.AsyncOpenAI(base_url=llm.base_url, api_key="sk-x"), tracer_provider=provider
    )

    async def consume() -> str:
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        assert isinstance(stream, openai.AsyncStream)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert asyncio.run(consume()) == "The answer is 42."
    (span,) = spans(exporter)
    assert assert_llm_span(span)["gen_ai.usage.output_tokens"] == 4


def test_tracing_twice_traces_once_and_untrace_undoes_it(llm, traced):
    provider, exporter = traced
    client = openai.OpenAI(base_url=llm.base_url, api_key="sk-x")
    trace_client(trace_client(client, tracer_provider=provider), tracer_provider=provider)
    client.chat.completions.create(model="m", messages=MESSAGES)
    assert len(spans(exporter)) == 1
    untrace_client(client)
    client.chat.completions.create(model="m", messages=MESSAGES)
    assert len(spans(exporter)) == 1


def test_completions_resource_and_langchain_like_wrapper(llm, traced):
    provider, exporter = traced
    resource = openai.OpenAI(base_url=llm.base_url, api_key="sk-x").chat.completions
    trace_client(resource, tracer_provider=provider)
    resource.create(model="m", messages=MESSAGES)

    class Wrapper:  # the shape of LangChain's ChatOpenAI: .client and .async_client
        client = openai.OpenAI(base_url=llm.base_url, api_key="sk-x").chat.completions
        async_client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="sk-x").chat.completions

    wrapper = trace_client(Wrapper(), tracer_provider=provider)
    wrapper.client.create(model="m", messages=MESSAGES)
    asyncio.run(wrapper.async_client.create(model="m", messages=MESSAGES))
    assert [s.name for s in spans(exporter)] == ["chat m"] * 3


class Generation:
    """The shape of DashScope's Generation: a class whose classmethod ``call`` does the work."""

    @classmethod
    def call(cls, model: str, messages: list, stream: bool = False, **kwargs):  # type: ignore[no-untyped-def]
        def response(text: str, finish: str) -> dict:
            return {
                "request_id": "req-ds-1",
                "output": {"text": text, "finish_reason": finish},
                "usage": {"input_tokens": 7, "output_tokens": 3},
            }

        if stream:
            return (response(t, f) for t, f in [("4", "null"), ("42", "stop")])
        return response("42", "stop")


def test_dashscope_generation_class(traced):
    provider, exporter = traced
    trace_client(Generation, tracer_provider=provider)
    try:
        assert Generation.call(model="qwen-plus", messages=MESSAGES)["output"]["text"] == "42"
        assert [
            r["output"]["text"]
            for r in Generation.call(model="qwen-plus", messages=MESSAGES, stream=True)
        ] == ["4", "42"]
    finally:
        untrace_client(Generation)
    first, second = spans(exporter)
    for span in (first, second):
        attributes = dict(span.attributes)
        assert span.name == "chat qwen-plus"
        assert attributes["gen_ai.provider.name"] == "dashscope"
        assert attributes["gen_ai.response.id"] == "req-ds-1"
        assert (
            attributes["gen_ai.usage.input_tokens"],
            attributes["gen_ai.usage.output_tokens"],
        ) == (7, 3)
        assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    Generation.call(model="qwen-plus", messages=MESSAGES)
    assert len(spans(exporter)) == 2  # untraced


def test_errors_set_status_once_and_never_leak_the_key(llm, traced):
    provider, exporter = traced
    client = trace_client(
        openai.OpenAI(base_url=llm.base_url, api_key="sk-LEAKME-123"), tracer_provider=provider
    )
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="reject-key", messages=MESSAGES)
    (span,) = spans(exporter)
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]
    dumped = span.to_json()
    assert "sk-LEAKME-123" not in dumped
    assert "***" in dumped


def test_unknown_client_shape_warns_once_and_passes_through(caplog):
    # As the SDK: tracing never breaks the code it observes; one warning per type.
    class Unknown:
        pass

    first, second = Unknown(), Unknown()
    with caplog.at_level(logging.WARNING):
        assert trace_client(first) is first
        assert trace_client(second) is second
    warned = [r for r in caplog.records if "not a client it knows" in r.getMessage()]
    assert len(warned) == 1 and "Unknown" in warned[0].getMessage()


def test_tracing_off_passes_through(llm):
    client = openai.OpenAI(base_url=llm.base_url, api_key="sk-x")
    original = client.chat.completions.create
    trace_client(client)  # no tracer provider installed in this process
    result = client.chat.completions.create(model="m", messages=MESSAGES)
    assert isinstance(result, openai.types.chat.ChatCompletion)
    assert client.chat.completions.create.__rl_traced__ == original


def test_observe_llm_keyword_positional_and_async(traced):
    provider, exporter = traced

    @observe_llm(tracer_provider=provider)
    def ask(model: str, messages: list, temperature: float = 1.0) -> str:
        return "42"

    @observe_llm(tracer_provider=provider)
    async def ask_async(*, model: str, messages: list) -> dict:
        return {
            "id": "r1",
            "model": model,
            "usage": {"prompt_tokens": 5, "completion_tokens": 1},
            "choices": [
                {"message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}
            ],
        }

    assert ask(model="mine", messages=MESSAGES, temperature=0.1) == "42"
    assert ask("mine", MESSAGES) == "42"
    assert asyncio.run(ask_async(model="mine", messages=MESSAGES))["id"] == "r1"
    names = [s.name for s in spans(exporter)]
    assert names == ["chat mine"] * 3
    assert spans(exporter)[0].attributes["gen_ai.request.temperature"] == 0.1
    assert spans(exporter)[2].attributes["gen_ai.usage.input_tokens"] == 5

    with pytest.raises(TypeError, match="no 'model' parameter"):

        @observe_llm
        def no_model(prompt: str) -> str:
            return prompt


def make_tools() -> tuple:
    """Fresh tools per test: a traced tool stays traced with the provider it was given."""

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two numbers."""
        return a * b

    return add, multiply


def tool_spans(exporter: InMemorySpanExporter) -> list:
    return [s for s in spans(exporter) if s.name.startswith("execute_tool")]


def test_langchain_tools_single_list_and_dict(traced):
    provider, exporter = traced
    add, multiply = make_tools()
    assert trace_tool(add, tracer_provider=provider) is add
    assert add.invoke({"a": 2, "b": 3}) == 5
    tools = [multiply]
    assert trace_tool(tools, tracer_provider=provider) is tools
    assert trace_tool({"add": add}, tracer_provider=provider)["add"] is add  # twice: once
    result = multiply.invoke(
        {"type": "tool_call", "id": "call-7", "name": "multiply", "args": {"a": 6, "b": 7}}
    )
    assert result.content == "42"
    first, second = tool_spans(exporter)
    assert first.name == "execute_tool add" and first.kind is SpanKind.INTERNAL
    assert first.attributes["gen_ai.tool.name"] == "add"
    assert second.attributes["gen_ai.tool.call.id"] == "call-7"
    assert len(tool_spans(exporter)) == 2


def test_langgraph_tool_node(traced):
    provider, exporter = traced
    add, _ = make_tools()
    node = trace_tool(ToolNode([add]), tracer_provider=provider)
    graph = StateGraph(MessagesState)
    graph.add_node("tools", node)
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    call = {"name": "add", "args": {"a": 1, "b": 2}, "id": "call-node", "type": "tool_call"}
    result = graph.compile().invoke({"messages": [AIMessage(content="", tool_calls=[call])]})
    assert result["messages"][-1].content == "3"
    (span,) = tool_spans(exporter)
    assert span.attributes["gen_ai.tool.call.id"] == "call-node"


def test_mcp_tools_record_their_provider(traced):
    from langchain_mcp_adapters.tools import load_mcp_tools
    from mcp.server.fastmcp import FastMCP
    from mcp.shared.memory import create_connected_server_and_client_session

    provider, exporter = traced
    server = FastMCP("calc")

    @server.tool()
    def subtract(a: int, b: int) -> int:
        """Subtract b from a."""
        return a - b

    async def run() -> object:
        async with create_connected_server_and_client_session(server._mcp_server) as session:
            tools = trace_tool(await load_mcp_tools(session), tracer_provider=provider)
            return await tools[0].ainvoke(
                {"type": "tool_call", "id": "mcp-1", "name": "subtract", "args": {"a": 5, "b": 2}}
            )

    assert "3" in str(asyncio.run(run()).content)
    (span,) = tool_spans(exporter)
    assert span.name == "execute_tool subtract"
    assert span.attributes["gen_ai.provider.name"] == "mcp"
    assert span.attributes["gen_ai.tool.call.id"] == "mcp-1"


def test_observe_tool_and_tool_errors(traced):
    provider, exporter = traced

    @observe_tool(tracer_provider=provider)
    def lookup(key: str) -> str:
        if key == "missing":
            raise KeyError(key)
        return key.upper()

    @observe_tool(tracer_provider=provider, name="fetch")
    async def fetch_async(url: str) -> str:
        return url

    assert lookup("a") == "A"
    assert asyncio.run(fetch_async("u")) == "u"
    with pytest.raises(KeyError):
        lookup("missing")
    ok, fetched, failed = tool_spans(exporter)
    assert (ok.name, fetched.name, failed.name) == (
        "execute_tool lookup",
        "execute_tool fetch",
        "execute_tool lookup",
    )
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]


def test_trace_tool_passes_what_is_not_a_tool_through_with_a_warning(traced, caplog):
    # as the SDK does: a warning, once per type, and the object back untouched
    provider, exporter = traced

    def plain(x: int) -> int:
        return x

    assert trace_tool(plain, tracer_provider=provider) is plain
    assert trace_tool([plain, plain], tracer_provider=provider)[0] is plain
    warnings = [r for r in caplog.records if "is not a tool" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    assert plain(3) == 3 and tool_spans(exporter) == []


def test_the_sdks_keyword_arguments_for_tools(traced):
    provider, exporter = traced
    add, _ = make_tools()
    trace_tool([add], provider="my-plugin", tracer_provider=provider)
    add.invoke({"a": 1, "b": 2})

    own = ExtendedTelemetryHandler(tracer_provider=provider)
    calls = []
    original_start = own.start_execute_tool
    own.start_execute_tool = lambda inv: (calls.append(inv.tool_name), original_start(inv))[1]

    @observe_tool(provider="search-api", handler=own, tracer_provider=provider)
    def search(query: str) -> str:
        return query

    assert search("q") == "q"
    traced_add, searched = tool_spans(exporter)
    assert traced_add.attributes["gen_ai.provider.name"] == "my-plugin"
    assert searched.attributes["gen_ai.provider.name"] == "search-api"
    assert calls == ["search"]  # recorded through the handler given


def test_the_sdks_keyword_arguments_for_observe_llm(traced):
    provider, exporter = traced
    own = ExtendedTelemetryHandler(tracer_provider=provider)
    seen = []
    original_stop = own.stop_llm
    own.stop_llm = lambda inv: (seen.append(inv.request_model), original_stop(inv))[1]

    def mapper(invocation, result) -> None:
        invocation.response_model_name = result["served_by"]
        invocation.input_tokens = result["tokens"]

    @observe_llm(
        request_model_arg="engine",
        messages_arg="history",
        prompt_arg="text",
        result_mapper=mapper,
        handler=own,
        tracer_provider=provider,
    )
    def complete(engine: str, history: list | None = None, text: str | None = None) -> dict:
        return {"served_by": engine + "-v2", "tokens": 7}

    assert complete("qwen", text="hi") == {"served_by": "qwen-v2", "tokens": 7}
    assert complete(engine="qwen", history=MESSAGES)["tokens"] == 7
    first, _ = spans(exporter)
    assert first.name == "chat qwen" and seen == ["qwen", "qwen"]
    assert first.attributes["gen_ai.response.model"] == "qwen-v2"
    assert first.attributes["gen_ai.usage.input_tokens"] == 7

    with pytest.raises(TypeError, match="no 'engine' parameter"):

        @observe_llm(request_model_arg="engine")
        def no_engine(model: str) -> str:
            return model


def test_processor_span_kind_comes_from_the_processor(traced):
    provider, exporter = traced

    class Scorer(AbstractRewardProcessor):
        @observe_processor(tracer_provider=provider)
        def process(self, input_data):  # type: ignore[no-untyped-def]
            return RewardOutput(reward=Reward(reward_score=1.0))

    Scorer().process({"agent_output": {}})
    (span,) = spans(exporter)
    assert span.name == "reward Scorer"  # the type from the processor's base
    assert span.kind is SpanKind.SERVER
    assert span.status.status_code is StatusCode.UNSET


@pytest.fixture
def capture_on(monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    monkeypatch.setenv("AGENTIC_RL_CAPTURE_MAX_CHARS", "300")
    capture_enabled.cache_clear()  # the switch is read once, as OpenTelemetry reads its env
    yield
    monkeypatch.undo()
    capture_enabled.cache_clear()


def test_content_is_captured_only_when_asked_capped_and_redacted(llm, traced, capture_on):
    provider, exporter = traced
    client = trace_client(
        openai.OpenAI(base_url=llm.base_url, api_key="sk-x"), tracer_provider=provider
    )
    long = [{"role": "user", "content": "1 + 1 " + "x" * 5000}]
    client.chat.completions.create(model="m", messages=long)
    (span,) = spans(exporter)
    captured = span.attributes["gen_ai.input.messages"]
    assert len(captured) <= 300 + len("...[truncated]")
    assert captured.endswith("...[truncated]")
    assert "gen_ai.output.messages" in span.attributes


def test_capture_redacts_fail_closed():
    token = request_secrets.set(("sk-request-key",))
    try:
        text = capture(
            {
                "api_key": "a",
                "Authorization": ["Bearer b"],
                "nested": {"access_token": {"deep": "c"}},
                "password": 12345,
                "model_resource": {"api_key": SecretStr("d")},
                "secret": SecretStr("e"),
                "note": "my key is sk-request-key",
                "max_tokens": 10,
                "opaque": object(),
            }
        )
    finally:
        request_secrets.reset(token)
    assert json.loads(text)["max_tokens"] == 10
    for leaked in ('"a"', "Bearer b", '"c"', "12345", '"d"', '"e"', "sk-request-key"):
        assert leaked not in text, leaked
    assert json.loads(text)["opaque"] == "<object>"


def test_capture_never_cuts_a_secret_in_half():
    secret = "sk-" + "q" * 100  # longer than any fixed slack
    token = request_secrets.set((secret,))
    try:
        for budget in range(64, 200):
            text = capture({"note": "x" * 60 + secret + "y" * 60}, limit=budget)
            assert "sk-qq" not in text, budget
    finally:
        request_secrets.reset(token)


def test_the_runtime_leaves_observe_processor_as_it_found_it(tmp_path):
    # While the runtime's tracing runs, it opens every processor span itself; once it is
    # shut down, @observe_processor with a provider of one's own opens them again.
    import os
    import subprocess
    import sys

    script = tmp_path / "library.py"
    script.write_text(
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import "
        "InMemorySpanExporter\n"
        "from processors_base import AbstractRewardProcessor, Reward, RewardOutput, "
        "observe_processor\n"
        "from runtime.tracing.spans import Tracing\n"
        "exporter = InMemorySpanExporter()\n"
        "provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "class Scorer(AbstractRewardProcessor):\n"
        "    @observe_processor(tracer_provider=provider)\n"
        "    def process(self, input_data):\n"
        "        return RewardOutput(reward=Reward(reward_score=1.0))\n"
        "if __name__ == '__main__':\n"
        "    tracing = Tracing('reward', 'Served')\n"
        "    Scorer().process({'agent_output': {}})\n"
        "    print(len(exporter.get_finished_spans()))\n"
        "    tracing.shutdown()\n"
        "    Scorer().process({'agent_output': {}})\n"
        "    print([span.name for span in exporter.get_finished_spans()])\n"
    )
    root = ROOT
    done = subprocess.run(
        [sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(root),
             "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["0", "['reward Scorer']"]
