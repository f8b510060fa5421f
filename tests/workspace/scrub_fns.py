"""Processors for tests/serving/test_redaction.py: user code whose error message, or log line, is a
megabyte of letters (degenerate model output, a protein sequence) next to the request's key."""

from __future__ import annotations

import logging
from typing import Any

from processors_base import AbstractRewardProcessor, Reward, RewardInput, RewardOutput

user_log = logging.getLogger("my_functions")
RUN = 1_000_000  # characters of letters


def _key(input_data: Any) -> str:
    return (input_data.model_extra or {}).get("model_resource", {}).get("api_key", "")


class RaisesOnAHugeAnswer(AbstractRewardProcessor):
    """Raises ValueError naming its key and a megabyte of letters, on the event loop."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        raise ValueError(f"could not parse the answer (key={_key(input_data)}; " + "A" * RUN)


class LogsAHugeSequence(AbstractRewardProcessor):
    """Logs its key and a megabyte of protein sequence on the event loop, then scores 1."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        sequence = ("MKVLAAGIVGLLLAQ" * (RUN // 15 + 1))[:RUN]
        user_log.info("key=%s; sequence=%s; end of sequence", _key(input_data), sequence)
        return RewardOutput(reward=Reward(reward_score=1.0))


class FailsWithTheKeyAtTheCut(AbstractRewardProcessor):
    """Returns a failed output whose error holds its key across character 500 (where the
    request log line cuts a failed result's error) and a password split there too."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        at = int((input_data.model_extra or {}).get("at", 490))
        error = "." * at + _key(input_data) + " postgres://alice:hunter2hunter2@db " + "B" * 600
        return RewardOutput(reward=Reward(reward_score=0.0), status="failed", error=error)


class FailsWithAHugeError(AbstractRewardProcessor):
    """Returns a failed output whose error is a megabyte of query parameters (a model's
    degenerate answer quoted in it) after its key, on the event loop."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        error = f"could not parse the answer (key={_key(input_data)}): " + "&key=x" * (RUN // 6)
        return RewardOutput(reward=Reward(reward_score=0.0), status="failed", error=error)
