"""Reward processors for the trainer-protocol tests: what they saw, and how they fail."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path

from pydantic import model_validator

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    reward_func,
    sub_reward_func,
)


def _answer(input_data: RewardInput) -> str:
    messages = input_data.agent_output.messages or []
    assistant = [m for m in messages if m.get("role") == "assistant" and m.get("content")]
    return str(assistant[-1]["content"]).strip() if assistant else ""


class MatchReward(AbstractRewardProcessor):
    """1.0 when the last assistant text equals the ground truth. ``RAISE`` raises, ``HANG``
    never returns, and ``PAIR`` waits for a second ``PAIR`` to run at the same time (so a
    batch run one sample after the other would hang). The metrics say what it was given."""

    def setup(self) -> None:
        self.pairs = 0
        self.paired = asyncio.Event()

    async def process(self, input_data: RewardInput) -> RewardOutput:
        answer = _answer(input_data)
        if answer == "RAISE":
            raise ValueError("the judge broke")
        if answer == "HANG":
            await asyncio.sleep(3600)
        if answer == "PAIR":
            self.pairs += 1
            if self.pairs % 2 == 0:
                self.paired.set()
            await self.paired.wait()
        if answer.startswith("STUBBORN"):  # swallows every cancellation for a while
            end = time.monotonic() + float(answer.split()[-1])
            while time.monotonic() < end:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.05)
        odd = _odd_output(answer)
        if odd is not None:
            return odd
        messages = input_data.agent_output.messages or []
        extra = input_data.agent_output.rollout_extra or {}
        metrics = {
            "messages": float(len(messages)),
            "user_turns": float(sum(m.get("role") == "user" for m in messages)),
            "tool_turns": float(sum(m.get("role") == "tool" for m in messages)),
            "answer_chars": float(len(answer)),
            "has_tools": 1.0 if extra.get("tools") else 0.0,
        }
        score = 1.0 if answer == str(input_data.ground_truth).strip() else 0.0
        return RewardOutput(reward=Reward(reward_score=score, reward_metrics=metrics))


class SyncHangReward(AbstractRewardProcessor):
    """Sync code that hangs on ``HANG``: only --isolation process can kill it."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        if _answer(input_data) == "HANG":
            time.sleep(3600)
        return RewardOutput(reward=Reward(reward_score=1.0))


class PidReward(AbstractRewardProcessor):
    """Says which process answered and how many times setup() ran in it."""

    setups = 0

    def setup(self) -> None:
        PidReward.setups += 1

    async def process(self, input_data: RewardInput) -> RewardOutput:
        metrics = {"pid": float(os.getpid()), "setups": float(PidReward.setups)}
        return RewardOutput(reward=Reward(reward_score=1.0, reward_metrics=metrics))


def _odd_output(answer: str) -> RewardOutput | None:
    """Outputs /api/v1 refuses (``NAN``, ``NONE``, ``TEXT``) or that say they failed."""
    if answer == "NAN":
        return RewardOutput(reward=Reward(reward_score=1.0, reward_metrics={"m": float("nan")}))
    if answer == "NONE":
        return RewardOutput.model_construct(reward=None)
    if answer == "TEXT":
        return RewardOutput(reward=Reward.model_construct(reward_score="high"))
    if answer == "FAILEDSCORE":
        return RewardOutput(
            reward=Reward(reward_score=0.9), status=TaskStatus.FAILED, error="judge unsure"
        )
    if answer == "FAILEDMETRIC":  # failed, with a "score" metric OpenRLHF would read
        return RewardOutput(
            reward=Reward(reward_score=1.0, reward_metrics={"score": 1.0}),
            status=TaskStatus.FAILED,
            error="judge unsure",
        )
    return None


class KeysReward(AbstractRewardProcessor):
    """One metric, named after the answer: every answer brings a new key."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(
            reward=Reward(reward_score=1.0, reward_metrics={_answer(input_data): 1.0})
        )


@reward_func("judged")
class JudgedReward(AbstractRewardProcessor):
    """Two sub-rewards: their names are known before any answer."""

    @sub_reward_func("format", sub_weight=0.5)
    def format(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=1.0))

    @sub_reward_func("answer", sub_weight=0.5)
    def answer(self, input_data: RewardInput) -> RewardOutput:
        if _answer(input_data) == "RAISE":
            raise ValueError("the judge broke")
        return RewardOutput(reward=Reward(reward_score=1.0))


class PidHangReward(AbstractRewardProcessor):
    """Sync: ``HANG`` holds its thread for good; anything else says which process answered."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        if _answer(input_data) == "HANG":
            time.sleep(3600)
        return RewardOutput(reward=Reward(reward_score=1.0, reward_metrics={"pid": os.getpid()}))


class SlowSetupReward(AbstractRewardProcessor):
    """setup() takes a minute: the function is still deploying long after it listens."""

    def setup(self) -> None:
        time.sleep(60)

    async def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=1.0))


class PausingInput(RewardInput):
    """Validation of the sample whose ground truth is ``PAUSE`` blocks (sync, as a custom
    validator may) until ``$PAUSE_DIR/release`` exists, after creating ``$PAUSE_DIR/paused``."""

    @model_validator(mode="after")
    def _pause(self) -> PausingInput:
        if self.ground_truth == "PAUSE":
            folder = Path(os.environ["PAUSE_DIR"])
            (folder / "paused").touch()
            deadline = time.monotonic() + 60  # never hang a test run for good
            while not (folder / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return self


class PausingReward(AbstractRewardProcessor):
    """1.0 for every sample; its input model pauses on ``PAUSE`` (see PausingInput)."""

    input_model = PausingInput

    async def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=1.0))


@reward_func("style_judged")
class StyleJudgedReward(AbstractRewardProcessor):
    """``correct`` (0.8) matches the ground truth; ``style`` (0.2), an LLM judge, times out
    on an answer ending in ``TIMEOUT``; ``BOTH`` fails both."""

    @sub_reward_func("correct", sub_weight=0.8)
    def correct(self, input_data: RewardInput) -> RewardOutput:
        answer = _answer(input_data)
        if answer == "BOTH":
            raise ConnectionError("the checker is down")
        truth = str(input_data.ground_truth)
        score = 1.0 if answer.removesuffix("TIMEOUT").strip() == truth else 0.0
        return RewardOutput(reward=Reward(reward_score=score))

    @sub_reward_func("style", sub_weight=0.2)
    async def style(self, input_data: RewardInput) -> RewardOutput:
        if _answer(input_data).endswith(("TIMEOUT", "BOTH")):
            raise TimeoutError("the judge timed out")
        return RewardOutput(reward=Reward(reward_score=0.5))


class PromptKindReward(AbstractRewardProcessor):
    """What the prompt asks: ``raise`` raises, ``hang`` never returns, ``failed`` answers a
    failed result; any other prompt scores the completion (its length, in tenths, at most
    1.0). Each call is written, as the server saw it, to the JSON-lines file
    ``$SCORES_FILE`` before it is answered, so a test can set what a trainer logged beside
    what the server scored."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        messages = input_data.agent_output.messages or []
        prompt = next((str(m["content"]) for m in messages if m.get("role") == "user"), "")
        completion = next(str(m["content"]) for m in messages if m.get("role") == "assistant")
        kind = prompt if prompt in ("raise", "hang", "failed") else "score"
        score = min(1.0, len(completion) / 10)
        seen = {"prompt": prompt, "completion": completion, "kind": kind, "score": score}
        with open(os.environ["SCORES_FILE"], "a", encoding="utf-8") as scores:
            scores.write(json.dumps(seen) + "\n")
        if kind == "raise":
            raise ValueError("the judge broke")
        if kind == "hang":
            await asyncio.sleep(3600)
        if kind == "failed":
            return RewardOutput(
                reward=Reward(reward_score=score), status=TaskStatus.FAILED, error="unsure"
            )
        return RewardOutput(reward=Reward(reward_score=score))
