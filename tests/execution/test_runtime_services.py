"""The runtime lends user code its services through the context, never the instance: the
offload (where sync sub-rewards run) and the sub-reward error policy reach a processor
whatever its class, one that takes no new attributes included."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    reward_func,
    sub_reward_func,
)
from processors_base.dispatch import runtime_services
from processors_base.models import FunctionType
from processors_base.rewards import SubRewardErrors, errors_for
from runtime.execution.function import Function
from runtime.execution.loading import Target

INPUT = RewardInput(agent_output={"messages": [{"role": "assistant", "content": "42"}]})
ran_on: dict[str, str] = {}  # sub-reward name: the thread it ran on
setup_saw: list[SubRewardErrors] = []


@reward_func("frozen")
class Frozen(AbstractRewardProcessor):
    """Slotted, and refuses every attribute it does not declare (as a frozen class does):
    nothing can be planted on an instance."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: no attribute {name!r}")

    def setup(self) -> None:
        setup_saw.append(errors_for(self))

    @sub_reward_func("format", sub_weight=0.5)
    def format_ok(self, input_data: RewardInput) -> RewardOutput:
        ran_on["format"] = threading.current_thread().name
        return RewardOutput(reward=Reward(reward_score=1.0))

    @sub_reward_func("judge", sub_weight=0.5)
    def judge(self, input_data: RewardInput) -> RewardOutput:
        ran_on["judge"] = threading.current_thread().name
        raise ValueError("the judge said no")


def _function(**options: Any) -> Function:
    target = Target(
        "frozen:Frozen", Frozen, FunctionType.REWARD, RewardInput, RewardOutput, Path.cwd()
    )
    return Function(target, **options)


@pytest.fixture(autouse=True)
def _clean() -> None:
    ran_on.clear()
    setup_saw.clear()


def test_the_instance_takes_no_attribute() -> None:
    with pytest.raises(AttributeError):
        Frozen().anything = 1  # type: ignore[attr-defined]


async def test_sync_sub_rewards_of_a_frozen_class_run_on_the_runtimes_threads() -> None:
    function = _function(threads=2, sub_reward_errors="fail")
    await function.setup()
    try:
        result = await function.call(INPUT)
    finally:
        await function.shutdown()
    # the runtime's own user-code threads (UserThreads names them), not anyio's workers
    assert set(ran_on) == {"format", "judge"}
    assert all(name.startswith("user-code-") for name in ran_on.values()), ran_on
    # --sub-reward-errors fail applies (a default policy would have scored the judge 0)
    assert result.status is TaskStatus.FAILED, result
    assert result.error_code == "SUB_REWARD_ERROR"
    assert "the judge said no" in result.error


async def test_setup_sees_the_runtimes_sub_reward_errors() -> None:
    function = _function(sub_reward_errors="renormalize")
    await function.setup()
    await function.shutdown()
    assert setup_saw == [function.sub_reward_errors]
    assert setup_saw[0].mode == "renormalize"


async def test_the_services_end_with_the_call() -> None:
    function = _function()
    await function.setup()
    await function.call(INPUT)
    await function.shutdown()
    assert runtime_services.get() is None
    # and without a runtime, the processor's own default policy (mode zero)
    assert errors_for(Frozen()).mode == "zero"
