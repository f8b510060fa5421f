"""No wedged worker: metrics, stuck sync calls, process isolation, dying workers, drain
under load. Each test drives a real server subprocess over HTTP."""

from __future__ import annotations

import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from conftest import SAMPLES, reward_body


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = (
        re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" ([0-9.e+-]+)"
    )
    found = re.search(pattern, text)
    assert found, f"{name}{{{labels}}} not in /metrics"
    return float(found.group(1))


def test_metrics_count_requests_by_status(start_server):
    server = start_server("workspace.fns:EchoReward", "--max-body", "1000")
    for _ in range(3):
        assert server.post(reward_body()).status_code == 200
    assert server.post(b"{").status_code == 400
    assert server.post({"func_type": "reward"}).status_code == 422
    response = server.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert metric(text, "rl_function_requests_total", 'func_type="reward",status="200"') == 3
    assert metric(text, "rl_function_requests_total", 'func_type="reward",status="400"') == 1
    assert metric(text, "rl_function_requests_total", 'func_type="reward",status="422"') == 1
    assert metric(text, "rl_function_request_duration_seconds_count", 'func_type="reward"') == 5
    assert metric(text, "rl_function_requests_in_flight") == 0
    assert metric(text, "rl_function_rejected_total") == 0


def test_metrics_add_up_across_workers(start_server):
    server = start_server("workspace.fns:EchoReward", "--workers", "2")
    deadline = time.monotonic() + 20
    while server.output().count("ready: EchoReward") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    for _ in range(20):
        with httpx.Client(base_url=server.url) as fresh:  # new connections spread over workers
            assert fresh.post("/api/v1", json=reward_body()).status_code == 200
    text = server.client.get("/metrics").text
    assert metric(text, "rl_function_requests_total", 'func_type="reward",status="200"') == 20


def test_overload_and_timeouts_are_counted(start_server, tmp_path):
    server = start_server(
        "workspace.fns:SleepyReward",
        "--concurrency",
        "1",
        "--queue",
        "0",
        "--timeout",
        "0.5",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    with ThreadPoolExecutor(3) as pool:
        statuses = sorted(
            f.result().status_code
            for f in [pool.submit(server.post, reward_body(sleep=2, tag=str(i))) for i in range(3)]
        )
    assert statuses == [503, 503, 504]
    text = server.client.get("/metrics").text
    assert metric(text, "rl_function_rejected_total") == 2
    assert metric(text, "rl_function_timeouts_total") == 1


def test_stuck_sync_call_is_answered_counted_and_logged(start_server):
    server = start_server("workspace.fns:SyncSleepyReward", "--timeout", "0.5")
    started = time.monotonic()
    assert server.post(reward_body(sleep=2.5)).status_code == 504
    assert time.monotonic() - started < 2
    assert metric(server.client.get("/metrics").text, "rl_function_stuck_sync_calls") == 1
    assert "stays stuck until it returns" in server.output()
    assert server.post(reward_body(sleep=0)).status_code == 200  # the slot came back
    time.sleep(2.5)
    assert metric(server.client.get("/metrics").text, "rl_function_stuck_sync_calls") == 0
    assert "stuck sync process() returned after" in server.output()


def test_process_isolation_kills_a_hung_call_and_frees_its_slot(start_server, tmp_path):
    server = start_server(
        "workspace.fns:HangingReward",
        "--isolation",
        "process",
        "--processes",
        "1",
        "--timeout",
        "1",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    first_child = server.post(reward_body()).json()["reward"]["reward_score"]
    started = time.monotonic()
    hung = server.post(reward_body(hang=True))
    assert hung.status_code == 504 and hung.json()["error_code"] == "DEADLINE_EXCEEDED"
    assert time.monotonic() - started < 3
    # With one child, this only answers if the hung child was killed and replaced.
    after = server.post(reward_body())
    assert after.status_code == 200
    assert after.json()["reward"]["reward_score"] != first_child
    assert "isolation process was killed and replaced" in server.output()
    assert len(list(tmp_path.glob("setup-*"))) >= 2  # setup() ran in each child
    assert server.terminate() == 0


def test_process_isolation_runs_decorated_sync_sub_rewards(start_server):
    server = start_server(
        "functions.reward.safety:SafetyProcessor",
        "--isolation",
        "process",
        "--processes",
        "2",
        workspace=SAMPLES,
    )
    import json

    body = json.loads((SAMPLES / "requests" / "reward.json").read_text())
    reward = server.post(body).json()["reward"]
    assert reward["reward_score"] == 1.0
    assert reward["reward_metrics"]["no_unsafe_content"] == 1.0


def test_a_dead_worker_is_replaced_while_the_others_serve(start_server):
    server = start_server("workspace.fns:DyingReward", "--workers", "2")
    deadline = time.monotonic() + 20
    while server.output().count("ready: DyingReward") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        with httpx.Client(base_url=server.url) as fresh:
            fresh.post("/api/v1", json=reward_body(die=True))
    except httpx.TransportError:
        pass  # its worker is gone mid-request
    served = 0
    for _ in range(10):  # meanwhile the surviving worker answers
        with httpx.Client(base_url=server.url) as fresh:
            served += fresh.post("/api/v1", json=reward_body()).status_code == 200
    assert served == 10
    deadline = time.monotonic() + 20
    while server.output().count("ready: DyingReward") < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "died (exit code 1); starting a replacement" in server.output()
    assert server.output().count("ready: DyingReward") == 3
    assert server.terminate() == 0


def test_sigterm_under_load_cuts_no_accepted_request(start_server, tmp_path):
    server = start_server(
        "workspace.fns:SleepyReward",
        "--concurrency",
        "8",
        "--queue",
        "100",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )

    def one(tag: int) -> tuple[int, object]:
        try:
            with httpx.Client(base_url=server.url, timeout=30) as client:
                response = client.post("/api/v1", json=reward_body(sleep=0.4, tag=str(tag)))
                return tag, (response.status_code, response.json())
        except httpx.TransportError as exc:
            return tag, exc

    with ThreadPoolExecutor(40) as pool:
        futures = [pool.submit(one, i) for i in range(40)]
        time.sleep(0.6)
        server.proc.send_signal(signal.SIGTERM)
        results = dict(f.result() for f in futures)
    assert server.proc.wait(30) == 0
    answered = {tag for tag, r in results.items() if isinstance(r, tuple) and r[0] == 200}
    finished = {int(p.name.split("-", 1)[1]) for p in tmp_path.glob("finished-*")}
    assert answered, "no request was served before the signal"
    # every request the processor finished was answered in full, and none was cancelled
    assert finished == answered
    assert not list(tmp_path.glob("cancelled-*"))
    for tag, result in results.items():
        if isinstance(result, tuple):
            assert result[0] in (200, 503), (tag, result)
            if result[0] == 200:
                assert result[1]["reward"]["reward_score"] == 1.0
