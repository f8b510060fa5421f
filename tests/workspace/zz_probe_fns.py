"""probe processors (temporary)"""
from __future__ import annotations
import logging
from typing import Any
from processors_base import AbstractRewardProcessor, Reward, RewardInput, RewardOutput
user_log = logging.getLogger("my_functions")
RUN = 1_000_000
def _key(input_data: Any) -> str:
    return (input_data.model_extra or {}).get("model_resource", {}).get("api_key", "")
DENSE = "&key=x" * (RUN // 6)
class SyncRaises(AbstractRewardProcessor):
    def process(self, input_data: RewardInput) -> RewardOutput:
        raise ValueError(f"could not parse (key={_key(input_data)}; " + DENSE + f" {_key(input_data)} tail")
class AsyncRaisesDense(AbstractRewardProcessor):
    async def process(self, input_data: RewardInput) -> RewardOutput:
        raise ValueError(f"could not parse (key={_key(input_data)}; " + DENSE + f" {_key(input_data)} tail")
class SyncLogs(AbstractRewardProcessor):
    def process(self, input_data: RewardInput) -> RewardOutput:
        user_log.info("key=%s; %s; end of sequence %s", _key(input_data), DENSE, _key(input_data))
        return RewardOutput(reward=Reward(reward_score=1.0))
class AsyncLogsExc(AbstractRewardProcessor):
    async def process(self, input_data: RewardInput) -> RewardOutput:
        try:
            raise ValueError(f"key={_key(input_data)} " + DENSE + f" {_key(input_data)} tail")
        except ValueError:
            user_log.exception("failed: %s", "x" * 20000 + _key(input_data))
        return RewardOutput(reward=Reward(reward_score=1.0))
