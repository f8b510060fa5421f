"""How runtime.serving is put together: the trainer routes are mounted by whoever builds
the app (server.build_app), so the app never imports them, and no two serving modules
import each other."""

from __future__ import annotations

import subprocess
import sys

import grimp
import httpx
from conftest import TESTS

from runtime.config import Settings
from runtime.execution.function import Function
from runtime.execution.loading import load_target
from runtime.serving.app import FunctionApp
from runtime.serving.server import build_app


def test_no_two_serving_modules_import_each_other():
    graph = grimp.build_graph("runtime")
    circles = [
        (a, b)
        for a in graph.modules
        if a.startswith("runtime.serving")
        for b in graph.find_modules_directly_imported_by(a)
        if a in graph.find_modules_directly_imported_by(b)
    ]
    assert circles == []
    assert "runtime.serving.trainers" not in graph.find_upstream_modules("runtime.serving.app")


async def _status(app: FunctionApp, path: str) -> int:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return (await client.post(path, json={})).status_code


async def test_the_trainer_routes_are_mounted_by_build_app():
    bare = FunctionApp(Function(load_target("workspace.fns:EchoReward", TESTS)), Settings())
    assert await _status(bare, "/verify") == 404
    built = build_app(Settings(target="workspace.fns:EchoReward", workspace=str(TESTS)))
    assert await _status(built, "/verify") == 503  # there: starting, setup() not run


def test_serving_without_tracing_leaves_out_the_tracing_sdk_and_yaml():
    """What `serve` imports before its first request, tracing off: neither OpenTelemetry's
    SDK (the tracer provider of the runtime's spans) nor PyYAML (for job files and
    manifests), about 20 ms of each cold start together; user code still gets
    OpenTelemetry's API."""
    modules = "runtime.cli runtime.compat.sdk runtime.serving.server runtime.serving.supervisor"
    code = f"import sys, {', '.join(modules.split())}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    imported = out.stdout.split()
    assert "runtime.serving.server" in imported
    assert "opentelemetry.trace" in imported  # the API, for processors_base.observability
    left_in = [
        m for m in imported if m.split(".")[0] == "yaml" or m.startswith("opentelemetry.sdk")
    ]
    assert left_in == []
