"""The platform stand-in started by hand, as the README shows: ``python
tests/platform_standin.py --port 8765`` in one terminal, the platform commands pointed at it
in another; SIGTERM, like Ctrl-C, stops it and the function instances it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
from conftest import SAMPLES, TESTS, descendants, free_port, wait_gone


def test_standin_from_its_command_line_serves_until_sigterm_and_stops_its_instances():
    port = free_port()
    standin = subprocess.Popen(
        [sys.executable, str(TESTS / "platform_standin.py"), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert standin.stdout is not None
        base_url = f"http://127.0.0.1:{port}/api/v1"
        assert standin.stdout.readline() == (
            f"platform stand-in at {base_url}, API key sk-standin-test (Ctrl-C stops it)\n"
        )
        deadline = time.monotonic() + 30
        while True:  # listening once a request gets any HTTP answer
            assert standin.poll() is None and time.monotonic() < deadline
            try:
                httpx.get(base_url, timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DASHSCOPE_", "FC_"))}
        env.update(DASHSCOPE_HTTP_BASE_URL=base_url, DASHSCOPE_API_KEY="sk-standin-test")

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "runtime", *args, "-o", "json"],
                cwd=SAMPLES,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )

        registered = cli(
            "register", "--reward", "functions.reward.reward:DemoRewardProcessor",
            "--no-lazy-load", "--poll-interval", "0.1", "--timeout", "120",
        )  # fmt: skip
        assert registered.returncode == 0, registered.stderr
        (instance,) = json.loads(registered.stdout)["reward_instance_ids"]
        tested = cli(
            "test-function", instance, "--type", "reward", "--input", "requests/reward.json"
        )
        assert tested.returncode == 0, tested.stderr
        assert json.loads(tested.stdout)["reward"]["reward_score"] == 1.0
        running = descendants(standin.pid)  # the instance's start.sh and its server
        assert running
        standin.send_signal(signal.SIGTERM)
        assert standin.wait(60) == 0
        assert wait_gone(running, 30) == set()
    finally:
        if standin.poll() is None:
            standin.kill()
            standin.wait(10)
        assert standin.stdout is not None
        standin.stdout.close()
