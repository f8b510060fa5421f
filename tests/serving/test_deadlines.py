"""The request timers (runtime.serving.deadlines) on a loop the test drives: a fake clock
that moves only when told, timers run in order, coroutines stepped by hand. No sleeps."""

from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from runtime.serving import deadlines
from runtime.serving.deadlines import BodyDeadlines, Deadline, Deadlines, FirstLooks, Reason


class _Handle:
    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when, self.callback, self.args = when, callback, args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTask:
    """A request's task (``coro`` None), or a task of the loop's, stepped by hand."""

    def __init__(self, coro: Coroutine[Any, Any, Any] | None = None) -> None:
        self.coro = coro
        self.cancels = 0  # cancel() calls
        self.pending = 0  # cancellations not uncancelled
        self.finished = False

    def cancel(self) -> bool:
        self.cancels += 1
        self.pending += 1
        if self.coro is not None and not self.finished:
            self.coro.close()
            self.finished = True
        return True

    def done(self) -> bool:
        return self.finished

    def cancelling(self) -> int:
        return self.pending

    def uncancel(self) -> int:
        self.pending -= 1
        return self.pending

    def step(self) -> None:
        assert self.coro is not None
        try:
            self.coro.send(None)
        except StopIteration:
            self.finished = True


class FakeLoop:
    """Time, timers and tasks as asyncio's loop has them; time moves in ``advance``."""

    def __init__(self) -> None:
        self.now = 100.0
        self._timers: list[tuple[float, int, _Handle]] = []
        self._order = itertools.count()
        self.tasks: list[FakeTask] = []
        self.timers_made = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> _Handle:
        handle = _Handle(when, callback, args)
        heapq.heappush(self._timers, (when, next(self._order), handle))
        self.timers_made += 1
        return handle

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> _Handle:
        return self.call_at(self.now + delay, callback, *args)

    def create_task(self, coro: Coroutine[Any, Any, Any]) -> FakeTask:
        task = FakeTask(coro)
        self.tasks.append(task)
        task.step()
        return task

    def advance(self, seconds: float) -> None:
        """Run every timer due within ``seconds``, each at its time, in order."""
        until = self.now + seconds
        while self._timers and self._timers[0][0] <= until:
            when, _, handle = heapq.heappop(self._timers)
            if handle.cancelled:
                continue
            self.now = max(self.now, when)
            handle.callback(*handle.args)
        self.now = until

    def pending(self) -> list[_Handle]:
        return [h for _, _, h in self._timers if not h.cancelled]


class Receive:
    """An ASGI receive whose next message the test hands over."""

    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self.waiting = 0

    def __call__(self) -> Receive:
        self.waiting += 1
        return self

    def __await__(self) -> Any:
        while self.message is None:
            yield
        message, self.message = self.message, None
        return message


def _deadlines(timeout: float = 10.0) -> tuple[Deadlines, list[tuple[Deadline, Reason]]]:
    fired: list[tuple[Deadline, Reason]] = []

    def on_fire(deadline: Deadline) -> None:
        assert deadline.reason is not None
        fired.append((deadline, deadline.reason))

    return Deadlines(timeout, on_fire), fired


def _deadline(
    loop: FakeLoop, table: Deadlines, timeout: float | None = None
) -> tuple[Deadline, FakeTask]:
    task = FakeTask()
    return Deadline(table, loop, task, timeout), task  # type: ignore[arg-type]


def test_a_deadline_fires_once_at_its_time_and_cancels_until_it_ends():
    loop = FakeLoop()
    table, fired = _deadlines(timeout=3.0)
    deadline, task = _deadline(loop, table)
    loop.advance(2.999)
    assert fired == [] and task.cancels == 0
    loop.advance(0.002)
    assert fired == [(deadline, Reason.DEADLINE)] and deadline.reason is Reason.DEADLINE
    assert task.cancels == 1
    # user code ignores the cancellation: cancelled again every RECANCEL, and only once fired
    loop.advance(deadlines.RECANCEL * 3 + 1e-9)
    assert task.cancels == 4 and len(fired) == 1
    deadline.end()
    loop.advance(10.0)
    assert task.cancels == 4 and loop.pending() == []
    assert deadline not in table.live


def test_a_deadline_shorter_than_the_first_look_keeps_its_own_time():
    loop = FakeLoop()
    table, fired = _deadlines()
    deadline, task = _deadline(loop, table, timeout=0.2)
    loop.advance(0.199)
    assert fired == []
    loop.advance(0.001)
    assert fired == [(deadline, Reason.DEADLINE)] and task.cancels == 1


def test_a_request_that_ends_early_leaves_no_timer_and_never_fires():
    loop = FakeLoop()
    table, fired = _deadlines(timeout=1.0)
    deadline, task = _deadline(loop, table)
    deadline.watch(Receive())
    deadline.end()
    loop.advance(5.0)
    assert fired == [] and task.cancels == 0 and loop.tasks == []  # no watcher either
    assert loop.pending() == [] and table.live == set()


def test_the_first_look_of_many_requests_is_one_timer():
    loop = FakeLoop()
    table, _ = _deadlines()
    made = loop.timers_made
    for _ in range(50):  # all started within one GRAIN
        _deadline(loop, table)
    assert loop.timers_made - made == 1
    loop.advance(FirstLooks.GRAIN * 2)  # the next grain: a timer of its own
    _deadline(loop, table)
    assert loop.timers_made - made == 2


def test_a_disconnect_is_watched_from_the_first_look_on_and_fires_then():
    loop = FakeLoop()
    table, fired = _deadlines()
    deadline, task = _deadline(loop, table)
    receive = Receive()
    deadline.watch(receive)
    loop.advance(deadlines.WATCH_AFTER - FirstLooks.GRAIN)
    assert receive.waiting == 0  # nothing waits on receive() before the first look
    loop.advance(3 * FirstLooks.GRAIN)  # a first look is late by up to one GRAIN
    assert receive.waiting == 1 and len(loop.tasks) == 1
    watcher = loop.tasks[0]
    receive.message = {"type": "http.request", "body": b"", "more_body": False}
    watcher.step()  # not a disconnect: it waits again
    assert fired == [] and receive.waiting == 2
    receive.message = {"type": "http.disconnect"}
    watcher.step()
    assert fired == [(deadline, Reason.DISCONNECT)] and task.cancels == 1
    assert watcher.done()


def test_a_request_not_watching_is_looked_at_again_until_its_deadline():
    loop = FakeLoop()
    table, fired = _deadlines(timeout=2.0)
    deadline, _ = _deadline(loop, table)
    loop.advance(1.0)
    receive = Receive()
    deadline.watch(receive)  # parsed late: watched from the next look (within WATCH_AFTER)
    loop.advance(deadlines.WATCH_AFTER)
    assert receive.waiting == 1
    loop.advance(1.0)
    assert fired == [(deadline, Reason.DEADLINE)]


def test_the_watcher_ends_with_the_request():
    loop = FakeLoop()
    table, fired = _deadlines()
    deadline, _ = _deadline(loop, table)
    deadline.watch(Receive())
    loop.advance(1.0)
    (watcher,) = loop.tasks
    assert not watcher.done()
    deadline.end()
    assert watcher.done() and fired == []


def test_the_first_reason_wins_and_an_ended_deadline_never_fires():
    loop = FakeLoop()
    table, fired = _deadlines()
    first, _ = _deadline(loop, table)
    first.fire(Reason.SHUTDOWN)
    first.fire(Reason.DISCONNECT)
    loop.advance(20.0)  # its deadline passes too
    assert fired == [(first, Reason.SHUTDOWN)] and first.reason is Reason.SHUTDOWN
    ended, ended_task = _deadline(loop, table)
    ended.end()
    ended.fire(Reason.DISCONNECT)
    assert ended.reason is None and ended_task.cancels == 0


def test_a_stop_fires_every_live_deadline_and_only_those():
    loop = FakeLoop()
    table, fired = _deadlines()
    live = [_deadline(loop, table)[0] for _ in range(3)]
    ended, _ = _deadline(loop, table)
    ended.end()
    table.fire_all(Reason.SHUTDOWN)
    assert sorted(map(id, (d for d, _ in fired))) == sorted(map(id, live))
    assert {reason for _, reason in fired} == {Reason.SHUTDOWN}


def test_absorb_takes_back_every_cancellation_of_ours():
    loop = FakeLoop()
    table, _ = _deadlines(timeout=1.0)
    deadline, task = _deadline(loop, table)
    loop.advance(1.0 + 2 * deadlines.RECANCEL)
    assert task.cancels == 3
    deadline.absorb()
    assert task.pending == 0
    loop.advance(1.0)
    assert task.cancels == 3


# --- a body's deadline ------------------------------------------------------------------


def test_a_body_still_being_read_at_its_timeout_is_cancelled_once():
    loop = FakeLoop()
    bodies = BodyDeadlines(timeout=4.0)
    slow, quick = FakeTask(), FakeTask()
    bodies.start(loop, slow)
    bodies.start(loop, quick)
    loop.advance(1.0)
    bodies.stop(quick)
    loop.advance(2.9)
    assert slow.cancels == 0
    loop.advance(1.1)  # within one sweep (timeout / 4) past its deadline
    assert slow.cancels == 1 and quick.cancels == 0
    assert bodies.expired(slow)
    assert slow.pending == 0  # absorbed: the reader answers 408
    assert not bodies.expired(slow)
    assert not bodies.expired(quick)
    loop.advance(10.0)
    assert slow.cancels == 1 and loop.pending() == []  # no sweep with nothing to read


def test_the_body_sweep_starts_again_with_the_next_body():
    loop = FakeLoop()
    bodies = BodyDeadlines(timeout=0.4)
    first = FakeTask()
    bodies.start(loop, first)
    bodies.stop(first)
    loop.advance(1.0)
    assert loop.pending() == []
    second = FakeTask()
    bodies.start(loop, second)
    loop.advance(0.5)
    assert second.cancels == 1 and bodies.expired(second)


@pytest.mark.parametrize("reason", list(Reason))
def test_reasons_read_as_their_words(reason):
    assert f"{reason}" == reason.value == str(reason)


class _Referable(Deadline):
    __slots__ = ("__weakref__",)


async def test_a_deadline_whose_client_was_watched_is_freed_once_dropped(monkeypatch):
    """On a real loop: the watcher, cancelled when the request ends, keeps its
    CancelledError, whose traceback holds the deadline. The deadline must not keep the
    watcher in turn: that cycle (and the request's whole graph with it) would wait for a
    full collection, which, with thousands of requests held for seconds, took a third of a
    worker's time."""
    monkeypatch.setattr(deadlines, "WATCH_AFTER", 0.0)  # the first look, and the watch, at once
    loop = asyncio.get_running_loop()
    started, never = asyncio.Event(), asyncio.Event()

    async def receive() -> dict[str, str]:
        started.set()
        await never.wait()
        return {"type": "http.disconnect"}

    deadline = _Referable(Deadlines(10.0, lambda _: None), loop, asyncio.current_task())
    deadline.watch(receive)
    await asyncio.wait_for(started.wait(), 10)
    (watcher,) = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Deadline._watch"]
    gc.disable()  # freed by reference counting alone, or not at all
    try:
        deadline.end()
        await asyncio.wait([watcher])
        assert watcher.cancelled()
        freed = weakref.ref(deadline)
        del deadline, watcher
        assert freed() is None
    finally:
        gc.enable()
