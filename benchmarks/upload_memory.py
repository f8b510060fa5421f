"""Peak memory of the platform client's uploads: ``upload-data`` of JSONL files of 10 MB,
300 MB and 2 GB, and ``register`` of a workspace with a 200 MB asset, each the real CLI
(``python -m runtime ...``) in a subprocess, against a loopback receiver that reads every
byte and keeps none (so its own memory stays out of the figures).

    python benchmarks/upload_memory.py                    # about 2 minutes; 2.5 GB of disk
    python benchmarks/upload_memory.py --sizes 10 300     # MB of each dataset
    python benchmarks/upload_memory.py --source /tmp/old  # another checkout's client

The figure is the client's own peak RSS (``ru_maxrss`` of its process, read as it exits;
the import check it runs in a subprocess is not counted). The files are written to a
temporary directory and removed after. The 2 GB file is over the contract's default dataset
limit (1 GiB, ``DATASETS_FILE_SIZE_WARNING``), which the runs raise. Writes the table to
stdout and to benchmarks/UPLOAD_MEMORY.md.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GOAL_MB = 150
LINE = b'{"messages": [{"role": "user", "content": "' + b"x" * 900 + b'"}], "rollout_extra": {}}\n'
# The client, its peak RSS written to a file as it exits (its own, not its children's).
CHILD = (
    "import atexit, os, resource, runpy, sys\n"
    "def report():\n"
    "    with open(os.environ['UPLOAD_MEMORY_REPORT'], 'w') as out:\n"
    "        out.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))\n"
    "atexit.register(report)\n"
    "sys.argv[0] = 'runtime'\n"
    "runpy.run_module('runtime', run_name='__main__', alter_sys=True)\n"
)


class Receiver:
    """The platform's upload calls on loopback: every body read to its end, counted and
    hashed, never kept."""

    def __init__(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.received: list[tuple[str, int, str]] = []  # path, bytes, sha256 of the body
        ft = "/api/v1/fine-tunes"
        routes = [
            Route("/api/v1/files", self._files, methods=["POST"]),
            Route(f"{ft}/generate/faas/upload/url", self._upload_url, methods=["POST"]),
            Route(f"{ft}/create/faas/layer", self._layer, methods=["POST"]),
            Route(f"{ft}/create/{{kind}}", self._register, methods=["POST"]),
            Route("/oss/{name}", self._put, methods=["PUT"]),
        ]
        config = uvicorn.Config(
            Starlette(routes=routes), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        while not self._server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    async def _drain(self, request: Request) -> None:
        digest, size = hashlib.sha256(), 0
        async for chunk in request.stream():
            digest.update(chunk)
            size += len(chunk)
        self.received.append((request.url.path, size, digest.hexdigest()))

    async def _files(self, request: Request) -> Response:
        await self._drain(request)
        uploaded = [{"file_id": f"file-{len(self.received)}", "name": "data.jsonl"}]
        return JSONResponse({"data": {"uploaded_files": uploaded, "failed_uploads": []}})

    async def _upload_url(self, request: Request) -> Response:
        key = (await request.json())["unique_key"]
        return JSONResponse({"output": {"url": f"{self.url}/oss/{key}.zip?Signature=s"}})

    async def _layer(self, request: Request) -> Response:
        await request.body()
        return JSONResponse({"output": {"layer_code": "layer-1"}})

    async def _register(self, request: Request) -> Response:
        kind = request.path_params["kind"].replace("-", "_")
        await request.body()
        return JSONResponse({"output": {f"{kind}_id": f"{kind}-1"}})

    async def _put(self, request: Request) -> Response:
        await self._drain(request)
        return Response(b"", 200)


def write_dataset(path: Path, megabytes: int) -> None:
    block = LINE * (1024 * 1024 // len(LINE))
    with path.open("wb") as out:
        while out.tell() < megabytes * 10**6:
            out.write(block)


def run_client(args: list[str], cwd: Path, receiver: Receiver, source: Path) -> tuple[int, float]:
    """Peak RSS in MB and seconds of ``python -m runtime ARGS``, run from ``cwd``."""
    report = cwd / ".peak-rss"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASHSCOPE_", "FC_"))}
    env.update(
        DASHSCOPE_HTTP_BASE_URL=f"{receiver.url}/api/v1",
        DASHSCOPE_API_KEY="sk-benchmark",
        DATASETS_FILE_SIZE_WARNING=str(4 * 1024**3),
        UPLOAD_MEMORY_REPORT=str(report),
        PYTHONPATH=str(source),
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    peak = int(report.read_text()) // 1024  # KiB on Linux
    report.unlink()
    return peak, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 300, 2000], help="MB")
    parser.add_argument("--asset", type=int, default=200, help="MB of the workspace's asset")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--output", type=Path, default=HERE / "UPLOAD_MEMORY.md")
    args = parser.parse_args()
    source = args.source.resolve()
    rows: list[tuple[str, int, int, float]] = []  # what, bytes, peak MB, seconds
    scratch = Path(tempfile.mkdtemp(prefix="upload-memory-"))
    try:
        with Receiver() as receiver:
            for megabytes in args.sizes:
                path = scratch / f"train-{megabytes}mb.jsonl"
                write_dataset(path, megabytes)
                size = path.stat().st_size
                peak, seconds = run_client(
                    ["upload-data", "--training", path.name], scratch, receiver, source
                )
                rows.append((f"upload-data, {megabytes} MB JSONL", size, peak, seconds))
                _, received, _ = receiver.received[-1]
                assert received > size, "the whole file did not arrive"
                path.unlink()
                print(rows[-1], flush=True)
            workspace = scratch / "ws"
            shutil.copytree(
                ROOT / "sample_functions" / "functions",
                workspace / "functions",
                ignore=shutil.ignore_patterns("__pycache__"),
            )
            (workspace / "assets").mkdir()
            with (workspace / "assets" / "model.bin").open("wb") as out:
                for _ in range(args.asset):  # random: the zip cannot shrink it
                    out.write(os.urandom(10**6))
            reward = "functions.reward.reward:DemoRewardProcessor"
            command = ["register", "--reward", reward]
            peak, seconds = run_client(command, workspace, receiver, source)
            _, received, _ = receiver.received[-1]
            assert received > args.asset * 10**6, "the whole package did not arrive"
            rows.append((f"register, {args.asset} MB asset", received, peak, seconds))
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Upload memory",
        "",
        f"Run on {when}, {os.cpu_count()} cores, Linux {platform.release()}, Python "
        f"{platform.python_version()}, client from {source}. Produced by "
        "`python benchmarks/upload_memory.py`: each command is the real CLI in a subprocess "
        "against a loopback receiver that reads every byte and keeps none; peak RSS is the "
        f"client's own. Goal: under {GOAL_MB} MB whatever the size.",
        "",
        "| command | bytes sent | peak RSS MB | seconds | goal |",
        "|---|---:|---:|---:|---|",
    ]
    for what, size, peak, seconds in rows:
        met = "met" if peak < GOAL_MB else "missed"
        lines.append(f"| {what} | {size:,} | {peak} | {seconds:.1f} | {met} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.output.write_text(text)


if __name__ == "__main__":
    main()
