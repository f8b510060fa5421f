"""The NeMo Gym resources-server routes over plain HTTP, in any Python (Gym's own code drives
them in test_nemo_gym_own_code.py, where a Python with nemo-gym is named): sessions, the
/ng-rollout/<id>/ path form, masked failures, /aggregate_metrics and its refusals."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Server
from helpers import started
from test_trainers import gym_row

from runtime.serving.gym_metrics import aggregate_metrics, t_quantile_975


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from started("workspace.gym_fns:GymReward", "--trainer-timeout", "4")


def test_seed_and_close_sessions(server: Server) -> None:
    seed = {
        "resources_session_id": "rs-1",
        "episode_id": {"rollout_id": "r1", "attempt": 0},
        "task_id": {"taskset": "t", "task_id": "1"},
        "task_data": {},
    }
    for path in ("/seed_session", "/nemo-gym/seed_session", "/ng-rollout/r1/seed_session"):
        seeded = server.client.post(path, json=seed)
        assert seeded.json() == {"resources_session_id": "rs-1"}
        cookie = seeded.headers["set-cookie"]
        assert cookie.startswith("nemo_gym_resources_session=")
        assert "httponly" in cookie.lower()
    legacy = server.client.post("/seed_session", json={})  # an agent's /run seeds this way
    assert legacy.json() == {}
    assert "nemo_gym_resources_session=" in legacy.headers["set-cookie"]
    closed = server.client.post("/close_session", json={"resources_session_id": "rs-1"})
    assert closed.json() == {"resources_session_id": "rs-1"}
    for bad in ({"resources_session_id": ""}, {"resources_session_id": 3}, {}):
        assert server.client.post("/close_session", json=bad).status_code == 422
    bad_task = {**seed, "task_data": []}
    assert server.client.post("/seed_session", json=bad_task).status_code == 422
    assert server.client.get("/ng-rollout/r1/reverify_mode").json() == "stateless"


def test_verify_on_the_rollout_path_and_an_id_gym_would_not_write(server: Server) -> None:
    answer = server.client.post("/ng-rollout/3-1.a_b/verify", json=gym_row("42")).json()
    assert (answer["reward"], answer["mask_sample"], answer["failure_kind"]) == (1.0, False, None)
    for bad in ("/ng-rollout/.hidden/verify", "/ng-rollout/a/b/verify", "/ng-rollout//verify"):
        refused = server.client.post(bad, json=gym_row("42"))
        assert refused.status_code == 404, bad
        assert refused.json()["error_code"] == "NOT_FOUND"


@pytest.mark.parametrize(
    ("answer", "kind", "code"),
    [
        ("RAISE", "verifier_error", "PROCESSOR_ERROR"),
        ("FAILEDSCORE", "verifier_error", "PROCESSOR_ERROR"),
        ("JUDGEDOWN", "judge_failed", "judge_failed"),
        ("HANG", "verifier_error", "DEADLINE_EXCEEDED"),
    ],
)
def test_a_failed_verifier_masks_the_sample(
    server: Server, answer: str, kind: str, code: str
) -> None:
    row = {**gym_row(answer), "instance_config": {"dataset": "x"}}
    body = server.client.post("/verify", json=row, timeout=60).json()
    assert (body["reward"], body["mask_sample"], body["failure_kind"]) == (0.0, True, kind)
    assert body["failure_reason"].startswith(code)
    assert body["instance_config"] == {"dataset": "x", "mask_sample": True}


def _verified(task: int, repeat: int, reward: float, **more: Any) -> dict[str, Any]:
    return {"_ng_task_index": task, "_ng_rollout_index": repeat, "reward": reward, **more}


def test_aggregate_metrics_over_http(server: Server) -> None:
    responses = [_verified(0, 0, 1.0), _verified(0, 1, 0.0), _verified(1, 0, 1.0)]
    responses.append(_verified(1, 1, 0.0, mask_sample=True, failure_kind="verifier_error"))
    for path in ("/aggregate_metrics", "/ng-rollout/x/aggregate_metrics"):
        answer = server.client.post(path, json={"verify_responses": responses}).json()
        assert answer == aggregate_metrics(responses)
    agent = answer["agent_metrics"]
    assert agent["mean/reward"] == pytest.approx(2 / 3)
    assert agent["coverage/masked_rollouts"] == 1
    assert agent["num_repeats"] == 2
    assert answer["key_metrics"] == {
        "mean/reward": agent["mean/reward"],
        **{k: v for k, v in agent.items() if k.startswith("coverage/")},
    }
    empty = server.client.post("/aggregate_metrics", json={"verify_responses": []}).json()
    assert empty == {
        "group_level_metrics": [],
        "agent_metrics": {},
        "key_metrics": {},
        "perf_summary": None,
        "repeat_level_metrics": [],
    }


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"verify_responses": [{"reward": 1.0}]}, "needs integer _ng_task_index"),
        ({"verify_responses": [_verified(0, 0, 1.0), _verified(0, 0, 0.0)]}, "two verify"),
        ({"verify_responses": [_verified(0, True, 1.0)]}, "needs integer"),
        ({"verify_responses": {"a": 1}}, "list of objects"),
        ({}, "list of objects"),
    ],
)
def test_aggregate_metrics_refusals(server: Server, body: dict[str, Any], says: str) -> None:
    refused = server.client.post("/aggregate_metrics", json=body)
    assert refused.status_code == 422
    assert says in refused.json()["error"]


def test_group_stats_and_intervals() -> None:
    # task 0: one rollout (std 0); task 1: three; repeats 0..2 of task 1: a t-interval, df 2
    responses = [_verified(0, 0, 0.5, ok=True)]
    responses += [_verified(1, r, v) for r, v in enumerate((0.0, 0.5, 1.0))]
    metrics = aggregate_metrics(responses)
    first, second = metrics["group_level_metrics"]
    assert (first["std/reward"], first["mean/ok"], first["std/ok"]) == (0.0, 1, 0.0)
    assert second["std/reward"] == pytest.approx(0.5)
    assert "mean/ok" not in second  # a field no rollout of the task has
    assert [i["rollout_id"] for i in second["rollout_infos"]] == ["1:0", "1:1", "1:2"]
    repeat = metrics["repeat_level_metrics"][0]  # tasks 0 and 1 in repeat 0: 0.5 and 0.0
    half = t_quantile_975(1) * 0.25  # sem of (0.5, 0.0): std 0.3536 / sqrt(2)
    assert repeat["ci_low_95/reward"] == pytest.approx(0.25 - half)
    assert (repeat["sample_count"], repeat["missing_count"]) == (2, 0)
    assert metrics["repeat_level_metrics"][1]["missing_count"] == 1  # task 0 has no repeat 1


def test_student_t_quantiles() -> None:
    # the closed forms of df 1 and 2, and the normal's limit
    assert t_quantile_975(1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-12)
    p = 0.975
    assert t_quantile_975(2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)
    assert t_quantile_975(100_000) == pytest.approx(1.959963984540054, rel=1e-4)
    values = [t_quantile_975(df) for df in range(1, 60)]
    assert values == sorted(values, reverse=True)  # narrower with every degree of freedom
