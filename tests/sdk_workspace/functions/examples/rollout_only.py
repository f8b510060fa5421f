"""A rollout with a tool loop, instrumented with the SDK's keyword arguments: an LLM
function of its own (observe_llm with request_model_arg=, messages_arg=, prompt_arg=,
result_mapper=, handler=), a plain-function tool (observe_tool with provider=, handler=),
a tool object traced with provider= (and an object that is no tool, passed through)."""

import json

from dashscope.finetune.reinforcement import (
    AbstractRolloutProcessor,
    AgentOutput,
    RolloutInput,
    RolloutOutput,
    TaskStatus,
)
from dashscope.finetune.reinforcement.component.observability import (
    is_tracing_enabled,
    observe_llm,
    observe_processor,
    observe_tool,
    rollout_context,
    trace_client,
    trace_tool,
)
from openai import OpenAI


def _record_usage(invocation, completion) -> None:
    invocation.response_model_name = completion.model


@observe_llm(
    provider="openai",
    request_model_arg="model_name",
    messages_arg="history",
    prompt_arg="prompt",
    result_mapper=_record_usage,
    handler=None,
)
def ask(client, model_name: str, history: list, tools: list):
    return client.chat.completions.create(model=model_name, messages=history, tools=tools)


@observe_tool(name="evaluate", provider="local", handler=None)
def evaluate(expression: str) -> str:
    allowed = set("0123456789+-*/. ()")
    if not set(expression) <= allowed:
        raise ValueError(f"not arithmetic: {expression!r}")
    return str(eval(expression))  # checked to be arithmetic above


class Calculator:
    """A tool object in LangChain's shape: a name and invoke."""

    name = "calculator"
    description = "Evaluates an arithmetic expression."

    def invoke(self, tool_input, config=None, **kwargs):
        return evaluate(tool_input["expression"])


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": Calculator.description,
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


class RolloutOnly(AbstractRolloutProcessor):
    def setup(self) -> None:
        self.calculator = Calculator()
        trace_tool([self.calculator], provider="custom")
        trace_tool(print)  # not a tool: the SDK warns and passes it through

    @observe_processor
    def process(self, input_data: RolloutInput) -> RolloutOutput:
        resource = input_data.model_resource
        client = OpenAI(base_url=resource.base_url, api_key=resource.api_key.get_secret_value())
        trace_client(client)
        metadata = input_data.request_metadata
        history = list(input_data.messages)
        turns = 0
        with rollout_context(rollout_id=metadata.rollout_id if metadata else None):
            while turns < 4:
                turns += 1
                reply = ask(client, resource.model_name, history, TOOLS).choices[0].message
                if not reply.tool_calls:
                    history.append({"role": "assistant", "content": reply.content})
                    break
                call = reply.tool_calls[0]
                result = self.calculator.invoke(json.loads(call.function.arguments))
                history.append(reply.model_dump(exclude_none=True))
                history.append({"role": "tool", "tool_call_id": call.id, "content": result})
        # role and content only: tool-call ids are random, and the answer is what counts
        kept = [{"role": m["role"], "content": m.get("content")} for m in history]
        return RolloutOutput(
            agent_output=AgentOutput(
                messages=kept,
                rollout_metrics={"turns": float(turns), "traced": float(is_tracing_enabled())},
            ),
            status=TaskStatus.SUCCESS,
        )
