"""Demo reward: 1.0 when the final answer of the last assistant message matches ground_truth."""

from __future__ import annotations

import math
import re
from typing import Any

from processors_base import AbstractRewardProcessor, Reward, RewardInput, RewardOutput

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_MARKED = re.compile(r"(?:final answer|answer)\s*(?:is)?\s*[:=]?\s*(.+)", re.IGNORECASE)
_HASHES = re.compile(r"####\s*(.+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def last_assistant_text(messages: list[dict[str, Any]] | None) -> str:
    for message in reversed(messages or []):
        if message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):  # content parts: keep the text ones
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content if isinstance(content, str) else ""
    return ""


def extract_answer(text: str) -> str | None:
    """The final answer: \\boxed{..}, '#### ..', 'answer: ..', else the last number."""
    for pattern in (_BOXED, _HASHES, _MARKED):
        found = pattern.findall(text)
        if found:
            return found[-1].strip().rstrip(".")
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def as_number(text: Any) -> float | None:
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text)
    if not isinstance(text, str):
        return None
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip("%").strip()
    try:
        return float(cleaned)
    except ValueError:
        return None


def answers_match(answer: str, ground_truth: Any) -> bool:
    a, b = as_number(answer), as_number(ground_truth)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    return " ".join(answer.split()).lower() == " ".join(str(ground_truth).split()).lower()


def score(messages: list[dict[str, Any]] | None, ground_truth: Any) -> tuple[float, bool]:
    answer = extract_answer(last_assistant_text(messages))
    if answer is None or ground_truth is None:
        return 0.0, answer is not None
    return (1.0 if answers_match(answer, ground_truth) else 0.0), True


class DemoRewardProcessor(AbstractRewardProcessor):
    # Cheap, non-blocking work: ``async def`` keeps it on the event loop. Blocking work
    # (a sandbox call, a slow sympy check) belongs in a plain ``def``: it then runs in
    # the runtime's thread pool and never stalls other requests.
    async def process(self, input_data: RewardInput) -> RewardOutput:
        value, found = score(input_data.agent_output.messages, input_data.ground_truth)
        return RewardOutput(
            reward=Reward(reward_score=value, reward_metrics={"answer_found": float(found)})
        )
