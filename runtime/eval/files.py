"""What eval writes: text that UTF-8 can carry, and files in ``--out`` written whole, never
through a link planted there (``--out`` may be a shared directory such as /tmp/calc-eval).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["make_dir", "writable", "write_file"]


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


def write_file(path: Path, chunks: Iterable[bytes]) -> None:
    """Write ``path`` through a new file beside it, renamed over it: a link planted at
    ``path`` is replaced, not followed, and no reader ever sees half a file."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    # O_EXCL: fails on anything already there, a link included; 0o666 less the umask
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.writelines(chunks)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def make_dir(path: Path) -> None:
    """``path`` as a directory: a link planted at its name is removed, not followed."""
    if path.is_symlink():
        path.unlink()
    path.mkdir(exist_ok=True)
