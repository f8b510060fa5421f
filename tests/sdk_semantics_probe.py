"""Observe how ``@reward_func`` processors behave, written only against the SDK's import
paths; prints one JSON object. Run by tests/compat/test_sdk_semantics.py with the real SDK
(``DASHSCOPE_PYTHON``) and with this runtime's alias, so the two can be compared."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

if importlib.util.find_spec("dashscope") is None:  # no SDK here: this runtime's alias
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from runtime.compat.sdk import install

    install()

from dashscope.finetune.reinforcement import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    aggregate_func,
    reward_func,
    sub_reward_func,
)

INPUT = RewardInput(agent_output={"messages": [{"role": "assistant", "content": "42"}]})
seen: dict[str, Any] = {}


def out(score: float) -> RewardOutput:
    return RewardOutput(reward=Reward(reward_score=score))


def score(processor: AbstractRewardProcessor) -> Any:
    try:
        return asyncio.run(processor.process(INPUT)).reward.reward_score
    except Exception:
        return "raised"


# Defined in the reverse of name order: the SDK sums in name order, 0.3 + 0.2 + 0.1.
@reward_func("order")
class Order(AbstractRewardProcessor):
    @sub_reward_func("small", sub_weight=0.1)
    def c_small(self, input_data: RewardInput) -> RewardOutput:
        return out(1.0)

    @sub_reward_func("mid", sub_weight=0.2)
    def b_mid(self, input_data: RewardInput) -> RewardOutput:
        return out(1.0)

    @sub_reward_func("big", sub_weight=0.3)
    async def a_big(self, input_data: RewardInput) -> RewardOutput:
        return out(1.0)


@reward_func("seen_order")
class SeenOrder(Order):
    @aggregate_func
    def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        seen["aggregate_sees"] = list(sub_rewards)
        return out(0.0)


# Subclasses are decorated too: an undecorated one shares its parent's meta under the
# SDK, whose contents then depend on which instances were made before (README).
@reward_func("stricter")
class Stricter(Order):  # an override without the decorator is no sub-reward
    def b_mid(self, input_data: RewardInput) -> RewardOutput:
        return out(0.0)


@reward_func("without_small")
class WithoutSmall(Order):
    c_small = None


@reward_func("twice")
class Twice(AbstractRewardProcessor):
    @sub_reward_func("same", sub_weight=1.0)
    def one(self, input_data: RewardInput) -> RewardOutput:
        return out(1.0)

    @sub_reward_func("other", sub_weight=1.0)
    def other(self, input_data: RewardInput) -> RewardOutput:
        return out(0.0)

    @sub_reward_func("same", sub_weight=10.0)
    def two(self, input_data: RewardInput) -> RewardOutput:
        return out(2.0)


@reward_func("reweighted")
class Reweighted(AbstractRewardProcessor):
    def setup(self) -> None:
        self.reward_meta.sub_functions["fmt"].weight = 2.0

    @sub_reward_func("fmt", sub_weight=0.5)
    def fmt(self, input_data: RewardInput) -> RewardOutput:
        return out(1.0)


@reward_func("failing")
class Failing(AbstractRewardProcessor):
    @sub_reward_func("bad")
    def bad(self, input_data: RewardInput) -> RewardOutput:
        raise RuntimeError("judge down")

    @aggregate_func
    def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        seen["placeholder"] = sub_rewards["bad"].model_dump(mode="json")
        return out(0.0)


@reward_func("forgot")
class Forgot(AbstractRewardProcessor):
    @sub_reward_func("f")
    def f(self, input_data: RewardInput) -> RewardOutput:
        out(1.0)  # no return


@reward_func("executor")
class Executor(AbstractRewardProcessor):
    @sub_reward_func("e", sub_weight=0.5)
    def e(self, input_data: RewardInput) -> RewardOutput:
        return out(1.0)

    @sub_reward_func("through_executor")
    async def through_executor(self, input_data: RewardInput) -> RewardOutput:
        sub = self.reward_meta.sub_functions["e"]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, sub.func, input_data)


class Undecorated(AbstractRewardProcessor):
    def process(self, input_data: RewardInput) -> RewardOutput:
        return out(0.0)


MINIMAL: dict[str, dict[str, Any]] = {  # the least each data model accepts
    "AgentOutput": {},
    "GroupReward": {"rewards": []},
    "GroupRewardInput": {"agent_outputs": []},
    "GroupRewardOutput": {"reward": {"rewards": []}},
    "ModelResource": {"model_name": "m", "base_url": "u", "api_key": "k"},
    "RequestMetadata": {"job_id": "j", "sample_id": "s", "rollout_id": "r", "attempt_id": "a"},
    "Resource": {"model_name": "m", "base_url": "u", "api_key": "k"},
    "Reward": {"reward_score": 0.0},
    "RewardInput": {"agent_output": {}},
    "RewardOutput": {"reward": {"reward_score": 0.0}},
    "RolloutInput": {
        "messages": [],
        "model_resource": {"model_name": "m", "base_url": "u", "api_key": "k"},
    },
    "RolloutOutput": {},
    "Task": {"prompt": "p"},
}


def fields() -> None:
    """Per data model and field: required, default, and whether null is accepted."""
    import dashscope.finetune.reinforcement.component.data as data

    found: dict[str, Any] = {}
    for model_name, minimal in MINIMAL.items():
        model = getattr(data, model_name)
        found[model_name] = {}
        for name, info in model.model_fields.items():
            if name in ("rollout_id",):  # a random id: only whether it has one
                default: Any = "<random>"
            else:
                default = info.get_default(call_default_factory=True)
                default = json.loads(json.dumps(default, default=str))
            try:
                model.model_validate({**minimal, name: None})
                null = True
            except ValueError:
                null = False
            found[model_name][name] = {
                "required": info.is_required(),
                "default": None if info.is_required() else default,
                "null": null,
            }
    print(json.dumps(found, sort_keys=True))


SOURCE = """
from dashscope.finetune.reinforcement import reward_func, sub_reward_func

@reward_func("w")
class W:
    @sub_reward_func("a", 0.25)
    def a(self, x): ...

    @sub_reward_func(name="b", sub_weight=2)
    async def b(self, x): ...
"""


def helpers() -> None:
    """The SDK's constants, utilities and tracing helpers, as code written for it sees them."""
    import dashscope.finetune.reinforcement.common.constants as constants
    from dashscope.finetune.reinforcement.common.utils import deep_mask, extract_reward_weights
    from dashscope.finetune.reinforcement.component.observability import (
        instrument_dashscope_generation_call,
        instrument_openai_chat_completions,
        is_tracing_enabled,
        trace_client,
    )

    class Unknown:
        pass

    class Generation:
        @classmethod
        def call(cls, **kwargs: Any) -> dict:
            return {}

    unknown = Unknown()
    secret = {"api_key": "sk-0123456789", "token": "tok-0123456789", "Password": "hunter2"}
    found: dict[str, Any] = {
        name: getattr(constants, name)
        for name in (
            "ENABLE_TRAJECTORY",
            "FC_ZIP_EXCLUDE_PATTERNS",
            "LOGGER_NAME",
            "DATASETS_FILE_SIZE_WARNING",
            "FC_OSS_FILE_SIZE_WARNING",
            "TUNING_MODE_NAME",
        )
    }
    found["weights_all"] = extract_reward_weights(SOURCE, "")
    found["weights_w"] = extract_reward_weights(SOURCE, "W")
    found["weights_broken"] = extract_reward_weights("class (:", "W")
    masked = deep_mask({**secret, "nested": [secret], "pair": ("a", 1), "set": {1}})
    found["masked"] = {**masked, "pair": list(masked["pair"]), "set": sorted(masked["set"])}
    found["tracing"] = is_tracing_enabled()
    found["trace_client_unknown"] = repr(trace_client(unknown))  # None (SDK) or the object
    found["openai_returns_it"] = (
        instrument_openai_chat_completions(unknown, provider="qwen", handler=None) is unknown
    )
    found["dashscope_returns_it"] = (
        instrument_dashscope_generation_call(Generation, provider="ds", handler=None) is Generation
    )
    print(json.dumps(found, sort_keys=True, default=str))


def main() -> None:
    if sys.argv[1:] == ["fields"]:
        fields()
        return
    if sys.argv[1:] == ["helpers"]:
        helpers()
        return
    reweighted = Reweighted()
    reweighted.setup()
    SeenOrder()
    executor = Executor()
    seen.update(
        order_score=score(Order()),
        order_weights=Order().get_weights(),
        aggregate_sees=(score(SeenOrder()), seen.get("aggregate_sees"))[1],
        stricter=Stricter().get_weights(),
        without_small=WithoutSmall().get_weights(),
        twice=[Twice().get_weights(), score(Twice())],
        reweighted=score(reweighted),
        failing=score(Failing()),
        forgot=score(Forgot()),
        executor=score(executor),
        bound=executor.reward_meta.sub_functions["e"].func.__self__ is executor,
        class_processor_id=Executor.reward_meta.processor_id,
        undecorated_processor_id=Undecorated().reward_meta.processor_id,
    )
    print(json.dumps(seen, sort_keys=True))


if __name__ == "__main__":
    main()
