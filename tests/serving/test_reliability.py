"""No wedged worker: metrics, stuck sync calls, process isolation, dying workers, drain
under load. Each test drives a real server subprocess over HTTP."""

from __future__ import annotations

import concurrent.futures
import gc
import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import SAMPLES, alive, descendants, proc_stat, reward_body, wait_gone
from helpers import metric, wait_for

API = 'func_type="reward",path="/api/v1"'  # the labels of /api/v1's requests


def wait_for_files(directory: Path, pattern: str, count: int, timeout: float = 60) -> list[Path]:
    """The marker files a processor writes: work is in flight once they exist."""
    deadline = time.monotonic() + timeout
    while len(found := sorted(directory.glob(pattern))) < count:
        assert time.monotonic() < deadline, f"{count} x {pattern} not written within {timeout}s"
        time.sleep(0.02)
    return found


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
    assert metric(text, "rl_function_requests_total", f'{API},status="200"') == 3
    assert metric(text, "rl_function_requests_total", f'{API},status="400"') == 1
    assert metric(text, "rl_function_requests_total", f'{API},status="422"') == 1
    assert metric(text, "rl_function_request_duration_seconds_count", 'func_type="reward"') == 5
    # the _created series prometheus-client's own counters and histograms have
    assert metric(text, "rl_function_requests_created", f'{API},status="200"') > 0
    assert metric(text, "rl_function_request_duration_seconds_created", 'func_type="reward"') > 0
    assert metric(text, "rl_function_requests_in_flight") == 0
    assert metric(text, "rl_function_rejected_total") == 0


def test_a_worker_starts_beside_another_workers_metrics_file_not_yet_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --workers, a worker made its metrics while another had just created its file,
    still empty: reading it at registration killed the starting worker (seen in CI)."""
    from runtime.serving.metrics import Metrics

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    (tmp_path / "counter_12345.db").touch()  # created, not yet sized
    metrics = Metrics("reward", lambda: (0, 0, 0))
    assert metrics.registry is not None


# the third threshold the server sets where CPython's collector has one (3.14's has not)
FULL_AFTER = 100 if gc.get_threshold()[2] else 0


@pytest.mark.parametrize(
    ("workers", "target", "full_after"),
    [
        ("1", "GcReward", FULL_AFTER),
        ("2", "GcReward", FULL_AFTER),
        ("1", "GcChoosingReward", 10),  # its setup() chose CPython's own: it stands
        ("2", "GcChoosingReward", 10),
    ],
)
def test_a_ready_worker_keeps_startup_out_of_the_cyclic_collector(
    start_server, workers, target, full_after
):
    """Once setup() is done, what startup left (its 20,000 dicts too) is frozen: full
    collections no longer walk it under load. And they are considered ten times more
    rarely than CPython's default, unless user code chose otherwise."""
    server = start_server(f"workspace.fns:{target}", "--workers", workers)
    server.wait_output(f"ready: {target}", int(workers))
    answered: set[float] = set()
    for _ in range(200):  # fresh connections until each worker has answered
        with httpx.Client(base_url=server.url) as fresh:
            metrics = fresh.post("/api/v1", json=reward_body()).json()["reward"]["reward_metrics"]
        assert metrics["table_frozen"] == 1.0, metrics
        assert metrics["full_after"] == full_after, metrics
        answered.add(metrics["pid"])
        if len(answered) == int(workers):
            break
    assert len(answered) == int(workers), answered
    assert server.terminate() == 0  # (and the workers' shared metrics directory goes)


def test_metrics_add_up_across_workers(start_server):
    server = start_server("workspace.fns:EchoReward", "--workers", "2")
    server.wait_output("ready: EchoReward", 2)
    for _ in range(20):
        with httpx.Client(base_url=server.url) as fresh:  # new connections spread over workers
            assert fresh.post("/api/v1", json=reward_body()).status_code == 200
    text = server.client.get("/metrics").text
    assert metric(text, "rl_function_requests_total", f'{API},status="200"') == 20
    results = 'error_code="",route="/api/v1",status="success"'
    assert metric(text, "rl_function_results_total", results) == 20
    assert server.terminate() == 0  # and its shared metrics directory goes with it


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
    assert server.post(reward_body(sleep=2.5)).status_code == 504
    # answered while the call still ran: it is counted stuck until it returns
    assert metric(server.client.get("/metrics").text, "rl_function_stuck_sync_calls") == 1
    server.wait_output("stays stuck until it returns")
    assert server.post(reward_body(sleep=0)).status_code == 200  # the slot came back
    wait_for(
        lambda: metric(server.client.get("/metrics").text, "rl_function_stuck_sync_calls") == 0,
        "the stuck call to return",
    )
    server.wait_output("stuck sync process() returned after")


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
    hung = server.post(reward_body(hang=True))  # it never returns: only the deadline answers
    assert hung.status_code == 504 and hung.json()["error_code"] == "DEADLINE_EXCEEDED"
    # The replacement child spawns and runs setup() outside any request's deadline: wait
    # for it, so that the 1 s deadline below only has to cover the call itself.
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("setup-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(list(tmp_path.glob("setup-*"))) >= 2  # setup() ran in each child
    # With one child, this only answers if the hung child was killed and replaced.
    after = server.post(reward_body())
    assert after.status_code == 200, after.text
    assert after.json()["reward"]["reward_score"] != first_child
    server.wait_output("isolation process was killed and replaced")
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

    body = json.loads((SAMPLES / "requests" / "reward.json").read_text())
    reward = server.post(body).json()["reward"]
    assert reward["reward_score"] == 1.0
    assert reward["reward_metrics"]["no_unsafe_content"] == 1.0


def test_a_dead_worker_is_replaced_while_the_others_serve(start_server):
    server = start_server("workspace.fns:DyingReward", "--workers", "2")
    server.wait_output("ready: DyingReward", 2)
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
    server.wait_output("ready: DyingReward", 3)
    server.wait_output("died (exit code 1); starting a replacement")
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
        wait_for_files(tmp_path, "started-*", 8)  # every slot busy, the queue filling
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


# --- supervision of --workers N -------------------------------------------------------


def workers_of(server) -> set[int]:  # type: ignore[no-untyped-def]
    """The supervisor's worker processes (not multiprocessing's resource tracker)."""
    found = set()
    for pid in descendants(server.proc.pid):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
        except OSError:
            pass
    return found


def test_a_worker_that_stops_on_its_own_is_replaced_while_it_drains(start_server, tmp_path):
    # A worker that found itself unhealthy drains and exits (serving.server); SIGTERM sent to
    # one worker takes the same path. Its replacement must not wait for the drain to end.
    server = start_server(
        "workspace.fns:SleepyReward", "--workers", "2", env={"TEST_MARKER_DIR": str(tmp_path)}
    )
    server.wait_output("ready: SleepyReward", 2)
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=server.url, timeout=60) as fresh:
        long = pool.submit(fresh.post, "/api/v1", json=reward_body(sleep=10, tag="long"))
        (marker,) = wait_for_files(tmp_path, "started-long", 1)
        draining = int(marker.read_text())
        os.kill(draining, signal.SIGTERM)
        server.wait_output("ready: SleepyReward", 3)
        assert alive(draining), "the replacement started only once the old worker was gone"
        assert long.result().status_code == 200  # and the old one finished its request
    server.wait_output(f"worker [{draining}] is draining; starting a replacement")
    assert server.terminate() == 0


def test_workers_exit_when_the_supervisor_is_killed(start_server):
    server = start_server("workspace.fns:EchoReward", "--workers", "2", "--grace", "2")
    server.wait_output("ready: EchoReward", 2)
    tree = descendants(server.proc.pid)
    assert len(workers_of(server)) == 2
    server.proc.kill()  # SIGKILL: the supervisor can clean up nothing itself
    server.proc.wait(10)
    left = wait_gone(tree, timeout=15)
    assert not left, f"still running 15s after the supervisor was killed: {left}"
    with pytest.raises(httpx.TransportError):  # nobody holds the socket any more
        httpx.get(f"{server.url}/health", timeout=2)
    server.wait_output("the supervisor is gone; stopping", count=2)
    # the conftest check then finds no temp file left: the orphans removed the metrics dir


def test_a_worker_that_dies_in_setup_is_restarted_with_backoff_then_given_up(
    start_server, tmp_path
):
    server = start_server(
        "workspace.fns:CrashingSetupReward",
        "--workers",
        "2",
        ready=False,
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    started = time.monotonic()
    try:
        code = server.proc.wait(60)
    except subprocess.TimeoutExpired:
        code = None
    tries = len(list(tmp_path.glob("crash-setup-*")))
    output = server.output()
    assert code == 3, f"exit {code} after {tries} tries in {time.monotonic() - started:.0f}s"
    assert 3 <= tries <= 6, tries  # a few restarts, not dozens
    delays = [float(d) for d in re.findall(r"restarting in ([0-9.]+)s", output)]
    assert delays == sorted(delays) and delays[-1] >= 2 * delays[0], delays  # backing off
    assert "5 in a row, giving up" in output


def test_a_worker_whose_event_loop_is_blocked_is_replaced(start_server, tmp_path):
    server = start_server(
        "workspace.fns:LoopBlockingReward",
        "--workers",
        "2",
        "--heartbeat-timeout",
        "1.5",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    server.wait_output("ready: LoopBlockingReward", 2)

    def blocked_request() -> object:
        try:
            with httpx.Client(base_url=server.url, timeout=60) as fresh:
                return fresh.post("/api/v1", json=reward_body(sleep=60)).status_code
        except httpx.TransportError as exc:
            return exc

    with ThreadPoolExecutor(1) as pool:
        blocked = pool.submit(blocked_request)
        (marker,) = wait_for_files(tmp_path, "blocking-*", 1)
        blocked_pid = int(marker.name.split("-")[1])
        health = []  # /health keeps answering from the other worker meanwhile
        deadline = time.monotonic() + 30
        while server.output().count("ready: LoopBlockingReward") < 3:
            assert time.monotonic() < deadline, f"not replaced within 30s: {health}"
            with httpx.Client(base_url=server.url) as fresh:
                health.append(fresh.get("/health", timeout=10).status_code)
            time.sleep(0.05)
        assert isinstance(blocked.result(timeout=30), httpx.TransportError)  # its worker was killed
    assert not alive(blocked_pid)
    # the live worker answered each (one the blocked worker took would have been reset)
    assert health and all(status == 200 for status in health), health
    server.wait_output(f"worker [{blocked_pid}]: event loop blocked for")
    assert server.terminate() == 0


def test_sigterm_stops_all_workers_within_one_grace(start_server, tmp_path):
    server = start_server(
        "workspace.fns:LoopBlockingReward",
        "--workers",
        "2",
        "--grace",
        "1",
        "--heartbeat-timeout",
        "120",  # this test is about the shared stop deadline, not the heartbeat
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    server.wait_output("ready: LoopBlockingReward", 2)

    def blocked_request() -> None:
        try:
            with httpx.Client(base_url=server.url, timeout=60) as fresh:
                fresh.post("/api/v1", json=reward_body(sleep=40))
        except httpx.TransportError:
            pass

    with ThreadPoolExecutor(2) as pool:
        pool.submit(blocked_request)
        wait_for_files(tmp_path, "blocking-*", 1)
        pool.submit(blocked_request)  # a blocked worker accepts nothing: this goes to the other
        wait_for_files(tmp_path, "blocking-*", 2)
        started = time.monotonic()
        code = server.terminate(timeout=60)
        took = time.monotonic() - started
    # Neither worker can drain (its loop is blocked): both are killed once the one shared
    # --grace is over, not after a bound each (which would add SHUTDOWN_SLACK, 30 s, or more).
    assert took < 1 + 15, f"stopping 2 wedged workers took {took:.1f}s"
    assert server.output().count("event loop blocked for") == 2
    assert code == 1  # two accepted requests were never answered


# ---- --workers: a stop past --grace, a worker whose isolation setup fails ----

FNS = "workspace.odd_fns"  # user code that leaks its key or fails in odd ways


@pytest.mark.parametrize(
    "target, extra",
    [
        ("SleepsSync", {"sleep": 8}),
        ("SwallowsCancellation", {"hold": 8}),
        ("WaitsInTheDefaultPool", {"sleep": 4}),  # the loop ends, then waits for the pool
    ],
    ids=["stuck-sync", "swallowing-async", "default-pool"],
)
def test_workers_stopped_past_grace_after_answering_exit_0(start_server, target, extra):
    server = start_server(f"{FNS}:{target}", "--workers", "2", "--grace", "1")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(server.post, reward_body(**extra), timeout=60)
        deadline = time.monotonic() + 30
        while "rl_function_requests_in_flight 1.0" not in server.client.get("/metrics").text:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        response = pending.result()
    assert response.status_code == 503 and response.json()["error_code"] == "DRAINING"
    assert server.proc.wait(60) == 0, server.output()
    assert "killing it" not in server.output()


def test_with_workers_a_worker_whose_isolation_setup_fails_is_replaced(start_server, tmp_path):
    server = start_server(
        f"{FNS}:SetupFailsWhenMarked",
        "--workers",
        "2",
        "--isolation",
        "process",
        "--processes",
        "1",
        "--timeout",
        "2",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )
    server.wait_output("ready: SetupFailsWhenMarked", 2)
    workers = [p for p in descendants(server.proc.pid) if proc_stat(p)[1] == str(server.proc.pid)]
    # the isolation processes of today's workers fail setup() from now on; a fresh worker's do not
    (tmp_path / "fail-setup").write_text(" ".join(map(str, workers)))
    assert server.post(reward_body(sleep=30)).status_code == 504
    deadline = time.monotonic() + 60
    while "so that a fresh one replaces it" not in server.output():
        assert time.monotonic() < deadline, server.output()[-3000:]
        server.post(reward_body())
        time.sleep(0.05)
    server.wait_output("ready: SetupFailsWhenMarked", 3, timeout=60)
    assert server.proc.poll() is None
    assert all(server.post(reward_body()).status_code == 200 for _ in range(4))
    assert server.terminate(60) == 0, server.output()[-3000:]
