"""The LLM stand-in started by hand, as the README tells a user to try the sample rollout:
``python tests/llm_stub.py --port 8001`` in one terminal, the rollout served in another."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import SAMPLES, TESTS, free_port


@pytest.fixture
def stub_cli() -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "llm_stub.py"), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # listening once a request gets any HTTP answer
            assert proc.poll() is None, proc.communicate()[0]
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the stand-in did not listen within 30 s"
                time.sleep(0.05)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # Ctrl-C, as the README says
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def test_stub_from_its_command_line_serves_the_sample_rollout(stub_cli, start_server):
    proc, port = stub_cli
    server = start_server("functions.rollout.rollout:DemoRolloutProcessor", workspace=SAMPLES)
    body = json.loads((SAMPLES / "requests" / "rollout.json").read_text())
    # the sample points at the README's port 8001; the test's stand-in has a free port
    assert body["model_resource"]["base_url"] == "http://127.0.0.1:8001/v1"
    body["model_resource"]["base_url"] = f"http://127.0.0.1:{port}/v1"
    answers = [server.post(body, timeout=60) for _ in range(2)]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        output = answer.json()
        assert output["status"] == "success"
        messages = output["agent_output"]["messages"]
        # the calculator was called with the task's expression and its result answered
        assert messages[1]["tool_calls"][0]["function"]["arguments"] == (
            '{"expression": "17 * 23"}'
        )
        assert messages[2] == {
            "role": "tool",
            "tool_call_id": messages[1]["tool_calls"][0]["id"],
            "content": "391",
        }
        assert messages[-1]["content"] == "The answer is \\boxed{391}."
    # deterministic: the same task gets the same trajectory (ids aside)
    strip = [
        [
            {k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")}
            for m in a.json()["agent_output"]["messages"]
        ]
        for a in answers
    ]
    assert strip[0] == strip[1]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(15) == 0  # Ctrl-C stops it quietly
    printed = proc.communicate()[0]
    assert "OpenAI-compatible stand-in at" in printed and "Traceback" not in printed
