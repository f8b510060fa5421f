"""The platform client against what a review found after the first round of fixes: answers
nested deep, numbers too large for 64 bits, half an emoji in a log line, ``register
--timeout`` against a platform that trickles its answers, numbers on the command line that
mean nothing, and credential files the first list missed. The real CLI (a subprocess)
against real servers (``tests/test_platform_hostile.py``'s raw server, the stand-in)."""

from __future__ import annotations

import asyncio
import io
import time
import zipfile
from pathlib import Path

import pytest
from conftest import SAMPLES
from platform_standin import PlatformStandIn
from test_platform_cli import FT, cli, one_error_line
from test_platform_hostile import RawServer, http, send

JOB = b'{"output": {"job_id": "ft-1", "status": "RUNNING", "extra": %s}}'
DEEP = [
    ("300 levels", JOB % (b"[" * 300 + b"]" * 300)),
    ("100,000 levels", JOB % (b"[" * 100_000 + b"]" * 100_000)),
    ("an integer of 100 digits", JOB % (b"9" * 100)),
]


def raw(answers: dict[str, bytes]) -> RawServer:
    """A server answering ``METHOD /path`` with the raw JSON bytes given (HTTP 200)."""

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        body = answers.get(f"{method} {target.split('?')[0]}")
        writer.write(http(200, body) if body is not None else http(404, b'{"message": "no"}'))

    return RawServer(handle)


@pytest.mark.parametrize(("what", "body"), DEEP, ids=[d[0] for d in DEEP])
def test_an_answer_nested_deep_or_with_a_huge_number_is_malformed_not_a_crash(what, body):
    """Nested 300 levels deep, ``-o table`` and ``-o json`` crashed on orjson's limit
    (``TypeError: Recursion limit reached``); 100,000 levels deep, the parser itself
    (``RecursionError``); an integer past 64 bits, ``-o json`` (``Integer exceeds 64-bit
    range``). Each is one error line naming the call, whatever the format."""
    with raw({f"GET {FT}/ft-1": body}) as server:
        for fmt in ("table", "json", "yaml"):
            done = cli(server, "job", "get", "ft-1", "-o", fmt)
            assert "Traceback" not in done.stderr, (fmt, done.stderr[-600:])
            if b"9" * 100 in body:  # a number: as a float, like any JSON reader
                assert done.returncode == 0, done.stderr
                continue
            assert done.returncode == 1, done.stderr
            line = one_error_line(done)
            assert f"getting job ft-1 failed: the answer to GET {FT}/ft-1 is malformed" in line
            assert "nested" in line


SURROGATE_JOB = b'{"output": {"job_id": "ft-1", "status": "SUCCEEDED", "job_name": "a \\ud83d"}}'
SURROGATE_LOGS = b'{"output": {"logs": ["step 1 \\ud83d", "step 2 \\ud83d\\ude00"]}}'


def test_half_an_emoji_in_an_answer_is_replaced_not_a_crash():
    """A lone surrogate (JSON ``\\ud83d``, as a log line cut in the middle of an emoji
    carries) crashed ``-o table`` (``UnicodeEncodeError``) and ``-o json`` (``TypeError``):
    it is shown as U+FFFD; a whole emoji is kept."""
    answers = {f"GET {FT}/ft-1": SURROGATE_JOB, f"GET {FT}/ft-1/logs": SURROGATE_LOGS}
    with raw(answers) as server:
        for args in (("job", "get", "ft-1"), ("job", "logs", "ft-1")):
            for fmt in ("table", "json", "yaml"):
                done = cli(server, *args, "-o", fmt)
                assert done.returncode == 0, (args, fmt, done.stderr[-600:])
                assert "Traceback" not in done.stderr
        table = cli(server, "job", "logs", "ft-1")
        waited = cli(server, "job", "wait", "ft-1", "--poll-interval", "0.1")
    assert table.stdout.splitlines() == ["step 1 \ufffd", "step 2 \U0001f600"]
    assert waited.returncode == 0, waited.stderr
    assert "  | step 1 \ufffd" in waited.stderr


def test_an_instance_answer_nested_deep_is_one_error_line(tmp_path: Path):
    """test-function parsed the instance's answer with a recursive parser: 100,000 levels
    ended in ``RecursionError`` and a traceback."""
    answers: dict[str, bytes] = {}
    with raw(answers) as server:
        url = f"http://127.0.0.1:{server.port}/instance"
        answers[f"POST {FT}/query/faas/rw-ins-1"] = (
            b'{"output": {"status": 2, "trigger_url": "%s", "trigger_token": "t"}}' % url.encode()
        )
        answers["POST /instance/api/v1"] = b"[" * 100_000 + b"]" * 100_000
        done = cli(
            server, "test-function", "rw-ins-1", "-t", "reward", "-i",
            '{"agent_output": {"messages": []}}',
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    assert "calling instance rw-ins-1 failed" in one_error_line(done)


# ---- register --timeout: a total deadline ---------------------------------------------


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
        started = time.monotonic()
        done = cli(
            server, "register", "--reward", "fns:DemoRewardProcessor", "--no-lazy-load",
            "--timeout", "3", "--poll-interval", "0.1", cwd=workspace, timeout=200,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert elapsed < 40, elapsed  # the import check and packaging take a few seconds
    line = one_error_line(done)
    reasons = ("no complete answer", "not done after 3 s", "time given ran out")
    assert "failed" in line and any(reason in line for reason in reasons), line
    assert "rw-1" in done.stdout  # what was created is printed


# ---- numbers on the command line ------------------------------------------------------

BAD_NUMBERS = [
    ("job", "wait", "ft-1", "--poll-interval", "-1"),
    ("job", "wait", "ft-1", "--poll-interval", "nan"),
    ("job", "wait", "ft-1", "--poll-interval", "1e300"),
    ("job", "wait", "ft-1", "--poll-interval", "0"),
    ("job", "wait", "ft-1", "--timeout", "-1"),
    ("job", "wait", "ft-1", "--timeout", "nan"),
    ("job", "run", "-c", "job.yaml", "--wait", "--poll-interval", "-1"),
    ("job", "logs", "ft-1", "--follow", "--poll-interval", "-1"),
    ("job", "logs", "ft-1", "--lines", "0"),
    ("job", "logs", "ft-1", "--offset", "0"),
    ("job", "list", "--size", "0"),
    ("job", "list", "--page", "-3"),
    ("job", "get", "ft-1", "--request-timeout", "0"),
    ("register", "--reward", "fns:X", "--timeout", "inf"),
]


@pytest.mark.parametrize("args", BAD_NUMBERS, ids=[" ".join(a[:2] + a[-2:]) for a in BAD_NUMBERS])
def test_a_number_that_means_nothing_is_a_usage_error(tmp_path: Path, args) -> None:
    """``--poll-interval -1`` (or nan, or 1e300) ended in a traceback from time.sleep, after
    a request; ``0`` asks the platform in a loop without a pause; ``--timeout -1`` said the
    job's state was unknown (exit 3); ``--request-timeout 0`` was taken for 600; sizes and
    pages of 0 or less were sent as they were."""
    (tmp_path / "job.yaml").write_text("teacher_model: t\ndatasets:\n- {file_id: file-1}\n")
    asked: list[str] = []

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        asked.append(f"{method} {target}")
        writer.write(http(404, b'{"message": "no"}'))

    with RawServer(handle) as server:
        done = cli(server, *args, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert not asked
    assert args[-2] in done.stderr.splitlines()[-1], done.stderr


# ---- credential files -----------------------------------------------------------------

MORE_CREDENTIALS = {
    ".config/gcloud/application_default_credentials.json": (
        '{"client_id": "x", "client_secret": "y", "refresh_token": "z", "type": "authorized_user"}'
    ),
    ".config/gh/hosts.yml": "github.com:\n    oauth_token: gho_example\n",
    ".cargo/credentials.toml": '[registry]\ntoken = "cio_example"\n',
    ".s3cfg": "[default]\naccess_key = AKIAEXAMPLE\nsecret_key = example\n",
    ".vault-token": "hvs.example\n",
    ".ENV": "SECRET=1\n",
    "ID_RSA": "key\n",
    # by content: AWS keys under a name of the user's
    "functions/aws.ini": "[default]\naws_access_key_id = AKIAEXAMPLE\n"
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
}
STILL_SHIPPED = {
    "functions/settings.ini": "[default]\nregion = cn-beijing\n",
    "functions/credentials_check.py": "AWS = 'aws_secret_access_key'\n",
}


def test_more_credential_files_are_left_out_with_a_warning(tmp_path: Path) -> None:
    """The GitHub CLI's token, the gcloud application-default credentials, cargo's and
    s3cmd's credentials, a Vault token, names in upper case and AWS keys in a file of the
    user's naming were packaged silently."""
    import shutil

    workspace = Path(
        shutil.copytree(SAMPLES, tmp_path / "ws", ignore=shutil.ignore_patterns("__pycache__"))
    )
    for name, text in {**MORE_CREDENTIALS, **STILL_SHIPPED}.items():
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text(text)
    with PlatformStandIn() as platform:
        done = cli(
            platform, "register", "--reward", "functions.reward.reward:DemoRewardProcessor",
            cwd=workspace,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (package,) = platform.uploads.values()
    names = set(zipfile.ZipFile(io.BytesIO(package)).namelist())
    assert not set(MORE_CREDENTIALS) & names, set(MORE_CREDENTIALS) & names
    assert set(STILL_SHIPPED) <= names
    for name in MORE_CREDENTIALS:
        assert f"warning: {name} looks like a credentials file and is not shipped" in done.stderr


# ---- ids are ids, never paths ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "sent"),
    [
        (("job", "delete", "../files/file-1"), f"DELETE {FT}/..%2Ffiles%2Ffile-1"),
        (("job", "cancel", "ft-1/../ft-2"), f"POST {FT}/ft-1%2F..%2Fft-2/cancel"),
        (("job", "get", "ft-1?page_no=9"), f"GET {FT}/ft-1%3Fpage_no%3D9"),
        (("instance", "delete", "ins-1#x"), f"POST {FT}/delete/faas/ins-1%23x"),
        (("job", "delete", ".."), None),
        (("instance", "logs", "."), None),
    ],
)
def test_an_id_is_one_segment_of_the_url_never_a_path(args, sent) -> None:
    """``job delete ../files/file-1`` sent ``DELETE /api/v1/files/file-1`` (another
    resource, deleted with the user's key), ``job cancel ft-1/../ft-2`` cancelled ft-2 and
    ``job get 'ft-1?page_no=9'`` sent a query: an id copied from anywhere (a job list of a
    hostile platform, a script) must name what it names."""
    asked: list[str] = []

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        asked.append(f"{method} {target}")
        writer.write(http(404, b'{"message": "no"}'))

    with RawServer(handle) as server:
        done = cli(server, *args, timeout=60)
    assert "Traceback" not in done.stderr
    if sent is None:
        assert done.returncode == 2, done.stderr
        assert not asked
        assert f"{args[-1]!r} is not an id" in one_error_line(done)
    else:
        assert done.returncode == 1, done.stderr  # the 404
        assert asked == [sent]


def test_an_extra_file_that_is_not_there_is_a_usage_error(tmp_path: Path) -> None:
    """``fcmodel.extra_files`` naming a file that is not there (a typo) was skipped
    silently: the function shipped without it, to fail on the platform."""
    import shutil

    workspace = Path(
        shutil.copytree(SAMPLES, tmp_path / "ws", ignore=shutil.ignore_patterns("__pycache__"))
    )
    (workspace / "job.yaml").write_text(
        "teacher_model: t\n"
        "functions:\n"
        "- type: reward\n"
        "  fcmodel:\n"
        "    classpath: functions.reward.reward:DemoRewardProcessor\n"
        "    extra_files: [./configs/setings.yaml]\n"
        "datasets:\n- {file_id: file-1}\n"
    )
    asked: list[str] = []

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        asked.append(f"{method} {target}")
        writer.write(http(404, b'{"message": "no"}'))

    with RawServer(handle) as server:
        done = cli(server, "job", "run", "-c", "job.yaml", cwd=workspace, timeout=120)
    assert done.returncode == 2, done.stderr
    assert not asked
    line = one_error_line(done)
    assert "configs/setings.yaml" in line and "extra_files" in line, line
