"""Secrets never leave in any encoding, request text cannot forge log lines, and a failure
of user code shows its traceback (in the log and in ``invoke``), never in the body."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from urllib.parse import quote, quote_plus

import anyio
import pytest
from conftest import SAMPLES, TESTS, free_port, reward_body
from helpers import wait_for
from otlp_receiver import OTLPReceiver
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from threaded_server import ThreadedServer

import runtime as runtime_package
from processors_base.observability._core import capture

KEY = "sk-Zm9v/YmFy+baz=qux"  # "/", "+" and "=": each URL encoding of it differs
FORMS = {
    "plain": KEY,
    "quote": quote(KEY, safe=""),
    "quote_plus": quote_plus(KEY),
    "base64": base64.b64encode(KEY.encode()).decode(),
    "basic auth": base64.b64encode(f"alice:{KEY}".encode()).decode()[8:],  # the key's part
}


class RateLimited(ThreadedServer):
    """The API a function calls: it answers 429 to everything."""

    def __init__(self) -> None:
        super().__init__(free_port(), [Route("/check", self._check)])
        self.url = f"http://127.0.0.1:{self.port}"
        self.queries: list[str] = []

    async def _check(self, request: Request) -> Response:
        self.queries.append(request.url.query)
        return Response("slow down", 429)


@pytest.fixture
def api() -> Iterator[RateLimited]:
    with RateLimited() as running:
        yield running


def rollout(base_url: str, **extra: object) -> dict:
    return {
        "messages": [{"role": "user", "content": "hi"}],
        "rollout_extra": extra or None,
        "model_resource": {"model_name": "m", "base_url": base_url, "api_key": KEY},
        "request_metadata": {
            "job_id": "job-1",
            "sample_id": "s-1",
            "rollout_id": "r-1",
            "attempt_id": "a-1",
        },
    }


def leaked(text: str) -> list[str]:
    return [name for name, form in FORMS.items() if form in text]


def frames_in(text: str, *packages: ModuleType) -> list[str]:
    """The traceback frames of ``text`` in the files of ``packages``: compared by directory,
    as a piece of a path ("runtime/") is also in a clone's own name (agentic-rl-runtime/)."""
    roots = [Path(package.__file__).resolve().parent for package in packages]
    files = [Path(name).resolve() for name in re.findall(r'File "([^"]+)", line', text)]
    assert files, f"no traceback frame in:\n{text}"
    return [str(f) for f in files if any(f.is_relative_to(root) for root in roots)]


def test_key_in_a_url_is_blanked_from_body_log_and_httpx_lines(start_server, api):
    # at DEBUG: httpx's per-call lines are left out at INFO
    server = start_server("workspace.secret_fns:KeyInUrlRollout", env={"LOG_LEVEL": "debug"})
    response = server.post(rollout(api.url, log=True))
    assert response.status_code == 500
    assert api.queries == [f"key={FORMS['quote']}"]  # the key really went out, URL-encoded
    body = response.json()
    assert body["error_code"] == "PROCESSOR_ERROR"
    assert "HTTPStatusError" in body["error"] and "429" in body["error"]
    assert leaked(response.text) == []
    assert "Traceback" not in response.text  # the traceback is for the log only
    wait_for(lambda: "PROCESSOR_ERROR" in server.output(), "the request's log line")
    log = server.output()
    assert leaked(log) == []
    assert "HTTP Request: GET" in log  # httpx's own line went through the filter
    assert "tok-0123456789abcdef" not in log and "hunter2" not in log
    metrics = server.client.get("/metrics").text
    assert (
        'rl_function_requests_total{func_type="rollout",path="/api/v1",status="500"} 1.0' in metrics
    )


def test_isolation_processes_scrub_their_lines_and_show_user_frames(start_server, api):
    server = start_server(
        "workspace.secret_fns:KeyInUrlRollout", "--isolation", "process", "--processes", "1"
    )
    response = server.post(rollout(api.url, log=True))
    assert response.status_code == 500 and leaked(response.text) == []
    wait_for(lambda: "PROCESSOR_ERROR" in server.output(), "the request's log line")
    wait_for(lambda: "plus-quoted" in server.output(), "the line logged in the child")
    log = server.output()
    assert leaked(log) == [] and "hunter2" not in log
    assert log.count("Traceback (most recent call last)") == 1
    assert 'secret_fns.py", line' in log and "raise_for_status" in log
    assert frames_in(log, runtime_package) == []


def test_failing_process_logs_the_traceback_of_user_code_once(start_server):
    server = start_server("workspace.secret_fns:FailingReward")
    body = reward_body()
    body["agent_output"]["messages"] = [{"role": "assistant", "content": "0"}]
    response = server.post(body)
    assert response.status_code == 500
    assert "Traceback" not in response.text and "secret_fns.py" not in response.text
    wait_for(lambda: "PROCESSOR_ERROR" in server.output(), "the request's log line")
    log = server.output()
    assert log.count("Traceback (most recent call last)") == 1
    assert 'secret_fns.py", line' in log and "in _score" in log and "in process" in log
    assert "ZeroDivisionError: float division by zero" in log
    assert frames_in(log, runtime_package, anyio) == []  # the runtime's frames


def test_traced_failure_has_no_encoded_key_in_the_span(start_server, api):
    with OTLPReceiver(free_port()) as receiver:
        server = start_server(
            "workspace.secret_fns:KeyInUrlRollout",
            "--tracing",
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "100",
                "AGENTIC_RL_FORCE_FLUSH_MODE": "request",
            },
        )
        assert server.post(rollout(api.url)).status_code == 500
        wait_for(lambda: len(receiver.spans) >= 1, "the processor span")
        assert receiver.spans[0]["events"] == ["exception"]
        raw = receiver.raw.decode("latin-1")
        assert "HTTPStatusError" in raw  # the exception was recorded...
        assert leaked(raw) == []  # ...without the key in any form


def test_func_type_that_is_not_a_plain_word_is_named_by_its_kind(start_server):
    server = start_server("workspace.fns:EchoReward")
    response = server.post({**reward_body(), "func_type": {"api_key": KEY}})
    assert response.status_code == 422
    assert response.json()["error_code"] == "FUNC_TYPE_MISMATCH"
    assert "an object" in response.json()["error"]
    assert "sk-" not in response.text
    plain = server.post({**reward_body(), "func_type": "rollout"})
    assert "'rollout'" in plain.json()["error"]  # a short plain word is still echoed
    wait_for(lambda: server.output().count("FUNC_TYPE_MISMATCH") >= 2, "two log lines")
    assert "sk-" not in server.output()


def test_request_ids_cannot_forge_log_lines(start_server):
    server = start_server("workspace.fns:EchoReward", "--access-log")
    body = reward_body()
    body["request_metadata"] = {
        "job_id": "j\n2026-01-01 00:00:00,000 ERROR [1] runtime: forged \x1b[31mred",
        "sample_id": "s" * 200_000,
        "rollout_id": "r",
        "attempt_id": "a",
    }
    assert server.post(body, headers={"x-request-id": "h" * 5000}).status_code == 200
    wait_for(lambda: "job_id=" in server.output(), "the access line")
    log = server.output()
    assert "\x1b" not in log
    assert not [line for line in log.splitlines() if "forged" in line and "job_id=" not in line]
    assert "s" * 128 in log and "s" * 129 not in log
    assert "h" * 128 in log and "h" * 129 not in log
    assert max(len(line) for line in log.splitlines()) < 2000


def test_json_log_format_has_one_object_per_line_with_the_ids(start_server):
    server = start_server(
        "workspace.secret_fns:FailingReward", "--access-log", env={"LOG_FORMAT": "json"}
    )
    body = reward_body()
    body["request_metadata"] = {
        "job_id": "job-7",
        "sample_id": "s-7",
        "rollout_id": "r-7",
        "attempt_id": "a\n7",
    }
    assert server.post(body, headers={"x-request-id": "req-7"}).status_code == 200
    body["agent_output"]["messages"] = [{"role": "assistant", "content": "0"}]
    assert server.post(body).status_code == 500
    wait_for(lambda: server.output().count('"job_id"') >= 2, "two request lines")
    entries = [json.loads(line) for line in server.output().splitlines()]
    requests = [e for e in entries if e["logger"] == "runtime.requests"]
    ok, failed = requests
    assert ok["status"] == 200 and ok["request_id"] == "req-7"
    assert (ok["job_id"], ok["sample_id"], ok["rollout_id"]) == ("job-7", "s-7", "r-7")
    assert ok["level"] == "INFO" and ok["func_type"] == "reward" and "time" in ok
    assert failed["status"] == 500 and failed["error_code"] == "PROCESSOR_ERROR"
    assert "ZeroDivisionError" in failed["traceback"] and "Traceback" not in failed["message"]
    assert any(e["message"].startswith("ready: FailingReward") for e in entries)


def runtime(*args: str, cwd=TESTS, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=60,
    )


def test_invoke_prints_the_traceback_of_user_code():
    body = reward_body()
    body["agent_output"]["messages"] = [{"role": "assistant", "content": "0"}]
    done = runtime(
        "invoke", "workspace.secret_fns:FailingReward", "-i", "-", stdin=json.dumps(body).encode()
    )
    assert done.returncode == 1
    stderr = done.stderr.decode()
    assert stderr.startswith("Traceback (most recent call last)")
    assert 'secret_fns.py", line' in stderr and "in _score" in stderr
    assert frames_in(stderr, runtime_package, anyio) == []
    assert stderr.rstrip().endswith("error: ZeroDivisionError: float division by zero")


def test_invoke_help_lists_every_exit_code():
    text = " ".join(runtime("invoke", "--help").stdout.decode().split())
    assert "1: the processor failed" in text and "2: invalid input" in text
    assert "3: setup() failed" in text


def test_a_target_naming_a_module_lists_its_processor_classes():
    done = runtime("invoke", "functions.reward.reward", "-i", "requests/reward.json", cwd=SAMPLES)
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "error: target 'functions.reward.reward' names a module, not a class: add :ClassName; "
        "processor classes in it: functions.reward.reward:DemoRewardProcessor"
    ]


def test_capture_redacts_header_pairs_auth_tuples_and_credential_shaped_values():
    text = capture(
        {
            "auth": ("alice", "hunter2"),
            "headers": [("Authorization", "Bearer tok-aaaaaaaaaa"), ("Accept", "json")],
            "key": "k-bbbbbbbb",
            "pwd": "p-cccccccc",
            "passwd": "p-dddddddd",
            "dsn": "d-eeeeeeee",
            "credential": "c-ffffffff",
            "cookie": "c-gggggggg",
            "session": "s-hhhhhhhh",
            "note": "use Bearer tok-iiiiiiiiii please",
            "db": "postgres://bob:jjjjjjjj@db.internal/rl",
        }
    )
    for secret in ("hunter2", "tok-aaaa", "bbbb", "cccc", "dddd", "eeee", "ffff", "gggg", "hhhh"):
        assert secret not in text, secret
    assert "iiii" not in text and "jjjj" not in text
    assert '"Accept","json"' in text and "db.internal/rl" in text  # the rest is kept


def test_no_stray_line_from_a_tracing_dependency_at_exit():
    code = (
        "import logging\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from processors_base.observability._core import handler\n"
        "handler(TracerProvider())\n"
        "logging.getLogger('opentelemetry.util.genai._multimodal_upload.pre_uploader')"
        ".warning('a real warning')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, cwd=TESTS)
    assert done.returncode == 0
    assert done.stderr.decode().strip() == "a real warning"  # real warnings still show


# ---- a failed output's error, lines logged from threads the runtime did not start ----

FNS = "workspace.odd_fns"  # user code that leaks its key or fails in odd ways


LOGGED_KEY = "sk-Zm9v/YmFy+baz=qux0123"


def keyed(**extra: object) -> dict:
    return {**reward_body(**extra), "model_resource": {"model_name": "m", "api_key": LOGGED_KEY}}


def assert_no_key(text: str) -> None:
    for form in (LOGGED_KEY, quote(LOGGED_KEY, safe=""), quote(LOGGED_KEY)):
        assert form not in text, text[-3000:]


@pytest.mark.parametrize("target", ["KeyInSubRewardError", "ReturnsFailedWithKey"])
def test_a_failed_outputs_error_never_carries_the_key(start_server, target):
    server = start_server(f"{FNS}:{target}", "--sub-reward-errors", "fail")
    response = server.post(keyed())
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "failed" and body["error"]
    assert_no_key(response.text)
    assert "**********" in body["error"]


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
