"""The timers of a request: its deadline (and the disconnect watch it starts), and the
deadline of its body.

Both are cheap on the hot path, where most requests end within milliseconds: no timer is
made per request for them (a timer made and cancelled is about a microsecond), only an
entry in a shared schedule. Nothing here knows the app: a fired deadline cancels its task
and calls back whoever made the deadlines (``Deadlines.on_fire``), once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import Enum
from typing import Any

__all__ = ["BodyDeadlines", "Deadline", "Deadlines", "FirstLooks", "Reason"]

WATCH_AFTER = 0.5  # seconds; a disconnect is noticed within this much
RECANCEL = 0.05  # seconds between cancellations of a task that ignores them


class Reason(str, Enum):
    """Why a request's user code was cancelled before it ended."""

    DEADLINE = "deadline"  # it ran past its deadline (--timeout)
    DISCONNECT = "disconnect"  # its client went away
    SHUTDOWN = "shutdown"  # the server stops and it ran past --grace

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Deadlines:
    """A worker's deadlines: the shared schedule of their first looks, the live ones (all
    fired at a stop), and ``on_fire``, called once with each deadline that fires."""

    def __init__(self, timeout: float, on_fire: Callable[[Deadline], None]) -> None:
        self.timeout = timeout  # seconds: a deadline's, unless it is given its own
        self.on_fire = on_fire
        self.live: set[Deadline] = set()
        self.first_looks = FirstLooks()

    def fire_all(self, reason: Reason) -> None:
        for deadline in list(self.live):
            deadline.fire(reason)


class Deadline:
    """When a request's user code must have ended, and what ended it if it did not.

    One schedule look a request, not a timer: at ``WATCH_AFTER`` the request is looked at
    (by the shared ``FirstLooks``; most requests have ended by then); a request still
    running starts watching its ``receive`` for a disconnect, and gets a timer of its own
    for the deadline. A deadline shorter than ``WATCH_AFTER`` is kept to the millisecond by
    a timer of its own from the start.

    ``fire(reason)`` sets ``reason``, cancels the task (again every ``RECANCEL`` seconds
    until ``end()``: user code may ignore one cancellation) and calls ``on_fire`` once.
    ``end()``: user code has ended; from then on nothing fires.
    """

    __slots__ = (
        "_at",
        "_deadlines",
        "_ended",
        "_first_look",
        "_loop",
        "_recancel",
        "_receive",
        "_timer",
        "_watcher",
        "reason",
        "task",
    )

    def __init__(
        self,
        deadlines: Deadlines,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[Any] | None,
        timeout: float | None = None,  # seconds; None: the deadlines' own
    ) -> None:
        self._deadlines = deadlines
        self._loop = loop
        self.task = task
        self.reason: Reason | None = None
        self._ended = False
        self._receive: Any = None
        self._watcher: asyncio.Task[None] | None = None
        self._recancel: asyncio.TimerHandle | None = None
        self._timer: asyncio.TimerHandle | None = None
        now = loop.time()
        self._at = now + (deadlines.timeout if timeout is None else timeout)
        deadlines.live.add(self)
        if self._at > now + WATCH_AFTER:
            self._first_look = deadlines.first_looks.add(loop, now + WATCH_AFTER, self)
        else:
            self._first_look = _NO_LOOK
            self._timer = loop.call_at(self._at, self.look)

    def watch(self, receive: Any) -> None:
        """From the next look on, a disconnect of the client fires ``DISCONNECT``. (Only
        once nothing else of the request waits on ``receive``.)"""
        self._receive = receive

    def look(self) -> None:
        """The timer's: fire at the deadline; else start the watch, and look again."""
        if self._ended:
            return
        loop = self._loop
        if self._watcher is None and self._receive is not None:
            self._watcher = loop.create_task(self._watch(self._receive))
        now = loop.time()
        if now >= self._at:
            self.fire(Reason.DEADLINE)
        elif self._watcher is None:  # not watching yet: look again soon
            self._timer = loop.call_at(min(self._at, now + WATCH_AFTER), self.look)
        else:
            self._timer = loop.call_at(self._at, self.look)

    async def _watch(self, receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.fire(Reason.DISCONNECT)

    def fire(self, reason: Reason) -> None:
        """Cancel the task for ``reason`` (the first reason wins); nothing once ended."""
        if self.reason is not None or self._ended or self.task is None:
            return
        self.reason = reason
        self._cancel()
        self._deadlines.on_fire(self)

    def _cancel(self) -> None:
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            self._recancel = self._loop.call_later(RECANCEL, self._cancel)

    def end(self) -> None:
        """User code has ended: no look, no cancelling, no watch any more."""
        if self._ended:
            return
        self._ended = True
        self._deadlines.live.discard(self)
        self._first_look.discard(self)
        # Each dropped once cancelled: a cancelled watcher keeps its CancelledError, whose
        # traceback holds this deadline. Kept, they would make a reference cycle, and the
        # request's whole graph (about 40 objects) garbage only a full collection frees.
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._recancel is not None:
            self._recancel.cancel()
            self._recancel = None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def absorb(self) -> None:
        """``end()``, after a cancellation that was ours (or the server's at a stop): the
        task goes on, to answer."""
        self.end()
        task = self.task
        # Task.cancelling and Task.uncancel exist on Python 3.11+ only
        cancelling = getattr(task, "cancelling", None)
        uncancel = getattr(task, "uncancel", None)
        if cancelling is not None and uncancel is not None:
            for _ in range(cancelling()):
                uncancel()


class FirstLooks:
    """Looks at each deadline once, ``WATCH_AFTER`` after it started, with one timer for
    all deadlines due in the same ``GRAIN`` of time rather than a timer each. One that has
    ended is skipped (it discarded itself); one still running gets its own timer from then
    on."""

    GRAIN = 0.01  # seconds: a first look is late by up to this much

    def __init__(self) -> None:
        self._due: dict[int, set[Deadline]] = {}

    def add(self, loop: asyncio.AbstractEventLoop, when: float, deadline: Deadline) -> set[Any]:
        """Look at ``deadline`` at ``when``; the set to discard it from once it has ended."""
        slot = int(when / self.GRAIN) + 1
        due = self._due.get(slot)
        if due is None:
            due = self._due[slot] = set()
            loop.call_at(slot * self.GRAIN, self._look, slot)
        due.add(deadline)
        return due

    def _look(self, slot: int) -> None:
        for deadline in tuple(self._due.pop(slot)):  # one may end while others are looked at
            deadline.look()


_NO_LOOK: set[Deadline] = set()  # what a deadline without a first look discards itself from


class BodyDeadlines:
    """Cancels the tasks still reading a body at their --body-timeout.

    One sweep a second for the whole worker while any body is being read, not a timer per
    request: the hot path only adds and removes a dict entry (a timer per request cost
    several microseconds). A body is late by up to one sweep.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._tick = min(1.0, timeout / 4)
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self._reading[task] = loop.time() + self.timeout
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._tick, self._sweep, loop)

    def stop(self, task: asyncio.Task[Any]) -> None:
        self._reading.pop(task, None)

    def expired(self, task: asyncio.Task[Any]) -> bool:
        """Whether ``task`` was cancelled here; if so, the cancellation is absorbed."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()
        return True

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        late = [task for task, deadline in self._reading.items() if deadline <= now]
        for task in late:
            del self._reading[task]
            self._expired.add(task)
            task.cancel()
        self._sweeper = loop.call_later(self._tick, self._sweep, loop) if self._reading else None
