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


def test_a_key_the_platform_echoes_back_is_never_printed(platform):
    platform.echo_key = True
    key = "sk-echoed/key+with=odd&chars-0123456789"
    forms = (
        key,
        urllib.parse.quote(key, safe=""),
        urllib.parse.quote_plus(key),
        base64.b64encode(key.encode()).decode(),
    )
    for args in (("job", "get", "ft-1"), ("instance", "logs", "rw-ins-1")):
        for fmt in ("table", "json"):
            done = cli(platform, *args, "--api-key", key, "-o", fmt)
            assert done.returncode == 1, done.stderr
            one_error_line(done)
            shown = done.stdout + done.stderr
            assert not [form for form in forms if form in shown], shown
            assert "Bearer sk-" not in shown and "***" in shown
    assert platform.requests[-1]["authorization"] == f"Bearer {key}"  # the key was sent


@pytest.mark.parametrize(
    ("env", "args", "expected"),
    [
        ({"DASHSCOPE_HTTP_BASE_URL": "ftp://x/api"}, (), "is not an http(s) URL"),
        ({"DASHSCOPE_HTTP_BASE_URL": "localhost:8080/api"}, (), "is not an http(s) URL"),
        ({"FC_QUERY_API": "nowhere"}, (), "FC_QUERY_API 'nowhere' is not an http(s) URL"),
        ({}, ("--api-key", "sk-abc\nX-Injected: 1"), "cannot go in an HTTP header"),
        ({}, ("--api-key", "sk-ключ"), "cannot go in an HTTP header"),
        ({"FC_WORKERS_COUNT": "abc"}, (), "FC_WORKERS_COUNT must be a positive whole number"),
        ({"HTTP_REQUEST_TIMEOUT": "soon"}, (), "must be a positive number of seconds"),
    ],
)
def test_local_mistakes_are_usage_errors_and_nothing_is_sent(platform, env, args, expected):
    done = cli(platform, "job", "list", *args, env=env)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done)
    assert expected in line and "Traceback" not in done.stderr
    assert "the request was sent" not in line and "nothing was sent" in line
    assert "ключ" not in line and "X-Injected" not in line  # the key not printed
    assert not platform.requests


def test_the_workspace_header_goes_on_job_calls_only(platform, workspace):
    listed = cli(platform, "job", "list", "--workspace-id", "ws-9")
    assert listed.returncode == 0, listed.stderr
    assert platform.requests[-1]["workspace"] == "ws-9"
    done = cli(
        platform, "upload-data", "--training", "data/calc_train.jsonl", "--workspace-id", "ws-9",
        cwd=workspace,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert platform.requests[-1]["path"] == "/api/v1/files"
    assert platform.requests[-1]["workspace"] is None  # never on file and function calls


def _opd_job(platform: PlatformStandIn, workspace: Path) -> Path:
    uploaded = cli(
        platform, "upload-data", "--training", "data/calc_train.jsonl", "-o", "json", cwd=workspace
    )
    assert uploaded.returncode == 0, uploaded.stderr
    (file_id,) = json.loads(uploaded.stdout)["training_file_ids"]
    opd = workspace / "opd.yaml"
    opd.write_text(f"teacher_model: t\ndatasets:\n- {{type: training, file_id: {file_id}}}\n")
    return opd


def test_waiting_rides_out_transient_errors_and_exit_codes_tell_the_outcomes_apart(
    platform, workspace
):
    opd = _opd_job(platform, workspace)
    platform.flaky[f"GET {FT}/ft-"] = 2  # two 502s on the job's status
    done = cli(platform, "job", "run", "-c", str(opd), "--wait", "--poll-interval", "0.05")
    assert done.returncode == 0, done.stderr
    assert "HTTP 502: <html>502 Bad Gateway</html>; retrying in 0.05 s" in done.stderr
    assert done.stdout.splitlines()[1].split() == ["status", "SUCCEEDED"]

    platform.job_outcome = "FAILED"
    failed = cli(platform, "job", "run", "-c", str(opd), "--wait", "--poll-interval", "0.05")
    assert failed.returncode == 1 and "status      FAILED" in failed.stdout

    platform.job_outcome = "RUNNING"  # never ends
    submitted = cli(platform, "job", "run", "-c", str(opd), "-o", "json")
    job_id = json.loads(submitted.stdout)["job_id"]
    late = cli(platform, "job", "wait", job_id, "--timeout", "0.5", "--poll-interval", "0.05")
    assert late.returncode == 124
    assert one_error_line(late) == f"error: job {job_id} is still RUNNING after 0.5 s"

    platform.flaky[f"GET {FT}/{job_id}"] = 1000  # the platform keeps failing
    lost = cli(platform, "job", "wait", job_id, "--timeout", "0.5", "--poll-interval", "0.05")
    assert lost.returncode == 3
    assert "HTTP 502" in one_error_line(lost) and "its state is unknown" in lost.stderr
