"""A reward with an LLM-judge sub-reward that fails: what an operator must see of it."""

from __future__ import annotations

import os

import httpx

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    logger,
    reward_func,
    sub_reward_func,
)
from processors_base.rewards import errors_for


def _answer(input_data: RewardInput) -> str:
    messages = input_data.agent_output.messages or []
    return str(messages[-1].get("content", "")) if messages else ""


@reward_func("http_judge")
class HttpJudge(AbstractRewardProcessor):
    """``judge`` (sync: it runs in a worker thread) asks the URL in ``rollout_extra.judge_url``
    over httpx and fails on its error status; without one it fails on the answer "wrong".
    ``JUDGE_LOG_EVERY`` (env) shortens the window of its failure log lines."""

    def setup(self) -> None:
        if "JUDGE_LOG_EVERY" in os.environ:  # the runtime's limiter, lent to setup() too
            errors_for(self).log_every = float(os.environ["JUDGE_LOG_EVERY"])

    @sub_reward_func("format", sub_weight=0.2)
    def format_ok(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=1.0))

    @sub_reward_func("judge", sub_weight=0.8)
    def judge(self, input_data: RewardInput) -> RewardOutput:
        logger.info("asking the judge")
        url = (input_data.agent_output.rollout_extra or {}).get("judge_url")
        if url:
            httpx.post(url, json={"answer": _answer(input_data)}).raise_for_status()
        elif _answer(input_data) == "wrong":
            raise ValueError("the judge said no")
        return RewardOutput(reward=Reward(reward_score=1.0))


class OwnCodeFailure(AbstractRewardProcessor):
    """Fails its result with an error code of its own, different on every request."""

    def setup(self) -> None:
        self.calls = 0

    async def process(self, input_data: RewardInput) -> RewardOutput:
        self.calls += 1
        return RewardOutput(
            reward=Reward(reward_score=0.0),
            status=TaskStatus.FAILED,
            error="no answer found",
            error_code=f"MY_CODE_{self.calls}",
        )
