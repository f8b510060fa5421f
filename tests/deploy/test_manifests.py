"""``python -m runtime manifests``: validated offline against the Kubernetes schemas, and
the environment it writes makes the server serve as the options said."""

from __future__ import annotations

import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from conftest import ROOT, SAMPLES, Server

TARGET = "functions.reward.reward:DemoRewardProcessor"
# oldest and newest Kubernetes releases the manifests must fit
VERSIONS = ("1.30.0", "1.37.0")


def manifests(*args: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "manifests", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return list(yaml.safe_load_all(done.stdout))


def env_of(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container["env"]}


@pytest.mark.parametrize("version", VERSIONS)
def test_deployment_service_and_hpa_are_valid(version: str) -> None:
    documents = manifests(
        TARGET,
        "--image",
        "registry.local/rl-fn:v1",
        "--concurrency",
        "64",
        "--queue",
        "32",
        "--grace",
        "50",
        "--trainer-errors",
        "error",
        "--min-replicas",
        "2",
        "--max-replicas",
        "8",
    )
    assert [d["kind"] for d in documents] == ["Deployment", "Service", "HorizontalPodAutoscaler"]
    for document in documents:
        kubernetes_validate.validate(document, version, strict=True)  # raises when invalid
    deployment, service, hpa = documents
    assert deployment["metadata"]["name"] == "demo-reward-processor"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 55  # the drain's --grace, and a margin
    (container,) = pod["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == 10001  # the image's user
    assert security["readOnlyRootFilesystem"] and security["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert env_of(container) == {
        "PROCESSOR_CLASS": TARGET,
        "CONCURRENCY": "64",
        "THREAD_POOL_QUEUE": "32",
        "GRACE_PERIOD": "50",
        "TRAINER_ERRORS": "error",
        "PORT": "8000",
    }
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http"}]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["scaleTargetRef"]["name"] == "demo-reward-processor"


def test_knative_service() -> None:
    (service,) = manifests(
        TARGET, "--image", "registry.local/rl-fn:v1", "--knative", "--concurrency", "16"
    )
    assert (service["apiVersion"], service["kind"]) == ("serving.knative.dev/v1", "Service")
    template = service["spec"]["template"]
    spec = template["spec"]
    assert spec["containerConcurrency"] == 16
    assert spec["timeoutSeconds"] == 600
    assert template["metadata"]["annotations"]["autoscaling.knative.dev/max-scale"] == "8"
    (container,) = spec["containers"]
    assert "PORT" not in env_of(container)  # Knative sets it
    assert container["readinessProbe"]["httpGet"] == {"path": "/health"}
    assert container["securityContext"]["runAsUser"] == 10001
    # a valid core container, once Knative has given its probes their port
    probes = ("readinessProbe", "livenessProbe")
    core = {k: v for k, v in container.items() if k not in probes}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "c"},
        "spec": {"containers": [core]},
    }
    kubernetes_validate.validate(pod, VERSIONS[-1], strict=True)


def test_bad_options_exit_2() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime",
            "manifests",
            TARGET,
            "--image",
            "x",
            "--min-replicas",
            "3",
            "--max-replicas",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--min-replicas" in done.stderr


def test_the_written_environment_configures_the_server() -> None:
    (deployment, _, _) = manifests(
        TARGET, "--image", "x", "--concurrency", "7", "--trainer-timeout", "42"
    )
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    server = Server("", workspace=SAMPLES, env=env)
    try:
        server.wait_ready()
        # the startup line: written by the log's own thread, it may trail /health's 200
        assert "trainer_timeout=42s" in server.wait_output("concurrency=7 ")
    finally:
        server.close()


@pytest.mark.parametrize(
    ("args", "processes"),
    [
        (("--cpu", "2"), "2"),  # the CPUs requested, not the node's count
        (("--cpu", "500m"), "1"),
        (("--cpu", "4", "--workers", "2"), "2"),  # per worker
        (("--cpu", "4", "--processes", "3"), "3"),  # given: kept
    ],
)
def test_process_isolation_sizes_its_children_to_the_pod(
    args: tuple[str, ...], processes: str
) -> None:
    (deployment, _, _) = manifests(TARGET, "--image", "x", "--isolation", "process", *args)
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    assert env["ISOLATION"] == "process"
    assert env["ISOLATION_PROCESSES"] == processes


def test_process_isolation_environment_serves_with_those_children() -> None:
    (deployment, _, _) = manifests(TARGET, "--image", "x", "--isolation", "process", "--cpu", "1")
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    server = Server("", workspace=SAMPLES, env=env)
    try:
        server.wait_ready()
        server.wait_output("isolation=process processes=1 ")
    finally:
        server.close()
