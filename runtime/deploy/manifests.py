"""``python -m runtime manifests``: Kubernetes manifests of a function's image, on paper.

A Deployment, a Service and a HorizontalPodAutoscaler, or with ``--knative`` one Knative
Service (Knative makes its own deployment and autoscaler, scaling on requests in flight
with ``containerConcurrency`` from ``--concurrency``). The serve options given here
(``--concurrency``, ``--queue``, ``--timeout``, ``--trainer-errors``...) travel to the
container as the environment variables the server reads, so the pod serves exactly as
``python -m runtime serve`` would with the same options. No cluster is needed.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any

from runtime.config import OPTIONS, Settings, SettingsError, add_options, resolve

__all__ = ["add_manifests_command", "build_manifests", "run_manifests"]

# The image's user (see the Dockerfile): the pod asks for it and for nothing more.
IMAGE_UID = 10001
_DEFAULTS = Settings()
# Settings that describe the image or this machine rather than how the pod serves.
_NOT_PASSED = {"target", "workspace", "host", "port", "min_replicas", "max_replicas"}


def add_manifests_command(commands: Any) -> None:
    parser = commands.add_parser(
        "manifests",
        help="write Kubernetes manifests (Deployment, Service, HPA, or a Knative Service)",
        description="Write the Kubernetes manifests that run a function's image: a "
        "Deployment with probes on /health, a Service and a HorizontalPodAutoscaler, or with "
        "--knative a Knative Service. Serve options given here become the container's "
        "environment.",
        epilog="example: python -m runtime manifests functions.reward.reward:DemoRewardProcessor "
        "--image registry.example/rl-fn:v1 --min-replicas 2 --max-replicas 20 > fn.yaml",
    )
    parser.add_argument("target", nargs="?", metavar="TARGET", help="the processor class")
    parser.add_argument("--image", required=True, help="the function's image")
    parser.add_argument("--name", help="name of the objects (default: from the class name)")
    parser.add_argument("--namespace", help="namespace of the objects (default: none given)")
    parser.add_argument("--knative", action="store_true", help="a Knative Service instead")
    parser.add_argument("--cpu", default="1", help="CPU request per pod (default 1)")
    parser.add_argument("--memory", default="1Gi", help="memory request and limit (default 1Gi)")
    parser.add_argument(
        "--target-cpu", type=int, default=70, metavar="PERCENT", help="HPA CPU target"
    )
    parser.add_argument("--output", "-o", metavar="FILE", help="write here, not to stdout")
    add_options(parser)


def run_manifests(args: argparse.Namespace) -> int:
    try:
        settings = resolve(args)
    except SettingsError as exc:
        print(f"error: invalid setting {exc}", file=sys.stderr)
        return 2
    if not settings.target:
        print("error: no TARGET given (nor PROCESSOR_CLASS)", file=sys.stderr)
        return 2
    if settings.min_replicas > settings.max_replicas:
        print("error: --min-replicas is more than --max-replicas", file=sys.stderr)
        return 2
    try:
        _cpu_cores(args.cpu)
    except SettingsError as exc:
        print(f"error: invalid setting {exc}", file=sys.stderr)
        return 2
    documents = build_manifests(
        settings,
        image=args.image,
        name=args.name,
        namespace=args.namespace,
        knative=args.knative,
        min_replicas=settings.min_replicas,
        max_replicas=settings.max_replicas,
        cpu=args.cpu,
        memory=args.memory,
        target_cpu=args.target_cpu,
    )
    text = _dump(documents)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def build_manifests(
    settings: Settings,
    *,
    image: str,
    name: str | None = None,
    namespace: str | None = None,
    knative: bool = False,
    min_replicas: int = 1,
    max_replicas: int = 8,
    cpu: str = "1",
    memory: str = "1Gi",
    target_cpu: int = 70,
) -> list[dict[str, Any]]:
    name = _dns_name(name or settings.target.replace(":", ".").rsplit(".", 1)[-1])
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "rl-function"}
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if namespace:
        metadata["namespace"] = namespace
    container = _container(settings, image, cpu, memory, knative)
    if knative:  # Knative's default pod spec allows no pod-level security context nor volumes
        pod_spec: dict[str, Any] = {"containers": [container]}
    else:
        pod_spec = {
            # the server drains for --grace after SIGTERM; Kubernetes must wait a little longer
            "terminationGracePeriodSeconds": math.ceil(settings.grace) + 5,
            "securityContext": {"fsGroup": IMAGE_UID},
            "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        }
    if knative:
        pod_spec["containerConcurrency"] = settings.concurrency * settings.workers
        pod_spec["timeoutSeconds"] = math.ceil(settings.timeout)
        return [
            {
                "apiVersion": "serving.knative.dev/v1",
                "kind": "Service",
                "metadata": metadata,
                "spec": {
                    "template": {
                        "metadata": {
                            "labels": labels,
                            "annotations": {
                                "autoscaling.knative.dev/min-scale": str(min_replicas),
                                "autoscaling.knative.dev/max-scale": str(max_replicas),
                                "autoscaling.knative.dev/metric": "concurrency",
                            },
                        },
                        "spec": pod_spec,
                    }
                },
            }
        ]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": min_replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(settings.port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "selector": {"app.kubernetes.io/name": name},
            "ports": [{"name": "http", "port": settings.port, "targetPort": "http"}],
        },
    }
    autoscaler = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": target_cpu},
                    },
                }
            ],
        },
    }
    return [deployment, service, autoscaler]


def _container(
    settings: Settings, image: str, cpu: str, memory: str, knative: bool
) -> dict[str, Any]:
    env = [{"name": "PROCESSOR_CLASS", "value": settings.target}]
    for option in OPTIONS:
        value = getattr(settings, option.dest)
        if option.dest in _NOT_PASSED or value == getattr(_DEFAULTS, option.dest):
            continue
        if option.dest == "processes" and settings.isolation != "process":
            continue  # the default is this machine's CPU count: not the pod's business
        env.append({"name": option.env[0], "value": _env_value(value)})
    if settings.isolation == "process" and not settings.processes:
        # Auto would count the node's CPUs (a pod has no CPU limit here, to spare it CFS
        # throttling): size the children to the CPUs requested, per worker.
        processes = max(1, math.floor(_cpu_cores(cpu) / max(1, settings.workers)))
        env.append({"name": "ISOLATION_PROCESSES", "value": str(processes)})
    if not knative:  # Knative sets PORT itself, to its one declared port
        env.append({"name": "PORT", "value": str(settings.port)})
    port: dict[str, Any] = {"containerPort": settings.port}
    if not knative:
        port["name"] = "http"

    def probe(period: int, failures: int) -> dict[str, Any]:
        get: dict[str, Any] = {"path": "/health"}
        if not knative:
            get["port"] = "http"
        return {"httpGet": get, "periodSeconds": period, "failureThreshold": failures}

    container: dict[str, Any] = {
        "name": "function",
        "image": image,
        "env": env,
        "ports": [port],
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "readinessProbe": probe(5, 2),
        "livenessProbe": probe(10, 3),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_UID,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if knative:
        # no startup probe there: liveness must not fail while setup() runs (/health is 503)
        container["livenessProbe"] = {"tcpSocket": {}, "periodSeconds": 10, "failureThreshold": 3}
    else:
        # /health answers 503 until setup() has finished: a slow setup gets 5 minutes
        container["startupProbe"] = probe(2, 150)
        # temporary files (metrics of --workers, isolation processes) go to a writable /tmp
        container["securityContext"]["readOnlyRootFilesystem"] = True
        container["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
    return container


def _dump(documents: list[dict[str, Any]]) -> str:
    import yaml  # here, not at the top: every `runtime serve` imports this module (its CLI)

    class PlainDumper(yaml.SafeDumper):
        """Repeated labels written out each time: no YAML anchors for a reader to chase."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump_all(documents, Dumper=PlainDumper, sort_keys=False)


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _cpu_cores(quantity: str) -> float:
    """A Kubernetes CPU quantity ("2", "1.5", "500m") in cores."""
    text = quantity.strip()
    try:
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        raise SettingsError(f"--cpu: {quantity!r} is not a CPU quantity") from None


def _dns_name(text: str) -> str:
    kebab = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", text).lower()  # MyReward -> my-reward
    name = re.sub(r"[^a-z0-9-]+", "-", kebab).strip("-")[:63].rstrip("-")
    return name or "rl-function"
