"""Demo rollout: a bounded multi-turn agent loop with a calculator tool.

It talks to the OpenAI-compatible endpoint named in the request's model_resource and
returns the whole conversation as the trajectory.
"""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

from openai import AsyncOpenAI

from processors_base import (
    AbstractRolloutProcessor,
    AgentOutput,
    RolloutInput,
    RolloutOutput,
    TaskStatus,
    trace_client,
    trace_tool,
)

DEFAULT_MAX_TURNS = 5

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+ - * / ** and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Mod: operator.mod,
    ast.FloorDiv: operator.floordiv,
}


def calculate(expression: str) -> str:
    """Arithmetic only: no names, no calls, and small exponents."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported expression: {ast.dump(node)[:40]}")

    try:
        value = walk(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


class CalculatorTool:
    """A tool object in LangChain's shape (a name and ``invoke``), so trace_tool traces it."""

    name = "calculator"
    description = CALCULATOR_TOOL["function"]["description"]

    def invoke(self, tool_input: dict[str, Any]) -> str:
        # a ToolCall ({"type": "tool_call", "id", "args"}) or the arguments themselves
        arguments = tool_input.get("args", tool_input)
        return calculate(str(arguments.get("expression", "")))


class DemoRolloutProcessor(AbstractRolloutProcessor):
    def setup(self) -> None:
        # One client per endpoint, reused across requests (connection pooling).
        self._clients: dict[tuple[str, str], AsyncOpenAI] = {}
        # Traced once here; a span per call whenever tracing is on.
        self._tools = trace_tool({"calculator": CalculatorTool()})

    def _client(self, base_url: str, api_key: str) -> AsyncOpenAI:
        key = (base_url, api_key)
        if key not in self._clients:
            self._clients[key] = trace_client(
                AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=1)
            )
        return self._clients[key]

    async def process(self, input_data: RolloutInput) -> RolloutOutput:
        resource = input_data.model_resource
        client = self._client(resource.base_url, resource.api_key.get_secret_value())
        extra = input_data.rollout_extra or {}
        max_turns = int(extra.get("max_turns", DEFAULT_MAX_TURNS))
        messages: list[dict[str, Any]] = [dict(m) for m in input_data.messages]
        tools = input_data.tools or [CALCULATOR_TOOL]
        metrics = {"turns": 0.0, "tool_calls": 0.0, "prompt_tokens": 0.0, "completion_tokens": 0.0}

        for _ in range(max_turns):
            response = await client.chat.completions.create(
                model=resource.model_name,
                messages=messages,
                tools=tools,
                **(input_data.sampling_params or {}),
            )
            metrics["turns"] += 1
            if response.usage is not None:
                metrics["prompt_tokens"] += response.usage.prompt_tokens
                metrics["completion_tokens"] += response.usage.completion_tokens
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                metrics["tool_calls"] += 1
                tool = self._tools.get(call.function.name)
                try:
                    arguments = json.loads(call.function.arguments)
                    result = (
                        tool.invoke({"type": "tool_call", "id": call.id, "args": arguments})
                        if tool is not None
                        else f"error: unknown tool {call.function.name}"
                    )
                except (json.JSONDecodeError, AttributeError):
                    result = "error: arguments are not a JSON object"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        else:
            return RolloutOutput(
                agent_output=AgentOutput(messages=messages, rollout_metrics=metrics),
                status=TaskStatus.FAILED,
                error=f"no final answer within {max_turns} turns",
                error_code="MAX_TURNS",
            )
        return RolloutOutput(agent_output=AgentOutput(messages=messages, rollout_metrics=metrics))
