"""The HTTP contract of ``python -m runtime serve``, against a real server subprocess."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import reward_body
from helpers import wait_for

ROLLOUT = {
    "func_type": "rollout",
    "messages": [{"role": "user", "content": "hi"}],
    "model_resource": {
        "model_name": "m",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key": "sk-SECRET-123456",
    },
}


@pytest.fixture
def echo(start_server):
    return start_server("workspace.fns:EchoReward", "--max-body", "2000")


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["status"] == "failed"
    assert body["error_code"] == code
    assert body["error"]
    return body


def test_health_and_a_valid_request(echo):
    health = echo.client.get("/health")
    assert health.status_code == 200
    assert health.json() == {
        "status": "healthy",
        "func_type": "reward",
        "processor": "EchoReward",
        "parser": "RewardRequestParser",  # the SDK server's name
    }
    response = echo.post(reward_body(messages=3))
    assert response.status_code == 200
    assert response.json() == {
        "reward": {"reward_score": 3.0, "reward_metrics": None},
        "status": "success",
        "error": None,
        "error_code": None,
    }


def test_func_type_may_be_omitted(echo):
    body = reward_body(messages=2)
    del body["func_type"]
    assert echo.post(body).json()["reward"]["reward_score"] == 2.0


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "INVALID_JSON"),
        (b"", 400, "INVALID_JSON"),
        (b'{"func_type": "reward", "x": "\xff\xfe"}', 400, "INVALID_JSON"),
        (b"[1, 2]", 400, "NOT_AN_OBJECT"),
        (b'"a string"', 400, "NOT_AN_OBJECT"),
        (b'{"agent_output": {"messages": [1]}, "x": NaN}', 400, "INVALID_JSON"),
        (b'{"func_type": "rollout", "messages": []}', 422, "FUNC_TYPE_MISMATCH"),
        (b'{"func_type": "reward"}', 422, "INVALID_INPUT"),
        (b'{"agent_output": {"rollout_metrics": {"a": "x"}}}', 422, "INVALID_INPUT"),
    ],
)
def test_bad_input_gets_its_documented_error(echo, body, status, code):
    assert_error(echo.post(body), status, code)
    assert echo.post(reward_body()).status_code == 200  # and the server keeps serving


def test_invalid_input_lists_each_field(echo):
    body = assert_error(
        echo.post({"agent_output": {"messages": "x", "rollout_metrics": {"a": "y"}}}),
        422,
        "INVALID_INPUT",
    )
    fields = {d["field"]: d for d in body["detail"]}
    assert set(fields) == {"agent_output.messages", "agent_output.rollout_metrics.a"}
    assert all(d["msg"] and d["type"] for d in body["detail"])


def test_func_type_mismatch_names_both(echo):
    body = assert_error(
        echo.post({"func_type": "group_reward", "agent_outputs": []}), 422, "FUNC_TYPE_MISMATCH"
    )
    assert "'group_reward'" in body["error"] and "'reward'" in body["error"]


def test_body_too_large_is_refused_without_reading_it(echo):
    # Content-Length alone decides: the server answers before the body is sent.
    with socket.create_connection(("127.0.0.1", echo.port), timeout=5) as sock:
        sock.sendall(
            b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000000\r\n\r\n"
        )
        reply = b""
        while chunk := sock.recv(4096):  # the server closes after answering
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413")
    assert b"BODY_TOO_LARGE" in reply


def test_body_too_large_when_chunked(echo):
    def chunks():
        for _ in range(10):
            yield b" " * 500

    assert_error(echo.client.post("/api/v1", content=chunks()), 413, "BODY_TOO_LARGE")
    assert echo.post(reward_body()).status_code == 200


def test_not_found_and_method_not_allowed_are_json(echo):
    assert_error(echo.client.get("/nope"), 404, "NOT_FOUND")
    response = echo.client.get("/api/v1")
    assert_error(response, 405, "METHOD_NOT_ALLOWED")
    assert response.headers["allow"] == "POST"
    assert_error(echo.client.post("/health"), 405, "METHOD_NOT_ALLOWED")


def test_processor_that_raises_gets_500_in_output_shape(start_server):
    server = start_server("workspace.fns:RaisingReward")
    body = assert_error(server.post(reward_body()), 500, "PROCESSOR_ERROR")
    assert body["reward"] == {"reward_score": 0.0, "reward_metrics": None}
    assert "boom: the scorer broke" in body["error"]
    assert "Traceback" not in body["error"]
    server.wait_output("PROCESSOR_ERROR")  # and one log line says so (written off the loop)


def test_processor_output_is_checked(start_server):
    server = start_server("workspace.fns:WrongOutputReward")
    assert server.post(reward_body(kind="dict")).json()["reward"]["reward_score"] == 0.5
    body = assert_error(server.post(reward_body(kind="bad-dict")), 500, "INVALID_OUTPUT")
    assert "reward.reward_score" in body["error"]
    body = assert_error(server.post(reward_body(kind="str")), 500, "INVALID_OUTPUT")
    assert "returned str" in body["error"]


def test_secret_never_leaves_in_error_bodies_or_logs(start_server):
    server = start_server("workspace.fns:LeakyRollout")
    ok = server.post(ROLLOUT)
    assert ok.status_code == 200 and "SECRET" not in ok.text
    failed = server.post({**ROLLOUT, "rollout_extra": {"fail": True}})
    assert_error(failed, 500, "PROCESSOR_ERROR")
    assert "sk-SECRET-123456" not in failed.text and "**********" in failed.text
    invalid = server.post({**ROLLOUT, "model_resource": {"api_key": "sk-SECRET-123456"}})
    assert_error(invalid, 422, "INVALID_INPUT")
    assert "SECRET" not in invalid.text
    server.terminate()
    assert "sk-SECRET-123456" not in server.output()


def test_overload_gets_503_with_retry_after(start_server, tmp_path):
    server = start_server(
        "workspace.fns:SleepyReward",
        "--concurrency",
        "2",
        "--queue",
        "1",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(server.post, reward_body(sleep=1.0, tag=str(i))) for i in range(8)]
        responses = [f.result() for f in futures]
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 200, 200, 503, 503, 503, 503, 503], statuses
    rejected = next(r for r in responses if r.status_code == 503)
    assert rejected.headers["retry-after"] == "1"
    assert_error(rejected, 503, "OVERLOADED")
    assert server.post(reward_body()).status_code == 200  # capacity comes back


def test_deadline_gives_504_and_cancels_async_work(start_server, tmp_path):
    server = start_server(
        "workspace.fns:SleepyReward", "--timeout", "0.5", env={"TEST_MARKER_DIR": str(tmp_path)}
    )
    body = assert_error(server.post(reward_body(sleep=5, tag="late")), 504, "DEADLINE_EXCEEDED")
    assert body["reward"]["reward_score"] == 0.0
    # answered at the deadline: the work was cancelled, never let run to its end
    assert (tmp_path / "cancelled-late").exists()
    assert not (tmp_path / "finished-late").exists()


def test_deadline_holds_for_sync_code_too(start_server, tmp_path):
    server = start_server(
        "workspace.stopping:BlockingSyncReward",
        "--timeout",
        "0.5",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    assert_error(server.post(reward_body(tag="held")), 504, "DEADLINE_EXCEEDED")
    # answered while the sync call still held its thread (it runs until released)
    assert (tmp_path / "started-held").exists()
    assert not (tmp_path / "ended-held").exists()
    (tmp_path / "release").touch()
    wait_for(lambda: (tmp_path / "ended-held").exists(), "the released call to end")


def test_client_disconnect_cancels_processing(start_server, tmp_path):
    server = start_server("workspace.fns:SleepyReward", env={"TEST_MARKER_DIR": str(tmp_path)})
    with pytest.raises(httpx.ReadTimeout):
        server.post(reward_body(sleep=5, tag="gone"), timeout=0.5)
    deadline = time.monotonic() + 5
    while not (tmp_path / "cancelled-gone").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "cancelled-gone").exists()
    assert not (tmp_path / "finished-gone").exists()
    server.wait_output("CLIENT_DISCONNECTED")


def test_sync_process_does_not_block_health_or_async_work(start_server, tmp_path):
    server = start_server(
        "workspace.stopping:BlockingSyncReward",
        "--threads",
        "4",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(server.post, reward_body(tag="slow"))
        wait_for(lambda: (tmp_path / "started-slow").exists(), "the sync call to start")
        assert server.client.get("/health").status_code == 200
        assert not slow.done()  # /health answered while the sync call held its thread
        (tmp_path / "release").touch()
        assert slow.result().status_code == 200


def test_slow_setup_reports_starting_then_healthy(start_server):
    server = start_server(
        "workspace.fns:SlowSetupReward", ready=False, env={"TEST_SETUP_SECONDS": "1.5"}
    )
    server.wait_listening()
    starting = server.client.get("/health")
    assert starting.status_code == 503
    assert starting.json()["status"] == "starting"
    assert_error(server.post(reward_body()), 503, "NOT_READY")
    server.wait_ready()
    assert server.client.get("/health").json()["status"] == "healthy"
    assert server.post(reward_body()).status_code == 200


def test_failing_setup_exits_non_zero_with_one_clear_line(start_server):
    server = start_server("workspace.fns:FailingSetupReward", ready=False)
    assert server.proc.wait(20) == 3
    output = server.output()
    assert (
        "FailingSetupReward.setup() failed: RuntimeError: model file weights.bin not found"
        in output
    )
    assert "Traceback" not in output


def test_sigterm_drains_requests_in_flight(start_server, tmp_path):
    server = start_server(
        "workspace.fns:ShutdownHookReward", env={"TEST_MARKER_DIR": str(tmp_path)}
    )
    with ThreadPoolExecutor(4) as pool:
        in_flight = [pool.submit(server.post, reward_body(sleep=1.5, tag=str(i))) for i in range(3)]
        deadline = time.monotonic() + 20  # all three in flight before the signal
        while len(list(tmp_path.glob("started-*"))) < 3:
            assert time.monotonic() < deadline, "the requests did not start"
            time.sleep(0.02)
        stopper = threading.Thread(target=server.terminate)
        stopper.start()
        responses = [f.result() for f in in_flight]
        stopper.join()
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert server.proc.returncode == 0
    assert Path(tmp_path / "shutdown-hook").read_text() == "ran"


def test_an_input_model_completed_by_setup_is_served(start_server):
    # its validator exists only once setup() has rebuilt it: read per request, not at start
    server = start_server("workspace.fns:LazyModelReward")
    response = server.post({**reward_body(), "judge": {"model": "x"}})
    assert response.status_code == 200, response.text
    assert response.json()["reward"]["reward_score"] == 1.0
    assert server.post(reward_body()).json()["reward"]["reward_score"] == 0.0
    assert server.post({**reward_body(), "judge": 5}).status_code == 422
