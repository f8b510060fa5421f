"""Hostile or broken clients and user code that fails in odd ways: every answer is the
documented JSON, and nothing grows without bound. Raw sockets for clients that do not
speak HTTP properly; the real server as a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import weakref
from pathlib import Path

import httpx
import orjson
import pytest
from conftest import ROOT, TESTS, Server, free_port, reward_body

from runtime.serving.protocol import KEEP_ALIVE_SECONDS

ERROR_FIELDS = {"status", "error", "error_code", "detail", "message"}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock


def read_response(sock: socket.socket, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """One whole HTTP response (status, headers, body) from a raw socket."""
    (response,) = read_responses(sock, 1, timeout)
    return response


def read_responses(
    sock: socket.socket, count: int, timeout: float = 30
) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` whole HTTP responses in a row. Answers to pipelined requests may arrive in
    one read: what follows them is kept for the next call on the same socket."""
    sock.settimeout(timeout)
    data = _unread.pop(sock, b"")
    responses = []
    while len(responses) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed without a response: {data!r}"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(data) < length:
            chunk = sock.recv(65536)
            assert chunk, "connection closed inside the body"
            data += chunk
        responses.append((int(lines[0].split()[1]), headers, data[:length]))
        data = data[length:]
    if data:
        _unread[sock] = data
    return responses


_unread: weakref.WeakKeyDictionary[socket.socket, bytes] = weakref.WeakKeyDictionary()


def assert_json_error(headers: dict[str, str], body: bytes, code: str) -> dict:
    assert headers["content-type"] == "application/json"
    data = orjson.loads(body)
    assert data.keys() >= ERROR_FIELDS, data
    assert data["status"] == "failed" and data["error_code"] == code
    assert data["message"] == data["error"]
    return data


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``sock`` (reads to EOF) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def send_until_refused(sock: socket.socket, chunk: bytes, limit: int) -> int:
    """Sends ``chunk`` until the server stops reading (or ``limit`` bytes); bytes sent."""
    sent = 0
    sock.settimeout(10)
    try:
        while sent < limit:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    return sent


# --- headers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "start, chunk",
    [
        (b"POST /api/v1 HTTP/1.1\r\nHost: x\r\n", b"a: b\r\n" * 10_000),  # many tiny headers
        (b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nX-Big: ", b"a" * 65536),  # one huge value
    ],
    ids=["many-headers", "huge-value"],
)
def test_header_floods_get_431_and_memory_stays_flat(start_server, start: bytes, chunk: bytes):
    server = start_server("workspace.fns:EchoReward")
    before = rss_mb(server.proc.pid)
    with connect(server) as sock:
        sock.sendall(start)
        sent = send_until_refused(sock, chunk, limit=64 * 1024 * 1024)
        status, headers, body = read_response(sock)
    assert status == 431
    assert_json_error(headers, body, "HEADERS_TOO_LARGE")
    assert sent < 16 * 1024 * 1024, f"the server kept reading headers: {sent} bytes"
    assert rss_mb(server.proc.pid) - before < 20
    assert server.post(reward_body()).status_code == 200  # and it still serves


def test_unfinished_headers_get_408_and_silent_connections_are_closed(start_server):
    server = start_server("workspace.fns:EchoReward")  # --body-timeout 10 s by default
    partial = [connect(server) for _ in range(20)]
    for sock in partial:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    silent = connect(server)
    for sock in partial:
        status, headers, body = read_response(sock)
        assert status == 408
        assert_json_error(headers, body, "REQUEST_TIMEOUT")
        assert closed_by_server(sock, 30)
        sock.close()
    assert closed_by_server(silent, 30)  # nothing asked: closed without an answer
    silent.close()


def test_a_pipelined_request_is_timed_out_only_after_the_one_before_it(start_server, tmp_path):
    server = start_server(
        "workspace.fns:SleepyReward", "--body-timeout", "1", env={"TEST_MARKER_DIR": str(tmp_path)}
    )
    body = orjson.dumps(reward_body(sleep=2.5))
    with connect(server) as sock:
        sock.sendall(
            b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s"
            % (len(body), body)
            + b"GET /health HTTP/1.1\r\nHost: x\r\n"  # the next request, never finished
        )
        status, headers, first = read_response(sock)
        assert status == 200, first  # answers keep their order: the first one's comes first
        status, headers, second = read_response(sock)
        assert status == 408
        assert_json_error(headers, second, "REQUEST_TIMEOUT")


def test_answers_are_framed_for_keep_alive_pipelining_http10_and_100_continue(start_server):
    """/api/v1 answers leave as one write each (runtime.serving.protocol's whole-response
    extension): whatever the client's framing, each is a complete HTTP/1.1 answer."""
    server = start_server("workspace.fns:EchoReward")
    body = orjson.dumps(reward_body())
    request = (
        b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )

    def assert_echo(status: int, headers: dict[str, str], answer: bytes) -> None:
        assert status == 200, answer
        assert headers["content-type"] == "application/json" and "date" in headers
        assert int(headers["content-length"]) == len(answer)
        assert orjson.loads(answer)["reward"]["reward_score"] == 1.0

    with connect(server) as sock:  # keep-alive: one after the other, then three at once
        for _ in range(2):
            sock.sendall(request)
            status, headers, answer = read_response(sock)
            assert_echo(status, headers, answer)
            assert "connection" not in headers
        sock.sendall(request * 3)
        for response in read_responses(sock, 3):
            assert_echo(*response)
    with connect(server) as sock:  # HTTP/1.0: told so, then closed
        sock.sendall(request.replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        status, headers, answer = read_response(sock)
        assert_echo(status, headers, answer)
        assert headers["connection"] == "close"
        # closed with the answer, not by the idle keep-alive timeout
        assert closed_by_server(sock, KEEP_ALIVE_SECONDS - 1)
    with connect(server) as sock:  # Expect: 100-continue, the body sent only once asked
        head, _, _ = request.partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\nExpect: 100-continue\r\n\r\n")
        sock.settimeout(30)
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = sock.recv(1)
            assert chunk, interim
            interim += chunk
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        assert_echo(*read_response(sock))
    with connect(server) as sock:  # an error answer that closes says so
        sock.sendall(b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 20000000\r\n\r\n")
        status, headers, answer = read_response(sock)
        assert status == 413 and headers["connection"] == "close"
        assert_json_error(headers, answer, "BODY_TOO_LARGE")
        assert closed_by_server(sock, KEEP_ALIVE_SECONDS - 1)


def test_a_client_that_half_closes_after_its_request_gets_the_answer(start_server):
    # `nc -N`, or a client that calls shutdown(SHUT_WR) once it has sent: the server reads
    # its end of file while the answer is held for the end of the loop's iteration
    server = start_server("workspace.fns:EchoReward")
    body = orjson.dumps(reward_body())
    for version in (b"HTTP/1.1", b"HTTP/1.0") * 10:
        with connect(server) as sock:
            sock.sendall(
                b"POST /api/v1 %s\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (version, len(body), body)
            )
            sock.shutdown(socket.SHUT_WR)
            status, _, answer = read_response(sock)
            assert status == 200 and orjson.loads(answer)["reward"]["reward_score"] == 1.0


def test_an_idle_connection_is_closed_after_the_keep_alive_not_a_busy_one(start_server, tmp_path):
    server = start_server("workspace.fns:SleepyReward", env={"TEST_MARKER_DIR": str(tmp_path)})

    def ask(sock: socket.socket, sleep: float) -> None:
        body = orjson.dumps(reward_body(sleep=sleep))
        sock.sendall(
            b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        status, _, answer = read_response(sock)
        assert status == 200, answer

    with connect(server) as sock:
        ask(sock, 0)
        # a request that runs past the keep-alive timeout armed at the first answer
        ask(sock, KEEP_ALIVE_SECONDS + 0.5)
        # idle again: counted from its last answer, so still open a while after it ...
        assert not closed_by_server(sock, KEEP_ALIVE_SECONDS / 2)
        ask(sock, 0)
        # ... and closed once idle for the timeout
        assert closed_by_server(sock, 30)


def test_connections_beyond_the_cap_are_answered_503_at_once(start_server):
    server = start_server("workspace.fns:EchoReward", "--max-connections", "8")
    held = [connect(server) for _ in range(8)]
    for sock in held:  # each holds a connection of the worker by never finishing its headers
        sock.sendall(b"GET /health HTTP/1.1\r\n")
    with connect(server) as sock:  # past the cap, liveness is still answered ...
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock)[0] == 200
    with connect(server) as sock:  # ... and nothing else
        sock.sendall(b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        status, headers, body = read_response(sock)
        assert status == 503 and headers["retry-after"] == "1"
        assert_json_error(headers, body, "OVERLOADED")
    held += [connect(server) for _ in range(8)]  # the connections kept for /health
    for sock in held[8:]:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
    with connect(server) as extra:  # (the fixture's own keep-alive connection may be one more)
        status, headers, body = read_response(extra)
        assert status == 503 and headers["retry-after"] == "1"
        assert_json_error(headers, body, "OVERLOADED")
        assert closed_by_server(extra, 30)
    assert 'code="OVERLOADED",status="503"' in server.client.get("/metrics").text
    assert "refused by the HTTP protocol layer" in server.wait_output("503 OVERLOADED")
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 30
    while True:  # freed places are taken again
        try:
            if httpx.get(f"{server.url}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_invalid_http_gets_a_json_400(start_server):
    server = start_server("workspace.fns:EchoReward")
    for request in (
        b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
    ):
        with connect(server) as sock:
            sock.sendall(request)
            status, headers, body = read_response(sock)
        assert status == 400, request
        assert_json_error(headers, body, "BAD_REQUEST")
    assert 'code="BAD_REQUEST",status="400"} 3.0' in server.client.get("/metrics").text
    server.wait_output("400 BAD_REQUEST")


def test_an_upgrade_with_a_body_is_told_to_come_without_it(start_server):
    # `curl --http2 -d @req.json http://...` asks for h2c: what follows the headers belongs
    # to the new protocol, so the body is not the request's; said so, not "body is empty"
    server = start_server("workspace.fns:EchoReward")
    body = orjson.dumps(reward_body())
    upgrade = (
        b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
    )
    with connect(server) as sock:
        sock.sendall(
            b"POST /api/v1 HTTP/1.1\r\nHost: x\r\n" + upgrade
            + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
        )  # fmt: skip
        status, headers, answer = read_response(sock)
    assert status == 400
    error = assert_json_error(headers, answer, "BAD_REQUEST")
    assert "Upgrade" in error["message"] and "--http1.1" in error["message"]
    with connect(server) as sock:  # without a body the Upgrade is ignored, as before
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + upgrade + b"\r\n")
        status, headers, answer = read_response(sock)
    assert status == 200 and orjson.loads(answer)["status"] == "healthy"


@pytest.mark.parametrize(
    "request_",
    [
        b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n",
        b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}GARBAGE\r\n\r\n",
    ],
    ids=["bad-chunk", "garbage-after-the-body"],
)
def test_a_request_the_protocol_answers_400_is_counted_400(start_server, request_: bytes):
    server = start_server("workspace.fns:EchoReward")
    with connect(server) as sock:
        sock.sendall(request_)
        status, headers, body = read_response(sock)
        assert status == 400
        assert_json_error(headers, body, "BAD_REQUEST")
        assert closed_by_server(sock, 30)
    deadline = time.monotonic() + 30
    while 'rl_function_requests_total{func_type="reward",path="/api/v1",status="400"} 1.0' not in (
        text := server.client.get("/metrics").text
    ):
        assert time.monotonic() < deadline, text
        time.sleep(0.05)
    assert 'status="499"' not in text and 'status="422"' not in text


# --- bodies ----------------------------------------------------------------------------


def _start_body(server: Server, length: int, first: bytes = b"{") -> socket.socket:
    sock = connect(server)
    sock.sendall(
        b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (length, first)
    )
    return sock


def test_stalled_bodies_get_408_and_never_hold_an_admission_place(start_server):
    # --body-timeout 10 s by default
    server = start_server("workspace.fns:EchoReward", "--concurrency", "1", "--queue", "0")
    stalled = [_start_body(server, 100) for _ in range(4)]
    # Admission counts a request only once its body is in: the stalled ones hold no place.
    assert server.post(reward_body()).status_code == 200
    for sock in stalled:
        status, headers, body = read_response(sock)
        assert status == 408
        assert_json_error(headers, body, "REQUEST_TIMEOUT")
        assert closed_by_server(sock, 30)
        sock.close()
    # each a 408 REQUEST_TIMEOUT: --body-timeout's answer, not --timeout's (600 s)
    assert server.post(reward_body()).status_code == 200
    assert 'status="408"} 4.0' in server.client.get("/metrics").text


def test_buffered_bodies_are_bounded_by_max_buffered(start_server):
    server = start_server(
        "workspace.fns:EchoReward",
        "--max-body",
        "1000000",
        "--max-buffered",
        "2000000",
        "--body-timeout",
        "30",
    )
    # Bytes received are held (not bytes announced): two bodies all but 10 bytes sent leave
    # too little for one more request.
    holding = [_start_body(server, 1_000_000, b" " * 999_990) for _ in range(2)]
    deadline = time.monotonic() + 30
    while True:  # once the two bodies' bytes are in, the budget is spent
        response = server.post(reward_body())
        if response.status_code == 503:
            break
        assert response.status_code == 200 and time.monotonic() < deadline
        time.sleep(0.05)
    assert response.headers["retry-after"] == "1"
    data = assert_json_error(response.headers, response.content, "OVERLOADED")
    assert "--max-buffered" in data["error"]
    for sock in holding:  # a client that goes away gives its share back at once
        sock.close()
    while server.post(reward_body()).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)


# --- errors that once escaped ----------------------------------------------------------


@pytest.mark.parametrize("target", ["BaseExceptionReward", "SyncBaseExceptionReward"])
def test_any_failure_of_user_code_is_a_json_500_counted_as_500(start_server, target):
    server = start_server(f"workspace.hostile_fns:{target}")
    secret = "sk-ZmFrZS1rZXk-hostile"
    for kind in ("surrogate", "exit", "interrupt"):
        body = reward_body(**{"raise": kind})
        body["model_resource"] = {"api_key": secret}
        response = server.post(body)
        assert response.status_code == 500, (kind, response.text)
        data = assert_json_error(response.headers, response.content, "PROCESSOR_ERROR")
        assert data["reward"] == {"reward_score": 0.0, "reward_metrics": None}
        expected = {
            "surrogate": "ValueError: cannot decode b'\\xff': \\udcff",
            "exit": "SystemExit: 4",
            "interrupt": "KeyboardInterrupt",
        }[kind]
        assert data["error"].startswith(expected)
    assert server.client.get("/health").status_code == 200  # SystemExit stopped nothing
    counted = [
        line
        for line in server.client.get("/metrics").text.splitlines()
        if line.startswith("rl_function_requests_total{")
    ]
    assert counted == [
        'rl_function_requests_total{func_type="reward",path="/api/v1",status="500"} 3.0'
    ]
    server.terminate()
    output = server.output()
    assert output.count(" 500 ") >= 3, output  # the request log says 500 for each
    assert "Exception in ASGI application" not in output
    assert secret not in output


def test_every_error_body_has_the_documented_fields(start_server):
    server = start_server("workspace.fns:RaisingReward", "--max-body", "1000")
    cases = [
        (server.post(b"{"), 400, "INVALID_JSON"),
        (server.post({"agent_output": 3}), 422, "INVALID_INPUT"),
        (server.post(b"{" + b" " * 2000 + b"}"), 413, "BODY_TOO_LARGE"),
        (server.client.get("/nope"), 404, "NOT_FOUND"),
        (server.client.get("/api/v1"), 405, "METHOD_NOT_ALLOWED"),
        (server.post(reward_body()), 500, "PROCESSOR_ERROR"),
    ]
    for response, status, code in cases:
        assert response.status_code == status, response.text
        assert_json_error(response.headers, response.content, code)


def test_a_trailing_slash_is_served_and_nothing_redirects(start_server):
    server = start_server("workspace.fns:EchoReward")
    response = server.client.post("/api/v1/", json=reward_body(), headers={"Host": "evil.example"})
    assert response.status_code == 200 and "location" not in response.headers
    assert response.json()["reward"]["reward_score"] == 1.0
    response = server.client.get("/health/", headers={"Host": "evil.example"})
    assert response.status_code == 404 and "location" not in response.headers
    assert_json_error(response.headers, response.content, "NOT_FOUND")


# --- startup failures ------------------------------------------------------------------


def _serve(target: str, *args: str, port: int | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "runtime", "serve", target, "--host", "127.0.0.1"]
    command += ["--port", str(port or free_port()), *args]
    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "WORKERS_COUNT")}
    return subprocess.run(command, cwd=TESTS, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("target", ["ExitInSetupReward", "AsyncExitInSetupReward"])
def test_sys_exit_in_setup_is_a_failed_setup(target, workers):
    result = _serve(f"workspace.hostile_fns:{target}", "--workers", workers)
    assert result.returncode == 3, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert any("setup() failed: SystemExit: no GPU found" in line for line in errors), errors
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_exits_2_with_one_line(workers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve("workspace.fns:EchoReward", "--workers", workers, port=port)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"port {port}" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_processes_default_to_the_cpus_this_process_may_use():
    # Pinned to one CPU on a machine with more: one isolation process, not os.cpu_count().
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "from runtime.config import Settings; from runtime.execution.function import usable_cpus;"
        "print(Settings().processes, usable_cpus())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["0", "1"]  # 0: decided when the pool starts, from affinity and quota


# ---- WebSocket upgrades; huge and unprintable exception messages ----

FNS = "workspace.odd_fns"  # user code that leaks its key or fails in odd ways


def test_a_websocket_upgrade_is_a_plain_json_answer(start_server):
    pytest.importorskip("websockets")  # installed (test extra): uvicorn would then use it
    server = start_server(f"{FNS}:SleepsSync")
    headers = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    for path, status in (("/health", 200), ("/api/v1", 405), ("/nowhere", 404)):
        response = server.client.get(path, headers=headers)
        assert response.headers["content-type"] == "application/json", (path, response.text)
        assert response.status_code == status, (path, response.text)
    output = server.output()
    assert " ERROR " not in output and "upgrade" not in output  # no line per upgrade either


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
