"""``python -m runtime ship``: build a workspace's image, push it, register it by digest.

1. check locally that the target imports and is a processor;
2. build the image (docker CLI, progress on stderr) and push it; read back the digest;
3. register with the platform by digest, unless the same image and settings already are;
4. print what came back, as a table or JSON.

``--local`` stops after the build: it runs the image on a free local port instead.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from processors_base.models import FunctionType
from runtime import images
from runtime.loading import Target, TargetError, load_target

# httpx (runtime.platform) and yaml are imported where used: `python -m runtime serve`
# builds this module's options too, and must not pay for them on a cold start.

__all__ = ["add_ship_arguments", "run_build", "run_ship"]

# runtime.* keys of the job file (the SDK's names on the right are accepted too)
_RUNTIME_KEYS = {
    "cpu": ("cpu",),
    "memory_size": ("memory_size",),
    "disk_size": ("disk_size",),
    "concurrency": ("concurrency",),
    "capacity": ("capacity",),
    "min_instances": ("min_instances", "min_capacity"),
    "max_instances": ("max_instances", "max_capacity"),
    "env": ("env",),
}
_DEFAULT_RUNTIME: dict[str, Any] = {
    "cpu": 2.0,
    "memory_size": 4096,
    "disk_size": 10240,
    "concurrency": 128,
    "capacity": 1,
    "min_instances": 1,
    "max_instances": 10,
    "env": {},
}


class ShipError(Exception):
    pass


def add_ship_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workspace", metavar="WORKSPACE", help="the directory of your functions")
    parser.add_argument(
        "--target", help="module:Class of the function (or fcmodel.classpath in --config)"
    )
    parser.add_argument("--image", required=True, help="REGISTRY/REPO[:TAG] to build and push")
    parser.add_argument(
        "--config",
        metavar="YAML",
        help="job file: functions: [{type, name, timeout, "
        "fcmodel.classpath, runtime.*, weight, reward_metric_weight}]",
    )
    parser.add_argument(
        "--function", metavar="NAME", help="which entry of --config (default: the only one)"
    )
    parser.add_argument(
        "--name", help="function name on the platform (default: from the class name)"
    )
    parser.add_argument(
        "--platform-url",
        default=os.environ.get("AGENTIC_RL_PLATFORM_URL"),
        help="platform base URL [env AGENTIC_RL_PLATFORM_URL]",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="platform API key, sent as a Bearer token [env DASHSCOPE_API_KEY]",
    )
    parser.add_argument("--timeout", type=int, help="function timeout in seconds (default 600)")
    parser.add_argument("--cpu", type=float)
    parser.add_argument("--memory-size", type=int, help="MB")
    parser.add_argument("--disk-size", type=int, help="MB")
    parser.add_argument("--concurrency", type=int, help="requests per instance")
    parser.add_argument("--capacity", type=int)
    parser.add_argument("--min-instances", type=int)
    parser.add_argument("--max-instances", type=int)
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment of the function's containers (repeatable)",
    )
    parser.add_argument("--weight", type=float, help="weight of a reward function (default 1.0)")
    parser.add_argument(
        "--local",
        action="store_true",
        help="build and run the image on a free local port; no push, no platform",
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")


def run_build(workspace: str, image: str, target_spec: str | None) -> int:
    try:
        if target_spec:
            _check_target(target_spec, Path(workspace))
        images.build(Path(workspace), image)
    except (ShipError, images.ImageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ShipError) else 1
    print(image)
    return 0


def run_ship(args: argparse.Namespace) -> int:
    from runtime.platform import PlatformError

    try:
        return _ship(args)
    except (ShipError, images.ImageError, PlatformError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ShipError) else 1


def _ship(args: argparse.Namespace) -> int:
    from runtime.platform import PlatformClient

    workspace = Path(args.workspace)
    entry = _job_entry(args.config, args.function) if args.config else {}
    spec = args.target or _classpath(entry)
    if not spec:
        raise ShipError("no target: pass --target module:Class (or fcmodel.classpath in --config)")
    target = _check_target(spec, workspace)
    if entry.get("type") and entry["type"] != target.func_type.value:
        raise ShipError(
            f"the job file says type {entry['type']!r}, but {target.name} is a "
            f"{target.func_type.value!r} processor"
        )

    print(f"building {args.image} from {workspace} ...", file=sys.stderr)
    images.build(workspace, args.image)
    if args.local:
        return _run_locally(args.image, spec)

    api_key = args.api_key or os.environ.get("DASHSCOPE_API_KEY", "")
    if not args.platform_url:
        raise ShipError(
            "no platform: pass --platform-url or set AGENTIC_RL_PLATFORM_URL "
            "(or try the image with --local)"
        )
    digest = images.push(args.image)
    payload = _registration(args, entry, target, spec, f"{_repository(args.image)}@{digest}")

    with PlatformClient(args.platform_url, api_key) as platform:
        existing = platform.get_function(payload["name"])
        if existing is not None and all(existing.get(k) == v for k, v in payload.items()):
            result, state = {"function": existing}, "unchanged"
        else:
            result, state = platform.register(payload), "registered"
    _print_result(result, state, payload, args.output)
    return 0


def _check_target(spec: str, workspace: Path) -> Target:
    try:
        return load_target(spec, workspace)
    except TargetError as exc:
        raise ShipError(f"{exc} (checked locally before building)") from None


def _job_entry(path: str, name: str | None) -> dict[str, Any]:
    import yaml

    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ShipError(f"cannot read the job file {path}: {exc}") from None
    entries = (document or {}).get("functions") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ShipError(f"{path}: expected a 'functions:' list of entries")
    if name is not None:
        chosen = [e for e in entries if e.get("name") == name]
        if not chosen:
            raise ShipError(f"{path}: no function named {name!r}")
        return chosen[0]
    if len(entries) != 1:
        names = ", ".join(str(e.get("name")) for e in entries)
        raise ShipError(
            f"{path} has {len(entries)} functions ({names}): choose one with --function"
        )
    return entries[0]


def _classpath(entry: dict[str, Any]) -> str | None:
    classpath = (entry.get("fcmodel") or {}).get("classpath")
    return str(classpath) if classpath else None


def _repository(image: str) -> str:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0] if ":" in last else name


def _default_name(target: Target) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", target.name).lower()


def _registration(
    args: argparse.Namespace, entry: dict[str, Any], target: Target, spec: str, image: str
) -> dict[str, Any]:
    runtime = dict(_DEFAULT_RUNTIME)
    for key, aliases in _RUNTIME_KEYS.items():
        for alias in aliases:
            if alias in (entry.get("runtime") or {}):
                runtime[key] = entry["runtime"][alias]
        option = getattr(args, key, None)
        if option is not None and key != "env":
            runtime[key] = option
    runtime["env"] = {**(runtime.get("env") or {}), **_env_pairs(args.env)}
    payload: dict[str, Any] = {
        "function_type": target.func_type.value,
        "name": args.name or entry.get("name") or _default_name(target),
        "image": image,
        "target": spec,
        "timeout": args.timeout or entry.get("timeout") or 600,
        "runtime": runtime,
    }
    if target.func_type is FunctionType.REWARD:
        payload["weight"] = (
            args.weight if args.weight is not None else float(entry.get("weight", 1.0))
        )
        # From the decorator registry of the class itself, never from its source text.
        payload["reward_metric_weight"] = target.cls().get_weights()
    return payload


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ShipError(f"--env {pair!r} is not KEY=VALUE")
        env[key] = value
    return env


def _print_result(result: dict[str, Any], state: str, payload: dict[str, Any], output: str) -> None:
    function = result.get("function") or {}
    shown = {
        "state": state,
        "name": payload["name"],
        "type": payload["function_type"],
        "image": payload["image"],
        "entity_id": function.get("entity_id"),
        "instance_ids": function.get("instance_ids") or [],
        "request_id": result.get("request_id"),
    }
    if output == "json":
        sys.stdout.buffer.write(orjson.dumps(shown, option=orjson.OPT_INDENT_2) + b"\n")
        return
    for key, value in shown.items():
        text = (
            ", ".join(value) if isinstance(value, list) else ("-" if value is None else str(value))
        )
        print(f"{key:<13}{text}")


def _run_locally(image: str, spec: str) -> int:
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    container = subprocess.run(
        [
            "docker",
            "run",
            "-d",
            "--rm",
            "--stop-timeout",
            "35",
            "-p",
            f"127.0.0.1:{port}:8000",
            "-e",
            f"PROCESSOR_CLASS={spec}",
            image,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    else:
        raise ShipError(
            f"the container did not turn healthy in 120 s; see: docker logs {container[:12]}"
        )
    print(f"serving {spec} from {image} at {url}")
    print(f"  curl -s {url}/api/v1 -H 'content-type: application/json' -d @request.json")
    print(f"  docker stop {container[:12]}")
    return 0
