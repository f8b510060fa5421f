"""Each function served as it will be on the platform: its package, unpacked, run by start.sh.

The package is the zip ``register`` uploads (``runtime.platform.packaging``): the workspace
files that ship (``data/``, ``tests/``, ``*.md`` ... do not) plus the generated
``start.sh``, which runs ``python -m runtime serve`` on the port the platform names in
``FC_SERVER_PORT``. Each server runs in its own session, so that a Ctrl-C in the terminal
reaches eval only, which then stops every server it started (their children too) and
removes the temporary directory. Should eval be killed outright (``kill -9``), the kernel
sends each server SIGTERM (Linux: ``PR_SET_PDEATHSIG``), and the next eval removes the
temporary directory the dead one left (named with its pid).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from runtime.eval.files import OutDir
from runtime.eval.plan import FunctionUnderTest, StartError
from runtime.platform import packaging

__all__ = ["Served", "exited", "remove_stale", "serve_all"]

_PREFIX = "runtime-eval-"
_PR_SET_PDEATHSIG = 1

_NAME_CHARS = 60  # of a function's name in its folder's and log's names (UTF-8: 4 bytes each)
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
    folder: Path  # its package, unpacked
    port: int
    process: subprocess.Popen[bytes]
    log: Path  # every start's output, appended
    log_start: int  # where this start's output begins in it
    hold: socket.socket | None  # holds the port for the server (see reserve_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def unpack_package(function: FunctionUnderTest, into: Path) -> Path:
    """The function's package, as ``register`` would build and upload it, unpacked."""
    component = function.component
    try:
        requirements = packaging.layer_requirements(
            component.zipdir, component.requirements_path, "runtime"
        )
        package = packaging.build_package_file(  # from disk: a workspace of any size
            component.zipdir,
            function.kind,
            component.module,
            component.class_name,
            requirements,
            extra_files=component.extra_files,
        )
    except packaging.PackagingError as exc:
        raise StartError(f"{function.name}: {exc}") from None
    with package, zipfile.ZipFile(package.path) as archive:
        for info in archive.infolist():
            path = Path(archive.extract(info, into))
            path.chmod((info.external_attr >> 16) & 0o777 or 0o644)
    return into


# Ports for the servers eval starts: above Linux's default ephemeral range (32768-60999),
# where connect() takes the source ports of outgoing connections (one took the port eval had
# just found free, and that server could not listen), and away from the ports services are
# set to use (Ray's 6379, 8265 and 10002-19999, say).
_PORT_RANGE = (61000, 65535)
_HOLD = sys.platform.startswith("linux")  # the hold relies on Linux's SO_REUSEADDR (see below)
_LISTEN_ATTEMPTS = 3  # a server whose port another process took first starts on another
_CANNOT_LISTEN = 2  # serve's exit code for a port in use, or a wrong setting (docs/serving.md)


def reserve_port() -> tuple[int, socket.socket | None]:
    """A free loopback port, drawn at random, and on Linux a socket that holds it for the
    server. Drawn at random: bind(0) hands recently freed ports out again (72 times in 20,000
    probes here, one of the previous 50), and two evals could get the same one. Held: bound
    without SO_REUSEADDR, the probe fails on a port anything else has; SO_REUSEADDR set
    after the bind then lets the server, which sets it too (socket.create_server), bind and
    listen there, while a bind without it (another eval's probe among them) and the
    kernel's choice of an outgoing connection's source port keep off it (5,000 connects
    here never took one of 2,000 ports held so). Another server binding it with
    SO_REUSEADDR could take it first: ours then exits 2 and starts again on another."""
    for _ in range(100):
        port = random.randint(*_PORT_RANGE)
        if (sock := _bound(port)) is not None:
            break
    else:  # a range all but full: the kernel's pick
        sock = _bound(0)
        if sock is None:
            raise StartError("no free loopback port for a function's server")
    port = int(sock.getsockname()[1])
    if not _HOLD:
        sock.close()
        return port, None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return port, sock


def _bound(port: int) -> socket.socket | None:
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    return sock


def _output(served: Served) -> str:
    """What this start of the server has written to its log."""
    with served.log.open("rb") as log:
        log.seek(served.log_start)
        return log.read().decode("utf-8", "replace")


def _lost_its_port(served: Served, code: int) -> bool:
    """Whether the server exited as another process had its port before it could listen:
    by what it said (exit 2 is also a wrong setting; and the port may be free again by the
    time eval looks, the connection that held it gone)."""
    said = f"cannot listen on 127.0.0.1 port {served.port}:"  # runtime.serving.server.bind
    return code == _CANNOT_LISTEN and said in _output(served)


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


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that has the kernel SIGTERM the child when eval dies, however it dies
    (``kill -9`` included); None where prctl is not there (not Linux)."""
    name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # eval died before prctl: nobody would send it
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale() -> None:
    """Remove the temporary directories of evals that are gone (killed with -9)."""
    with contextlib.suppress(OSError):
        for entry in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
            pid = entry.name[len(_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)


def exited(served: dict[str, Served]) -> Callable[[str], str | None]:
    """name -> why its server is gone (exit code and the end of its log), None if it runs."""

    def why(name: str) -> str | None:
        found = served.get(name)
        code = found.process.poll() if found else None
        if found is None or code is None:
            return None
        return f"exited with code {code} during the run; its log ends:\n{_tail(found.log)}"

    return why


def _file_names(functions: list[FunctionUnderTest]) -> list[str]:
    """Each function's name as a file name of its own (its folder and log): names are
    names, never paths (``../x`` or ``/x`` would lead out of the temporary directory)."""
    names: list[str] = []
    for function in functions:
        # and short enough for one (255 bytes): a 300-character name is a valid name
        base = re.sub(r"[^\w.-]", "_", function.name).lstrip(".")[:_NAME_CHARS] or "function"
        name, count = base, 1
        while name in names:
            count += 1
            name = f"{base}-{count}"
        names.append(name)
    return names


def _start(
    function: FunctionUnderTest, folder: Path, log: Path, attempt: int = 1, lost: int = 0
) -> Served:
    """The function's server started on a port of its own (``lost``: the port its last
    start could not listen on, said in the log)."""
    port, hold = reserve_port()
    try:
        with log.open("ab") as sink:
            if lost:
                sink.write(
                    f"eval: port {lost} was taken before the server could listen; start "
                    f"{attempt} of {_LISTEN_ATTEMPTS}, on port {port}\n".encode()
                )
                sink.flush()
            log_start = sink.tell()
            process = subprocess.Popen(
                ["bash", str(folder / "start.sh")],
                cwd=folder,
                env=_environment(function, port),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent(),  # prctl only: no lock taken after fork
            )
    except BaseException:
        if hold is not None:
            hold.close()
        raise
    return Served(function, folder, port, process, log, log_start, hold)


def _wait_ready(served: Served, deadline: float) -> int | None:
    """None once the server answers /health; its exit code if it exits first; StartError
    at the deadline."""
    with httpx.Client(timeout=2.0) as client:
        while True:
            code = served.process.poll()
            if code is not None:
                return code
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{served.url}/health").status_code == 200:
                    return None
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
    """SIGTERM to every server's process group; SIGKILL to those not gone after a grace
    (and to what the others left in theirs); their ports let go."""
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
        if served.hold is not None:
            served.hold.close()


@contextlib.contextmanager
def serve_all(
    functions: list[FunctionUnderTest],
    out: OutDir | None = None,
    scrub: Callable[[str], str] = str,
    logs: dict[str, str] | None = None,
) -> Iterator[dict[str, Served]]:
    """Every function served and ready; all stopped and the directory removed on exit. The
    logs copied to ``logs/`` in ``out`` pass through ``scrub``; ``logs``, when given, gets
    each function's whole log by its name once its server has stopped (unscrubbed)."""
    root = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
    started: list[Served] = []
    try:
        for function, name in zip(functions, _file_names(functions), strict=True):
            folder = unpack_package(function, root / name)
            started.append(_start(function, folder, root / f"{name}.log"))
        deadline = time.monotonic() + START_TIMEOUT
        for index, served in enumerate(started):
            for attempt in range(1, _LISTEN_ATTEMPTS + 1):
                code = _wait_ready(served, deadline)
                if code is None:
                    break
                lost = _lost_its_port(served, code)
                if not lost or attempt == _LISTEN_ATTEMPTS:
                    why = f" at each of its {attempt} starts: its port was taken" if lost else ""
                    raise StartError(
                        f"{served.function.name} ({served.function.component.target}) exited "
                        f"with code {code} before it was ready{why}:\n{_tail(served.log)}"
                    )
                _stop([served])  # what its import of the user's code started, and its hold
                function, folder, log = served.function, served.folder, served.log
                served = started[index] = _start(function, folder, log, attempt + 1, served.port)
        yield {s.function.name: s for s in started}
    finally:
        _stop(started)
        for served in started:
            if logs is not None:  # read once every line is written: the server has stopped
                with contextlib.suppress(OSError):
                    logs[served.function.name] = served.log.read_text("utf-8", "replace")
        if out is not None and started:
            with contextlib.suppress(OSError), out.subdir("logs") as copies:
                for served in started:
                    text = served.log.read_text(encoding="utf-8", errors="replace")
                    copies.write(served.log.name, (scrub(text).encode(),))
        shutil.rmtree(root, ignore_errors=True)
