"""The function image and the ship client, through the real ``docker`` CLI.

Needs a Docker-compatible engine: ``eval "$(../shared/container-engine/up.sh)"`` brings
one up here (``.ci/run`` does). Without one these tests skip and say so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from conftest import ROOT, SAMPLES, TESTS, free_port, reward_body
from llm_stub import LLMStub
from platform_stub import PlatformStub

REGISTRY = "127.0.0.1:5000"


def _engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


pytestmark = pytest.mark.skipif(
    not _engine_answers(),
    reason="no container engine answers the docker CLI "
    '(here: eval "$(../shared/container-engine/up.sh)")',
)


def docker(
    *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=check, timeout=timeout
    )


def wait_healthy(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not turn healthy in {timeout}s")


@pytest.fixture(scope="module")
def image() -> str:
    tag = "rl-fn:test"
    docker("build", "-t", tag, str(ROOT))
    return tag


@pytest.fixture(scope="module")
def test_workspace_image() -> str:
    tag = "rl-fn-tests:test"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime",
            "build",
            str(TESTS),
            "--image",
            tag,
            "--target",
            "workspace.fns:SleepyReward",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return tag


@pytest.fixture
def run_container() -> Iterator:
    names: list[str] = []

    def run(
        image: str, *args: str, env: dict[str, str] | None = None, network_host: bool = False
    ) -> tuple[str, str]:
        name = f"rl-test-{uuid.uuid4().hex[:8]}"
        port = free_port()
        options = ["--name", name]
        if network_host:
            options += ["--network", "host", "-e", f"PORT={port}"]
        else:
            options += ["-p", f"127.0.0.1:{port}:8000"]
        for key, value in (env or {}).items():
            options += ["-e", f"{key}={value}"]
        docker("run", "-d", *options, image, *args)
        names.append(name)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        return name, url

    yield run
    for name in names:
        docker("rm", "-f", name, check=False)


def test_image_serves_the_demo_reward_as_non_root(image, run_container):
    name, url = run_container(image)
    assert httpx.get(f"{url}/health").json()["processor"] == "DemoRewardProcessor"
    body = json.loads((SAMPLES / "requests" / "reward.json").read_text())
    assert httpx.post(f"{url}/api/v1", json=body).json()["reward"]["reward_score"] == 1.0
    assert docker("exec", name, "id", "-u").stdout.strip() == "10001"
    # the server is PID 1 itself: docker stop's SIGTERM reaches it
    assert "runtime" in docker("exec", name, "cat", "/proc/1/cmdline").stdout
    healthcheck = docker("inspect", name, "--format", "{{json .Config.Healthcheck}}").stdout.strip()
    if healthcheck != "null":  # engines that keep HEALTHCHECK (Docker) run the probe
        assert "/health" in healthcheck
    # the probe's own command succeeds inside the container
    docker(
        "exec",
        name,
        "python",
        "-c",
        "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health')",
    )


@pytest.mark.parametrize(
    ("target", "request_file", "check"),
    [
        (
            "functions.reward.safety:SafetyProcessor",
            "reward",
            lambda o: o["reward"]["reward_metrics"]["concise"] == 1.0,
        ),
        (
            "functions.reward.group_reward:DemoGroupRewardProcessor",
            "group_reward",
            lambda o: [r["reward_score"] for r in o["reward"]["rewards"]] == [1.0, -1.0, 1.0, -1.0],
        ),
    ],
)
def test_processor_chosen_at_run_time(image, run_container, target, request_file, check):
    body = json.loads((SAMPLES / "requests" / f"{request_file}.json").read_text())
    _, by_env = run_container(image, env={"PROCESSOR_CLASS": target})
    assert check(httpx.post(f"{by_env}/api/v1", json=body).json())
    _, by_argument = run_container(image, target)
    assert check(httpx.post(f"{by_argument}/api/v1", json=body).json())


def test_rollout_in_the_image_reaches_the_llm(image, run_container):
    with LLMStub(free_port()) as llm:
        _, url = run_container(
            image, "functions.rollout.rollout:DemoRolloutProcessor", network_host=True
        )
        body = json.loads((SAMPLES / "requests" / "rollout.json").read_text())
        body["model_resource"]["base_url"] = llm.base_url
        output = httpx.post(f"{url}/api/v1", json=body, timeout=30).json()
    assert output["status"] == "success"
    assert output["agent_output"]["messages"][-1]["content"].endswith("\\boxed{391}.")


def test_docker_stop_drains_and_exits_zero(test_workspace_image, run_container):
    name, url = run_container(test_workspace_image, "workspace.fns:SleepyReward")
    result: dict[str, httpx.Response] = {}
    request = threading.Thread(
        target=lambda: result.setdefault(
            "r", httpx.post(f"{url}/api/v1", json=reward_body(sleep=2), timeout=30)
        )
    )
    request.start()
    time.sleep(0.5)
    docker("stop", "-t", "35", name)
    request.join()
    assert result["r"].status_code == 200
    assert docker("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip() == "0"
    assert "Finished server process" in docker("logs", name).stderr + docker("logs", name).stdout


def ship(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "ship", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_ship_pushes_by_digest_and_registers_once(tmp_path):
    repository = f"shipped-{uuid.uuid4().hex[:6]}"
    job = tmp_path / "job.yaml"
    job.write_text(
        "functions:\n"
        "  - type: reward\n"
        "    name: safety-reward\n"
        "    timeout: 300\n"
        "    weight: 0.5\n"
        "    fcmodel:\n"
        "      classpath: functions.reward.safety.SafetyProcessor\n"
        "    runtime:\n"
        "      cpu: 1\n"
        "      memory_size: 2048\n"
        "      max_capacity: 3\n"
        "      env: {MODE: strict}\n"
    )
    with PlatformStub(free_port(), busy_first=1) as platform:
        arguments = [
            str(SAMPLES),
            "--config",
            str(job),
            "--image",
            f"{REGISTRY}/{repository}:v1",
            "--platform-url",
            platform.url,
            "--concurrency",
            "16",
            "-o",
            "json",
        ]
        env_key = {"DASHSCOPE_API_KEY": platform.api_key}
        first = ship(*arguments, env=env_key)
        assert first.returncode == 0, first.stderr[-3000:]
        shown = json.loads(first.stdout)
        assert shown["state"] == "registered"
        assert shown["entity_id"].startswith("fn-") and shown["instance_ids"]
        digest = shown["image"].split("@", 1)[1]
        # the manifest is in the registry, by the printed digest
        manifest = httpx.get(
            f"http://{REGISTRY}/v2/{repository}/manifests/{digest}",
            headers={
                "Accept": "application/vnd.oci.image.manifest.v1+json, "
                "application/vnd.docker.distribution.manifest.v2+json"
            },
        )
        assert manifest.status_code == 200
        assert manifest.headers["docker-content-digest"] == digest
        assert platform.registrations == [
            {
                "function_type": "reward",
                "name": "safety-reward",
                "image": f"{REGISTRY}/{repository}@{digest}",
                "target": "functions.reward.safety.SafetyProcessor",
                "timeout": 300,
                "runtime": {
                    "cpu": 1,
                    "memory_size": 2048,
                    "disk_size": 10240,
                    "concurrency": 16,
                    "capacity": 1,
                    "min_instances": 1,
                    "max_instances": 3,
                    "env": {"MODE": "strict"},
                },
                "weight": 0.5,
                "reward_metric_weight": {"no_unsafe_content": 0.7, "concise": 0.3},
            }
        ]
        assert set(platform.authorizations) == {f"Bearer {platform.api_key}"}
        assert platform.api_key not in first.stdout + first.stderr

        second = ship(*arguments, env=env_key)
        assert second.returncode == 0, second.stderr[-3000:]
        again = json.loads(second.stdout)
        assert again["state"] == "unchanged" and again["image"] == shown["image"]
        assert len(platform.registrations) == 1


def test_ship_reports_platform_errors_and_bad_targets():
    with PlatformStub(free_port()) as platform:
        wrong_key = ship(
            str(SAMPLES),
            "--target",
            "functions.reward.reward:DemoRewardProcessor",
            "--image",
            f"{REGISTRY}/denied:v1",
            "--platform-url",
            platform.url,
            "--api-key",
            "sk-wrong-key",
        )
    assert wrong_key.returncode == 1
    assert "invalid API key status=401 code=Unauthorized request_id=req-denied" in wrong_key.stderr
    assert "sk-wrong-key" not in wrong_key.stderr + wrong_key.stdout
    bad = ship(str(SAMPLES), "--target", "functions.reward.missing:X", "--image", "x:1", "--local")
    assert bad.returncode == 2 and "checked locally before building" in bad.stderr


def test_ship_local_runs_the_built_image():
    done = ship(
        str(SAMPLES),
        "--target",
        "functions.reward.reward:DemoRewardProcessor",
        "--image",
        "rl-fn-local:test",
        "--local",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    url = lines[0].rsplit(" at ", 1)[1]
    container = lines[-1].split()[-1]
    try:
        body = json.loads((SAMPLES / "requests" / "reward.json").read_text())
        assert httpx.post(f"{url}/api/v1", json=body).json()["reward"]["reward_score"] == 1.0
        assert "curl" in done.stdout
    finally:
        docker("rm", "-f", container, check=False)
