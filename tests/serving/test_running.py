"""Who answers a request whose deadline fires (runtime.serving.running), in-process: the
deadline is fired by hand, no timer is waited for, and every wait is on a condition."""

from __future__ import annotations

import asyncio
from time import perf_counter
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.config import Settings
from runtime.serving import running
from runtime.serving.admission import Admission
from runtime.serving.deadlines import Reason
from runtime.serving.running import Runner, Running


class Recorded(Running):
    """A run whose late answers and abandonment are written down."""

    __slots__ = ("events",)
    events: list[Any]

    async def answer_late(self) -> None:
        self.events.append(("late", self.late))

    def abandoned_now(self) -> None:
        self.events.append(("abandoned", self.late))


class Stubborn:
    """User code that ignores every cancellation until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(self) -> None:
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                continue


@pytest.fixture
async def stubborn():
    user_code = Stubborn()
    yield user_code
    user_code.release.set()  # a failed test leaves no task that never ends
    await _until(lambda: len(asyncio.all_tasks()) == 1)


async def _until(condition: Any, turns: int = 1000) -> None:
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def _runner() -> tuple[Runner, Admission]:
    admission = Admission(concurrency=1, queue=0)
    function: Any = SimpleNamespace(threads=SimpleNamespace(stuck=0))
    return Runner(function, admission, Settings(timeout=5.0)), admission


async def _request(runner: Runner, admission: Admission, user_code: Any) -> tuple[Recorded, Any]:
    """A request admitted and in its slot, running ``user_code``; answered like /api/v1:
    by its own task unless the runner claimed the answer first."""
    assert admission.try_admit()
    await admission.acquire_slot()
    made: asyncio.Future[Recorded] = asyncio.get_running_loop().create_future()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        started = perf_counter()
        run = Recorded(runner, loop, asyncio.current_task(), {"path": "/api/v1"}, started)
        run.events = []
        run.in_slot = True
        made.set_result(run)
        try:
            try:
                await user_code()
            finally:
                run.end()
                runner.release_slot(run)
        except asyncio.CancelledError:
            if run.reason is None:
                raise
            run.absorb()
        if run.reason is not Reason.DISCONNECT and run.claim():  # as /api/v1: 499 unsent
            run.events.append(("own", run.reason))
        if run.abandoned:
            runner.stuck_ended(run)
        else:
            admission.leave()

    task = asyncio.create_task(serve())
    return await made, task


async def test_a_request_that_ends_when_cancelled_answers_itself():
    runner, admission = _runner()
    run, task = await _request(runner, admission, asyncio.Event().wait)
    run.fire(Reason.DEADLINE)
    await task
    await _until(lambda: len(asyncio.all_tasks()) == 1)  # the runner's look at it too
    assert run.events == [("own", Reason.DEADLINE)] and run.late is None
    assert admission.admitted == 0 and admission.in_flight == 0 and runner.stuck_tasks == 0


async def test_user_code_that_ignores_its_cancellation_is_answered_late_then_counted_stuck(
    monkeypatch, stubborn
):
    monkeypatch.setattr(running, "STUCK_AFTER", 0)
    runner, admission = _runner()
    run, task = await _request(runner, admission, stubborn)
    run.fire(Reason.DEADLINE)
    await _until(lambda: run.abandoned)
    deadline = (504, "DEADLINE_EXCEEDED", runner.deadline_message())
    assert run.events == [("late", deadline), ("abandoned", deadline)]
    # the place and the slot are given back at once; the task is counted until it ends
    assert admission.admitted == 0 and admission.in_flight == 0 and runner.stuck_tasks == 1
    stubborn.release.set()
    await task
    assert runner.stuck_tasks == 0
    assert run.events == [("late", deadline), ("abandoned", deadline)]  # no second answer


async def test_a_stop_past_grace_is_answered_503_by_the_runner(monkeypatch, stubborn):
    monkeypatch.setattr(running, "STUCK_AFTER", 0)
    runner, admission = _runner()
    run, task = await _request(runner, admission, stubborn)
    runner.deadlines.fire_all(Reason.SHUTDOWN)
    await _until(lambda: run.abandoned)
    assert run.events[0] == ("late", (503, "DRAINING", runner.past_grace))
    stubborn.release.set()
    await task


async def test_nobody_answers_a_client_that_went_away(monkeypatch, stubborn):
    monkeypatch.setattr(running, "STUCK_AFTER", 0)
    runner, admission = _runner()
    run, task = await _request(runner, admission, stubborn)
    run.fire(Reason.DISCONNECT)
    await _until(lambda: run.abandoned)
    assert run.events == [("abandoned", None)] and run.late is None
    stubborn.release.set()
    await task
    assert run.events == [("abandoned", None)]  # no one answers: 499 is only logged


def test_the_first_claim_answers_and_no_other():
    runner, _ = _runner()
    loop = asyncio.new_event_loop()
    try:
        run = Running(runner, loop, None, {}, 0.0)
        assert run.claim() and not run.claim()
        run.end()
    finally:
        loop.close()


@pytest.mark.parametrize("reason", [Reason.DEADLINE, Reason.SHUTDOWN])
async def test_an_answer_already_claimed_is_not_sent_late(reason, monkeypatch, stubborn):
    monkeypatch.setattr(running, "STUCK_AFTER", 0)
    runner, admission = _runner()
    run, task = await _request(runner, admission, stubborn)
    assert run.claim()
    run.fire(reason)
    await _until(lambda: run.abandoned)
    assert run.events == [("abandoned", None)]
    stubborn.release.set()
    await task
