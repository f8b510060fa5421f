"""What eval writes: text that UTF-8 can carry (and the terminal shows), and files in
``--out`` written whole, in the directory that was checked, never through a link planted
there (``--out`` may be a shared directory such as /tmp/calc-eval).
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runtime.platform.scrub import printable

__all__ = ["OutDir", "terminal", "writable"]


def writable(value: Any) -> Any:
    """``value``, a string or a JSON-like value (keys too), as UTF-8 can carry it: a lone
    surrogate (half an emoji, as a tokenizer may cut one) becomes U+FFFD."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, dict):
        return {writable(k): writable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [writable(v) for v in value]
    return value


def terminal(value: Any) -> Any:
    """``value`` (a text, or a JSON-like value: keys too) as eval prints it: every control
    character but line breaks and tabs shown escaped (``\\x1b``), so that no name, error or
    data line sets the window title, clears the screen or colours it."""
    if isinstance(value, str):
        return "\n".join(printable(line, tabs=True) for line in value.split("\n"))
    if isinstance(value, dict):
        return {terminal(k): terminal(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [terminal(v) for v in value]
    return value


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class OutDir:
    """``--out``, held open by its descriptor from its check to the last file written: every
    file is made in the directory that was checked, even if its path is renamed away and
    made a link to another directory meanwhile (the owner of a shared /tmp/calc-eval can),
    and no name in it is followed when it is a link."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path  # as shown in messages
        self.fd = fd

    @classmethod
    def open(cls, path: Path) -> OutDir:
        """OSError when ``path`` is not a directory, or is a link (ELOOP)."""
        return cls(path, os.open(path, _DIRECTORY))

    def __enter__(self) -> OutDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def names(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def kind(self, name: str) -> int | None:
        """The file type (``stat.S_IFMT``) of ``name`` in it, a link not followed; None
        when there is no such name."""
        try:
            return stat.S_IFMT(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return None

    def check_writable(self) -> None:
        """OSError unless a file can be made in it."""
        temporary = f".eval-check.{uuid.uuid4().hex[:8]}.tmp"
        os.close(os.open(temporary, _NEW_FILE, 0o600, dir_fd=self.fd))
        os.unlink(temporary, dir_fd=self.fd)

    def write(self, name: str, chunks: Iterable[bytes]) -> None:
        """Write ``name`` through a new file beside it, renamed over it: a link planted at
        ``name`` is replaced, not followed, and no reader ever sees half a file."""
        temporary = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        # O_EXCL: fails on anything already there, a link included; 0o666 less the umask
        handle = os.open(temporary, _NEW_FILE, 0o666, dir_fd=self.fd)
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.writelines(chunks)
            os.replace(temporary, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=self.fd)
            raise

    def subdir(self, name: str) -> OutDir:
        """``name`` in it as a directory, opened (close it): a link planted at its name is
        removed, not followed."""
        if self.kind(name) == stat.S_IFLNK:
            os.unlink(name, dir_fd=self.fd)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, dir_fd=self.fd)
        return self.opened(name)

    def opened(self, name: str) -> OutDir:
        """The directory ``name`` in it, opened (close it); OSError when it is not one (a
        link included)."""
        return OutDir(self.path / name, os.open(name, _DIRECTORY, dir_fd=self.fd))

    def remove(self, name: str) -> None:
        """Remove the file ``name``, or the directory ``name`` and the files in it (only
        files: a directory there is an OSError), never following a link."""
        if self.kind(name) != stat.S_IFDIR:
            os.unlink(name, dir_fd=self.fd)
            return
        with self.opened(name) as inner:
            for entry in inner.names():
                os.unlink(entry, dir_fd=inner.fd)
        os.rmdir(name, dir_fd=self.fd)
