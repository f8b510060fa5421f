"""Deadlines and stops that hold whatever user code does, stuck-call accounting, health that
means "can serve", and process isolation that one odd exception cannot break. Each test
drives a real server subprocess over HTTP and waits on conditions, never on fixed sleeps."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from conftest import Server, reward_body
from helpers import metric, wait_for

MODAL = "workspace.stopping:ModalReward"
BLOCKING = "workspace.stopping:BlockingSyncReward"
CROSSING = "workspace.stopping:CrossingReward"


def gauge(server, name: str) -> float:
    return metric(server.client.get("/metrics").text, name)


def markers(directory: Path, prefix: str) -> int:
    return len(list(directory.glob(f"{prefix}-*")))


def in_background(call: Callable[[], httpx.Response]) -> tuple[ThreadPoolExecutor, object]:
    pool = ThreadPoolExecutor(1)
    return pool, pool.submit(call)


# --- the deadline fires once, for real ------------------------------------------------


def test_a_swallowed_cancellation_still_gets_its_504_at_the_deadline(start_server, tmp_path):
    server = start_server(MODAL, "--timeout", "1", env={"TEST_MARKER_DIR": str(tmp_path)})
    # timeout: far below the 30 s the task sleeps once it has swallowed the cancellation
    response = server.post(reward_body(mode="swallow-once", tag="a"), timeout=20)
    assert response.status_code == 504, response.text
    assert response.json()["error_code"] == "DEADLINE_EXCEEDED"
    # the task was cancelled again at its next await instead of sleeping its 30 s
    wait_for(lambda: (tmp_path / "ended-a").exists(), "the task to end", timeout=10)
    assert (tmp_path / "ended-a").read_text() == "cancelled"
    assert server.post(reward_body(mode="ok")).status_code == 200


def test_a_task_that_ignores_every_cancellation_is_answered_and_counted_stuck(
    start_server, tmp_path
):
    server = start_server(
        MODAL, "--timeout", "1", "--threads", "1", env={"TEST_MARKER_DIR": str(tmp_path)}
    )
    # the task runs until released: only the deadline can answer this
    response = server.post(reward_body(mode="swallow-always", tag="a"), timeout=60)
    assert response.status_code == 504, response.text
    wait_for(lambda: gauge(server, "rl_function_stuck_sync_calls") == 1, "the stuck gauge")
    health = server.client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "unhealthy"
    assert "stuck" in health.json()["reason"]
    assert not (tmp_path / "ended-a").exists()
    (tmp_path / "release").write_text("go")
    wait_for(lambda: gauge(server, "rl_function_stuck_sync_calls") == 0, "the task to end")
    assert server.client.get("/health").status_code == 200
    server.wait_output("ignores its cancellation")
    server.wait_output("a stuck async process() ended after")
    text = server.client.get("/metrics").text
    assert (
        metric(text, "rl_function_requests_total", 'func_type="reward",path="/api/v1",status="504"')
        == 1
    )


# --- slots, the queue and stuck counts ------------------------------------------------


def test_slot_comes_back_after_500_and_504_at_concurrency_1(start_server, tmp_path):
    server = start_server(
        MODAL,
        "--concurrency",
        "1",
        "--queue",
        "0",
        "--timeout",
        "1",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    for _ in range(3):
        failed = server.post(reward_body(mode="raise"))
        assert failed.status_code == 500, failed.text
        timed_out = server.post(reward_body(mode="sleep", sleep=30))
        assert timed_out.status_code == 504, timed_out.text
        ok = server.post(reward_body(mode="ok"))
        assert ok.status_code == 200, ok.text  # a leaked slot makes this wait and 504
    assert gauge(server, "rl_function_requests_in_flight") == 0


def test_queued_gauge_counts_requests_waiting_for_a_slot(start_server, tmp_path):
    server = start_server(
        MODAL, "--concurrency", "1", "--queue", "5", env={"TEST_MARKER_DIR": str(tmp_path)}
    )
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(server.post, reward_body(mode="block", tag="first"))
        wait_for(lambda: (tmp_path / "started-first").exists(), "the first to hold the slot")
        rest = [pool.submit(server.post, reward_body(mode="block", tag=f"q{i}")) for i in (1, 2)]
        wait_for(lambda: gauge(server, "rl_function_requests_queued") == 2, "two queued")
        assert gauge(server, "rl_function_requests_in_flight") == 1
        assert markers(tmp_path, "started") == 1  # the queued ones have not started
        (tmp_path / "release").write_text("go")
        assert [f.result().status_code for f in [first, *rest]] == [200, 200, 200]
    assert gauge(server, "rl_function_requests_queued") == 0
    assert gauge(server, "rl_function_requests_in_flight") == 0


def test_calls_cancelled_while_waiting_for_a_thread_are_not_stuck(start_server, tmp_path):
    server = start_server(
        BLOCKING,
        "--threads",
        "2",
        "--concurrency",
        "8",
        "--timeout",
        "1",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    with ThreadPoolExecutor(8) as pool:
        statuses = [
            f.result().status_code
            for f in [pool.submit(server.post, reward_body(tag=str(i))) for i in range(8)]
        ]
    assert statuses == [504] * 8
    # --threads bounds the threads running user code: only two calls ever started
    assert markers(tmp_path, "started") == 2
    assert gauge(server, "rl_function_stuck_sync_calls") == 2
    health = server.client.get("/health")
    assert health.status_code == 503, health.text
    assert health.json()["status"] == "unhealthy" and "--threads is 2" in health.json()["reason"]
    # /metrics never waits behind user code, even with every user thread stuck (until
    # released below)
    assert server.client.get("/metrics", timeout=10).status_code == 200
    (tmp_path / "release").write_text("go")
    wait_for(lambda: gauge(server, "rl_function_stuck_sync_calls") == 0, "stuck calls to return")
    assert server.client.get("/health").status_code == 200
    assert server.post(reward_body(tag="after")).status_code == 200


def test_metrics_answer_while_the_only_user_thread_is_busy(start_server, tmp_path):
    server = start_server(
        BLOCKING, "--threads", "1", "--timeout", "60", env={"TEST_MARKER_DIR": str(tmp_path)}
    )
    pool, busy = in_background(lambda: server.post(reward_body(tag="busy"), timeout=60))
    try:
        wait_for(lambda: (tmp_path / "started-busy").exists(), "the only thread to be busy")
        response = server.client.get("/metrics", timeout=10)
        assert response.status_code == 200
        assert metric(response.text, "rl_function_requests_in_flight") == 1
    finally:
        (tmp_path / "release").write_text("go")
        assert busy.result().status_code == 200
        pool.shutdown()


# --- stopping -------------------------------------------------------------------------


def test_sigterm_exits_although_a_sync_call_is_stuck(start_server, tmp_path):
    server = start_server(
        BLOCKING, "--timeout", "0.5", "--grace", "2", env={"TEST_MARKER_DIR": str(tmp_path)}
    )
    assert server.post(reward_body(tag="stuck")).status_code == 504
    assert gauge(server, "rl_function_stuck_sync_calls") == 1
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(20) == 0
    assert not (tmp_path / "ended-stuck").exists()  # it was still stuck when we exited


def test_sigterm_exits_during_a_hung_sync_setup(start_server, tmp_path):
    server = start_server(
        "workspace.stopping:HungSetupReward",
        "--grace",
        "2",
        ready=False,
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    wait_for(lambda: (tmp_path / "setup-started").exists(), "setup() to start")
    server.wait_listening()
    assert server.client.get("/health").json()["status"] == "starting"
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(20) == 0


def test_a_request_past_grace_gets_json_503_and_one_log_line(start_server, tmp_path):
    server = start_server(MODAL, "--grace", "1", env={"TEST_MARKER_DIR": str(tmp_path)})
    pool, pending = in_background(lambda: server.post(reward_body(mode="block", tag="long")))
    try:
        wait_for(lambda: (tmp_path / "started-long").exists(), "the request to be in flight")
        server.proc.send_signal(signal.SIGTERM)
        response = pending.result()
    finally:
        pool.shutdown()
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error_code"] == "DRAINING"
    assert server.proc.wait(20) == 0
    output = server.output()
    assert "Traceback" not in output and "CancelledError" not in output, output
    assert output.count(" 503 ") == 1 and "DRAINING" in output


def test_sigterm_answers_and_exits_past_a_task_that_ignores_cancellation(start_server, tmp_path):
    server = start_server(MODAL, "--grace", "1", env={"TEST_MARKER_DIR": str(tmp_path)})
    pool, pending = in_background(
        lambda: server.post(reward_body(mode="swallow-always", tag="s"), timeout=60)
    )
    try:
        wait_for(lambda: (tmp_path / "started-s").exists(), "the request to be in flight")
        server.proc.send_signal(signal.SIGTERM)
        response = pending.result()
    finally:
        pool.shutdown()
    assert response.status_code == 503, response.text
    assert response.json()["error_code"] == "DRAINING"
    assert server.proc.wait(20) == 0
    assert not (tmp_path / "ended-s").exists()  # it never gave in; the process left it


def test_shutdown_under_process_isolation_kills_the_children(start_server, tmp_path):
    server = start_server(
        CROSSING,
        "--isolation",
        "process",
        "--processes",
        "1",
        "--grace",
        "1",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    child = int(server.post(reward_body(mode="ok")).json()["reward"]["reward_score"])
    pool, pending = in_background(lambda: server.post(reward_body(mode="hang")))
    try:
        wait_for(lambda: markers(tmp_path, "started") == 1, "the hung call to start")
        server.proc.send_signal(signal.SIGTERM)
        response = pending.result()
    finally:
        pool.shutdown()
    assert response.status_code == 503 and response.json()["error_code"] == "DRAINING"
    assert server.proc.wait(20) == 0
    assert "Traceback" not in server.output()

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(lambda: gone(child), f"isolation process {child} to be gone", timeout=10)


# --- process isolation and health -----------------------------------------------------


def test_an_exception_that_cannot_be_unpickled_does_not_break_process_isolation(
    start_server, tmp_path
):
    server = start_server(
        CROSSING,
        "--isolation",
        "process",
        "--processes",
        "1",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    with ThreadPoolExecutor(4) as pool:
        bad = [pool.submit(server.post, reward_body(mode="http-error")) for _ in range(2)]
        good = [pool.submit(server.post, reward_body(mode="ok")) for _ in range(2)]
        for future in bad:
            response = future.result()
            assert response.status_code == 500, response.text
            assert response.json()["error"].startswith("HTTPStatusError: Client error '429")
        for future in good:
            assert future.result().status_code == 200, future.result().text
    unpicklable = server.post(reward_body(mode="unpicklable"))
    assert unpicklable.status_code == 500
    assert "cannot be sent back from its isolation process" in unpicklable.json()["error"]
    for _ in range(3):
        assert server.post(reward_body(mode="ok")).status_code == 200
    assert server.client.get("/health").status_code == 200
    assert "BrokenProcessPool" not in server.output()


def test_a_broken_isolation_pool_says_unhealthy_and_is_rebuilt(start_server, tmp_path):
    server = start_server(
        CROSSING,
        "--isolation",
        "process",
        "--processes",
        "1",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    child = int(server.post(reward_body(mode="ok")).json()["reward"]["reward_score"])
    (tmp_path / "slow-setup").write_text("hold the rebuilt pool's setup()")
    os.kill(child, signal.SIGKILL)  # an idle child killed (the OOM killer) breaks pebble's pool
    wait_for(lambda: server.client.get("/health").status_code == 503, "/health to say 503")
    health = server.client.get("/health").json()
    assert health["status"] == "unhealthy"
    assert "isolation process pool broke" in health["reason"], health
    # a request meanwhile waits for the rebuilt pool instead of failing
    pool, pending = in_background(lambda: server.post(reward_body(mode="ok")))
    try:
        (tmp_path / "slow-setup").unlink()
        response = pending.result()
    finally:
        pool.shutdown()
    assert response.status_code == 200, response.text
    assert response.json()["reward"]["reward_score"] != child
    wait_for(lambda: server.client.get("/health").status_code == 200, "the pool to be rebuilt")
    server.wait_output("rebuilt and serves again")


def test_an_unhealthy_supervised_worker_is_replaced(start_server, tmp_path):
    server = start_server(
        BLOCKING,
        "--workers",
        "2",
        "--threads",
        "1",
        "--timeout",
        "0.5",
        "--grace",
        "2",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    wait_for(lambda: server.output().count("ready: BlockingSyncReward") == 2, "two workers")
    with httpx.Client(base_url=server.url) as fresh:
        assert fresh.post("/api/v1", json=reward_body(tag="stuck")).status_code == 504
    wait_for(
        lambda: "stopping this worker so that a fresh one replaces it" in server.output(),
        "the stuck worker to stop itself",
    )
    wait_for(lambda: server.output().count("ready: BlockingSyncReward") == 3, "its replacement")
    (tmp_path / "release").write_text("go")
    assert server.terminate() == 0


# ---- every thread stuck, late answers, an isolation process whose setup() fails ----

FNS = "workspace.odd_fns"  # user code that leaks its key or fails in odd ways


def test_with_every_thread_stuck_requests_are_refused_at_once(start_server):
    server = start_server(f"{FNS}:SleepsSync", "--threads", "1", "--timeout", "1")
    assert server.post(reward_body(sleep=20)).status_code == 504
    deadline = time.monotonic() + 30
    while server.client.get("/health").status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # refused, not queued for a thread: a queued request would end in a 504 at --timeout
    response = server.post(reward_body())
    assert response.status_code == 503, response.text
    assert response.json()["error_code"] == "UNHEALTHY"
    assert response.headers["retry-after"] == "1"


def test_a_trainer_sample_that_swallows_cancellation_is_no_api_v1_504(start_server):
    server = start_server(f"{FNS}:SwallowsCancellation", "--timeout", "1")
    answer = server.client.post("/slime/reward", json={"prompt": "p", "response": "x"})
    assert answer.status_code == 200 and answer.json() == 0.0  # slime without a reward key
    server.wait_output("ignores its cancellation")
    assert "POST /api/v1" not in server.output()
    assert not [m for m in metric_lines(server, "rl_function_requests_total") if "504" in m]


def test_a_late_answers_latency_is_when_it_was_sent(start_server):
    server = start_server(f"{FNS}:SwallowsCancellation", "--timeout", "1", "--log-format", "json")
    response = server.post(reward_body(hold=30))
    assert response.status_code == 504
    output = server.wait_output('"status":504')
    line = next(json.loads(x) for x in output.splitlines() if '"status":504' in x)
    assert line["elapsed_ms"] < 30_000, line  # answered at 1 s; the task runs on to 30 s


def test_a_replacement_isolation_process_failing_setup_is_unhealthy_and_retried(
    start_server, tmp_path
):
    server = start_server(
        f"{FNS}:SetupFailsWhenMarked",
        "--isolation",
        "process",
        "--processes",
        "1",
        "--timeout",
        "2",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    first = server.post(reward_body()).json()["reward"]["reward_score"]
    (tmp_path / "fail-setup").write_text("")  # the replacement's setup() fails
    # past its deadline the child is killed; the one started in its place fails setup()
    assert server.post(reward_body(sleep=30)).status_code == 504
    deadline = time.monotonic() + 60
    while (health := server.client.get("/health")).status_code == 200:
        assert time.monotonic() < deadline, "never unhealthy: " + health.text
        server.post(reward_body())  # reaches the failed child: noticed
        time.sleep(0.05)
    assert "setup()" in health.json()["reason"], health.json()
    # refused at once: one queued for the child would end in a 504 at --timeout
    refused = server.post(reward_body())
    assert refused.status_code == 503 and refused.json()["error_code"] == "UNHEALTHY"
    (tmp_path / "fail-setup").unlink()  # the next try (with backoff) succeeds
    while server.client.get("/health").status_code != 200:
        assert time.monotonic() < deadline + 60, server.output()[-3000:]
        time.sleep(0.1)
    answer = server.post(reward_body())
    assert answer.status_code == 200 and answer.json()["reward"]["reward_score"] != first


def metric_lines(server: Server, name: str) -> list[str]:
    text = server.client.get("/metrics").text
    return [line for line in text.splitlines() if line.startswith(name)]
