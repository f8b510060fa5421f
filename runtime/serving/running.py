"""An admitted input run in a processing slot under its deadline; who answers it when the
deadline fires; and the user calls that will not end (the stuck).

Who answers a request is decided once, by ``Running.claim()``: its own task, which
answers when user code has ended (its result, its error, or 504/503 after a cancellation
of ours), or, when a deadline or a stop fires while user code still runs, the overdue
responder (``Runner``), which answers at once whatever the task does. The first to claim
answers; the other sends nothing. A disconnect is answered by no one (499 is logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, MutableMapping
from time import perf_counter
from typing import TYPE_CHECKING, Any

from processors_base.observability.runtime_hooks import record_output
from runtime import errors
from runtime.config import Settings
from runtime.execution.function import Function
from runtime.logs import bind_request, unbind_request
from runtime.serving.admission import Admission
from runtime.serving.deadlines import Deadline, Deadlines, Reason

if TYPE_CHECKING:  # imported only when tracing is on (server.build_app)
    from runtime.tracing.spans import Tracing

__all__ = ["Runner", "Running"]

log = logging.getLogger("runtime")

STUCK_AFTER = 1.0  # seconds a cancelled task may take to end before it counts as stuck


class Running(Deadline):
    """One admitted input of a request and its deadline; what the log lines of its task
    read (``scope``, ``input_data``). Subclasses say how a late answer goes out
    (``answer_late``) and what an abandoned one leaves behind (``abandoned``)."""

    __slots__ = (
        "abandoned",
        "answered",
        "answered_at",
        "in_slot",
        "input_data",
        "late",
        "scope",
        "started",
    )

    def __init__(
        self,
        runner: Runner,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[Any] | None,
        scope: MutableMapping[str, Any],
        started: float,
        timeout: float | None = None,
    ) -> None:
        self.scope = scope
        self.started = started  # perf_counter() when the request came in
        self.input_data: Any = None
        self.in_slot = False
        self.answered = False  # claimed: its answer is being (or has been) sent
        # (status, code, message) of the answer the overdue responder sent, if it did
        self.late: tuple[int, str, str] | None = None
        self.answered_at: float | None = None  # perf_counter() when that answer was sent
        self.abandoned = False  # its request ended without it: it is counted as stuck
        Deadline.__init__(self, runner.deadlines, loop, task, timeout)

    def claim(self) -> bool:
        """Whether the caller answers: the first to ask does, every later ask is told no."""
        if self.answered:
            return False
        self.answered = True
        return True

    async def answer_late(self) -> None:
        """Send ``late``: the request's answer, now, while its user code still runs."""

    def abandoned_now(self) -> None:
        """Its request has ended without it (its slot and place given back)."""


class Runner:
    """Runs admitted inputs in slots under their deadlines; answers the ones whose
    deadline fires; counts as stuck the ones whose user code will not end."""

    def __init__(
        self,
        function: Function,
        admission: Admission,
        settings: Settings,
        tracing: Tracing | None = None,
    ) -> None:
        self.function = function
        self.admission = admission
        self.tracing = tracing
        self.timeout = settings.timeout
        self.grace = settings.grace
        self.deadlines = Deadlines(settings.timeout, self._fired)
        self.stuck_tasks = 0  # async calls that ignored their cancellation and run on

    @property
    def past_grace(self) -> str:
        return (
            "the server is stopping and the request was still running after "
            f"--grace ({self.grace:g}s); retry it"
        )

    def deadline_message(self) -> str:
        return f"the request did not finish within its {self.timeout:g}s deadline"

    def stopped_answer(self, reason: Reason | None) -> tuple[int, str, str]:
        """(status, code, message) of a request stopped by a stop that ran past --grace
        (503) or by its deadline (504)."""
        if reason is Reason.SHUTDOWN:
            return 503, errors.DRAINING, self.past_grace
        return 504, errors.DEADLINE_EXCEEDED, self.deadline_message()

    async def run_admitted(
        self, run: Running, input_data: Any, serialise: Callable[[Any], bytes] | None = None
    ) -> tuple[Any, bytes]:
        """Run one admitted input in a slot, traced: what process() returned and, with
        ``serialise``, the answer's body made in the slot and the span (else b""). Its
        deadline ends here, and its slot is given back once (a stuck request's was already);
        its place in the admission is the caller's to give back."""
        function = self.function
        await self.admission.acquire_slot()
        run.in_slot = True
        try:
            tracing = self.tracing
            if tracing is None:
                result = await function.call(input_data)
                return result, serialise(result) if serialise else b""
            # begin/end inline, not a context manager: this is every request's path
            span, entered = tracing.begin(run.scope, input_data)
            try:
                result = await function.call(input_data)
                record_output(span, result)
                output = serialise(result) if serialise else b""
            except BaseException as exc:
                tracing.end(span, entered, exc)
                raise
            tracing.end(span, entered)
            return result, output
        finally:
            run.end()  # nothing fires from now on
            self.release_slot(run)

    def release_slot(self, run: Running) -> None:
        if run.in_slot:
            run.in_slot = False
            self.admission.release_slot()

    def stuck_ended(self, run: Running) -> None:
        """The task of an abandoned run has ended at last."""
        self.stuck_tasks -= 1
        log.warning("a stuck async process() ended after %.1fs", perf_counter() - run.started)

    def _fired(self, deadline: Deadline) -> None:
        assert isinstance(deadline, Running)
        asyncio.get_running_loop().create_task(self._overdue(deadline))

    async def _overdue(self, run: Running) -> None:
        """A run was cancelled (deadline, stop or disconnect): answer it now, whatever its
        task does, and count a task that still runs after STUCK_AFTER as stuck (its request
        ends here: the slot and the queue place are given back)."""
        bound = bind_request(run)  # this task's context came from whichever request
        try:
            await self._answer_overdue(run)
        except Exception:
            log.exception("internal error while ending a cancelled request")
        finally:
            unbind_request(bound)

    async def _answer_overdue(self, run: Running) -> None:
        task = run.task
        assert task is not None
        reason = run.reason
        if reason is not Reason.DISCONNECT and not task.done() and run.claim():
            run.late = self.stopped_answer(reason)
            run.answered_at = perf_counter()  # its latency: when the client got it
            with contextlib.suppress(Exception):  # the client may be gone
                await run.answer_late()
        await asyncio.wait((task,), timeout=STUCK_AFTER)
        if task.done():
            return
        run.abandoned = True
        self.release_slot(run)
        self.admission.leave()
        self.stuck_tasks += 1
        run.abandoned_now()
        log.warning(
            "process() ignores its cancellation and runs on %gs after its request was "
            "cancelled; it stays cancelled and is counted as stuck until it ends (%d stuck now)",
            STUCK_AFTER,
            self.function.threads.stuck + self.stuck_tasks,
        )
