"""The platform commands under attack: what ships, what is printed, what a local mistake
or a flaky platform does. The real CLI (a subprocess) against the stand-in platform."""

from __future__ import annotations

import base64
import io
import json
import shutil
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SAMPLES
from platform_standin import PlatformStandIn
from test_platform_cli import FT, cli, one_error_line


@pytest.fixture
def platform() -> Iterator[PlatformStandIn]:
    with PlatformStandIn() as standin:
        yield standin
    for instance in standin.started:
        assert instance.process.poll() is not None
        assert not Path(instance.directory.name).exists()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return Path(
        shutil.copytree(SAMPLES, tmp_path / "ws", ignore=shutil.ignore_patterns("__pycache__"))
    )


def _own(tmp_path: Path, files: dict[str, str]) -> Path:
    ws = tmp_path / "own"
    for name, text in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    return ws


REWARD = (
    "from processors_base import AbstractRewardProcessor, Reward, RewardOutput\n"
    "{imports}\n\n"
    "class R(AbstractRewardProcessor):\n"
    "    def process(self, input_data):\n"
    "        return RewardOutput(reward=Reward(reward_score={score}))\n"
)


def test_the_import_check_imports_what_ships_and_nested_data_packages_ship(platform, tmp_path):
    ws = _own(
        tmp_path,
        {
            "fns/__init__.py": "",
            "fns/data/__init__.py": "",
            "fns/data/table.py": "SCORE = 0.5\n",
            "fns/r.py": REWARD.format(imports="from fns.data.table import SCORE", score="SCORE"),
            # a namespace package at the top named data/: importable here, never shipped
            "data/extra.py": "BONUS = 1\n",
            "fns/bad.py": REWARD.format(imports="from data.extra import BONUS", score="BONUS"),
        },
    )
    done = cli(platform, "register", str(ws), "--reward", "fns.r:R", "-o", "json")
    assert done.returncode == 0, done.stderr
    (package,) = platform.uploads.values()
    assert "fns/data/table.py" in zipfile.ZipFile(io.BytesIO(package)).namelist()

    count = len(platform.requests)
    bad = cli(platform, "register", str(ws), "--reward", "fns.bad:R")
    assert bad.returncode == 1
    line = one_error_line(bad)
    assert "No module named 'data'" in line and "imported from the package" in line
    assert len(platform.requests) == count  # nothing sent


def test_an_instance_that_fails_to_start_is_reported_with_its_logs_and_deleted(platform, tmp_path):
    ws = _own(
        tmp_path,
        {
            "fns/__init__.py": "",
            # imports here; dies on the instance (where the platform sets FC_SERVER_PORT)
            "fns/r.py": "import os\n"
            "if os.environ.get('FC_SERVER_PORT'):\n"
            "    raise SystemExit('no GPU on this instance: giving up')\n"
            + REWARD.format(imports="", score="1.0"),
        },
    )
    done = cli(
        platform, "register", str(ws), "--reward", "fns.r:R", "--no-lazy-load",
        "--poll-interval", "0.1", "--timeout", "240",
    )  # fmt: skip
    assert done.returncode == 1
    line = one_error_line(done)
    assert "failed to start (platform status -1)" in line and "was deleted" in line
    assert "no GPU on this instance: giving up" in done.stderr  # its last log lines
    assert not platform.instances  # deleted
    assert any(r["path"].startswith(f"{FT}/delete/faas/") for r in platform.requests)
