"""What a worker says of itself: on /health, in its heartbeat to the supervisor, and to
Ray Serve's health check."""

from __future__ import annotations

from enum import Enum

__all__ = ["Health"]


class Health(str, Enum):
    """A worker's health. str-valued: /health answers and the heartbeat carry the value,
    and a value compares equal to its string. The order is the heartbeat's wire code."""

    STARTING = "starting"  # setup() has not finished
    READY = "healthy"
    DRAINING = "draining"  # stopping: new requests are refused
    UNHEALTHY = "unhealthy"  # set up, but cannot serve (a broken pool, every thread stuck)
    STOPPED = "stopped"  # a worker's last beat once its server has stopped: silence is no block

    # the value, not "Health.READY", in log lines and f-strings (as StrEnum, from 3.11 on)
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)
