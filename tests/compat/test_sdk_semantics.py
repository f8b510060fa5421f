"""The reward registry and the data models behave as the SDK's do, observed side by side.

``sdk_semantics_probe.py`` observes a set of ``@reward_func`` processors (and the data
models' fields) through the SDK's import paths. Here it runs under this runtime's alias
and is compared with what the real SDK answers: recorded below, and, where a Python with
the SDK is at hand (``DASHSCOPE_PYTHON``), observed from the SDK itself as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest
from conftest import TESTS
from helpers import SDK_PYTHON, with_sdk

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    reward_func,
    sub_reward_func,
)

PROBE = TESTS / "sdk_semantics_probe.py"

# What the SDK (dashscope 1.x's finetune.reinforcement) answers to the probe.
SDK_REGISTRY = {
    "aggregate_sees": ["big", "mid", "small"],
    "bound": True,
    "class_processor_id": "executor",
    "executor": 1.5,
    "failing": 0.0,
    "forgot": "raised",
    "order_score": 0.6,  # 0.3 + 0.2 + 0.1 in name order; not 0.6000000000000001
    "order_weights": {"big": 0.3, "mid": 0.2, "small": 0.1},
    "placeholder": {
        "error": "judge down",
        "error_code": None,
        "reward": {"reward_metrics": {}, "reward_score": 0.0},
        "status": "failed",
    },
    "reweighted": 2.0,
    "stricter": {"big": 0.3, "small": 0.1},
    "twice": [{"other": 1.0, "same": 10.0}, 20.0],
    "undecorated_processor_id": "default",
    "without_small": {"big": 0.3, "mid": 0.2},
}

# What the SDK's constants, utilities and tracing helpers answer to the probe.
_MASKED = {"Password": "****", "api_key": "sk-0****6789", "token": "tok-0123456789"}
SDK_HELPERS = {
    "DATASETS_FILE_SIZE_WARNING": 1073741824,
    "ENABLE_TRAJECTORY": True,
    "FC_OSS_FILE_SIZE_WARNING": 209715200,
    "FC_ZIP_EXCLUDE_PATTERNS": ".git,.gitignore,.DS_Store,.vscode,.Python,.env,.venv,.idea,"
    "__pycache__,*.swp,*.egg,*.egg-info,*.pyc,*.md,*.log,*.tmp,*.bak,"
    "build,develop-eggs,.eggs,test,tests,tmp,temp,data",
    "LOGGER_NAME": "dashscope.finetune.reinforcement",
    "TUNING_MODE_NAME": "reinforcement",
    "dashscope_returns_it": True,
    "masked": {**_MASKED, "nested": [_MASKED], "pair": ["a", 1], "set": [1]},
    "openai_returns_it": True,
    "weights_all": {},
    "weights_broken": {},
    "weights_w": {"a": 0.25, "b": 2.0},
}

# Fields our outputs carry that the SDK's 1.x models lack (README: error_code is kept).
OURS_ONLY = {("GroupRewardOutput", "error_code")}


def probe(python: str, *args: str, env: dict[str, str] | None = None) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "ENABLE_TRAJECTORY"}
    done = subprocess.run(
        [python, str(PROBE), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={**environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_registry_answers_as_the_sdks() -> None:
    ours = probe(sys.executable)
    for key, expected in SDK_REGISTRY.items():
        assert ours[key] == expected, key
    assert list(ours["order_weights"]) == list(SDK_REGISTRY["order_weights"])  # same order


@with_sdk
def test_the_recorded_answers_are_the_installed_sdks() -> None:
    assert probe(SDK_PYTHON) == SDK_REGISTRY


@with_sdk
def test_every_data_model_field_is_as_optional_as_the_sdks() -> None:
    sdk = probe(SDK_PYTHON, "fields")
    ours = probe(sys.executable, "fields")
    differences = [
        (model, field, sdk[model].get(field), ours[model].get(field))
        for model in sdk
        for field in sorted(set(sdk[model]) | set(ours[model]))
        if sdk[model].get(field) != ours[model].get(field) and (model, field) not in OURS_ONLY
    ]
    assert differences == []


@pytest.mark.parametrize("enabled", ["", "1"])
def test_the_sdks_helpers_answer_as_the_sdks(enabled: str) -> None:
    # trace_client() returns None in the SDK; ours hands back the object (with a warning
    # for one it does not know), which code written for the SDK never reads.
    env = {"ENABLE_TRAJECTORY": enabled} if enabled else {}
    ours = probe(sys.executable, "helpers", env=env)
    assert ours.pop("trace_client_unknown").startswith("<")
    assert ours == {**SDK_HELPERS, "tracing": bool(enabled)}


@with_sdk
@pytest.mark.parametrize("enabled", ["", "1"])
def test_the_recorded_helpers_are_the_installed_sdks(enabled: str) -> None:
    env = {"ENABLE_TRAJECTORY": enabled} if enabled else {}
    sdk = probe(SDK_PYTHON, "helpers", env=env)
    assert sdk.pop("trace_client_unknown") == "None"
    assert sdk == {**SDK_HELPERS, "tracing": bool(enabled)}


def test_the_sdk_servers_own_objects_raise_a_clear_error_when_used() -> None:
    code = (
        "from runtime.compat import sdk as sdk_compat; sdk_compat.install()\n"
        "from dashscope.finetune.reinforcement.component.server import server\n"
        "for use in (lambda: server.executor.submit(print), "
        "lambda: server.func_manager.processor, lambda: server.app.routes):\n"
        "    try:\n"
        "        use()\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, 'runtime serve' in str(exc))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=TESTS.parent
    )
    assert done.stdout.split("\n")[:3] == ["NotProvidedError True"] * 3, done.stderr


def test_null_rollout_metrics_and_a_required_group_reward_list() -> None:
    ours = probe(sys.executable, "fields")
    metrics = ours["AgentOutput"]["rollout_metrics"]
    assert metrics == {"default": {}, "null": True, "required": False}
    assert ours["GroupReward"]["rewards"]["required"] is True


@reward_func("meta")
class Meta(AbstractRewardProcessor):
    @sub_reward_func("fmt", sub_weight=0.5)
    def fmt(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=1.0))


def test_reward_meta_on_the_class_on_instances_and_undecorated() -> None:
    assert Meta.reward_meta.processor_id == "meta"
    assert Meta.reward_meta.sub_functions["fmt"].func is Meta.fmt
    first, second = Meta(), Meta()
    assert first.reward_meta.sub_functions["fmt"].func.__self__ is first
    first.reward_meta.sub_functions["fmt"].weight = 3.0  # in setup(), say
    assert first.get_weights() == {"fmt": 3.0} and second.get_weights() == {"fmt": 0.5}
    inp = RewardInput(agent_output={})
    assert anyio.run(first.process, inp).reward.reward_score == 3.0

    class Plain(AbstractRewardProcessor):
        def process(self, input_data: RewardInput) -> RewardOutput:
            return RewardOutput(reward=Reward(reward_score=0.0))

    assert Plain().reward_meta.processor_id == "default"
    assert Plain().reward_meta.sub_functions == {}
    with pytest.raises(AttributeError, match="not a @reward_func"):
        Plain.reward_meta  # noqa: B018 - as under the SDK: the class has none
