"""``python -m runtime`` as a user runs it: invoke, environment fallbacks, startup errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from conftest import SAMPLES, STARTUP, TESTS, free_port, reward_body


def runtime(*args: str, cwd=SAMPLES, env: dict | None = None, stdin: bytes | None = None):
    import os

    full_env = {k: v for k, v in os.environ.items() if k not in ("PROCESSOR_CLASS", "FUNC_TYPE")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args],
        cwd=cwd,
        env=full_env,
        input=stdin,
        capture_output=True,
        timeout=60,
    )


def test_invoke_prints_the_output():
    done = runtime(
        "invoke", "functions.reward.reward:DemoRewardProcessor", "--input", "requests/reward.json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reward"]["reward_score"] == 1.0


def test_invoke_reads_stdin_and_fails_clearly():
    bad = runtime(
        "invoke",
        "workspace.fns:EchoReward",
        "-i",
        "-",
        cwd=TESTS,
        stdin=b'{"func_type": "rollout"}',
    )
    assert bad.returncode == 2
    assert b"does not match this function's type 'reward'" in bad.stderr
    failing = runtime(
        "invoke",
        "workspace.fns:RaisingReward",
        "-i",
        "-",
        cwd=TESTS,
        stdin=json.dumps(reward_body()).encode(),
    )
    assert failing.returncode == 1
    assert json.loads(failing.stdout)["error_code"] == "PROCESSOR_ERROR"
    assert b"boom" in failing.stderr


def test_bad_targets_exit_with_one_line():
    done = runtime("serve", "functions.reward.nothing:X")
    assert done.returncode == 2
    lines = done.stderr.decode().strip().splitlines()
    assert lines == [
        "error: importing 'functions.reward.nothing' failed: ModuleNotFoundError: "
        "No module named 'functions.reward.nothing'"
    ]
    mismatch = runtime("serve", "functions.reward.reward:DemoRewardProcessor", "--type", "rollout")
    assert mismatch.returncode == 2
    assert b"'rollout'" in mismatch.stderr and b"'reward'" in mismatch.stderr
    missing = runtime("serve")
    assert missing.returncode == 2 and b"no target given" in missing.stderr


def test_invalid_settings_are_named():
    done = runtime(
        "serve", "functions.reward.reward:DemoRewardProcessor", env={"SERVER_PORT": "http"}
    )
    assert done.returncode == 2
    assert b"SERVER_PORT='http': not an integer" in done.stderr
    done = runtime("serve", "functions.reward.reward:DemoRewardProcessor", "--timeout", "-1")
    assert b"--timeout='-1': must be a positive number of seconds" in done.stderr


def test_help_lists_every_option_with_its_environment_variable():
    text = runtime("serve", "--help").stdout.decode()
    for flag, env in [
        ("--port", "SERVER_PORT"),
        ("--workers", "WORKERS_COUNT"),
        ("--queue", "THREAD_POOL_QUEUE"),
        ("--threads", "THREAD_POOL_WORKERS"),
        ("--log-level", "LOG_LEVEL"),
        ("--timeout", "REQUEST_TIMEOUT"),
    ]:
        assert flag in text and env in text


def test_environment_alone_starts_the_server(start_server):
    port = free_port()
    server = start_server(
        "",
        workspace=SAMPLES,
        ready=False,
        env={
            "PROCESSOR_CLASS": "functions.reward.reward.DemoRewardProcessor",
            "FUNC_TYPE": "reward",
            "THREAD_POOL_QUEUE": "7",
        },
    )
    server.wait_ready()
    request = json.loads((SAMPLES / "requests" / "reward.json").read_text())
    assert server.post(request).json()["reward"]["reward_score"] == 1.0
    server.wait_output("queue=7")  # the startup line, from the log's own thread
    assert port  # the port under test comes from --port; SERVER_PORT is covered above


def ready_pids(server) -> set[str]:
    return {
        line.split("[")[1].split("]")[0]
        for line in server.output().splitlines()
        if "ready: " in line
    }


def test_workers_serve_together_and_stop_cleanly(start_server):
    server = start_server("workspace.fns:EchoReward", "--workers", "2")
    deadline = time.monotonic() + STARTUP
    while len(ready_pids(server)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(ready_pids(server)) == 2
    for _ in range(20):
        assert server.post(reward_body(messages=2)).json()["reward"]["reward_score"] == 2.0
    assert server.terminate() == 0


def test_workers_stop_when_setup_fails(start_server):
    server = start_server("workspace.fns:FailingSetupReward", "--workers", "2", ready=False)
    assert server.proc.wait(30) == 3
    assert "setup() failed: RuntimeError: model file weights.bin not found" in server.output()
