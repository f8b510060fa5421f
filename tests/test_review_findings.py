"""Findings of an outside review, each against the real server (a subprocess): the body
budget, secrets in 200 bodies and in lines logged from foreign threads, the JSON log
format, WebSocket upgrades, huge and unprintable error messages, a worker whose threads
are all stuck, late answers on the trainer routes."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import socket
import time
from urllib.parse import quote

import pytest
from conftest import Server, _stat, descendants, reward_body

FNS = "workspace.review_fns"
KEY = "sk-Zm9v/YmFy+baz=qux0123"


def keyed(**extra: object) -> dict:
    return {**reward_body(**extra), "model_resource": {"model_name": "m", "api_key": KEY}}


def assert_no_key(text: str) -> None:
    for form in (KEY, quote(KEY, safe=""), quote(KEY)):
        assert form not in text, text[-3000:]


def metric_lines(server: Server, name: str) -> list[str]:
    text = server.client.get("/metrics").text
    return [line for line in text.splitlines() if line.startswith(name)]


# --- 1: the body budget charges bytes received, not bytes announced ----------------------


def test_stalled_large_announcements_do_not_starve_real_requests(start_server):
    server = start_server(f"{FNS}:SleepsSync", "--max-body", "1000000", "--max-buffered", "2000000")
    stalled = []
    for _ in range(8):  # each announces a whole --max-body and sends one byte
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(
            b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000\r\n\r\n{"
        )
        stalled.append(sock)
    try:
        # the stalled bodies' first bytes have reached the app once /metrics can be read
        server.client.get("/metrics")
        for _ in range(5):
            response = server.post(reward_body())
            assert response.status_code == 200, response.text
    finally:
        for sock in stalled:
            sock.close()


# --- 2: secrets in a 200 body's error ----------------------------------------------------


@pytest.mark.parametrize("target", ["KeyInSubRewardError", "ReturnsFailedWithKey"])
def test_a_failed_outputs_error_never_carries_the_key(start_server, target):
    server = start_server(f"{FNS}:{target}", "--sub-reward-errors", "fail")
    response = server.post(keyed())
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "failed" and body["error"]
    assert_no_key(response.text)
    assert "**********" in body["error"]


# --- 4, 5: lines logged from threads the runtime did not start; the JSON log format ------


def test_foreign_threads_and_warnings_are_scrubbed_and_json_lines_never_break(start_server):
    server = start_server(f"{FNS}:LogsFromForeignThreads", "--log-format", "json")
    assert server.post(keyed()).status_code == 200
    output = server.wait_output("surrogate")
    for text in ("executor", "default pool", "own thread", "warned"):
        server.wait_output(text)
    output = server.output()
    assert_no_key(output)
    assert "Logging error" not in output
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    messages = " ".join(line["message"] for line in lines)
    for text in ("executor **********", "default pool **********", "own thread **********"):
        assert text in messages, messages
    assert "warned **********" in messages
    assert "surrogate \\udcff end" in messages


def test_work_handed_to_self_executor_keeps_its_requests_secrets(start_server):
    server = start_server(f"{FNS}:LogsAfterItsRequest")
    assert server.post(keyed()).status_code == 200
    output = server.wait_output("after the request")
    assert "after the request **********" in output
    assert_no_key(output)


# --- 8: WebSocket upgrades --------------------------------------------------------------


def test_a_websocket_upgrade_is_a_plain_json_answer(start_server):
    pytest.importorskip("websockets")  # installed (test extra): uvicorn would then use it
    server = start_server(f"{FNS}:SleepsSync")
    headers = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    for path in ("/health", "/api/v1", "/nowhere"):
        response = server.client.get(path, headers=headers)
        assert response.headers["content-type"] == "application/json", (path, response.text)
        assert response.status_code in (200, 404, 405)
    output = server.output()
    assert " ERROR " not in output and "upgrade" not in output  # no line per upgrade either


# --- 11, 14: huge and unprintable exception messages -------------------------------------


def test_a_huge_exception_message_makes_a_small_body(start_server):
    server = start_server(f"{FNS}:HugeError")
    response = server.post(reward_body())
    assert response.status_code == 500
    assert len(response.content) < 40_000
    assert "characters cut]" in response.json()["error"]


@pytest.mark.parametrize("kind", ["raises", "none"])
def test_an_unprintable_user_exception_is_a_processor_error(start_server, kind):
    server = start_server(f"{FNS}:OddExceptions")
    body = server.post(reward_body(kind=kind)).json()
    assert body["error_code"] == "PROCESSOR_ERROR", body
    assert "<unprintable>" in body["error"]


# --- 15: every thread stuck: /api/v1 answers 503 at once ---------------------------------


def test_with_every_thread_stuck_requests_are_refused_at_once(start_server):
    server = start_server(f"{FNS}:SleepsSync", "--threads", "1", "--timeout", "1")
    assert server.post(reward_body(sleep=20)).status_code == 504
    deadline = time.monotonic() + 30
    while server.client.get("/health").status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    response = server.post(reward_body())
    assert time.monotonic() - started < 0.9  # not at --timeout
    assert response.status_code == 503, response.text
    assert response.json()["error_code"] == "UNHEALTHY"
    assert response.headers["retry-after"] == "1"


# --- 7, 17: late answers ----------------------------------------------------------------


def test_a_trainer_sample_that_swallows_cancellation_is_no_api_v1_504(start_server):
    server = start_server(f"{FNS}:SwallowsCancellation", "--timeout", "1")
    answer = server.client.post("/slime/reward", json={"prompt": "p", "response": "x"})
    assert answer.status_code == 200 and answer.json() == 0.0  # slime without a reward key
    server.wait_output("ignores its cancellation")
    assert "POST /api/v1" not in server.output()
    assert not [m for m in metric_lines(server, "rl_function_requests_total") if "504" in m]


def test_a_late_answers_latency_is_when_it_was_sent(start_server):
    server = start_server(f"{FNS}:SwallowsCancellation", "--timeout", "1", "--log-format", "json")
    response = server.post(reward_body(hold=3))
    assert response.status_code == 504
    output = server.wait_output('"status":504')
    line = next(json.loads(x) for x in output.splitlines() if '"status":504' in x)
    assert line["elapsed_ms"] < 2000, line  # answered at 1 s; the task ran on to 3 s


# --- 6: --workers, a stop past --grace ---------------------------------------------------


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


# --- 12, 13: what capture and the text scrubbing recognise -------------------------------

PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0123456789\n-----END RSA PRIVATE KEY-----"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLXZhbHVl"


@pytest.mark.parametrize(
    "name",
    ["basic_auth", "http_auth", "proxy_auth", "auth_header", "pass", "passphrase", "conn_str"],
)
def test_capture_blanks_values_under_more_secret_names(name):
    from processors_base.observability._core import capture

    text = capture({name: "hunter2-value", "model": "m"})
    assert "hunter2-value" not in text and '"model":"m"' in text


@pytest.mark.parametrize(
    "text, secret",
    [
        ("DefaultEndpointsProtocol=https;AccountName=a;AccountKey=c2VjcmV0a2V5==;E=x", "c2VjcmV0"),
        ("https://b.s3.example/o?X-Amz-Date=1&X-Amz-Signature=0a1b2c3d4e5f6a7b", "0a1b2c3d"),
        ("headers: Token 9f8e7d6c5b4a39281706", "9f8e7d6c"),
        (f"bearer-less token {JWT} in a line", "eyJzdWIi"),
        (f"key file:\n{PEM}\nend", "MIIEowIB"),
    ],
    ids=["conn-str", "x-amz-signature", "token-scheme", "jwt", "pem"],
)
def test_credential_shapes_are_blanked_in_text_and_captures(text, secret):
    from processors_base.observability._core import capture
    from processors_base.redaction import redact

    assert secret not in redact(text, ())
    assert secret not in capture({"note": text})


def test_prose_that_merely_says_token_is_kept():
    from processors_base.redaction import redact

    assert redact("Token generation failed: too many tokens", ()) == (
        "Token generation failed: too many tokens"
    )


def test_mime_base64_and_double_url_encoding_of_the_key_are_blanked():
    import base64

    from processors_base.redaction import redact

    key = "sk-" + "Zm9v/YmFy+baz=" * 8  # long enough for MIME's line breaks
    mime = base64.encodebytes(key.encode()).decode()
    assert "\n" in mime.rstrip("\n")
    twice = quote(quote(key, safe=""), safe="")
    assert "%252F" in twice
    for text in (mime, twice):
        cleaned = redact(f"sent {text} there", (key,))
        assert "***" in cleaned
        for line in text.split():
            assert line not in cleaned, cleaned


# --- 3: an isolation process whose setup() fails ---------------------------------------


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
    started = time.monotonic()
    refused = server.post(reward_body())
    assert refused.status_code == 503 and refused.json()["error_code"] == "UNHEALTHY"
    assert time.monotonic() - started < 1.5
    (tmp_path / "fail-setup").unlink()  # the next try (with backoff) succeeds
    while server.client.get("/health").status_code != 200:
        assert time.monotonic() < deadline + 60, server.output()[-3000:]
        time.sleep(0.1)
    answer = server.post(reward_body())
    assert answer.status_code == 200 and answer.json()["reward"]["reward_score"] != first


# --- 16: non-finite numbers in free-form output fields ----------------------------------


def test_a_nan_in_a_free_form_output_field_is_invalid_output(start_server):
    server = start_server(f"{FNS}:NanInExtras")
    response = server.post(reward_body())
    assert response.status_code == 500, response.text
    body = response.json()
    assert body["error_code"] == "INVALID_OUTPUT" and "debug.ratios[1]" in body["error"]
    text = server.post(reward_body(text=True))  # the words alone are no number
    assert text.status_code == 200 and text.json()["note"] == "NaN or Infinity"


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
    workers = [p for p in descendants(server.proc.pid) if _stat(p)[1] == str(server.proc.pid)]
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


# --- 9: refusals of the HTTP layer are counted and logged --------------------------------


def test_header_refusals_are_counted_and_logged_once(start_server):
    server = start_server(f"{FNS}:SleepsSync")
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(b"POST /api/v1 HTTP/1.1\r\nHost: x\r\n" + b"a: b\r\n" * 200)
            assert sock.recv(65536).startswith(b"HTTP/1.1 431")
    text = server.client.get("/metrics").text
    assert 'rl_function_protocol_rejections_total{code="HEADERS_TOO_LARGE",status="431"} 3.0' in (
        text
    )
    output = server.wait_output("refused by the HTTP protocol layer")
    assert output.count("refused by the HTTP protocol layer") == 1  # not one line each
    assert "Invalid HTTP request" not in output  # nor uvicorn's own line for each
