"""Progress of long steps on stderr: ``rich`` when stderr is a terminal, plain lines otherwise.

Plain lines keep logs and CI output readable (no cursor movement, no colour codes); the
terminal gets a spinner that is replaced by a one-line result, and a transfer (an upload) a
bar in bytes with its rate and the time left. Every text goes through ``scrub.shown``: no
key, and no control sequence the platform sent (in a log line, a name).
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from runtime.platform.scrub import shown

__all__ = ["Reporter", "size_text"]


def size_text(size: float) -> str:
    """A number of bytes as progress shows it: KiB under a MiB, then MiB, then GiB."""
    if size < 1024**2:
        return f"{size / 1024:.1f} KiB"
    if size < 1024**3:
        return f"{size / 1024**2:.1f} MiB"
    return f"{size / 1024**3:.2f} GiB"


class Reporter:
    def __init__(
        self, stream: TextIO | None = None, *, tty: bool | None = None, every: float = 10.0
    ) -> None:
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty() if tty is None else tty
        self._every = every  # seconds between the plain lines of a transfer
        self._console: Any = None
        self._status: Any = None
        if self._tty:
            from rich.console import Console

            self._console = Console(file=self._stream, highlight=False)

    def note(self, text: str) -> None:
        """One line of news (a status change, a retry, a log line)."""
        text = shown(text)
        if self._console is not None:
            self._console.print(text, markup=False)
        else:
            print(text, file=self._stream, flush=True)

    def update(self, text: str) -> None:
        """New text for the running step (a spinner's label; a line when plain)."""
        if self._status is not None:
            self._status.update(shown(text))
        else:
            self.note(text)

    @contextmanager
    def step(self, text: str) -> Iterator[None]:
        """A long step: a spinner on a terminal, a start and an end line otherwise."""
        started = time.monotonic()
        text = shown(text)
        if self._console is not None:
            with self._console.status(text) as status:
                self._status = status
                try:
                    yield
                finally:
                    self._status = None
        else:
            self.note(f"{text} ...")
            yield
        self.note(f"{text}: done ({time.monotonic() - started:.1f} s)")

    @contextmanager
    def transfer(self, text: str, total: int) -> Iterator[Callable[[int], None]]:
        """A transfer of ``total`` bytes; yields ``sent(n)``, to be called with the bytes sent
        so far (0 again when a retry starts over). On a terminal a bar in bytes with the rate
        and the time left; otherwise a line every ``every`` seconds, and the same start and
        end lines as a step."""
        started = time.monotonic()
        text = shown(text)
        if self._console is None:
            self.note(f"{text} ...")
            yield _PlainTransfer(self, text, total, self._every).sent
        else:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            status = self._status  # a spinner running: one live display at a time
            if status is not None:
                status.stop()
            bar = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                DownloadColumn(binary_units=True),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=self._console,
                transient=True,
            )
            task = bar.add_task(text, total=total)
            done = [0]

            def sent(count: int) -> None:
                if count < done[0]:  # a retry, from the start: the rate starts over too
                    bar.reset(task, total=total, completed=count)
                else:
                    bar.update(task, completed=count)
                done[0] = count

            try:
                with bar:
                    yield sent
            finally:
                if status is not None:
                    status.start()
        self.note(f"{text}: done ({time.monotonic() - started:.1f} s)")


class _PlainTransfer:
    """The plain lines of a transfer: bytes, share, rate and time left, one line every
    ``every`` seconds at most."""

    def __init__(self, reporter: Reporter, text: str, total: int, every: float) -> None:
        self._reporter, self._text, self._total, self._every = reporter, text, total, every
        self._start = self._last = time.monotonic()  # of this attempt; of the last line
        self._done = 0

    def sent(self, count: int) -> None:
        now = time.monotonic()
        if count < self._done:  # a retry, from the start
            self._start = now
        self._done = count
        if now - self._last < self._every or not count:
            return
        self._last = now
        rate = count / max(now - self._start, 1e-6)
        left = datetime.timedelta(seconds=round((self._total - count) / rate))
        share = 100 * count / self._total if self._total else 100.0
        self._reporter.note(
            f"{self._text}: {size_text(count)} of {size_text(self._total)} ({share:.0f}%), "
            f"{size_text(rate)}/s, {left} left"
        )
