"""An operator sees failed results: counted by status and code, logged as failed with the
request's ids on every line about it, the judge's HTTP chatter kept out, suppressed
failures summarised when their window closes. Real servers, a judge reached over HTTP."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

from conftest import Server, reward_body
from helpers import metric_sample

JUDGE = "workspace.judge_fns:HttpJudge"

StartServer = Callable[..., Server]


def result(route: str, status: str, code: str = "") -> str:
    return f'rl_function_results_total{{error_code="{code}",route="{route}",status="{status}"}}'


def wait_until(condition: Callable[[], object], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout}s")
        time.sleep(0.05)


def judged(server: Server, request_id: str, sample_id: str, **extra: object) -> dict:
    """A request to the judge with its ids, by header and request_metadata."""
    body = reward_body(**extra)
    body["request_metadata"] = {
        "job_id": "job-1",
        "sample_id": sample_id,
        "rollout_id": "ro-1",
        "attempt_id": "at-1",
    }
    response = server.post(body, headers={"x-request-id": request_id})
    assert response.status_code == 200, response.text
    return response.json()


def lines_with(output: str, *texts: str) -> list[str]:
    return [line for line in output.splitlines() if all(text in line for text in texts)]


def test_a_failed_result_is_counted_and_logged_as_failed_with_its_ids(
    start_server: StartServer,
) -> None:
    server = start_server(JUDGE, "--sub-reward-errors", "fail", "--access-log")
    assert judged(server, "r-ok", "s-ok")["status"] == "success"
    failed = judged(server, "r-bad", "s-bad", judge_url=f"{server.url}/no-judge-here")
    assert failed["status"] == "failed" and failed["error_code"] == "SUB_REWARD_ERROR"
    assert server.post({"func_type": "reward"}).status_code == 422

    assert metric_sample(server, result("/api/v1", "success")) == 1.0
    assert metric_sample(server, result("/api/v1", "failed", "SUB_REWARD_ERROR")) == 1.0
    assert metric_sample(server, result("/api/v1", "failed", "INVALID_INPUT")) == 1.0
    assert (
        metric_sample(
            server, 'rl_function_requests_total{func_type="reward",path="/api/v1",status="200"}'
        )
        == 2.0
    )

    output = server.wait_output("runtime.requests", count=3)
    (access,) = lines_with(output, "runtime.requests", "request_id=r-bad")
    assert " WARNING " in access and " 200 " in access, access
    assert " failed SUB_REWARD_ERROR" in access and "sample_id=s-bad" in access, access
    (ok,) = lines_with(output, "runtime.requests", "request_id=r-ok")
    assert " INFO " in ok and "failed" not in ok, ok
    # the sub-reward's ERROR line, and user code's line from its worker thread: the ids too
    (error,) = lines_with(output, "ERROR", "sub-reward 'judge' of HttpJudge failed")
    assert "request_id=r-bad" in error and "sample_id=s-bad" in error, error
    assert len(lines_with(output, "asking the judge", "request_id=r-bad", "sample_id=s-bad")) == 1
    assert len(lines_with(output, "asking the judge", "request_id=r-ok", "sample_id=s-ok")) == 1
    # the judge's HTTP client said nothing at INFO (its line would precede the ERROR line)
    assert "HTTP Request:" not in output, output


def test_json_lines_of_a_failed_result_carry_its_code_and_ids(start_server: StartServer) -> None:
    server = start_server(
        JUDGE, "--sub-reward-errors", "fail", "--access-log", env={"LOG_FORMAT": "json"}
    )
    judged(server, "r-bad", "s-bad", judge_url=f"{server.url}/no-judge-here")
    server.wait_output('"path":"/api/v1"')  # (the judge's own 404 has a line too)
    entries = [json.loads(line) for line in server.output().splitlines()]
    (access,) = [e for e in entries if e.get("path") == "/api/v1"]
    assert access["level"] == "WARNING" and access["status"] == 200, access
    assert access["result"] == "failed" and access["error_code"] == "SUB_REWARD_ERROR", access
    assert access["request_id"] == "r-bad" and access["sample_id"] == "s-bad", access
    (error,) = [e for e in entries if e["logger"] == "processors_base.rewards"]
    assert error["level"] == "ERROR", error
    assert error["request_id"] == "r-bad" and error["sample_id"] == "s-bad", error
    (user,) = [e for e in entries if e["message"] == "asking the judge"]
    assert user["request_id"] == "r-bad" and user["job_id"] == "job-1", user


def test_lines_of_user_code_in_an_isolation_process_carry_the_samples_ids(
    start_server: StartServer,
) -> None:
    server = start_server(JUDGE, "--isolation", "process", "--processes", "1")
    judged(server, "r-1", "s-1")  # the sync judge runs in the isolation process
    output = server.wait_output("asking the judge")
    (line,) = lines_with(output, "asking the judge")
    assert "sample_id=s-1" in line and "job_id=job-1" in line, line  # its headers stay here


def test_a_code_of_the_functions_own_is_counted_as_other(start_server: StartServer) -> None:
    server = start_server("workspace.judge_fns:OwnCodeFailure")
    for _ in range(3):
        assert server.post(reward_body()).json()["error_code"].startswith("MY_CODE_")
    # bounded labels: the function's own codes are one value; each is on its access line
    assert metric_sample(server, result("/api/v1", "failed", "OTHER")) == 3.0
    assert "MY_CODE" not in server.client.get("/metrics").text
    output = server.wait_output("runtime.requests", count=3)
    assert len(lines_with(output, "WARNING", " failed MY_CODE_")) == 3, output


def test_the_judges_http_client_is_heard_at_debug(start_server: StartServer) -> None:
    server = start_server(JUDGE, env={"LOG_LEVEL": "debug"})
    judged(server, "r-1", "s-1", judge_url=f"{server.url}/no-judge-here")
    server.wait_output("HTTP Request: POST")


def test_suppressed_failures_are_summarised_when_their_window_closes(
    start_server: StartServer,
) -> None:
    server = start_server(JUDGE, env={"JUDGE_LOG_EVERY": "2"})
    body = reward_body()
    body["agent_output"]["messages"] = [{"role": "assistant", "content": "wrong"}]
    for _ in range(3):
        assert server.post(body).json()["reward"]["reward_metrics"]["judge.failed"] == 1.0
    # no later failure is needed: the summary comes when the window closes, and says how long
    pattern = re.compile(r"ERROR .*'judge' of HttpJudge: (\d+) more failures?.* in the ([\d.]+)s")
    wait_until(lambda: pattern.search(server.output()), "the summary")
    output = server.output()
    logged = len(lines_with(output, "sub-reward 'judge' of HttpJudge failed"))
    summarised = sum(int(m[0]) for m in pattern.findall(output))
    assert logged + summarised == 3, output
    assert all(float(m[1]) >= 2.0 for m in pattern.findall(output)), output


def test_suppressed_failures_are_summarised_at_shutdown(start_server: StartServer) -> None:
    server = start_server(JUDGE, env={"JUDGE_LOG_EVERY": "600"})
    body = reward_body()
    body["agent_output"]["messages"] = [{"role": "assistant", "content": "wrong"}]
    for _ in range(3):
        assert server.post(body).status_code == 200
    assert server.terminate() == 0
    match = re.search(r"HttpJudge: 2 more failures.* in the ([\d.]+)s", server.output())
    assert match and float(match[1]) < 600, server.output()


def test_trainer_routes_get_access_lines_ids_and_result_counts(start_server: StartServer) -> None:
    server = start_server(JUDGE, "--sub-reward-errors", "fail", "--access-log")
    client = server.client

    def slime(answer: str, request_id: str) -> object:
        payload = {"prompt": "6*7?", "response": answer, "label": "42"}
        response = client.post("/slime/reward", json=payload, headers={"x-request-id": request_id})
        assert response.status_code == 200, response.text
        return response.json()

    assert slime("42", "t-ok") == 1.0
    assert slime("wrong", "t-bad") == 0.0
    batch = {"query": ["q 42", "q wrong"], "prompts": ["q ", "q "], "labels": ["42", "42"]}
    response = client.post("/openrlhf/get_reward", json=batch, headers={"x-request-id": "t-batch"})
    assert response.json()["extra_logs"]["reward_failed"] == [0.0, 1.0]
    assert client.post("/slime/reward", json={"prompt": "p"}).status_code == 422

    assert metric_sample(server, result("slime", "success")) == 1.0
    assert metric_sample(server, result("slime", "failed", "SUB_REWARD_ERROR")) == 1.0
    assert metric_sample(server, result("slime", "failed", "INVALID_INPUT")) == 1.0
    assert metric_sample(server, result("openrlhf", "success")) == 1.0
    assert metric_sample(server, result("openrlhf", "failed", "SUB_REWARD_ERROR")) == 1.0

    output = server.wait_output("runtime.requests", count=4)
    (ok,) = lines_with(output, "runtime.requests: POST /slime/reward", "request_id=t-ok")
    assert " INFO " in ok and " 200 " in ok, ok
    (bad,) = lines_with(output, "runtime.requests: POST /slime/reward", "request_id=t-bad", " 200 ")
    assert " WARNING " in bad and " failed SUB_REWARD_ERROR" in bad, bad
    (batch_line,) = lines_with(output, "POST /openrlhf/get_reward", "request_id=t-batch", " 200 ")
    assert " WARNING " in batch_line and "1 of 2" in batch_line, batch_line
    (invalid,) = lines_with(output, "POST /slime/reward", " 422 ")
    assert "INVALID_INPUT" in invalid, invalid
    # the sub-reward's ERROR line and the trainer's warning about the sample: the request's id
    (error,) = lines_with(output, "ERROR", "sub-reward 'judge' of HttpJudge failed")
    assert "request_id=t-bad" in error, error
    warnings = lines_with(output, "reward failed, answered 0")
    assert len(warnings) == 2 and all("request_id=t-" in w for w in warnings), warnings
