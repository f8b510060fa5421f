"""Where sync user code runs: ``process``, ``setup``, ``shutdown``, sync sub-rewards and
aggregates.

``--isolation thread`` (the default): ``UserThreads``, this module's own pool of at most
``--threads`` daemon threads, used by nothing else (runtime internals such as /metrics use
anyio's default pool, so they never wait behind user code). Python cannot kill a thread: a
call that passes its deadline is abandoned (the request gets its 504 on time and frees its
slot), counted as stuck until it returns, and logged. An abandoned call keeps its thread
and its place in ``--threads`` until it returns, so ``--threads`` bounds the OS threads
running user code; a worker whose threads are all stuck reports unhealthy. The threads are
daemonic, so a stuck one never keeps the process from exiting.

``--isolation process``: a pool of child processes (pebble), each of which imports the
target and runs ``setup()`` once. A call that passes its deadline has its child killed
and replaced, so a hung sympy evaluation or sandbox call can never wedge the worker.
Costs: inputs and outputs are pickled across, and each child holds its own copy of what
``setup()`` loads. Exceptions and results cross the process boundary in a form that always
unpickles (an exception as its type name, message and traceback text; a result as bytes
pickled in the child), so one odd exception cannot break the pool; a pool that breaks
anyway is rebuilt.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import multiprocessing
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from processors_base import dispatch
from runtime.execution.handoff import HandOff
from runtime.logs import bind_input, bind_secrets, logging_settings, setup_logging

__all__ = ["CrossedError", "ProcessOffload", "ThreadOffload", "UserThreads", "run_user_code"]

log = logging.getLogger("runtime")


class CrossedError(Exception):
    """User code raised something that cannot travel as itself: a ``BaseException`` that
    would stop the event loop (``SystemExit``, ``KeyboardInterrupt``), or any exception of
    an isolation process. Its class is named after the original, so ``type(exc).__name__``
    and ``str(exc)`` read as the original did; ``remote_traceback`` holds its traceback."""

    remote_traceback = ""


_crossed_types: dict[tuple[str, str], type[CrossedError]] = {}


def crossed(name: str, module: str, message: str, traceback_text: str) -> CrossedError:
    key = (module, name)
    cls = _crossed_types.get(key)
    if cls is None:
        cls = _crossed_types[key] = type(name, (CrossedError,), {"__module__": module})
    error = cls(message)
    error.remote_traceback = traceback_text
    add_note = getattr(error, "add_note", None)  # Python 3.10 has none: remote_traceback only
    if traceback_text and add_note is not None:
        add_note(traceback_text.rstrip())
    return error


def _describe(exc: BaseException) -> tuple[str, str, str, str]:
    text = "".join(traceback.format_exception(exc))
    return type(exc).__name__, type(exc).__module__, str(exc), text


# --- threads ---------------------------------------------------------------------------

_QUEUED, _RUNNING, _DONE, _DROPPED, _ABANDONED = range(5)


class _Call:
    __slots__ = ("args", "func", "future", "name", "started", "state", "token")

    def __init__(
        self,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        future: asyncio.Future[Any],
        name: str,
        token: bool,
    ) -> None:
        self.token = token
        self.func = func
        self.args = args
        self.future = future
        self.name = name
        self.state = _QUEUED
        self.started = 0.0


class UserThreads:
    """At most ``size`` daemon threads for sync user code, with their own token count.

    A call takes a token before it gets a thread and gives it back only when its function
    returns; waiting for a token can be cancelled at no cost. A call cancelled after it
    started is abandoned: counted in ``stuck`` until it returns.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.stuck = 0
        self._tokens = HandOff(size)
        self._jobs: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads = 0
        self._lock = threading.Lock()

    async def run(
        self, func: Callable[..., Any], *args: Any, name: str = "", token: bool = True
    ) -> Any:
        """``func(*args)`` in a thread. ``token=False`` is for the once-only hooks (setup,
        shutdown): they run even when every thread is stuck, in one more thread."""
        loop = asyncio.get_running_loop()
        if token and not self._tokens.take_now():  # the common case takes one: no checkpoint
            await self._tokens.take()
        call = _Call(  # in the caller's context: its span, baggage and secrets to redact
            contextvars.copy_context().run,
            (func, *args),
            loop.create_future(),
            name or getattr(func, "__name__", "?"),
            token,
        )
        self._jobs.put(call)
        if not self._idle.acquire(blocking=False) and (self._threads < self.size or not token):
            self._threads += 1
            threading.Thread(
                target=self._work, name=f"user-code-{self._threads}", daemon=True
            ).start()
        try:
            return await call.future
        except BaseException:
            with self._lock:
                state = call.state
                if state == _QUEUED:
                    call.state = _DROPPED  # never started: not stuck, its token is free now
                elif state == _RUNNING:
                    call.state = _ABANDONED
            if state == _QUEUED and call.token:
                self._tokens.give()
            elif state == _RUNNING:
                self.stuck += 1
                log.warning(
                    "sync %s() is still running after its request ended; its thread cannot "
                    "be killed and stays stuck until it returns (%d of %d threads stuck now; "
                    "--isolation process kills such calls)",
                    call.name,
                    self.stuck,
                    self.size,
                )
            raise

    async def run_hook(self, func: Callable[..., Any], *args: Any) -> Any:
        return await self.run(func, *args, token=False)

    def _work(self) -> None:
        jobs, lock, idle = self._jobs, self._lock, self._idle
        while True:
            call = jobs.get()
            with lock:
                dropped = call.state != _QUEUED  # its token went back when it was dropped
                if not dropped:
                    call.state = _RUNNING
                    call.started = time.monotonic()
            if not dropped:
                self._run(call)
            del call
            idle.release()

    def _run(self, call: _Call) -> None:
        try:
            result, error = call.func(*call.args), None
        except Exception as exc:
            result, error = None, exc
        except BaseException as exc:  # SystemExit on the loop would stop the server
            result, error = None, crossed(*_describe(exc))
        with self._lock:
            abandoned = call.state == _ABANDONED
            call.state = _DONE
        with contextlib.suppress(RuntimeError):  # a closed loop: the server has stopped
            call.future.get_loop().call_soon_threadsafe(
                self._finished, call, abandoned, result, error
            )

    def _finished(self, call: _Call, abandoned: bool, result: Any, error: Any) -> None:
        if call.token:
            self._tokens.give()
        if abandoned:
            self.stuck -= 1
            log.warning(
                "a stuck sync %s() returned after %.1fs", call.name, time.monotonic() - call.started
            )
        elif not call.future.done():
            if error is not None:
                call.future.set_exception(error)
            else:
                call.future.set_result(result)


async def run_user_code(
    func: Callable[..., Any], *args: Any, threads: UserThreads | None = None
) -> Any:
    """Await async user code on the loop; run sync user code in ``threads`` (as a once-only
    hook: see ``UserThreads.run``), or without them in anyio's worker threads."""
    return await dispatch.call_function(
        func, *args, run_sync=threads.run_hook if threads is not None else None
    )


class ThreadOffload:
    """``offload(attr, arg)``: run the processor's sync method ``attr`` in ``UserThreads``."""

    failing = ""  # (see ProcessOffload.failing: threads run no setup() of their own)

    def check(self) -> str:
        return ""  # threads never break; a worker whose threads are all stuck is unhealthy

    def __init__(self, processor: Any, threads: UserThreads) -> None:
        self._processor = processor
        self.threads = threads

    @property
    def stuck(self) -> int:
        return self.threads.stuck

    async def __call__(self, attr: str, arg: Any) -> Any:
        return await self.threads.run(getattr(self._processor, attr), arg, name=attr)

    async def close(self) -> None:
        pass


# --- process isolation -----------------------------------------------------------------

_child_processor: Any = None
_child_error: BaseException | None = None


class _Crossing(Exception):
    """What a child raises: plain strings only, so it always unpickles in the parent."""

    def __init__(self, name: str, module: str, message: str, traceback_text: str) -> None:
        super().__init__(name, module, message, traceback_text)


def _child_init(
    spec: str, workspace: str, func_type: str, log_settings: tuple[str, str] | None = None
) -> None:
    """Runs once in each child: import the target, instantiate it, run its setup()."""
    global _child_processor, _child_error
    if log_settings is not None:  # the parent's format and scrubbing for user code's lines
        setup_logging(*log_settings)
    try:
        import anyio

        from runtime.execution.loading import load_target

        target = load_target(spec, workspace, func_type)
        processor = target.cls()
        setup = getattr(processor, "setup", None)
        if setup is not None:
            anyio.run(run_user_code, setup)
        _child_processor = processor
    except BaseException as exc:  # reported by the first call, not by a dying pool
        _child_error = exc


_SETUP_FAILED = "setup() failed in the isolation process: "


def _child_call(attr: str, arg: Any) -> bytes | None:
    if _child_error is not None:
        name, module, message, text = _describe(_child_error)
        raise _Crossing("RuntimeError", "builtins", f"{_SETUP_FAILED}{name}: {message}", text)
    if attr == "":
        return None  # a readiness probe
    bind_secrets(arg)  # the request's api_key, blanked from what user code logs here
    bind_input(arg)  # and its ids on those lines
    try:
        result = getattr(_child_processor, attr)(arg)
    except BaseException as exc:
        raise _Crossing(*_describe(exc)) from None
    try:
        return pickle.dumps(result, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        name, module, message, text = _describe(exc)
        raise _Crossing(
            name,
            module,
            f"{attr}() returned a {type(result).__name__} that cannot be sent back from its "
            f"isolation process: {message}",
            text,
        ) from None


class IsolationPoolBroken(RuntimeError):
    pass


class UnreadableResult(RuntimeError):
    pass


REBUILD_BACKOFF = (0.5, 30.0)  # seconds: first and longest wait between rebuilds


class ProcessOffload:
    def __init__(self, spec: str, workspace: str, func_type: str, processes: int) -> None:
        self._args = (spec, workspace, func_type, processes)
        self._pool = self._new_pool()
        self.stuck = 0  # a stuck child is killed, never left running
        self.broken = ""  # why the pool cannot serve right now ("" when it can)
        # why its children cannot serve: their setup() fails (a replacement child's, or the
        # rebuilt pool's); requests are then answered 503 at once while it is retried
        self.failing = ""
        self._rebuilding: asyncio.Task[None] | None = None
        self._closing = False

    def _new_pool(self) -> Any:
        import pebble  # only with --isolation process

        spec, workspace, func_type, processes = self._args
        return pebble.ProcessPool(
            max_workers=processes,
            initializer=_child_init,
            initargs=(spec, workspace, func_type, logging_settings()),
            context=multiprocessing.get_context("spawn"),
        )

    async def ready(self) -> None:
        """Wait until a child has run setup(); raises its error if setup() failed."""
        await self("", None)

    def check(self) -> str:
        """Why the pool cannot serve ("" when it can). Notices a pool that broke while idle
        (pebble gives up when a child dies with no task running, e.g. an OOM kill) and
        starts rebuilding it."""
        pool = self._pool
        if not self._closing and not pool.active:
            self._broke(pool, RuntimeError("pebble's pool is in its error state"))
        return self.broken

    async def __call__(self, attr: str, arg: Any) -> Any:
        pool = self._pool
        if not pool.active and not self._closing:
            # broken before this call reached it: the call waits for the rebuilt pool
            self._broke(pool, RuntimeError("pebble's pool is in its error state"))
            if self._rebuilding is not None and attr:
                await asyncio.shield(self._rebuilding)
                if self.broken:
                    raise IsolationPoolBroken(self.broken)
            pool = self._pool
        try:
            future = pool.schedule(_child_call, args=(attr, arg))
        except RuntimeError as exc:  # pebble: "Unexpected error within the Pool"
            raise self._broke(pool, exc) from None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        future.add_done_callback(lambda done: loop.call_soon_threadsafe(_settle, waiter, done))
        try:
            data = await waiter
        except _Crossing as exc:
            if attr and exc.args[2].startswith(_SETUP_FAILED):
                # a child pebble started in place of one killed (a deadline) failed its
                # setup(): every call it gets would fail; rebuild the pool, with backoff
                self.failing = f"an isolation process failed its setup() ({exc.args[2]})"
                self._broke(pool, RuntimeError(self.failing))
            raise crossed(*exc.args) from None
        except concurrent.futures.process.BrokenProcessPool as exc:
            raise self._broke(pool, exc) from None
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
        if data is None:
            return None
        try:
            return pickle.loads(data)
        except Exception as exc:
            raise UnreadableResult(
                f"the result of {attr}() could not be read back from its isolation process: "
                f"{type(exc).__name__}: {exc}"
            ) from None

    def _broke(self, pool: Any, exc: BaseException) -> IsolationPoolBroken:
        reason = f"the isolation process pool broke ({type(exc).__name__}: {exc})"
        if pool is self._pool:  # the first request to notice starts the rebuild
            log.error("%s; rebuilding it", reason)
            self.broken = f"{reason}; rebuilding it"
            self._pool = self._new_pool()
            self._rebuilding = asyncio.get_running_loop().create_task(self._rebuild(pool))
        return IsolationPoolBroken(f"{reason}; it is being rebuilt, retry the request")

    async def _rebuild(self, old: Any) -> None:
        delay = REBUILD_BACKOFF[0]
        while True:
            old.stop()
            threading.Thread(target=old.join, name="pool-join", daemon=True).start()
            try:
                await self.ready()
                break
            except Exception as exc:  # setup() fails: retried, ever more slowly
                self.broken = self.failing = (
                    f"the rebuilt isolation process pool cannot serve: {exc}; "
                    f"retrying in {delay:g}s"
                )
                log.error("%s", self.broken)
            await asyncio.sleep(delay)
            delay = min(2 * delay, REBUILD_BACKOFF[1])
            old, self._pool = self._pool, self._new_pool()
        self.broken = self.failing = ""
        log.info("the isolation process pool was rebuilt and serves again")

    async def close(self) -> None:
        self._closing = True
        if self._rebuilding is not None:
            self._rebuilding.cancel()
        self._pool.stop()
        done = asyncio.get_running_loop().create_future()

        def join() -> None:
            self._pool.join()
            done.get_loop().call_soon_threadsafe(_set_done, done)

        # a daemon thread: a child that does not die cannot keep this process alive
        threading.Thread(target=join, name="pool-join", daemon=True).start()
        await done


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _settle(waiter: asyncio.Future[Any], done: concurrent.futures.Future[Any]) -> None:
    if waiter.done():
        return
    if done.cancelled():
        waiter.cancel()
    elif (error := done.exception()) is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(done.result())
