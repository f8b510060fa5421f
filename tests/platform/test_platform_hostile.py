"""The platform client against a hostile platform and an awkward workspace: malformed
answers, a server that trickles one byte a second, an answer far over the size limit,
terminal control sequences in what the platform says, credential files, file names that
are not UTF-8, files that cannot be read. The real CLI (a subprocess) against real
servers: the stand-in platform, or a raw asyncio server that writes its answers byte by
byte."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import urllib.parse
import zipfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import SAMPLES
from helpers import FT, Handler, RawServer, cli, controls, http, one_error_line, send
from platform_standin import PlatformStandIn


def canned(answers: dict[str, Any]) -> Handler:
    """Answers by ``METHOD /path`` (the query left out): a JSON body, HTTP 200."""

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        key = f"{method} {target.split('?')[0]}"
        if key in answers:
            writer.write(http(200, orjson.dumps(answers[key])))
        else:
            writer.write(http(404, b'{"code": "NotFound", "message": "no canned answer"}'))

    return handle


# ---- malformed answers ----------------------------------------------------------------

REWARD_INPUT = '{"agent_output": {"messages": []}}'
MALFORMED = [
    (
        ("job", "get", "ft-1"),
        {f"GET {FT}/ft-1": {"output": "not-an-object"}},
        f"getting job ft-1 failed: the answer to GET {FT}/ft-1 is malformed: output: not a "
        "JSON object",
    ),
    (
        ("job", "list"),
        {f"GET {FT}": {"output": {"jobs": [{"job_id": 7, "status": "RUNNING"}]}}},
        "output.jobs.0.job_id: Input should be a valid string",
    ),
    (
        ("job", "logs", "ft-1"),
        {f"GET {FT}/ft-1/logs": {"output": {"logs": {"step": 1}}}},
        "output.logs: Input should be a valid list",
    ),
    (
        ("job", "cancel", "ft-1"),
        {f"POST {FT}/ft-1/cancel": {"output": ["success"]}},
        "output: not a JSON object",
    ),
    (
        ("instance", "logs", "rw-ins-1"),
        {f"POST {FT}/query/faas/log/rw-ins-1": {"data": {"logEntries": "one line"}}},
        "data.logEntries: Input should be a valid list",
    ),
    (
        ("test-function", "rw-ins-1", "-t", "reward", "-i", REWARD_INPUT),
        {f"POST {FT}/query/faas/rw-ins-1": {"output": {"status": "active"}}},
        "querying instance rw-ins-1 failed: the answer to POST "
        f"{FT}/query/faas/rw-ins-1 is malformed: output.status: Input should be a valid integer",
    ),
    (
        ("upload-data", "--training", "data/calc_train.jsonl"),
        {"POST /api/v1/files": {"data": {"uploaded_files": [{"file_id": None}]}}},
        "data.uploaded_files.0.file_id: Input should be a valid string",
    ),
    (
        ("register", "--reward", "functions.reward.reward:DemoRewardProcessor"),
        {
            f"POST {FT}/create/faas/layer": {"output": {"layer_code": "layer-1"}},
            f"POST {FT}/generate/faas/upload/url": {"output": {"url": 12345}},
        },
        "getting an upload URL failed: the answer to POST "
        f"{FT}/generate/faas/upload/url is malformed: output.url: Input should be a valid string",
    ),
]


@pytest.mark.parametrize(
    ("args", "answers", "expected"), MALFORMED, ids=[" ".join(m[0][:2]) for m in MALFORMED]
)
def test_a_malformed_answer_is_one_line_naming_the_call(workspace, args, answers, expected):
    with RawServer(canned(answers)) as server:
        done = cli(server, *args, cwd=workspace)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    assert expected in one_error_line(done)
    assert server.api_key not in done.stdout + done.stderr


# ---- total deadlines --------------------------------------------------------------------


def trickle(*, headers_at_once: bool) -> Handler:
    """An answer written one byte a second, from its first byte or after its headers; at
    most 300 bytes (five minutes), less once the client has gone."""
    body = b'{"output": {"job_id": "ft-1", "status": "RUNNING", "pad": "' + b"x" * 200 + b'"}}'

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        answer = http(200, body)
        start = answer.index(b"\r\n\r\n") + 4 if headers_at_once else 0
        if not await send(writer, answer[:start]):
            return
        for byte in answer[start : start + 300]:
            if not await send(writer, bytes([byte])):
                return
            await asyncio.sleep(1)

    return handle


@pytest.mark.parametrize("headers_at_once", [False, True], ids=["headers", "body"])
def test_a_trickling_server_cannot_hold_a_request_or_a_wait_past_its_deadline(headers_at_once):
    with RawServer(trickle(headers_at_once=headers_at_once)) as server:
        # a POST that creates nothing: not retried, one request cut at 2 s
        cancel = cli(server, "job", "cancel", "ft-1", "--request-timeout", "2", timeout=60)
        # GETs, retried: all of them together cut at the wait's 3 s
        wait = cli(
            server, "job", "wait", "ft-1", "--timeout", "3", "--poll-interval", "0.1", timeout=60
        )
    assert cancel.returncode == 1, cancel.stderr
    line = one_error_line(cancel)
    assert "canceling job ft-1 failed: no complete answer from 127.0.0.1" in line
    assert "within 2 s (ReadTimeout)" in line
    assert wait.returncode == 3, wait.stderr  # the job's state is unknown
    assert "getting job ft-1 failed" in one_error_line(wait)
    assert "its state is unknown" in wait.stderr and "Traceback" not in wait.stderr


# ---- the size of an answer --------------------------------------------------------------

LIMIT = 16 * 1024 * 1024  # the client's bound on an answer


@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "content-length"])
def test_an_answer_over_the_size_limit_is_refused_without_reading_it_all(declared):
    size = 4 * LIMIT
    prefix = b'{"output": {"job_id": "ft-1", "status": "RUNNING", "pad": "'

    sent = 0

    async def huge(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {size}\r\n".encode() if declared else b"Connection: close\r\n"
        if not await send(writer, head + b"\r\n" + prefix):
            return
        chunk = b"x" * (1024 * 1024)  # generated as it goes, never held whole
        left = size - len(prefix) - 3
        while left > 0:
            if not await send(writer, chunk[: min(left, len(chunk))]):
                return
            sent += min(left, len(chunk))
            left -= len(chunk)
        await send(writer, b'"}}')
        writer.close()

    with RawServer(huge) as server:
        done = cli(server, "job", "get", "ft-1", timeout=120)
    assert done.returncode == 1, f"exit {done.returncode}, {len(done.stdout)} bytes printed"
    assert one_error_line(done).endswith(
        "getting job ft-1 failed: the answer is over the limit of 16 MiB (not read further)"
    )
    assert len(done.stdout) == 0
    assert sent < 2 * LIMIT  # the client stopped reading: most of it was never sent


# ---- control sequences ------------------------------------------------------------------

EVIL = "\x1b]0;pwned\x07 \x1b[2J\x1b[31mred\x1b[0m \x9b31m \x9d0;t\x9c \x90q\x9c bell\x07 del\x7f"


def evil_platform(method: str, target: str) -> tuple[int, Any]:
    path, _, query = target.partition("?")
    job = {"job_id": "ft-evil", "job_name": f"name {EVIL}", "status": "SUCCEEDED"}
    if f"{method} {path}" == f"POST {FT}":
        return 200, {"output": {**job, "status": "PENDING"}}
    if f"{method} {path}" == f"GET {FT}":
        return 200, {"output": {"jobs": [job], "total": 1}}
    if path == f"{FT}/ft-evil":
        return 200, {"output": job}
    if path == f"{FT}/ft-evil/logs":
        first = urllib.parse.parse_qs(query)["offset"] == ["1"]
        return 200, {"output": {"logs": [f"step 1 {EVIL}", f"step 2\t{EVIL}"] if first else []}}
    return 404, {"code": "NotFound", "message": f"no job {EVIL}", "request_id": EVIL}


def test_control_sequences_from_the_platform_never_reach_the_terminal(tmp_path):
    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        status, body = evil_platform(method, target)
        writer.write(http(status, orjson.dumps(body)))

    (tmp_path / "opd.yaml").write_text("teacher_model: t\ndatasets:\n- {file_id: file-1}\n")
    every_format = ("table", "json", "yaml")
    commands = [
        (("job", "wait", "ft-evil", "--poll-interval", "0.05"), every_format),
        (("job", "run", "-c", "opd.yaml", "--wait", "--poll-interval", "0.05"), ("table",)),
        (("job", "logs", "ft-evil"), ("table", "json")),
        (("job", "logs", "ft-evil", "--follow", "--poll-interval", "0.05"), ("table",)),
        (("job", "get", "ft-evil"), every_format),
        (("job", "list"), every_format),
        (("job", "get", "ft-gone"), ("table",)),
    ]
    with RawServer(handle) as server:
        for args, formats in commands:
            for fmt in formats:
                done = cli(server, *args, "-o", fmt, cwd=tmp_path)
                assert done.returncode == (1 if "ft-gone" in args else 0), done.stderr
                shown = done.stdout + done.stderr
                assert not controls(shown), (args, fmt, sorted(controls(shown)))
                assert "pwned" in shown and "Traceback" not in shown
                if args[1] in ("wait", "run"):  # the log lines, escaped on stderr
                    assert "  | step 1 \\x1b]0;pwned\\x07 \\x1b[2J\\x1b[31mred" in done.stderr
                    assert "\\x9b31m \\x9d0;t\\x9c" in done.stderr


# ---- the workspace ------------------------------------------------------------------------

CREDENTIALS = {
    ".aws/credentials": "[default]\naws_access_key_id = AKIAEXAMPLE\n",
    "deploy/.git-credentials": "https://user:token@example.com\n",
    ".docker/config.json": '{"auths": {"registry.example.com": {"auth": "dXNlcjpwYXNz"}}}',
    "kubeconfig": "apiVersion: v1\nkind: Config\n",
    "ops/.kube/config": "apiVersion: v1\nkind: Config\n",
    ".pgpass": "localhost:5432:*:user:password\n",
    "keys/deploy.ppk": "PuTTY-User-Key-File-3: ssh-ed25519\n",
    # by content: a service-account key, a private key block under a harmless name
    "functions/gcp.json": json.dumps(
        {
            "type": "service_account",
            "project_id": "p",
            "private_key_id": "abc",
            "private_key": "-----BEGIN PRIVATE KEY-----\nMIIEvQ==\n-----END PRIVATE KEY-----\n",
        }
    ),
    "functions/signing.txt": "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ==\n-----END OPENSSH PRIVATE KEY-----\n",
}
SHIPPED = {
    "functions/settings.json": '{"type": "settings", "private_key": false}',
    "functions/pem_check.py": 'MARKER = "-----BEGIN PRIVATE KEY-----"\n',
    "functions/kube.py": "",
}


def test_credential_files_are_left_out_by_name_and_by_content_with_a_warning(platform, workspace):
    for name, text in {**CREDENTIALS, **SHIPPED}.items():
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text(text)
    done = cli(
        platform, "register", "--reward", "functions.reward.reward:DemoRewardProcessor",
        cwd=workspace,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (package,) = platform.uploads.values()
    names = set(zipfile.ZipFile(io.BytesIO(package)).namelist())
    assert not set(CREDENTIALS) & names
    assert set(SHIPPED) <= names
    for name in CREDENTIALS:
        assert f"warning: {name} looks like a credentials file and is not shipped" in done.stderr


READ_OVERRIDE_DROPPED = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: root would read anything\n"
    "    libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP: gone after the exec below\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


def test_a_name_that_is_not_utf8_or_a_file_that_cannot_be_read_is_one_line_exit_2(
    platform, workspace
):
    reward = ("register", "--reward", "functions.reward.reward:DemoRewardProcessor")
    bad = os.fsencode(workspace / "functions") + b"/bad\xffname.py"
    with open(bad, "wb") as file:
        file.write(b"X = 1\n")
    undecodable = cli(platform, *reward, cwd=workspace)
    assert undecodable.returncode == 2, undecodable.stderr
    assert "Traceback" not in undecodable.stderr
    line = one_error_line(undecodable)
    assert "functions/bad\\xffname.py: the file name is not valid UTF-8" in line
    assert line.endswith("(nothing was sent)")
    os.remove(bad)

    locked = workspace / "functions" / "table.py"
    locked.write_text("TABLE = {}\n")
    locked.chmod(0)
    python = ("-c", READ_OVERRIDE_DROPPED)
    probe = subprocess.run(
        [sys.executable, *python, "-c", f"open({str(locked)!r})"], capture_output=True
    )
    if probe.returncode == 0:
        pytest.skip("this user reads a file whatever its mode")
    unreadable = cli(platform, *reward, cwd=workspace, python=python)
    assert unreadable.returncode == 2, unreadable.stderr
    assert "Traceback" not in unreadable.stderr
    line = one_error_line(unreadable)
    assert "functions/table.py: cannot read it: Permission denied" in line
    assert line.endswith("(nothing was sent)")
    assert not platform.requests
    assert not platform.requests


# ---- answers nested deep, huge numbers, half an emoji; more credential files ----

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
