"""NeMo Gym 0.7.0's own code against the runtime's resources-server routes (issue 22).

NeMo Gym needs Python >= 3.13: its code runs in a Python that has ``nemo-gym==0.7.0``, named
in ``NEMO_GYM_PYTHON`` (``.ci/run`` builds one), as one subprocess for the module
(``nemo_gym_driver.py``: Gym's Environment Server, ``ServerClient``, models,
``compute_aggregate_metrics`` and session conformance check). Without one these tests skip,
saying so; test_nemo_gym.py covers the same routes over plain HTTP.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Server

GYM_VERSION = "0.7.0"  # the release these tests prove
NEMO_GYM_PYTHON = os.environ.get("NEMO_GYM_PYTHON") or None
DRIVER = Path(__file__).with_name("nemo_gym_driver.py")
pytestmark = pytest.mark.skipif(
    NEMO_GYM_PYTHON is None,
    reason=f"NeMo Gym (nemo-gym=={GYM_VERSION}, Python >= 3.13) is not installed here: name "
    "a Python that has it in NEMO_GYM_PYTHON (.ci/run builds one)",
)


@pytest.fixture(scope="module")
def gym(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, Any]]]:
    """The server, and what Gym's code saw of it (one driver run for the module)."""
    assert NEMO_GYM_PYTHON is not None
    server = Server("workspace.gym_fns:GymReward", "--trainer-timeout", "4", "--access-log", "on")
    try:
        server.wait_ready()
        done = subprocess.run(
            [NEMO_GYM_PYTHON, str(DRIVER)],
            cwd=tmp_path_factory.mktemp("gym"),  # Gym's Hydra writes outputs/ where it runs
            env={**os.environ, "RUNTIME_PORT": str(server.port)},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-6000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["version"] == GYM_VERSION
        yield server, seen
    finally:
        server.close()


def test_gym_0_7_environment_server_runs_episodes_seeded_verified_and_closed(
    gym: tuple[Server, dict[str, Any]],
) -> None:
    # single_agent_turn requires its resources_session_id back and a session cookie
    # (before: "resources_session_id Field required"), verifies with the cookie and closes
    # the session at cleanup (before: 404)
    server, seen = gym
    for name in ("plain", "observed"):
        episode = seen["episodes"][name]
        assert episode["failure"] is None, episode
        result = episode["result"]
        assert (result["reward"], result["mask_sample"], result["failure_kind"]) == (
            1.0,
            False,
            None,
        )
        assert result["reward_components"]["reward_failed"] == 0.0
    # 3 + 2 episodes' closes: Gym's conformance check closes 3 times
    output = server.wait_output("/close_session reward 200", count=3 + 3)
    for path in ("/seed_session", "/verify", "/close_session"):
        assert f"POST {path} reward 200" in output  # observability off: at the root
        # on: the path form Gym writes (/ng-rollout/<rollout id>/...)
        assert f"POST /ng-rollout/rollout-2{path} reward 200" in output
    assert "cookie" not in output.lower()  # a session handle is never logged


def test_gym_0_7_session_contract_of_its_own_conformance_check(
    gym: tuple[Server, dict[str, Any]],
) -> None:
    assert gym[1]["conformance"] == "ok"


def test_gym_0_7_agent_verify_on_the_ng_rollout_path(gym: tuple[Server, dict[str, Any]]) -> None:
    # with observability_enabled Gym's ServerClient posts /ng-rollout/<task>-<repeat>/verify
    # (before: 404, and SimpleAgent.run raised); each answer read as BaseVerifyResponse
    _, seen = gym
    for key, verified in seen["verified"].items():
        task, repeat = key.split(":")
        assert verified["url"].endswith(f"/ng-rollout/{task}-{repeat}/verify")
    assert seen["verified"]["0:1"]["body"]["reward"] == 1.0
    assert seen["verified"]["0:0"]["body"]["reward"] == 0.0  # "41"
    assert seen["plain_verify"]["url"].endswith(f":{gym[0].port}/verify")


def test_gym_0_7_infrastructure_failures_are_masked_with_their_kind(
    gym: tuple[Server, dict[str, Any]],
) -> None:
    # a failed verifier is no measurement of the policy: masked, never trained on as a 0
    _, seen = gym
    kinds = {
        "4:0": ("verifier_error", "PROCESSOR_ERROR: ValueError: the judge broke"),  # raised
        "4:1": ("judge_failed", "judge_failed: the judge is unreachable"),  # said so
        "4:2": ("verifier_error", "PROCESSOR_ERROR: judge unsure"),  # failed, no kind
        "5:0": ("verifier_error", "DEADLINE_EXCEEDED"),  # past --trainer-timeout
    }
    for key, (kind, reason) in kinds.items():
        body = seen["verified"][key]["body"]
        assert (body["reward"], body["mask_sample"], body["failure_kind"]) == (0.0, True, kind)
        assert body["failure_reason"].startswith(reason)
        assert body["instance_config"] == {"mask_sample": True}  # NeMo RL before 0.7 reads it
    scored = [v["body"] for k, v in seen["verified"].items() if k not in kinds]
    assert all(b["mask_sample"] is False and b["failure_kind"] is None for b in scored)
    raised = seen["episodes"]["raised"]["result"]  # through the Environment Server too
    assert (raised["mask_sample"], raised["failure_kind"]) == (True, "verifier_error")


def test_gym_0_7_aggregate_metrics_are_gyms_own(gym: tuple[Server, dict[str, Any]]) -> None:
    # ng_collect_rollouts' end-of-run call (before: 404), through the Environment Server:
    # the numbers of Gym's compute_aggregate_metrics on the same verify answers
    aggregate = gym[1]["aggregate"]
    ours, gyms = aggregate["ours"], aggregate["gyms"]
    _same(ours, gyms)
    agent = ours["agent_metrics"]
    assert agent["mean/reward"] == pytest.approx(9 / 14)  # 14 measured, 9 right
    assert agent["coverage/masked_rollouts"] == 4
    assert agent["coverage/fully_masked_tasks"] == 1
    assert ours["key_metrics"]["coverage/measured_rollouts"] == 14
    assert len(ours["repeat_level_metrics"]) == 3
    assert "ci_low_95/reward" in ours["repeat_level_metrics"][0]  # a t-interval, df 4
    assert ours["perf_summary"]["overall_observability_coverage"] == pytest.approx(3 / 18)
    assert [g["_ng_task_index"] for g in ours["group_level_metrics"]] == [0, 1, 2, 3, 5]
    # every rollout masked: coverage only, as Gym answers it
    _same(aggregate["ours_masked_only"], aggregate["gyms_masked_only"])
    assert aggregate["ours_masked_only"]["group_level_metrics"] == []


def test_gym_0_7_unknown_route_is_logged_and_counted(gym: tuple[Server, dict[str, Any]]) -> None:
    server, seen = gym
    assert seen["unknown_status"] == 404
    assert seen["reverify_mode"] == "stateless"  # GET /reverify_mode, as gym eval reverify asks
    server.wait_output("POST /a_tool_it_lacks reward 404")
    metrics = server.client.get("/metrics").text
    counted = [line for line in metrics.splitlines() if 'path="unknown"' in line]
    assert any('status="404"' in line and line.endswith(" 1.0") for line in counted), metrics


def _same(ours: Any, gyms: Any, at: str = "") -> None:
    """Equal as JSON, numbers to 1e-9 (summation order differs from pandas')."""
    if isinstance(gyms, dict):
        assert isinstance(ours, dict), at
        assert sorted(ours) == sorted(gyms), f"{at}: {sorted(set(ours) ^ set(gyms))}"
        for key in gyms:
            _same(ours[key], gyms[key], f"{at}/{key}")
    elif isinstance(gyms, list):
        assert isinstance(ours, list) and len(ours) == len(gyms), at
        for index, (one, other) in enumerate(zip(ours, gyms, strict=True)):
            _same(one, other, f"{at}[{index}]")
    elif isinstance(gyms, (int, float)) and not isinstance(gyms, bool):
        assert isinstance(ours, (int, float)) and not isinstance(ours, bool), at
        assert math.isclose(ours, gyms, rel_tol=1e-9, abs_tol=1e-12), f"{at}: {ours} != {gyms}"
    else:
        assert ours == gyms, f"{at}: {ours!r} != {gyms!r}"
