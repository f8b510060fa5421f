"""Drives a runtime that serves a reward as a NeMo Gym resources server with NeMo Gym's own
code, in a Python that has nemo-gym (``NEMO_GYM_PYTHON``; run by test_nemo_gym_own_code.py):

- Gym's Environment Server (``environment_servers/single_agent_turn``) runs whole episodes
  against it: seed (it requires the session id back and a session cookie), verify with the
  cookie, close at cleanup; with ``observability_enabled`` every call goes to
  ``/ng-rollout/<id>/...``. Only the agent's answers are canned (the policy's response);
- Gym's ``ServerClient`` posts verify rows as an agent does (``/ng-rollout/<task>-<repeat>/
  verify`` with observability on), and each answer is read as Gym's ``BaseVerifyResponse``;
- the Environment Server's ``/aggregate_metrics`` (forwarded to the runtime, as
  ``ng_collect_rollouts`` calls it at a run's end) next to Gym's own
  ``compute_aggregate_metrics`` on the same verify answers;
- Gym's own session conformance check (``check_resources_session_contract``), through an
  ASGI app that forwards to the runtime.

Usage: ``RUNTIME_PORT=PORT python nemo_gym_driver.py`` (Gym reads the command line as
its own config overrides); prints one JSON object of what it saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import traceback
from typing import Any

import httpx
from environment_servers.single_agent_turn.app import (
    SingleAgentTurnEnvironmentServer,
    SingleAgentTurnEnvironmentServerConfig,
)
from nemo_gym.base_resources_server import BaseVerifyResponse, ResourcesSeedSessionRequest
from nemo_gym.config_types import (
    AgentServerRef,
    AggregateMetricsRequest,
    BaseServerConfig,
    ResourcesServerRef,
)
from nemo_gym.episode_types import EpisodeId, MaterializedTask, TaskId
from nemo_gym.package_info import __version__
from nemo_gym.reward_profile import compute_aggregate_metrics
from nemo_gym.server_utils import ServerClient, get_response_json, raise_for_status
from nemo_gym.single_agent_turn_types import SingleAgentTurnRequest, SingleAgentTurnTaskInput
from nemo_gym.testing.session_conformance import check_resources_session_contract
from omegaconf import OmegaConf
from pydantic import BaseModel

RUNTIME = "runtime"  # the resources server's name in Gym's config
AGENT = "agent"
PROMPT = {"input": [{"role": "user", "content": "What is 6*7?"}]}


def policy_response(answer: str, output_tokens: int) -> dict[str, Any]:
    """The policy's Responses API object, as Gym's agent returns it."""
    message = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": answer, "annotations": []}],
    }
    usage = {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12 + output_tokens,
    }
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": "policy",
        "output": [message],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


class _Canned:
    """An agent server's answer, as the Environment Server reads one."""

    ok = True
    status = 200
    cookies: dict[str, Any] = {}

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = json.dumps(body).encode()

    async def read(self) -> bytes:
        return self.body


class Client(ServerClient):
    """Gym's client: the runtime's calls go out for real; the agent's answers are canned."""

    answer: str = "42"

    async def post(self, server_name: str, url_path: str, **kwargs: Any) -> Any:  # type: ignore[override]
        if server_name != AGENT:
            return await super().post(server_name, url_path, **kwargs)
        body = kwargs.get("json")
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        if url_path.endswith("/v1/responses"):
            return _Canned(policy_response(self.answer, len(self.answer)))
        return _Canned({"agent_session_id": body["agent_session_id"]})  # seed, close


def client(port: int, observability: bool) -> Client:
    config = {
        "observability_enabled": observability,
        RUNTIME: {"resources_servers": {"reward": {"host": "127.0.0.1", "port": port}}},
        AGENT: {"responses_api_agents": {"stub": {"host": "127.0.0.1", "port": 9}}},
    }
    return Client(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=port),
        global_config_dict=OmegaConf.create(config),
    )


def environment(gym: Client) -> SingleAgentTurnEnvironmentServer:
    config = SingleAgentTurnEnvironmentServerConfig(
        name="environment",
        host="127.0.0.1",
        port=9,
        entrypoint="app.py",
        resources_server=ResourcesServerRef(type="resources_servers", name=RUNTIME),
        agent_server=AgentServerRef(type="responses_api_agents", name=AGENT),
        cleanup_timeout_seconds=10,
    )
    return SingleAgentTurnEnvironmentServer(config=config, server_client=gym)


async def episode(gym: Client, rollout_id: str, answer: str) -> dict[str, Any]:
    gym.answer = answer
    request = SingleAgentTurnRequest(
        episode_id=EpisodeId(rollout_id=rollout_id),
        task=MaterializedTask(
            task_id=TaskId(taskset="runtime:arith", task_id="six-times-seven"),
            task_input=SingleAgentTurnTaskInput(
                responses_create_params=PROMPT, task_data={"expected_answer": "42"}
            ),
        ),
    )
    result = await environment(gym).run_request(request)
    return result.model_dump(mode="json")


async def verify(gym: Client, row: dict[str, Any]) -> dict[str, Any]:
    """As an agent's /run posts it: the row, its indices, the policy's response."""
    answer = await gym.post(server_name=RUNTIME, url_path="/verify", json=row)
    await raise_for_status(answer)
    body = await get_response_json(answer)
    BaseVerifyResponse.model_validate(body)  # Gym's own reading of it
    return {"url": str(answer.url), "body": body}


class Forward:
    """An ASGI app that forwards each request to the runtime (for Gym's TestClient)."""

    def __init__(self, base: str) -> None:
        self.base = base

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        skip = (b"host", b"content-length")
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k not in skip]
        async with httpx.AsyncClient() as http:
            answer = await http.request(
                scope["method"], self.base + scope["path"], content=body, headers=headers
            )
        out = [(b"content-length", str(len(answer.content)).encode())]
        for name, value in answer.headers.multi_items():
            if name.lower() not in ("content-length", "transfer-encoding", "content-encoding"):
                out.append((name.encode(), value.encode()))
        await send({"type": "http.response.start", "status": answer.status_code, "headers": out})
        await send({"type": "http.response.body", "body": answer.content})


def conformance(port: int) -> str:
    seed = ResourcesSeedSessionRequest(
        resources_session_id="conformance-1",
        episode_id=EpisodeId(rollout_id="conformance"),
        task_id=TaskId(taskset="runtime:arith", task_id="t"),
        task_data={"expected_answer": "42"},
    )
    try:
        check_resources_session_contract(
            Forward(f"http://127.0.0.1:{port}"),  # type: ignore[arg-type]
            seed,
            keeps_state=False,
        )
    except AssertionError:
        return traceback.format_exc()
    return "ok"


async def main(port: int) -> dict[str, Any]:
    plain, observed = client(port, observability=False), client(port, observability=True)
    seen: dict[str, Any] = {"version": __version__}
    seen["episodes"] = {
        "plain": await episode(plain, "rollout-1", "42"),
        "observed": await episode(observed, "rollout-2", "42"),
        "raised": await episode(observed, "rollout-3", "RAISE"),
    }
    # a run of 6 tasks x 3 repeats as agents post it: tasks 0-3 scored (some wrong), task 4
    # failed every time (raised, judge unreachable, said it failed), task 5 once (too slow)
    answers = {(t, r): "41" if (t + r) % 3 == 0 else "42" for t in range(4) for r in range(3)}
    answers |= {(4, 0): "RAISE", (4, 1): "JUDGEDOWN", (4, 2): "FAILEDSCORE"}
    answers |= {(5, 0): "HANG", (5, 1): "42", (5, 2): "41"}
    rows = []
    for (task, repeat), answer in answers.items():
        row: dict[str, Any] = {
            "responses_create_params": PROMPT,
            "response": policy_response(answer, 3 + task * repeat),
            "expected_answer": "42",
            "_ng_task_index": task,
            "_ng_rollout_index": repeat,
            "difficulty": task % 2 == 0,  # a boolean column: 0/1 in the metrics
        }
        if task == 1:  # observability's per-rollout record, echoed back
            row["ng_perf"] = {
                "num_turns": 1 + repeat,
                "completion_tokens": 7,
                "total_latency_ms": 9,
            }
        rows.append(row)
    seen["verified"] = {
        f"{r['_ng_task_index']}:{r['_ng_rollout_index']}": await verify(observed, r) for r in rows
    }
    seen["plain_verify"] = await verify(plain, {**rows[0], "_ng_rollout_index": 5})
    responses = [v["body"] for v in seen["verified"].values()]
    ours = await environment(plain).aggregate_metrics(
        AggregateMetricsRequest(verify_responses=responses)
    )
    seen["aggregate"] = {
        "ours": ours.model_dump(mode="json"),
        "gyms": compute_aggregate_metrics(responses).model_dump(mode="json"),
        "ours_masked_only": (
            await environment(plain).aggregate_metrics(
                AggregateMetricsRequest(verify_responses=responses[12:15])
            )
        ).model_dump(mode="json"),
        "gyms_masked_only": compute_aggregate_metrics(responses[12:15]).model_dump(mode="json"),
    }
    unknown = await plain.post(server_name=RUNTIME, url_path="/a_tool_it_lacks", json={})
    seen["unknown_status"] = unknown.status
    reverify = await plain.get(server_name=RUNTIME, url_path="/reverify_mode")
    seen["reverify_mode"] = await get_response_json(reverify)
    seen["conformance"] = await asyncio.to_thread(conformance, port)
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(int(os.environ["RUNTIME_PORT"])))))
