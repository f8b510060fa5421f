"""``--workers N``: N worker processes sharing one listening socket, kept alive.

Each worker is a spawned process (never forked after user code was imported) that
loads the target, runs setup() and serves. A worker that dies (os._exit, a segfault)
is replaced while the others keep serving; a worker whose setup() fails stops the
whole server with exit code 3, since every replacement would fail the same way.
SIGTERM/SIGINT are forwarded so each worker drains before the supervisor exits.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import tempfile
import threading
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client.multiprocess import mark_process_dead
from uvicorn.config import STARTUP_FAILURE

from runtime.config import Settings

__all__ = ["supervise"]

log = logging.getLogger("runtime")


def _worker(settings: dict[str, Any], sock: socket.socket) -> None:
    from runtime.server import run_worker

    run_worker(Settings(**settings), sock)


def supervise(settings: Settings, sock: socket.socket) -> int:
    context = multiprocessing.get_context("spawn")
    stop = threading.Event()
    exit_code = 0
    # /metrics of any worker answers for all: samples go to files in one shared directory.
    metrics_dir = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        metrics_dir = tempfile.TemporaryDirectory(prefix="rl-fn-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir.name

    def start() -> BaseProcess:
        process = context.Process(target=_worker, args=(settings.to_json(), sock), name="worker")
        process.start()
        return process

    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    workers = [start() for _ in range(settings.workers)]
    log.info("supervisor [%d]: started %d workers", os.getpid(), len(workers))
    try:
        while not stop.wait(0.2):
            for index, worker in enumerate(workers):
                if worker.is_alive():
                    continue
                if worker.exitcode == STARTUP_FAILURE:
                    log.error("worker [%s] failed to start; stopping", worker.pid)
                    exit_code = STARTUP_FAILURE
                    stop.set()
                    break
                log.warning(
                    "worker [%s] died (exit code %s); starting a replacement",
                    worker.pid,
                    worker.exitcode,
                )
                if worker.pid is not None:
                    mark_process_dead(worker.pid)
                workers[index] = start()
    finally:
        for worker in workers:
            if worker.is_alive() and worker.pid is not None:
                os.kill(worker.pid, signal.SIGTERM)
        for worker in workers:
            worker.join(settings.grace + 10)
            if worker.is_alive():
                worker.kill()
                worker.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if metrics_dir is not None:
            metrics_dir.cleanup()
    return exit_code
