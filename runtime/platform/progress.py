"""Progress of long steps on stderr: ``rich`` when stderr is a terminal, plain lines otherwise.

Plain lines keep logs and CI output readable (no cursor movement, no colour codes); the
terminal gets a spinner that is replaced by a one-line result. Every text goes through
``scrub.shown``: no key, and no control sequence the platform sent (in a log line, a name).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from runtime.platform.scrub import shown

__all__ = ["Reporter"]


class Reporter:
    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None) -> None:
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty() if tty is None else tty
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
