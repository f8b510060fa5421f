"""Where sync user code runs: ``process``, sync sub-rewards and aggregates.

``--isolation thread`` (the default): the bounded thread pool. Cheap, shares memory with
the server, and right for most code. Python cannot kill a thread: a call that passes its
deadline is abandoned (the request gets its 504 on time and frees its slot), counted as
stuck until it returns, and logged.

``--isolation process``: a pool of child processes (pebble), each of which imports the
target and runs ``setup()`` once. A call that passes its deadline has its child killed
and replaced, so a hung sympy evaluation or sandbox call can never wedge the worker.
Costs: inputs and outputs are pickled across, and each child holds its own copy of what
``setup()`` loads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import threading
import time
from typing import Any

import anyio.to_thread

__all__ = ["ProcessOffload", "ThreadOffload"]

log = logging.getLogger("runtime")


class ThreadOffload:
    def __init__(self, processor: Any) -> None:
        self._processor = processor
        self._lock = threading.Lock()
        self.stuck = 0

    async def __call__(self, attr: str, arg: Any) -> Any:
        func = getattr(self._processor, attr)
        call = _Call()

        def run() -> Any:
            try:
                return func(arg)
            finally:
                with self._lock:
                    call.done = True
                    if call.abandoned:
                        self.stuck -= 1
                        log.warning(
                            "a stuck sync %s() returned after %.1fs",
                            attr,
                            time.monotonic() - call.started,
                        )

        try:
            return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        except BaseException:
            with self._lock:
                if not call.done:
                    call.abandoned = True
                    self.stuck += 1
                    log.warning(
                        "sync %s() is still running after its request ended; its thread cannot "
                        "be killed and stays stuck until it returns (%d stuck now; "
                        "--isolation process kills such calls)",
                        attr,
                        self.stuck,
                    )
            raise

    async def close(self) -> None:
        pass


class _Call:
    __slots__ = ("abandoned", "done", "started")

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.done = False
        self.abandoned = False


# --- process isolation -----------------------------------------------------------------

_child_processor: Any = None
_child_error: BaseException | None = None


def _child_init(spec: str, workspace: str, func_type: str) -> None:
    """Runs once in each child: import the target, instantiate it, run its setup()."""
    global _child_processor, _child_error
    try:
        from runtime.function import run_user_code
        from runtime.loading import load_target

        target = load_target(spec, workspace, func_type)
        processor = target.cls()
        setup = getattr(processor, "setup", None)
        if setup is not None:
            anyio.run(run_user_code, setup)
        _child_processor = processor
    except BaseException as exc:  # reported by the first call, not by a dying pool
        _child_error = exc


def _child_call(attr: str, arg: Any) -> Any:
    if _child_error is not None:
        raise RuntimeError(
            "setup() failed in the isolation process: "
            f"{type(_child_error).__name__}: {_child_error}"
        )
    if attr == "":
        return None  # a readiness probe
    return getattr(_child_processor, attr)(arg)


class ProcessOffload:
    def __init__(self, spec: str, workspace: str, func_type: str, processes: int) -> None:
        import pebble  # only with --isolation process

        self._pool = pebble.ProcessPool(
            max_workers=processes,
            initializer=_child_init,
            initargs=(spec, workspace, func_type),
            context=multiprocessing.get_context("spawn"),
        )
        self.stuck = 0  # a stuck child is killed, never left running

    async def ready(self) -> None:
        """Wait until a child has run setup(); raises its error if setup() failed."""
        await self("", None)

    async def __call__(self, attr: str, arg: Any) -> Any:
        future = self._pool.schedule(_child_call, args=(attr, arg))
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        future.add_done_callback(lambda done: loop.call_soon_threadsafe(_settle, waiter, done))
        try:
            return await waiter
        except BaseException:
            running = future.running()
            future.cancel()  # a running task's child is terminated and replaced
            if running:
                log.warning(
                    "sync %s() passed its deadline or lost its client: its isolation "
                    "process was killed and replaced",
                    attr,
                )
            raise

    async def close(self) -> None:
        self._pool.stop()
        await anyio.to_thread.run_sync(self._pool.join)


def _settle(waiter: asyncio.Future[Any], done: concurrent.futures.Future[Any]) -> None:
    if waiter.done():
        return
    if done.cancelled():
        waiter.cancel()
    elif (error := done.exception()) is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(done.result())
