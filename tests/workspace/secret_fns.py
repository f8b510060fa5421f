"""Processors for the tests of secrets and of failures of user code
(tests/serving/test_secrets.py)."""

from __future__ import annotations

import base64
import logging
from urllib.parse import quote, quote_plus

import httpx

from processors_base import AbstractRewardProcessor, AbstractRolloutProcessor
from processors_base.models import (
    AgentOutput,
    Reward,
    RewardInput,
    RewardOutput,
    RolloutInput,
    RolloutOutput,
)

user_log = logging.getLogger("my_functions")


class KeyInUrlRollout(AbstractRolloutProcessor):
    """Calls its endpoint with the api_key in the query string, as many APIs want, and
    raise_for_status()es; also logs the key in other encodings through its own logger."""

    def process(self, input_data: RolloutInput) -> RolloutOutput:
        resource = input_data.model_resource
        key = resource.api_key.get_secret_value()
        extra = input_data.rollout_extra or {}
        if extra.get("log"):
            user_log.warning("plus-quoted %s", quote_plus(key))
            user_log.warning("basic %s", base64.b64encode(f"alice:{key}".encode()).decode())
            user_log.warning("headers %s", {"Authorization": "Bearer tok-0123456789abcdef"})
            user_log.warning("dsn %s", "postgres://alice:hunter2@db.internal/rl")
        response = httpx.get(f"{resource.base_url}/check?key={quote(key, safe='')}")
        response.raise_for_status()
        return RolloutOutput(agent_output=AgentOutput(messages=input_data.messages))


def _score(answer: str) -> float:
    return 1.0 / int(answer)  # ZeroDivisionError for "0": a line of user code to point at


class FailingReward(AbstractRewardProcessor):
    """Raises from a helper two frames below process()."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        messages = input_data.agent_output.messages or [{}]
        score = _score(str(messages[-1].get("content", "0")))
        return RewardOutput(reward=Reward(reward_score=score))
