"""``--workers N``: N worker processes sharing one listening socket, kept alive.

Each worker is a spawned process (never forked after user code was imported) that loads
the target, runs setup() and serves. The supervisor:

- replaces a worker that dies after it served (os._exit, a segfault, an OOM kill) at once;
- restarts one that dies before it was ready after 0.5 s, 1 s, 2 s, ... and, after
  ``RESTART_LIMIT`` such failures in a row, stops everything and exits 3, as it does at
  once when a worker reports a failed setup() (exit 3): every replacement would fail too;
- kills and replaces a worker whose event loop has not run for ``--heartbeat-timeout``
  (sync code blocking an ``async def``), and starts a replacement as soon as a worker
  drains on its own (one that found itself unhealthy stops itself, runtime.serving.server), not
  only once it has exited; both read a heartbeat the worker's loop writes to shared memory;
- on SIGTERM/SIGINT signals every worker at once and gives them one ``--grace`` in all,
  not one each: past it, a worker whose loop is blocked (it cannot drain) is killed (not
  one whose server has stopped and whose loop has ended: it said so, "stopped"), and
  the others get ``SHUTDOWN_SLACK`` more for their shutdown() hooks;
- dies with its workers: each holds the read end of a pipe only the supervisor writes to,
  and stops (drains, then exits within the same bound) when it reads end-of-file, which
  happens however the supervisor ended, SIGKILL included, on every platform.

Why not uvicorn's own ``uvicorn.supervisors.Multiprocess`` (0.54): it restarts without
backoff or limit, answers its health ping from a separate thread (so a blocked event loop
goes unnoticed), joins workers one by one with no bound, and its workers outlive it. Why
not gunicorn with a uvicorn worker class: a second server with its own config and signal
handling to keep in step with our drain and exit codes, Unix-only, and it too restarts a
worker that dies in setup() at once and forever (only a worker exit 3 halts it).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client.multiprocess import mark_process_dead
from uvicorn.config import STARTUP_FAILURE

from runtime.config import Settings
from runtime.serving.health import Health
from runtime.serving.heartbeat import Heartbeat

__all__ = ["supervise"]

log = logging.getLogger("runtime")

RESTART_LIMIT = 5  # workers in a row that die before they are ready: a crash loop
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 30.0  # seconds before restarting such a worker
# Past --grace: beyond a worker's own bound on its shutdown (runtime.serving.server), so that the
# supervisor's kill is only the backstop for a worker that fails to bound itself.
SHUTDOWN_SLACK = 30.0
SILENT = 1.0  # seconds without a beat: a loop that is blocked now, not merely busy
_TICK = 0.1


@dataclass
class _Worker:
    process: BaseProcess
    heartbeat: Heartbeat
    ready: bool = False  # the supervisor has seen it report "healthy"

    def note_ready(self) -> bool:
        """True at the first look after it reported "healthy" (whatever it reports now)."""
        if self.ready or not self.heartbeat.was_ready:
            return False
        self.ready = True
        return True


def _worker(
    settings: dict[str, Any],
    sock: socket.socket,
    heartbeat: Heartbeat,
    lifeline: Connection,
    owned_dir: str | None,
) -> None:
    from runtime.serving.server import run_worker  # in the worker only: the supervisor stays lean

    orphaned = threading.Event()
    threading.Thread(
        target=_watch_lifeline,
        args=(lifeline, orphaned, settings["grace"] + SHUTDOWN_SLACK, owned_dir),
        name="lifeline",
        daemon=True,
    ).start()
    try:
        run_worker(Settings(**settings), sock, heartbeat)
    finally:
        if orphaned.is_set() and owned_dir:  # no supervisor is left to remove it
            shutil.rmtree(owned_dir, ignore_errors=True)


def _watch_lifeline(
    lifeline: Connection, orphaned: threading.Event, bound: float, owned_dir: str | None
) -> None:
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv_bytes()  # nothing is ever sent: this returns at end-of-file
    orphaned.set()
    log.warning("worker [%d]: the supervisor is gone; stopping", os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)  # drain as on any stop
    time.sleep(bound)  # a loop that cannot even drain (it is blocked) ends here
    log.error(
        "worker [%d]: still running %gs after its supervisor died; exiting", os.getpid(), bound
    )
    if owned_dir:
        shutil.rmtree(owned_dir, ignore_errors=True)
    os._exit(1)


class _Supervisor:
    def __init__(self, settings: Settings, sock: socket.socket) -> None:
        self.settings = settings
        self.sock = sock
        self.context = multiprocessing.get_context("spawn")
        # Only this process holds the write end: a worker reads end-of-file when it is gone.
        self.lifeline, self._lifeline_writer = self.context.Pipe(duplex=False)
        # Set by SIGTERM/SIGINT: a plain flag, as a signal handler must take no lock. An
        # Event's set() there deadlocks when the signal lands while the Event.wait() it
        # interrupts holds the Event's lock: a supervisor hung so in CI (Python 3.13), and
        # a script of that pattern on 1 SIGTERM in 300.
        self.stopping = False
        self.exit_code = 0
        self.failures = 0  # workers in a row that died before they were ready
        self.owned_dir: tempfile.TemporaryDirectory[str] | None = None
        # /metrics of any worker answers for all: samples go to files in one shared directory.
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            self.owned_dir = tempfile.TemporaryDirectory(prefix="rl-fn-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.owned_dir.name
        self.slots: list[_Worker | None] = []
        self.restart_at: list[float] = []
        self.retiring: list[tuple[BaseProcess, float]] = []  # draining, with a kill deadline

    def start(self) -> _Worker:
        heartbeat = Heartbeat(self.context)
        process = self.context.Process(
            target=_worker,
            args=(
                self.settings.to_json(),
                self.sock,
                heartbeat,
                self.lifeline,
                self.owned_dir.name if self.owned_dir else None,
            ),
            name="worker",
        )
        process.start()
        return _Worker(process, heartbeat)

    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            self.slots = [self.start() for _ in range(self.settings.workers)]
            self.restart_at = [0.0] * len(self.slots)
            log.info("supervisor [%d]: started %d workers", os.getpid(), len(self.slots))
            while not self.stopping:
                time.sleep(_TICK)  # a signal is seen within a tick
                if not self.stopping:
                    self.tend()
        finally:
            self.stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._lifeline_writer.close()
            if self.owned_dir is not None:
                self.owned_dir.cleanup()
        return self.exit_code

    def tend(self) -> None:
        now = time.monotonic()
        for index, worker in enumerate(self.slots):
            if worker is None:
                if now >= self.restart_at[index]:
                    self.slots[index] = self.start()
                continue
            process = worker.process
            alive = process.is_alive()  # first: a dead worker's last beat is then in
            if worker.note_ready():  # it may have got ready (and died) since the last look
                self.failures = 0
            if not alive:
                self.slots[index] = None
                self.on_death(index, worker, now)
                if self.stopping:
                    return
                continue
            state = worker.heartbeat.state
            if worker.ready and self.blocked(worker, self.settings.heartbeat_timeout):
                self.slots[index] = self.start()
            elif worker.ready and state in (Health.DRAINING, Health.UNHEALTHY, Health.STOPPED):
                # Stopping on its own (it found itself unhealthy, or was signalled): its
                # replacement starts now, not only once its drain is over.
                log.warning("worker [%s] is %s; starting a replacement", process.pid, state)
                if state == Health.UNHEALTHY:  # says so but does not stop by itself
                    self.terminate(process)
                self.retiring.append((process, now + self.settings.grace + SHUTDOWN_SLACK))
                self.slots[index] = self.start()
        self.reap_retiring(now)

    def blocked(self, worker: _Worker, limit: float) -> bool:
        """Kills a worker whose event loop has not beaten for ``limit`` seconds (not one
        whose loop has ended: it said so, and its process is on its way out)."""
        silence = worker.heartbeat.silence()
        if silence < limit or worker.heartbeat.state is Health.STOPPED:
            return False
        log.error(
            "worker [%s]: event loop blocked for %.1fs; killing it", worker.process.pid, silence
        )
        self.kill(worker.process)
        return True

    def on_death(self, index: int, worker: _Worker, now: float) -> None:
        process = worker.process
        if process.pid is not None:
            mark_process_dead(process.pid)
        if process.exitcode == STARTUP_FAILURE:
            log.error("worker [%s] failed to start; stopping", process.pid)
            self.give_up()
            return
        if worker.ready:
            log.warning(
                "worker [%s] died (exit code %s); starting a replacement",
                process.pid,
                process.exitcode,
            )
            self.restart_at[index] = now
            return
        self.failures += 1
        if self.failures >= RESTART_LIMIT:
            log.error(
                "worker [%s] died before it was ready (exit code %s); %d in a row, giving up",
                process.pid,
                process.exitcode,
                self.failures,
            )
            self.give_up()
            return
        delay = min(BACKOFF_FIRST * 2 ** (self.failures - 1), BACKOFF_MAX)
        log.warning(
            "worker [%s] died before it was ready (exit code %s); restarting in %gs (%d of %d)",
            process.pid,
            process.exitcode,
            delay,
            self.failures,
            RESTART_LIMIT,
        )
        self.restart_at[index] = now + delay

    def on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True

    def give_up(self) -> None:
        self.exit_code = STARTUP_FAILURE
        self.stopping = True

    def reap_retiring(self, now: float) -> None:
        for entry in list(self.retiring):
            process, deadline = entry
            if process.is_alive() and now < deadline:
                continue
            if process.is_alive():
                log.error("worker [%s] did not stop within its grace; killing it", process.pid)
            self.kill(process)
            self.retiring.remove(entry)

    def stop_all(self) -> None:
        """SIGTERM to every worker at once, then one shared deadline for all of them."""
        workers = [w for w in self.slots if w is not None]
        processes = [w.process for w in workers] + [p for p, _ in self.retiring]
        # SIGTERM to each worker still serving: retiring ones stop already, and a "stopped"
        # one may have its default handler back, so that SIGTERM would kill it.
        for worker in workers:
            if worker.heartbeat.state is not Health.STOPPED:
                self.terminate(worker.process)
        grace_end = time.monotonic() + self.settings.grace
        deadline = grace_end + SHUTDOWN_SLACK
        while any(p.is_alive() for p in processes) and (now := time.monotonic()) < deadline:
            for worker in workers:  # a loop that is blocked cannot drain: no use waiting
                # (one whose loop has ended, "stopped", beats no more but has answered: the
                # interpreter exiting, asyncio.run waiting for its default pool)
                if worker.process.is_alive() and worker.heartbeat.state is not Health.STOPPED:
                    limit = SILENT if now >= grace_end else self.settings.heartbeat_timeout
                    self.blocked(worker, limit)
            time.sleep(_TICK)
        for process in processes:
            if process.is_alive():
                log.error("worker [%s] did not stop within its grace; killing it", process.pid)
            self.kill(process)
        # As a single worker does: exit 0 only if every worker that took requests stopped
        # cleanly (one that was killed, or exited 1 itself, may have left requests unanswered).
        for worker in workers:
            worker.note_ready()
        unclean = [w.process.pid for w in workers if w.ready and w.process.exitcode != 0]
        unclean += [p.pid for p, _ in self.retiring if p.exitcode == -signal.SIGKILL]
        if unclean and not self.exit_code:
            log.error("workers %s did not stop cleanly; exiting 1", unclean)
            self.exit_code = 1

    @staticmethod
    def terminate(process: BaseProcess) -> None:
        if process.is_alive() and process.pid is not None:
            os.kill(process.pid, signal.SIGTERM)

    @staticmethod
    def kill(process: BaseProcess) -> None:
        if process.is_alive():
            process.kill()
        process.join()
        if process.pid is not None:
            mark_process_dead(process.pid)


def supervise(settings: Settings, sock: socket.socket) -> int:
    """Run ``settings.workers`` workers on ``sock`` until a signal; the exit code to use."""
    return _Supervisor(settings, sock).run()
