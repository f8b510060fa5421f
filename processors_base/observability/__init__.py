"""Tracing instrumentation users put in their functions (OpenTelemetry GenAI spans).

- ``@observe_processor`` on ``process()``: the processor span (the runtime opens one per
  request anyway when tracing is on, so decorating is optional there);
- ``trace_client(client)`` / ``untrace_client(client)``: LLM spans for every chat completion;
- ``@observe_llm``: an LLM span around a function of your own;
- ``trace_tool(tools)``: tool spans for tool objects, lists, dicts, ToolNodes, MCP tools;
- ``@observe_tool``: a tool span around a plain function.

All of them may be applied in ``setup()`` whether or not tracing is on yet; while it is
off they pass calls straight through. Content (messages, arguments, results) is recorded
only when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT asks for it, capped and
with secrets redacted.
"""

from processors_base.observability.llm import observe_llm, trace_client, untrace_client
from processors_base.observability.processor import observe_processor
from processors_base.observability.tools import observe_tool, trace_tool

__all__ = [
    "observe_llm",
    "observe_processor",
    "observe_tool",
    "trace_client",
    "trace_tool",
    "untrace_client",
]
