"""Every line about a request can be told apart from another's: a request that brings no
id (OpenRLHF, slime and NeMo Gym send none) gets one made for it; and 404 and 405 answers
are logged and counted like every other non-2xx answer."""

from __future__ import annotations

import concurrent.futures
import json
import socket

from conftest import Server


def _records(server: Server) -> list[dict]:
    return [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]


def test_trainer_requests_without_ids_get_one_each_on_all_their_lines(start_server) -> None:
    server = start_server(
        "workspace.request_id_fns:PairedJudgesReward",
        "--log-format",
        "json",
        "--sub-reward-errors",
        "fail",
    )
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # in flight together
        slime = pool.submit(
            server.client.post, "/slime/reward", json={"prompt": "q", "response": "A"}
        )
        openrlhf = pool.submit(
            server.client.post,
            "/openrlhf/get_reward",
            json={"query": ["q B"], "prompts": ["q "], "labels": [None]},
        )
        assert slime.result().status_code == openrlhf.result().status_code == 200
    server.wait_output("samples failed", 2)  # lines trail their answers
    server.wait_output("judge second is down")
    # each: its own line, its sub-reward's ERROR line, the trainer's warning, its access line
    mine = {
        "A": ("judging A", "sub-reward 'first'", "/slime/reward"),
        "B": ("judging B", "sub-reward 'second'", "/openrlhf/get_reward"),
    }
    ids = {}
    for request, needles in mine.items():
        lines = [r for r in _records(server) if any(n in r["message"] for n in needles)]
        assert len(lines) == 4, lines
        found = {r.get("request_id") for r in lines}
        assert len(found) == 1 and None not in found, lines
        ids[request] = found.pop()
    assert ids["A"] != ids["B"]
    # an id the client sends is the one its lines carry
    headers = {"x-request-id": "r-7"}
    answer = server.client.post("/slime/reward", json={"response": "C"}, headers=headers)
    assert answer.status_code == 200
    server.wait_output("judging C")
    (line,) = [r for r in _records(server) if r["message"] == "judging C"]
    assert line["request_id"] == "r-7"


def test_404_and_405_answers_are_logged_and_counted(start_server) -> None:
    server = start_server("workspace.fns:EchoReward")
    headers = {"x-request-id": "typo-1"}
    assert server.client.post("/openrlhf/reward", json={}, headers=headers).status_code == 404
    assert server.client.post("/openrlhf/get_reward/", json={}).status_code == 404
    assert server.client.get("/api/v1").status_code == 405
    assert server.client.post("/health").status_code == 405
    server.wait_output("NOT_FOUND", 2)
    output = server.wait_output("METHOD_NOT_ALLOWED", 2)
    lines = [line for line in output.splitlines() if "runtime.requests" in line]
    assert len(lines) == 4, lines
    assert all(" WARNING " in line for line in lines), lines
    assert "POST /openrlhf/reward reward 404" in lines[0]
    assert "NOT_FOUND request_id=typo-1: no such endpoint: /openrlhf/reward" in lines[0]
    assert "POST /openrlhf/get_reward/ reward 404" in lines[1]
    assert "GET /api/v1 reward 405" in lines[2] and "METHOD_NOT_ALLOWED" in lines[2]
    assert "POST /health reward 405" in lines[3]
    counted = [
        line
        for line in server.client.get("/metrics").text.splitlines()
        if line.startswith("rl_function_requests_total{")
    ]
    assert sorted(counted) == [  # the path label: a route's, else "unknown", never the path
        'rl_function_requests_total{func_type="reward",path="/api/v1",status="405"} 1.0',
        'rl_function_requests_total{func_type="reward",path="/health",status="405"} 1.0',
        'rl_function_requests_total{func_type="reward",path="unknown",status="404"} 2.0',
    ], counted


# ---- refusals of the HTTP layer ----

FNS = "workspace.odd_fns"  # user code that leaks its key or fails in odd ways


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
