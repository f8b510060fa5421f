"""The function image and the build command, through the real ``docker`` CLI.

Needs a Docker-compatible engine: ``eval "$(../shared/container-engine/up.sh)"`` brings
one up here (``.ci/run`` does). Without one these tests skip and say so.
"""

from __future__ import annotations

import json
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

REGISTRY = "127.0.0.1:5000"


def _engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


# They use the whole machine (the container engine with fixed image tags and registry
# port, a local Ray cluster): one xdist group, so that no two of them run at once.
pytestmark = [
    pytest.mark.xdist_group("machine"),
    pytest.mark.skipif(
        not _engine_answers(),
        reason="no container engine answers the docker CLI "
        '(here: eval "$(../shared/container-engine/up.sh)")',
    ),
]


def docker(
    *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:  # with the engine's own words
        raise AssertionError(f"docker {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done


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
        image: str,
        *args: str,
        env: dict[str, str] | None = None,
        network_host: bool = False,
        run_options: tuple[str, ...] = (),
    ) -> tuple[str, str]:
        name = f"rl-test-{uuid.uuid4().hex[:8]}"
        port = free_port()
        options = ["--name", name, *run_options]
        if network_host:
            options += ["--network", "host", "-e", f"PORT={port}"]
        else:
            options += ["-p", f"127.0.0.1:{port}:8000"]
        for key, value in (env or {}).items():
            options += ["-e", f"{key}={value}"]
        names.append(name)  # removed after the test: created even where it failed to start
        docker("run", "-d", *options, image, *args)
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


def test_build_target_is_the_image_default_and_an_argument_overrides_it(
    test_workspace_image, run_container
):
    env = docker("inspect", test_workspace_image, "--format", "{{json .Config.Env}}").stdout
    assert "PROCESSOR_CLASS=workspace.fns:SleepyReward" in json.loads(env)
    _, plain = run_container(test_workspace_image)  # no argument: the built target
    assert httpx.get(f"{plain}/health").json()["processor"] == "SleepyReward"
    _, other = run_container(test_workspace_image, "workspace.fns:EchoReward")
    assert httpx.get(f"{other}/health").json()["processor"] == "EchoReward"
    _, by_env = run_container(
        test_workspace_image, env={"PROCESSOR_CLASS": "workspace.fns:EchoReward"}
    )
    assert httpx.get(f"{by_env}/health").json()["processor"] == "EchoReward"


@pytest.mark.parametrize(
    ("run_options", "stop_options"),
    [((), ("-t", "35")), (("--stop-timeout", "35"), ())],
    ids=["docker-stop-t", "docker-run-stop-timeout"],
)
def test_docker_stop_drains_and_exits_zero(
    test_workspace_image, run_container, run_options, stop_options
):
    """Both ways the README gives; a plain `docker stop` of a container started without
    --stop-timeout kills at once on some engines (Podman 4.3 through the docker CLI)."""
    name, url = run_container(
        test_workspace_image, "workspace.fns:SleepyReward", run_options=run_options
    )
    result: dict[str, httpx.Response] = {}
    request = threading.Thread(
        target=lambda: result.setdefault(
            "r", httpx.post(f"{url}/api/v1", json=reward_body(sleep=2), timeout=30)
        )
    )
    request.start()
    deadline = time.monotonic() + 30  # stop once the request is in flight
    while "rl_function_requests_in_flight 1.0" not in httpx.get(f"{url}/metrics").text:
        assert time.monotonic() < deadline, "the request never reached the server"
        time.sleep(0.05)
    docker("stop", *stop_options, name)
    request.join()
    assert result["r"].status_code == 200
    assert docker("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip() == "0"
    assert "Finished server process" in docker("logs", name).stderr + docker("logs", name).stdout


def build(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "build", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


def test_build_push_prints_the_image_by_digest():
    repository = f"pushed-{uuid.uuid4().hex[:6]}"
    done = build(
        str(SAMPLES),
        "--image",
        f"{REGISTRY}/{repository}:v1",
        "--target",
        "functions.reward.reward:DemoRewardProcessor",
        "--push",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reference = done.stdout.strip().splitlines()[-1]
    assert reference.startswith(f"{REGISTRY}/{repository}@sha256:")
    digest = reference.split("@", 1)[1]
    manifest = httpx.get(
        f"http://{REGISTRY}/v2/{repository}/manifests/{digest}",
        headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json, "
            "application/vnd.docker.distribution.manifest.v2+json"
        },
    )
    assert manifest.status_code == 200
    assert manifest.headers["docker-content-digest"] == digest


def test_build_checks_the_target_before_building():
    bad = build(str(SAMPLES), "--target", "functions.reward.missing:X", "--image", "x:1")
    assert bad.returncode == 2 and "checked locally before building" in bad.stderr
