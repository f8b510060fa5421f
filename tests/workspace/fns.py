"""Processors the tests serve: each exercises one behaviour of the runtime."""

from __future__ import annotations

import asyncio
import gc
import os
import time

from processors_base import (
    AbstractGroupRewardProcessor,
    AbstractRewardProcessor,
    AbstractRolloutProcessor,
    AgentOutput,
    GroupReward,
    GroupRewardOutput,
    Reward,
    RewardInput,
    RewardOutput,
    RolloutInput,
    RolloutOutput,
    TaskStatus,
)

from .markers import mark


def _delay(input_data: RewardInput) -> float:
    return float((input_data.agent_output.rollout_extra or {}).get("sleep", 0))


class EchoReward(AbstractRewardProcessor):
    async def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=len(input_data.agent_output.messages or [])))


class GcReward(AbstractRewardProcessor):
    """Its metrics: whether the table setup() loads (20,000 dicts, as a judge's data would
    be) is out of the cyclic collector's sight, which process answered, and the collector's
    third threshold (full collections)."""

    def setup(self) -> None:
        self.table = [{"row": i} for i in range(20_000)]

    async def process(self, input_data: RewardInput) -> RewardOutput:
        seen = any(o is self.table for o in gc.get_objects())  # frozen ones are not listed
        metrics = {
            "table_frozen": float(not seen),
            "pid": float(os.getpid()),
            "full_after": float(gc.get_threshold()[2]),
        }
        return RewardOutput(reward=Reward(reward_score=1.0, reward_metrics=metrics))


class GcChoosingReward(GcReward):
    """Chooses CPython's own third threshold in setup()."""

    def setup(self) -> None:
        super().setup()
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, 10)


class SyncEchoReward(AbstractRewardProcessor):
    def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=len(input_data.agent_output.messages or [])))


class SleepyReward(AbstractRewardProcessor):
    """Async: sleeps rollout_extra.sleep seconds; marks its start (so a test can wait until
    work is in flight) and its cancellation or end in marker files."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        tag = (input_data.agent_output.rollout_extra or {}).get("tag", "x")
        mark(f"started-{tag}", str(os.getpid()))
        try:
            await asyncio.sleep(_delay(input_data))
        except asyncio.CancelledError:
            mark(f"cancelled-{tag}", "cancelled")
            raise
        mark(f"finished-{tag}", "finished")
        return RewardOutput(reward=Reward(reward_score=1.0))


class SyncSleepyReward(AbstractRewardProcessor):
    """Sync: blocks its worker thread for rollout_extra.sleep seconds."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        time.sleep(_delay(input_data))
        return RewardOutput(reward=Reward(reward_score=1.0))


class RaisingReward(AbstractRewardProcessor):
    def process(self, input_data: RewardInput) -> RewardOutput:
        raise ValueError("boom: the scorer broke")


class WrongOutputReward(AbstractRewardProcessor):
    async def process(self, input_data: RewardInput):  # type: ignore[override]
        kind = (input_data.agent_output.rollout_extra or {}).get("kind")
        if kind == "dict":
            return {"reward": {"reward_score": 0.5}}
        if kind == "bad-dict":
            return {"reward": {"reward_score": "not a number"}}
        return "a string"


class SlowSetupReward(AbstractRewardProcessor):
    def setup(self) -> None:
        time.sleep(float(os.environ.get("TEST_SETUP_SECONDS", "2")))

    async def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=1.0))


class FailingSetupReward(AbstractRewardProcessor):
    async def setup(self) -> None:
        raise RuntimeError("model file weights.bin not found")

    async def process(self, input_data: RewardInput) -> RewardOutput:
        raise AssertionError("never reached")


class ShutdownHookReward(SleepyReward):
    def shutdown(self) -> None:
        mark("shutdown-hook", "ran")


class LeakyRollout(AbstractRolloutProcessor):
    """Fails with a message that contains the request's api_key."""

    async def process(self, input_data: RolloutInput) -> RolloutOutput:
        key = input_data.model_resource.api_key.get_secret_value()
        if (input_data.rollout_extra or {}).get("fail"):
            raise ConnectionError(
                f"could not reach {input_data.model_resource.base_url} with key {key}"
            )
        return RolloutOutput(agent_output=AgentOutput(messages=input_data.messages))


class EchoGroupReward(AbstractGroupRewardProcessor):
    def process(self, input_data):  # type: ignore[no-untyped-def]
        return GroupRewardOutput(
            reward=GroupReward(
                rewards=[Reward(reward_score=i) for i, _ in enumerate(input_data.agent_outputs)]
            )
        )


class NotAProcessor:
    def process(self, input_data):  # type: ignore[no-untyped-def]
        return None


class Abstract(AbstractRewardProcessor):
    pass


class DyingReward(AbstractRewardProcessor):
    """Kills its own worker process when asked to (a segfault stands in the same way)."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        if (input_data.agent_output.rollout_extra or {}).get("die"):
            os._exit(1)
        return RewardOutput(reward=Reward(reward_score=float(os.getpid())))


class HangingReward(AbstractRewardProcessor):
    """Sync code that hangs when asked to (an endless sympy evaluation, a stuck sandbox)."""

    def setup(self) -> None:
        mark(f"setup-{os.getpid()}", "ran")

    def process(self, input_data: RewardInput) -> RewardOutput:
        if (input_data.agent_output.rollout_extra or {}).get("hang"):
            while True:
                time.sleep(0.05)
        return RewardOutput(reward=Reward(reward_score=float(os.getpid())))


class CrashingSetupReward(AbstractRewardProcessor):
    """Its worker dies in setup() (os._exit stands in for an OOM kill); each try leaves a marker."""

    def setup(self) -> None:
        mark(f"crash-setup-{os.getpid()}", "started")
        os._exit(1)

    async def process(self, input_data: RewardInput) -> RewardOutput:
        raise AssertionError("never reached")


class LoopBlockingReward(AbstractRewardProcessor):
    """Async code that blocks its event loop with sync sleep (a common mistake); leaves a marker
    once the loop is blocked, so a test can wait for it instead of sleeping."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        delay = _delay(input_data)
        if delay:
            mark(f"blocking-{os.getpid()}", "blocking")
            time.sleep(delay)
        return RewardOutput(reward=Reward(reward_score=float(os.getpid())))


class OddAttributesReward(AbstractRewardProcessor):
    """Sets values OTLP cannot carry on its request's span and on a span of its own."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        import threading

        from opentelemetry import trace

        span = trace.get_current_span()
        itself: list[object] = []
        itself.append(itself)
        shared = ["before"]
        span.set_attribute("ok", "yes")
        span.set_attribute("status", TaskStatus.SUCCESS)  # a str subclass: marshal fails
        span.set_attribute("lock", threading.Lock())  # cannot be pickled
        span.set_attribute("huge", 2**70)  # outside int64
        span.set_attribute("itself", itself)
        span.set_attribute("shared", shared)
        shared.append("after")  # set before: not what the span says
        with trace.get_tracer("user code").start_as_current_span("judge") as judge:
            judge.set_attribute("ok", "yes")
            judge.set_attribute("status", TaskStatus.FAILED)
            judge.set_attribute("huge", -(2**70))
        return RewardOutput(reward=Reward(reward_score=1.0))


class NeedsTwo(str):
    """A str that pickles but will not unpickle (its constructor wants two arguments)."""

    def __new__(cls, value: str, extra: str) -> NeedsTwo:
        return super().__new__(cls, value)


class CarelessTracingReward(AbstractRewardProcessor):
    """Tracing used as reward code might: numpy values, statuses and keys that are none,
    a context of its own, values and names that cannot travel, odd times and scopes."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        import numpy as np
        from opentelemetry import context, trace
        from opentelemetry.trace import Status

        from processors_base import observe_processor

        class Inner(AbstractRewardProcessor):
            @observe_processor
            async def process(self, input_data: RewardInput) -> RewardOutput:
                return RewardOutput(reward=Reward(reward_score=0.0))

        class Local(str):  # a class made here: it cannot be pickled
            pass

        scores = np.array([0.5, 1.0])
        span = trace.get_current_span()
        span.set_attribute("score", scores.mean())
        span.set_attribute("label", np.str_("gpt-4o"))
        span.set_status("error")  # type: ignore[arg-type]  (not a Status: left out)
        span.set_status(Status("error"))  # type: ignore[arg-type]  (nor is its code)
        span.set_attribute(["k"], 1)  # type: ignore[arg-type]  (a key that is no str)
        tracer = trace.get_tracer("user code")
        with tracer.start_as_current_span("user-np") as user:
            user.set_attribute("score", scores.mean())
            user.set_attribute("two", NeedsTwo("a", "b"))  # as a str
            user.set_status(Status("error"))  # type: ignore[arg-type]
        with tracer.start_as_current_span(Local("unpicklable")):
            pass
        tracer.start_span("negative end").end(end_time=-5)
        trace.get_tracer("versioned", 1.0).start_span("bad scope").end()  # type: ignore[arg-type]
        token = context.attach(context.Context())  # a context without the request's span
        try:
            await Inner().process(input_data)  # no second processor span
        finally:
            context.detach(token)
        return RewardOutput(reward=Reward(reward_score=float(scores.mean())))


class LazyInput(RewardInput):
    judge: JudgeConfig | None = None  # noqa: F821 (a name only setup() defines: incomplete)


class LazyModelReward(AbstractRewardProcessor):
    """An input model completed by setup() (model_rebuild), as one whose types are loaded
    with a model would be."""

    input_model = LazyInput

    def setup(self) -> None:
        from pydantic import BaseModel

        class JudgeConfig(BaseModel):
            model: str = "judge"

        LazyInput.model_rebuild(_types_namespace={"JudgeConfig": JudgeConfig})

    async def process(self, input_data: LazyInput) -> RewardOutput:  # type: ignore[override]
        judge = input_data.judge
        return RewardOutput(reward=Reward(reward_score=1.0 if judge else 0.0))
