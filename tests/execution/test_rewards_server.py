"""The reward registry and output checks through the real server: what the platform sees."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TESTS, Server, reward_body
from helpers import metric_sample

CASES = "workspace.reward_cases"

StartServer = Callable[..., Server]


def wait_for_output(server: Server, pattern: str, timeout: float = 60) -> str:
    """The server's log once ``pattern`` shows in it (log lines are written by a thread)."""
    deadline = time.monotonic() + timeout
    while True:
        output = server.output()
        if re.search(pattern, output) or time.monotonic() > deadline:
            return output
        time.sleep(0.05)


def test_a_failing_sub_reward_is_logged_counted_and_marked(start_server: StartServer) -> None:
    server = start_server(f"{CASES}:FlakyJudge")
    bodies = [server.post(reward_body()).json() for _ in range(3)]
    for body in bodies:  # the SDK's semantics by default: success, the failed one scores 0
        assert body["status"] == "success"
        assert body["reward"]["reward_score"] == pytest.approx(0.2)
        assert body["reward"]["reward_metrics"]["judge.failed"] == 1.0
        assert body["reward"]["reward_metrics"]["judge"] == 0.0
        assert "format.failed" not in body["reward"]["reward_metrics"]
    assert metric_sample(server, 'rl_function_sub_reward_failures_total{sub_reward="judge"}') == 3.0
    output = wait_for_output(server, "judge endpoint timed out")
    # once with its traceback, not once per request: a broken judge cannot flood the log
    assert output.count("sub-reward 'judge' of FlakyJudge failed") == 1, output
    assert output.count("Traceback (most recent call last)") == 1, output
    assert re.search(r"ERROR .*sub-reward 'judge' of FlakyJudge failed", output), output
    assert "reward_cases.py" in output  # the user's frame is in the traceback


def test_sub_reward_errors_fail_fails_the_whole_result(start_server: StartServer) -> None:
    server = start_server(f"{CASES}:FlakyJudge", "--sub-reward-errors", "fail")
    response = server.post(reward_body())
    body = response.json()
    assert body["status"] == "failed"
    assert body["error_code"] == "SUB_REWARD_ERROR"
    assert "'judge'" in body["error"] and "judge endpoint timed out" in body["error"]
    assert "'format'" not in body["error"]
    assert metric_sample(server, 'rl_function_sub_reward_failures_total{sub_reward="judge"}') == 1.0


def test_sub_reward_errors_fail_wins_over_an_aggregate(start_server: StartServer) -> None:
    env = {"SUB_REWARD_ERRORS": "fail"}
    server = start_server(f"{CASES}:FlakyJudgeAggregate", env=env)
    body = server.post(reward_body()).json()
    assert body["status"] == "failed" and body["error_code"] == "SUB_REWARD_ERROR"
    assert "judge endpoint timed out" in body["error"]


def test_with_an_aggregate_a_failure_is_still_counted(start_server: StartServer) -> None:
    server = start_server(f"{CASES}:FlakyJudgeAggregate")
    body = server.post(reward_body()).json()
    assert body["status"] == "success"  # the aggregate decided, with the failed output in hand
    assert body["reward"]["reward_score"] == pytest.approx(0.2)
    assert metric_sample(server, 'rl_function_sub_reward_failures_total{sub_reward="judge"}') == 1.0


@pytest.mark.parametrize(
    ("kind", "field"),
    [
        ("nan-score", "reward.reward_score"),
        ("inf-metric", "reward.reward_metrics['acc']"),
        ("dict", "reward.reward_score"),
    ],
)
def test_non_finite_reward_output_is_invalid_output(
    start_server: StartServer, kind: str, field: str
) -> None:
    server = start_server(f"{CASES}:NonFiniteReward")
    response = server.post(reward_body(kind=kind))
    assert response.status_code == 500, response.text
    body = response.json()
    assert body["error_code"] == "INVALID_OUTPUT"
    assert field in body["error"]
    assert metric_sample(server, "rl_function_processor_errors_total") == 1.0
    assert field in wait_for_output(server, re.escape(field))


def test_non_finite_group_and_rollout_outputs_are_invalid_output(
    start_server: StartServer,
) -> None:
    group = start_server(f"{CASES}:NonFiniteGroupReward")
    outputs = reward_body()["agent_output"]
    response = group.post({"func_type": "group_reward", "agent_outputs": [outputs, outputs]})
    assert response.status_code == 500, response.text
    assert response.json()["error_code"] == "INVALID_OUTPUT"
    assert "reward.rewards[1].reward_metrics['z']" in response.json()["error"]

    rollout = start_server(f"{CASES}:NonFiniteRollout")
    response = rollout.post(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "model_resource": {"model_name": "m", "base_url": "http://x", "api_key": "sk-1"},
        }
    )
    assert response.status_code == 500, response.text
    assert "agent_output.rollout_metrics['turns']" in response.json()["error"]


def test_a_non_finite_sub_reward_is_a_failed_sub_reward(start_server: StartServer) -> None:
    server = start_server(f"{CASES}:NaNSubReward")
    body = server.post(reward_body()).json()
    assert body["status"] == "success"
    assert body["reward"]["reward_score"] == 1.0
    assert body["reward"]["reward_metrics"]["broken.failed"] == 1.0


def test_the_decorator_wins_over_a_placeholder_process(start_server: StartServer) -> None:
    server = start_server(f"{CASES}:Placeholder")
    body = server.post(reward_body()).json()
    assert body["status"] == "success"
    assert body["reward"]["reward_score"] == pytest.approx(0.8)  # the SDK's answer, not 0.0


@pytest.mark.parametrize(
    ("target", "score", "metrics"),
    [
        # an override without the decorator is no aggregate (as the SDK collects them)
        ("AsyncAggregateOverride", 1.5, {"a": 1.0, "b": 0.5}),
        ("WithoutB", 1.0, {"a": 1.0}),  # b = None unregisters b, combine = None the aggregate
        ("WrappedSync", 1.0, {"wrapped": 1.0}),  # the async wrapper is awaited
        ("NoSubRewards", 0.0, None),  # as the SDK answers (in its own module, see below)
        ("UsesExecutor", 3.0, {"offloaded": 3.0}),  # self.executor works
    ],
)
def test_registry_edge_cases_over_http(
    start_server: StartServer, target: str, score: float, metrics: dict | None
) -> None:
    module = "workspace.reward_sdk_cases" if target == "NoSubRewards" else CASES
    server = start_server(f"{module}:{target}")
    response = server.post(reward_body())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "success", body
    assert body["reward"]["reward_score"] == pytest.approx(score)
    if metrics is not None:
        assert body["reward"]["reward_metrics"] == metrics


def test_invoke_shows_a_failing_sub_reward_on_stderr(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text('{"agent_output": {"messages": []}}')
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "invoke", f"{CASES}:FlakyJudge", "--input", str(request)],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "sub-reward 'judge' of FlakyJudge failed" in result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert "ConnectionError: judge endpoint timed out" in result.stderr
    assert '"judge.failed": 1.0' in result.stdout

    failing = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime",
            "invoke",
            f"{CASES}:FlakyJudge",
            "--input",
            str(request),
            "--sub-reward-errors",
            "fail",
        ],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failing.returncode == 1, failing.stderr
    assert '"error_code": "SUB_REWARD_ERROR"' in failing.stdout


def test_a_sub_reward_that_returns_none_is_invalid_output(start_server: StartServer) -> None:
    # The SDK's server answers 500 for a forgotten return; a silent 0 would be trained on.
    server = start_server(f"{CASES}:ForgotReturn")
    response = server.post(reward_body())
    assert response.status_code == 500, response.text
    body = response.json()
    assert body["error_code"] == "INVALID_OUTPUT"
    assert "sub-reward 'forgot' returned NoneType" in body["error"]
    assert "missing return" in body["error"]


def test_null_rollout_metrics_in_and_out(start_server: StartServer) -> None:
    # Optional in the SDK's AgentOutput: null is accepted on input and on output.
    body = reward_body()
    body["agent_output"]["rollout_metrics"] = None
    reward = start_server(f"{CASES}:FlakyJudge")
    assert reward.post(body).status_code == 200

    rollout = start_server(f"{CASES}:NullMetricsRollout")
    response = rollout.post(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "model_resource": {"model_name": "m", "base_url": "http://x", "api_key": "sk-1"},
        }
    )
    assert response.status_code == 200, response.text
    assert response.json()["agent_output"]["rollout_metrics"] is None


# ---- non-finite numbers in free-form output fields ----

FNS = "workspace.odd_fns"  # user code that leaks its key or fails in odd ways


def test_a_nan_in_a_free_form_output_field_is_invalid_output(start_server):
    server = start_server(f"{FNS}:NanInExtras")
    response = server.post(reward_body())
    assert response.status_code == 500, response.text
    body = response.json()
    assert body["error_code"] == "INVALID_OUTPUT" and "debug.ratios[1]" in body["error"]
    text = server.post(reward_body(text=True))  # the words alone are no number
    assert text.status_code == 200 and text.json()["note"] == "NaN or Infinity"
