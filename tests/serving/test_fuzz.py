"""Bad input, hunted: generated bodies against a running server.

The only answers allowed are 200 and the documented 4xx: no 5xx (the fuzzed processor
never fails), no hang, and the server still serves afterwards. The run is bounded for
CI; FUZZ_EXAMPLES=5000 python -m pytest tests/serving/test_fuzz.py is a longer one.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
from conftest import Server, reward_body
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))
ALLOWED = {200, 400, 413, 422}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    running = Server(
        "workspace.fns:EchoReward", "--max-body", "20000", "--timeout", "5", "--body-timeout", "2"
    )
    running.wait_ready()
    yield running
    running.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=25,
)
field_names = st.sampled_from(
    [
        "func_type",
        "agent_output",
        "messages",
        "rollout_metrics",
        "reward_score",
        "rollout_extra",
        "ground_truth",
        "request_metadata",
        "job_id",
    ]
)


def mutate(body: dict, path: list[str], value: object) -> bytes:
    target = body
    for key in path[:-1]:
        child = target.get(key)
        if not isinstance(child, dict):
            break
        target = child
    target[path[-1]] = value
    return json.dumps(body, allow_nan=True).encode()


valid = orjson.dumps(reward_body(messages=3))
bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    st.builds(
        mutate, st.just(reward_body()), st.lists(field_names, min_size=1, max_size=3), json_values
    ),
    st.binary(max_size=3000),
    st.integers(0, len(valid)).map(lambda n: valid[:n]),
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 5000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.integers(20, 5000).map(lambda n: b'{"agent_output": {"reward_score": ' + b"9" * n + b"}}"),
    st.sampled_from(
        [
            b'{"agent_output": {"reward_score": NaN}}',
            b'{"agent_output": {"reward_score": Infinity}}',
            b'{"agent_output": {}, "agent_output": 5}',
            b'{"func_type": "reward", "func_type": "rollout"}',
            b'{"agent_output": {"messages": [{"c": "\xff\xfe"}]}}',
            b'{"agent_output": {"messages": [{"c": "\\ud800"}]}}',
            b"",
            b" ",
            b"null",
            b"\x00",
            b'{"agent_output": {"rollout_metrics": {"x": 1e999}}}',
        ]
    ),
)
content_types = st.sampled_from(
    [
        "application/json",
        "text/plain",
        "application/x-www-form-urlencoded",
        "",
        "application/json; charset=latin-1",
        "multipart/form-data",
    ]
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(body=bodies, content_type=content_types)
def test_generated_bodies_get_documented_answers(server, body, content_type):
    response = server.client.post("/api/v1", content=body, headers={"content-type": content_type})
    assert response.status_code in ALLOWED, (body[:200], response.status_code, response.text[:300])
    answer = response.json()
    assert answer["status"] in ("success", "failed")
    if response.status_code != 200:
        assert answer["error_code"] and answer["error"]


def test_server_is_alive_after_the_fuzz(server):
    assert server.client.get("/health").status_code == 200
    assert server.post(reward_body(messages=2)).json()["reward"]["reward_score"] == 2.0
    assert "Traceback" not in server.output()


def test_slow_sender_gets_408_and_others_are_served(server):
    # a body that trickles in: its own deadline (--body-timeout), not the processing one
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        started = time.monotonic()
        assert server.post(reward_body()).status_code == 200  # not held up by the slow one
        reply = b""
        try:
            while time.monotonic() - started < 30 and b"\r\n\r\n" not in reply:
                sock.sendall(b" ")
                time.sleep(0.2)
                sock.setblocking(False)
                try:
                    reply += sock.recv(4096)
                except BlockingIOError:
                    pass
                finally:
                    sock.setblocking(True)
        except OSError:
            pass
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"REQUEST_TIMEOUT" in reply  # --body-timeout's answer, before the loop gave up


def test_wrong_methods_and_paths_never_5xx(server):
    for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"):
        for path in ("/api/v1", "/health", "/metrics", "/", "/api/v1/x", "/%ff"):
            response = httpx.request(method, f"{server.url}{path}")
            assert response.status_code < 500, (method, path, response.status_code)
