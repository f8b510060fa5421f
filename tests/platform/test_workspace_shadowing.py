"""A workspace whose top-level names are the runtime's own packages (``runtime.py``,
``runtime/``, ``processors_base.py``, ``processors_base/``): packaging refuses it, serve
and invoke warn of it, and nothing runs the workspace's module in place of the runtime."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES, TESTS, reward_body

from runtime.platform import packaging
from runtime.platform.functions import Component, check_imports
from runtime.platform.progress import Reporter
from runtime.platform.shadowing import shadowed_package, workspace_shadows

HIJACK = "raise SystemExit('hijacked: the workspace module ran')\n"
TARGET = "functions.reward.reward:DemoRewardProcessor"
SCRIPT = Path(sys.executable).parent / "agentic-rl-runtime"


@pytest.mark.parametrize(
    ("name", "package"),
    [
        ("runtime.py", "runtime"),
        ("runtime/__init__.py", "runtime"),
        ("runtime/notes.txt", "runtime"),  # merged into the runtime's own directory
        ("processors_base.py", "processors_base"),
        ("processors_base.pyc", "processors_base"),
        ("processors_base/models.py", "processors_base"),
        ("runtime.cpython-311-x86_64-linux-gnu.so", "runtime"),
        ("runtime.txt", None),
        ("runtime", None),  # a file without a module suffix is not importable
        ("runtime_utils.py", None),
        ("my_runtime/runtime.py", None),
        ("functions/runtime.py", None),  # below the top: functions.runtime
    ],
)
def test_which_workspace_paths_shadow_the_runtime(name, package):
    assert shadowed_package(name) == package


def _workspace(tmp_path: Path, *shadows: str) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(SAMPLES, ws, ignore=shutil.ignore_patterns("__pycache__", "data"))
    for shadow in shadows:
        path = ws / shadow
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HIJACK)
    return ws


def _package(ws: Path, server: str = "runtime") -> packaging.Package:
    module, _, name = TARGET.partition(":")
    return packaging.build_package(ws, "reward", module, name, "", server=server)


@pytest.mark.parametrize(
    ("shadow", "named"),
    [
        ("runtime.py", "runtime.py"),
        ("processors_base.py", "processors_base.py"),
        ("processors_base/__init__.py", "processors_base/"),
        ("runtime/extra.py", "runtime/"),
    ],
)
def test_packaging_refuses_a_workspace_that_shadows_the_runtime(tmp_path, shadow, named):
    ws = _workspace(tmp_path, shadow)
    with pytest.raises(packaging.PackagingError) as caught:
        _package(ws)
    message = str(caught.value)
    assert f"the workspace has {named} at its top" in message
    assert "would shadow the runtime's sources" in message and "rename it" in message


def test_packaging_takes_names_that_only_look_alike(tmp_path):
    ws = _workspace(tmp_path, "runtime_utils.py", "functions/runtime.py")
    (ws / "runtime.txt").write_text("notes\n")
    entries = _package(ws).entries
    assert {"runtime_utils.py", "functions/runtime.py", "runtime.txt"} <= set(entries)
    assert "runtime/cli.py" in entries  # the runtime's own sources, at the top


def test_the_sdk_server_ships_a_workspace_runtime_module(tmp_path):
    """--server sdk ships no runtime sources and starts the SDK's server: nothing to shadow."""
    ws = _workspace(tmp_path, "runtime.py")
    assert "runtime.py" in _package(ws, server="sdk").entries


def test_the_import_check_imports_the_runtime_not_the_workspace_module(tmp_path):
    """register's import check runs in the workspace: its runtime.py must not run instead."""
    ws = _workspace(tmp_path, "runtime.py")
    module, _, name = TARGET.partition(":")
    component = Component("reward", "the reward", ws, module=module, class_name=name)
    check_imports([component], Reporter(io.StringIO(), tty=False))
    assert component.weights is None  # the check ran and answered (no sub-rewards)


def test_the_workspace_shadows_found_for_serve(tmp_path):
    ws = _workspace(tmp_path, "runtime.py", "processors_base/__init__.py", "runtime_x.py")
    (ws / "runtime").mkdir()  # no __init__: a namespace portion, which a package outranks
    assert workspace_shadows(ws) == ["processors_base/", "runtime.py"]
    assert workspace_shadows(ROOT) == []  # the runtime's own checkout shadows nothing


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PROCESSOR_CLASS", "FUNC_TYPE")}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_invoke_warns_of_a_workspace_module_the_runtime_hides(tmp_path):
    ws = _workspace(tmp_path, "runtime.py")
    done = _run([str(SCRIPT), "invoke", TARGET, "--input", "requests/reward.json"], ws)
    assert done.returncode == 0, done.stderr
    assert "hijacked" not in done.stderr
    assert f"the workspace {ws.resolve()} has runtime.py" in done.stderr
    assert "rename it" in done.stderr


def test_serve_warns_of_a_workspace_module_the_runtime_hides(tmp_path):
    """The warning comes before anything is served: a setup() that fails ends the server."""
    ws = _workspace(tmp_path, "processors_base.py")
    (ws / "broken.py").write_text(
        "from processors_base import AbstractRewardProcessor\n\n\n"
        "class Broken(AbstractRewardProcessor):\n"
        "    def setup(self):\n"
        "        raise RuntimeError('setup fails on purpose')\n\n"
        "    def process(self, input_data):\n"
        "        raise AssertionError('never called')\n"
    )
    done = _run([str(SCRIPT), "serve", "broken:Broken", "--port", "0"], ws)
    assert done.returncode != 0
    assert "setup fails on purpose" in done.stderr
    assert f"the workspace {ws.resolve()} has processors_base.py" in done.stderr


def test_python_m_runtime_runs_on_its_own_processors_base_not_the_workspaces(tmp_path):
    """``python -m runtime`` puts the current directory first on sys.path; a workspace's
    processors_base (here a full copy, which imports cleanly, and says so) must not be what
    the server runs on: the directory is taken off the path before anything is imported,
    and the copy is named in a warning. Found first by way of PYTHONPATH, a copy is refused."""
    ws = _workspace(tmp_path)
    shutil.copytree(
        ROOT / "processors_base",
        ws / "processors_base",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    init = ws / "processors_base" / "__init__.py"
    init.write_text('import sys; sys.stderr.write("hijacked\\n")\n' + init.read_text())
    command = [sys.executable, "-m", "runtime", "invoke", TARGET, "-i", "requests/reward.json"]
    done = _run(command, ws)
    assert done.returncode == 0, done.stderr
    assert "hijacked" not in done.stderr
    assert json.loads(done.stdout)["status"] == "success"
    assert f"the workspace {ws.resolve()} has processors_base/" in done.stderr

    elsewhere = tmp_path / "elsewhere"  # a copy found before the runtime's own, by PYTHONPATH
    shutil.move(ws / "processors_base", elsewhere / "processors_base")
    forced = subprocess.run(
        command, cwd=ws, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(elsewhere)},
    )  # fmt: skip
    assert forced.returncode == 2, forced.stderr
    assert f"processors_base was imported from {elsewhere.resolve()}" in forced.stderr
    assert "agentic-rl-runtime command instead" in forced.stderr
    assert forced.stdout == ""


# libraries the runtime imports: a workspace module of the same name must not run in their
# place, whether the process loads the class (invoke, one worker) or spawns workers
LIBRARIES = (
    "uvicorn.py",
    "starlette.py",
    "orjson.py",
    "prometheus_client.py",
    "anyio.py",
    "uvloop.py",
    "yaml.py",
)


def test_a_workspace_module_named_as_a_library_never_stands_in_for_it(tmp_path, start_server):
    ws = _workspace(tmp_path, *LIBRARIES)
    done = _run(
        [sys.executable, "-m", "runtime", "invoke", TARGET, "-i", "requests/reward.json"], ws
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "success"
    for workers in ("1", "2"):
        server = start_server(TARGET, "--workers", workers, workspace=ws)
        answer = server.post(reward_body())
        assert answer.status_code == 200 and answer.json()["status"] == "success", answer.text
        assert "hijacked" not in server.output()
        assert server.terminate() == 0, server.output()


def test_a_workspace_module_named_as_a_library_never_stands_in_for_it_under_the_sdk_alias(
    tmp_path,
):
    """A function written for the DashScope SDK loads through the runtime's alias of it,
    whose names include the job file's models: none of what they import comes from the
    workspace either (PyYAML: read only with a job file)."""
    ws = tmp_path / "ws"
    shutil.copytree(TESTS / "sdk_workspace", ws, ignore=shutil.ignore_patterns("__pycache__"))
    for shadow in LIBRARIES:
        (ws / shadow).write_text(HIJACK)
    (ws / "reward.json").write_text(json.dumps(reward_body()))
    target = "functions.plain_reward:ExactMatchReward"
    done = _run([sys.executable, "-m", "runtime", "invoke", target, "-i", "reward.json"], ws)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "success"
