"""Each function served as it will be on the platform: its package, unpacked, run by start.sh.

The package is the zip ``register`` uploads (``runtime.platform.packaging``): the workspace
files that ship (``data/``, ``tests/``, ``*.md`` ... do not) plus the generated
``start.sh``, which runs ``python -m runtime serve`` on the port the platform names in
``FC_SERVER_PORT``. Each server runs in its own session, so that a Ctrl-C in the terminal
reaches eval only, which then stops every server it started (their children too) and
removes the temporary directory.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from runtime.eval.plan import FunctionUnderTest, StartError
from runtime.platform import packaging

__all__ = ["Served", "serve_all"]

START_TIMEOUT = 120.0  # setup() may load a model or a tokenizer
_STOP_GRACE = 10.0
# Settings a user's shell may have that would override what start.sh and eval set.
_CLEARED = (
    "PORT",
    "SERVER_PORT",
    "HOST",
    "PROCESSOR_CLASS",
    "FUNC_TYPE",
    "WORKERS_COUNT",
    "WORKSPACE_DIR",
    "PYTHONPATH",
    "FC_LAYER_USED",
)


@dataclass
class Served:
    function: FunctionUnderTest
    url: str
    process: subprocess.Popen[bytes]
    log: Path


def unpack_package(function: FunctionUnderTest, into: Path) -> Path:
    """The function's package, as ``register`` would build and upload it, unpacked."""
    component = function.component
    try:
        requirements = packaging.layer_requirements(
            component.zipdir, component.requirements_path, "runtime"
        )
        package = packaging.build_package(
            component.zipdir,
            function.kind,
            component.module,
            component.class_name,
            requirements,
            extra_files=component.extra_files,
        )
    except packaging.PackagingError as exc:
        raise StartError(f"{function.name}: {exc}") from None
    with zipfile.ZipFile(io.BytesIO(package.data)) as archive:
        for info in archive.infolist():
            path = Path(archive.extract(info, into))
            path.chmod((info.external_attr >> 16) & 0o777 or 0o644)
    return into


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environment(function: FunctionUnderTest, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env.update(function.env)  # the job file's runtime.env, as the platform sets it
    # start.sh runs python3: this interpreter's, so that the same packages are there
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(
        FC_SERVER_PORT=str(port),
        HOST="127.0.0.1",
        REQUEST_TIMEOUT=f"{function.timeout:g}",
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
        GRACE_PERIOD="2",  # eval has no requests worth draining when it stops a server
    )
    if function.concurrency:
        env["CONCURRENCY"] = str(function.concurrency)
    return env


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def _start(function: FunctionUnderTest, root: Path) -> Served:
    folder = unpack_package(function, root / function.name)
    port = _free_port()
    log = root / f"{function.name}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            ["bash", str(folder / "start.sh")],
            cwd=folder,
            env=_environment(function, port),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Served(function, f"http://127.0.0.1:{port}", process, log)


def _wait_ready(served: Served, deadline: float) -> None:
    with httpx.Client(timeout=2.0) as client:
        while True:
            code = served.process.poll()
            if code is not None:
                raise StartError(
                    f"{served.function.name} ({served.function.component.target}) exited "
                    f"with code {code} before it was ready:\n{_tail(served.log)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{served.url}/health").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise StartError(
                    f"{served.function.name} was not ready after {START_TIMEOUT:g} s:\n"
                    f"{_tail(served.log)}"
                )
            time.sleep(0.1)


def _signal(served: Served, sig: signal.Signals) -> None:
    # the server's children (isolation processes) share its process group
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(served.process.pid, sig)


def _stop(started: list[Served]) -> None:
    """SIGTERM to every server's process group; SIGKILL to those not gone after a grace."""
    for served in started:
        _signal(served, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE
    for served in started:
        try:
            served.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(served, signal.SIGKILL)
            served.process.wait()
        _signal(served, signal.SIGKILL)  # whatever the server left in its group


@contextlib.contextmanager
def serve_all(
    functions: list[FunctionUnderTest], logs_to: Path | None = None
) -> Iterator[dict[str, Served]]:
    """Every function served and ready; all stopped and the directory removed on exit."""
    root = Path(tempfile.mkdtemp(prefix="runtime-eval-"))
    started: list[Served] = []
    try:
        for function in functions:
            started.append(_start(function, root))
        deadline = time.monotonic() + START_TIMEOUT
        for served in started:
            _wait_ready(served, deadline)
        yield {s.function.name: s for s in started}
    finally:
        _stop(started)
        if logs_to is not None and started:
            with contextlib.suppress(OSError):
                logs_to.mkdir(parents=True, exist_ok=True)
                for served in started:
                    shutil.copyfile(served.log, logs_to / served.log.name)
        shutil.rmtree(root, ignore_errors=True)
