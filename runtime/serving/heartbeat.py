"""The lifeline between a worker of --workers and its supervisor: the worker's event loop
beats into shared memory (when it last ran, what its /health says); the supervisor reads
it to tell a blocked loop from a busy one and a ready worker from a starting one."""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections.abc import Callable
from multiprocessing.context import SpawnContext

from runtime.serving.health import Health

__all__ = ["Heartbeat"]


class Heartbeat:
    """What a worker tells its supervisor through shared memory: when its event loop last
    ran and the status its /health reports. One writer, no lock: a torn read can only
    delay a decision by a tick."""

    INTERVAL = 0.25  # seconds between beats
    STATES = tuple(Health)  # a state's index is what shared memory holds

    def __init__(self, context: SpawnContext) -> None:
        self._stamp = context.RawValue(ctypes.c_double, 0.0)
        self._state = context.RawValue(ctypes.c_int, 0)
        self._was_ready = context.RawValue(ctypes.c_bool, False)

    def beat(self, state: Health) -> None:
        if state == Health.READY:  # first: whoever reads READY finds this set too
            self._was_ready.value = True
        self._state.value = self.STATES.index(state) if state in self.STATES else 0
        self._stamp.value = time.monotonic()  # system-wide clock: comparable across processes

    @property
    def state(self) -> Health:
        return self.STATES[self._state.value]

    @property
    def was_ready(self) -> bool:
        """Whether it has reported READY at least once: a worker may get ready, take a
        request that blocks its loop and be told to stop, all between two looks."""
        return self._was_ready.value

    def silence(self) -> float:
        """Seconds since the last beat (0 before the first)."""
        stamp = self._stamp.value
        return time.monotonic() - stamp if stamp else 0.0

    async def keep_beating(self, state: Callable[[], Health]) -> None:
        """Run on the worker's event loop: a loop that is blocked stops beating."""
        while True:
            self.beat(state())
            await asyncio.sleep(self.INTERVAL)
