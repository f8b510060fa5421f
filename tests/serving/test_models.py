"""The wire models: the platform's JSON round-trips, extras are kept, secrets stay secret."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from processors_base import (
    AgentOutput,
    FunctionType,
    GroupRewardInput,
    GroupRewardOutput,
    ModelProtocol,
    ModelResource,
    Resource,
    RewardInput,
    RewardOutput,
    RolloutInput,
    RolloutOutput,
    Task,
    TaskStatus,
)

ROLLOUT = {
    "messages": [{"role": "user", "content": "2+2?"}],
    "model_resource": {"model_name": "qwen", "base_url": "http://llm/v1", "api_key": "sk-live-abc"},
    "request_metadata": {"job_id": "j", "sample_id": "s", "rollout_id": "r", "attempt_id": "a"},
}


def test_enums_are_strings():
    assert [t.value for t in TaskStatus] == ["success", "failed"]
    assert [p.value for p in ModelProtocol] == ["openai", "anthropic", "dashscope"]
    assert [f.value for f in FunctionType] == ["rollout", "reward", "group_reward"]
    assert TaskStatus.FAILED == "failed" and str(FunctionType.GROUP_REWARD) == "group_reward"


def test_rollout_input_defaults_and_round_trip():
    parsed = RolloutInput.model_validate(ROLLOUT)
    assert parsed.func_type is FunctionType.ROLLOUT
    assert parsed.tools is None and parsed.ground_truth is None and parsed.sampling_params is None
    assert parsed.request_metadata.rollout_id == "r"
    again = RolloutInput.model_validate(parsed.model_dump(mode="python"))
    assert again == parsed


def test_api_key_is_secret_everywhere_but_get_secret_value():
    parsed = RolloutInput.model_validate(ROLLOUT)
    assert parsed.model_resource.api_key.get_secret_value() == "sk-live-abc"
    assert "sk-live-abc" not in repr(parsed)
    assert "sk-live-abc" not in str(parsed)
    assert "sk-live-abc" not in parsed.model_dump_json()
    with pytest.raises(ValidationError) as caught:
        ModelResource.model_validate({"api_key": "sk-live-abc"})
    assert "sk-live-abc" not in str(caught.value.errors(include_input=False))


def test_extra_fields_are_kept_and_reachable():
    parsed = RewardInput.model_validate(
        {"agent_output": {"messages": [], "trajectory_id": 7}, "priority": "high"}
    )
    assert parsed.priority == "high"
    assert parsed.agent_output.trajectory_id == 7
    assert parsed.model_dump()["priority"] == "high"
    out = RewardOutput.model_validate({"reward": {"reward_score": 1, "judge": "v2"}, "latency": 3})
    assert out.reward.judge == "v2" and out.model_dump()["latency"] == 3


def test_output_defaults_and_error_code_coercion():
    out = RolloutOutput()
    assert out.model_dump() == {
        "agent_output": None,
        "status": TaskStatus.SUCCESS,
        "error": None,
        "error_code": None,
    }
    assert RolloutOutput(error_code=404).error_code == "404"
    assert RewardOutput(reward={"reward_score": 1}, error_code="E1").error_code == "E1"
    with pytest.raises(ValidationError):
        RewardOutput()  # reward is required
    assert (
        GroupRewardOutput(reward={"rewards": [{"reward_score": 0.5}]})
        .reward.rewards[0]
        .reward_score
        == 0.5
    )


def test_agent_output_defaults():
    agent = AgentOutput()
    assert agent.rollout_metrics == {} and agent.messages is None and agent.reward_score is None
    assert AgentOutput().rollout_metrics is not agent.rollout_metrics  # no shared default
    with pytest.raises(ValidationError):
        AgentOutput(rollout_metrics={"turns": "many"})


def test_group_reward_input_requires_outputs():
    with pytest.raises(ValidationError):
        GroupRewardInput.model_validate({})
    assert GroupRewardInput(agent_outputs=[{}]).func_type is FunctionType.GROUP_REWARD


def test_task_and_resource():
    task = Task(prompt="hi")
    assert task.rollout_id.startswith("ro-") and len(task.rollout_id) == 15
    assert Task(prompt="hi").rollout_id != task.rollout_id
    resource = Resource(model_name="m", base_url="u", api_key="k")
    assert (resource.protocol, resource.max_tokens, resource.max_turns, resource.timeout) == (
        ModelProtocol.OPENAI,
        2048,
        25,
        60.0,
    )
    with pytest.raises(ValidationError):
        Resource(model_name="m", base_url="u", api_key="k", max_turns=0)
