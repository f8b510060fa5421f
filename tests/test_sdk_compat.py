"""Functions written for the DashScope SDK serve unchanged, with and without the SDK.

Environment 1 (no ``dashscope`` installed) runs with this interpreter. Environment 2
needs a Python with ``dashscope`` installed: this one if it has it, else the one named
by ``DASHSCOPE_PYTHON`` (``.ci/run`` makes one with ``pip install -e ".[test,sdk]"``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, free_port
from llm_stub import LLMStub

WORKSPACE = TESTS / "sdk_workspace"
HERE_HAS_SDK = importlib.util.find_spec("dashscope") is not None


def _sdk_python() -> str | None:
    if HERE_HAS_SDK:
        return sys.executable
    candidate = os.environ.get("DASHSCOPE_PYTHON")
    if candidate and Path(candidate).exists():
        return candidate
    return None


SDK_PYTHON = _sdk_python()
without_sdk = pytest.mark.skipif(
    HERE_HAS_SDK, reason="dashscope is installed in this interpreter; environment 1 needs it absent"
)
with_sdk = pytest.mark.skipif(
    SDK_PYTHON is None,
    reason="environment 2 needs dashscope: pip install -e '.[test,sdk]' here, "
    "or set DASHSCOPE_PYTHON to a Python that has it (.ci/run does)",
)

REWARD = {
    "func_type": "reward",
    "ground_truth": "42",
    "agent_output": {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}]
    },
}
GROUP = {
    "func_type": "group_reward",
    "agent_outputs": [{"messages": [{"role": "user", "content": "q"}]}, {"messages": [{}, {}]}],
}
SDK_MODULES = {
    "dashscope.finetune.reinforcement": [
        "AbstractRolloutProcessor",
        "AbstractRewardProcessor",
        "AbstractGroupRewardProcessor",
        "RolloutInput",
        "RolloutOutput",
        "RewardInput",
        "RewardOutput",
        "Reward",
        "GroupRewardInput",
        "GroupRewardOutput",
        "GroupReward",
        "AgentOutput",
        "TaskStatus",
        "reward_func",
        "sub_reward_func",
        "aggregate_func",
        "logger",
    ],
    "dashscope.finetune.reinforcement.component.processor": [
        "AbstractRolloutProcessor",
        "AbstractRewardProcessor",
        "AbstractGroupRewardProcessor",
    ],
    "dashscope.finetune.reinforcement.component.processor.abstract_processor": [
        "AbstractProcessor"
    ],
    "dashscope.finetune.reinforcement.component.processor.abstract_rollout_processor": [
        "AbstractRolloutProcessor"
    ],
    "dashscope.finetune.reinforcement.component.processor.abstract_reward_processor": [
        "AbstractRewardProcessor"
    ],
    "dashscope.finetune.reinforcement.component.processor.abstract_group_reward_processor": [
        "AbstractGroupRewardProcessor"
    ],
    "dashscope.finetune.reinforcement.component.data.base_data_model": [
        "BaseDataModel",
        "TaskStatus",
        "ModelProtocol",
        "ModelResource",
        "RequestMetadata",
        "AgentOutput",
        "Task",
        "Resource",
    ],
    "dashscope.finetune.reinforcement.component.data.reward_input": ["RewardInput"],
    "dashscope.finetune.reinforcement.component.data.reward_output": ["Reward", "RewardOutput"],
    "dashscope.finetune.reinforcement.component.data.rollout_input": ["RolloutInput"],
    "dashscope.finetune.reinforcement.component.data.rollout_output": ["RolloutOutput"],
    "dashscope.finetune.reinforcement.component.data.group_reward_input": ["GroupRewardInput"],
    "dashscope.finetune.reinforcement.component.data.group_reward_output": [
        "GroupReward",
        "GroupRewardOutput",
    ],
    "dashscope.finetune.reinforcement.component.func_decorator": [
        "reward_func",
        "sub_reward_func",
        "aggregate_func",
    ],
    "dashscope.finetune.reinforcement.component.observability": [
        "observe_processor",
        "trace_client",
        "trace_tool",
        "observe_llm",
        "observe_tool",
    ],
    "dashscope.finetune.reinforcement.common.log": ["logger"],
}


def python_says(code: str, python: str = sys.executable, cwd: Path = ROOT) -> str:
    done = subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def check_all_functions(start_server, python: str) -> None:
    plain = start_server(
        "functions.plain_reward:ExactMatchReward", workspace=WORKSPACE, python=python
    )
    answer = plain.post(REWARD)
    assert answer.status_code == 200
    assert answer.json() == {
        "reward": {"reward_score": 1.0, "reward_metrics": {"len": 2.0}},
        "status": "success",
        "error": None,
        "error_code": None,
    }
    assert set(plain.client.get("/health").json()) == {"status", "func_type", "processor", "parser"}
    assert plain.post({**REWARD, "ground_truth": "7"}).json()["reward"]["reward_score"] == 0.0

    composite = start_server(
        "functions.composite_reward:CompositeReward", workspace=WORKSPACE, python=python
    )
    reward = composite.post(REWARD).json()["reward"]
    assert reward["reward_score"] == pytest.approx(1.0)
    assert reward["reward_metrics"] == {"has_answer": 1.0, "correct": 1.0}
    wrong = composite.post({**REWARD, "ground_truth": "0"}).json()["reward"]
    assert wrong["reward_score"] == pytest.approx(0.4)

    group = start_server(
        "functions/group_reward.py:RankGroupReward", workspace=WORKSPACE, python=python
    )
    rewards = group.post(GROUP).json()["reward"]["rewards"]
    assert [r["reward_score"] for r in rewards] == [0.0, 1.0]

    with LLMStub(free_port()) as llm:
        rollout = start_server(
            "functions.rollout:OneShotRollout", workspace=WORKSPACE, python=python
        )
        output = rollout.post(
            {
                "func_type": "rollout",
                "messages": [{"role": "user", "content": "no tools, please"}],
                "model_resource": {
                    "model_name": "m",
                    "base_url": llm.base_url,
                    "api_key": "sk-sdk-test",
                },
            }
        ).json()
    assert (
        output["status"] == "success" and output["error"] is None and output["error_code"] is None
    )
    assert output["agent_output"]["rollout_metrics"] == {"turns": 1.0}
    assert len(output["agent_output"]["messages"]) == 2
    assert llm.authorizations == ["Bearer sk-sdk-test"]


# --- environment 1: dashscope not installed ------------------------------------------


@without_sdk
def test_every_sdk_path_resolves_to_ours_only_under_the_runtime():
    code = textwrap.dedent(f"""
        import importlib, importlib.util, json
        import processors_base
        from runtime import sdk_compat

        def state():
            return "importable" if importlib.util.find_spec("dashscope") else "absent"

        before = state()
        assert sdk_compat.install()
        modules = {SDK_MODULES!r}
        missing = [f"{{m}}.{{n}}" for m, names in modules.items() for n in names
                   if not hasattr(importlib.import_module(m), n)]
        r = importlib.import_module("dashscope.finetune.reinforcement")
        same = r.AbstractRewardProcessor is processors_base.AbstractRewardProcessor
        sdk_compat.uninstall()
        print(json.dumps([before, missing, same, state()]))
    """)
    before, missing, same, after = json.loads(python_says(code))
    assert before == "absent"  # nothing was written into site-packages
    assert missing == []
    assert same is True
    assert after == "absent"


def test_a_real_dashscope_is_never_hidden(tmp_path):
    fake = tmp_path / "dashscope"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL = True\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from runtime import sdk_compat\n"
        "installed = sdk_compat.install()\n"
        "import dashscope\n"
        "print(installed, dashscope.REAL)\n"
    )
    assert python_says(code) == "False True"


@without_sdk
def test_sdk_style_workspace_serves_without_the_sdk(start_server):
    check_all_functions(start_server, sys.executable)


@without_sdk
def test_sdk_start_script_environment_starts_the_server(start_server):
    server = start_server(
        "",
        workspace=WORKSPACE,
        ready=False,
        env={
            "FUNC_TYPE": "reward",
            "PROCESSOR_CLASS": "functions.plain_reward.ExactMatchReward",
            "THREAD_POOL_WORKERS": "4",
            "THREAD_POOL_QUEUE": "10",
            "ENABLE_LOGGING": "false",
            "LOG_LEVEL": "INFO",
        },
    )
    server.wait_ready()
    assert server.post(REWARD).json()["reward"]["reward_score"] == 1.0
    output = server.output()
    assert "queue=10 threads=4" in output and "log_level=warning" in output  # config still shown
    assert "ready: ExactMatchReward" not in output  # ENABLE_LOGGING=false hides info lines


@without_sdk
def test_invoke_an_sdk_style_function():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime",
            "invoke",
            "functions.composite_reward.CompositeReward",
            "-i",
            "-",
        ],
        cwd=WORKSPACE,
        input=json.dumps(REWARD).encode(),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reward"]["reward_score"] == pytest.approx(1.0)


# --- environment 2: dashscope installed ----------------------------------------------


@with_sdk
def test_classes_derive_from_the_installed_sdk():
    code = textwrap.dedent("""
        from runtime.loading import load_target
        import dashscope.finetune.reinforcement as r
        t = load_target("functions.composite_reward:CompositeReward", ".")
        real = r.__file__.endswith("dashscope/finetune/reinforcement/__init__.py")
        print(t.func_type.value, t.input_model.__module__,
              issubclass(t.cls, r.AbstractRewardProcessor), real)
    """)
    assert python_says(code, SDK_PYTHON, WORKSPACE) == (
        "reward dashscope.finetune.reinforcement.component.data.reward_input True True"
    )


@with_sdk
def test_sdk_style_workspace_serves_with_the_sdk(start_server):
    check_all_functions(start_server, SDK_PYTHON)
