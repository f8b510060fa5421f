"""``register``: what ships and is imported, an instance that fails to start, and its total
deadline. The real CLI (a subprocess) against the stand-in platform or a raw server."""

from __future__ import annotations

import asyncio
import io
import zipfile
from pathlib import Path

import pytest
from conftest import SAMPLES
from helpers import FT, RawServer, cli, http, one_error_line, send


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


# ---- register --timeout: a total deadline ----


def _register_platform(trickled: str) -> RawServer:
    """Answers the calls of ``register --no-lazy-load``; the one named ``trickled`` (the
    layer's status, or the instance's) a byte a second, for five minutes at most."""
    layer = b'{"output": {"layer_code": "layer-1"}}'
    answers: dict[str, bytes] = {
        f"POST {FT}/create/faas/layer": layer,
        f"POST {FT}/create/reward": b'{"output": {"reward_id": "rw-1"}}',
        f"GET {FT}/query/faas/layer/status": b'{"output": {"status": "SUCCESS"}}',
        "PUT /upload": b"",
        f"POST {FT}/query/faas/ins-1": b'{"output": {"status": 1}}',
    }

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        path = target.split("?")[0]
        if path.startswith(f"{FT}/online/faas/"):
            writer.write(http(200, b'{"output": {"instanceId": "ins-1"}}'))
            return
        if path.endswith("/upload/url"):
            url = f"http://127.0.0.1:{server.port}/upload".encode()
            writer.write(http(200, b'{"output": {"url": "%s"}}' % url))
            return
        key = f"{method} {path}"
        if key == trickled:
            answer = http(200, answers[key])
            for byte in answer[:300]:
                if not await send(writer, bytes([byte])):
                    return
                await asyncio.sleep(1)
            return
        body = answers.get(key)
        writer.write(http(200, body) if body is not None else http(404, b'{"message": "no"}'))

    server = RawServer(handle)
    return server


@pytest.mark.parametrize(
    "trickled",
    [f"GET {FT}/query/faas/layer/status", f"POST {FT}/query/faas/ins-1"],
    ids=["layer", "instance"],
)
def test_register_timeout_is_a_total_deadline(tmp_path: Path, trickled: str) -> None:
    """``register --no-lazy-load --timeout 3`` waited for a trickled status answer until
    the request timeout (600 s), retries besides."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "fns.py").write_text((SAMPLES / "functions" / "reward" / "reward.py").read_text())
    with _register_platform(trickled) as server:
        # cli's timeout (200 s) is far inside the 600 s the trickled answer would hold it
        done = cli(
            server, "register", "--reward", "fns:DemoRewardProcessor", "--no-lazy-load",
            "--timeout", "3", "--poll-interval", "0.1", cwd=workspace, timeout=200,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    line = one_error_line(done)
    reasons = ("no complete answer", "not done after 3 s", "time given ran out")
    assert "failed" in line and any(reason in line for reason in reasons), line
    assert "rw-1" in done.stdout  # what was created is printed
