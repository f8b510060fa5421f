"""The image starts the console script, which a workspace ``runtime.py`` cannot replace
(``python -m runtime``, run in the image's WORKDIR /workspace, would run that instead).
hadolint on the Dockerfile: tests/deploy/test_dockerfile.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from conftest import ROOT, SAMPLES

SCRIPT = "agentic-rl-runtime"
TARGET = "functions.reward.reward:DemoRewardProcessor"


def _instruction(name: str) -> str:
    """The last ``name`` instruction of the Dockerfile (its final stage's), joined over
    continuation lines."""
    logical, current = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            logical.append(current.strip())
            current = ""
    found = [text for text in logical if text.split(" ", 1)[0] == name]
    assert found, f"the Dockerfile has no {name}"
    return found[-1].split(" ", 1)[1]


def test_the_image_starts_the_console_script():
    assert json.loads(_instruction("ENTRYPOINT")) == [SCRIPT, "serve"]
    scripts = metadata.distribution("agentic-rl-runtime").entry_points.select(
        group="console_scripts"
    )
    assert scripts[SCRIPT].value == "runtime.cli:main"


def test_the_healthcheck_keeps_the_workspace_off_its_path():
    command = json.loads(_instruction("HEALTHCHECK").split("CMD", 1)[1])
    assert command[:3] == ["python", "-I", "-c"]


def test_a_workspace_runtime_module_replaces_python_m_runtime_not_the_script(tmp_path):
    """What the image does, without docker: the workspace is the current directory."""
    ws = tmp_path / "workspace"
    shutil.copytree(SAMPLES, ws, ignore=shutil.ignore_patterns("__pycache__"))
    (ws / "runtime.py").write_text("raise SystemExit('hijacked: the workspace runtime.py ran')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PROCESSOR_CLASS", "FUNC_TYPE")}
    args = ["invoke", TARGET, "--input", "requests/reward.json"]

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *args], cwd=ws, env=env, capture_output=True, text=True, timeout=120
        )

    hijacked = run(sys.executable, "-m", "runtime")
    assert hijacked.returncode == 1 and "hijacked" in hijacked.stderr  # why the image avoids it
    served = run(str(Path(sys.executable).parent / SCRIPT))
    assert served.returncode == 0, served.stderr
    assert json.loads(served.stdout)["reward"]["reward_score"] == 1.0
