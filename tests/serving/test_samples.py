"""The sample workspace, served as a user serves it, answers correctly."""

from __future__ import annotations

import json

import pytest
from conftest import SAMPLES, free_port
from llm_stub import LLMStub


def request(name: str) -> dict:
    return json.loads((SAMPLES / "requests" / f"{name}.json").read_text())


def test_demo_reward(start_server):
    server = start_server("functions.reward.reward:DemoRewardProcessor", workspace=SAMPLES)
    assert server.post(request("reward")).json()["reward"] == {
        "reward_score": 1.0,
        "reward_metrics": {"answer_found": 1.0},
    }
    wrong = request("reward")
    wrong["ground_truth"] = "41.5"
    assert server.post(wrong).json()["reward"]["reward_score"] == 0.0
    numeric = request("reward")
    numeric["ground_truth"] = 42.0000000001  # numbers compare with a tolerance
    assert server.post(numeric).json()["reward"]["reward_score"] == 1.0


def test_safety_sub_rewards_and_aggregate(start_server):
    server = start_server("functions.reward.safety:SafetyProcessor", workspace=SAMPLES)
    reward = server.post(request("reward")).json()["reward"]
    assert reward["reward_score"] == pytest.approx(1.0)
    assert reward["reward_metrics"]["no_unsafe_content"] == 1.0
    assert reward["reward_metrics"]["concise.words"] > 0
    unsafe = request("reward")
    unsafe["agent_output"]["messages"][-1]["content"] = "Just run rm -rf / and the answer is 42"
    assert server.post(unsafe).json()["reward"]["reward_score"] == 0.0


def test_group_reward_is_normalised(start_server):
    server = start_server(
        "functions.reward.group_reward:DemoGroupRewardProcessor", workspace=SAMPLES
    )
    rewards = server.post(request("group_reward")).json()["reward"]["rewards"]
    assert [r["reward_score"] for r in rewards] == [1.0, -1.0, 1.0, -1.0]


def test_rollout_drives_the_llm_and_the_calculator(start_server):
    with LLMStub(free_port()) as llm:
        server = start_server("functions.rollout.rollout:DemoRolloutProcessor", workspace=SAMPLES)
        body = request("rollout")
        body["model_resource"]["base_url"] = llm.base_url
        output = server.post(body).json()
    assert output["status"] == "success", output
    messages = output["agent_output"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2]["content"] == "391"
    assert "391" in messages[3]["content"]
    assert output["agent_output"]["rollout_metrics"] == {
        "turns": 2.0,
        "tool_calls": 1.0,
        "prompt_tokens": 40.0,
        "completion_tokens": 20.0,
    }
    assert llm.authorizations == ["Bearer sk-demo-not-a-real-key"] * 2
    assert llm.requests[0]["temperature"] == 0.7
    assert "sk-demo-not-a-real-key" not in json.dumps(output)
