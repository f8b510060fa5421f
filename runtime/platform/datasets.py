"""Training data: check JSONL files locally, then upload them one by one (``POST /files``).

Both stream: the check reads a line at a time and keeps only the first bad lines it names,
the upload sends the file from disk a chunk at a time, so neither needs memory that grows
with the file (files of several GB are common).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import orjson

from runtime.platform import answers
from runtime.platform.http import FileBody, FileStamp, Platform, PlatformError, stamp

__all__ = ["DatasetError", "check_jsonl", "upload"]

_SIZE_LIMIT = 1024 * 1024 * 1024
_SHOWN = 5  # bad lines named in one message
_LINE_LIMIT = 32 * 1024 * 1024  # bytes of one record: longer is refused, never read whole
_EVERY = 4 * 1024 * 1024  # bytes checked between two progress reports


class DatasetError(Exception):
    pass


class _Bad:
    """The bad lines found: every one counted, the first ``_SHOWN`` named."""

    def __init__(self) -> None:
        self.count = 0
        self.named: list[str] = []

    def add(self, text: str) -> None:
        self.count += 1
        if len(self.named) < _SHOWN:
            self.named.append(text)

    def blank(self, first: int, last: int) -> None:
        """Lines ``first`` to ``last``, empty, with a record after them."""
        for number in range(first, min(last, first + _SHOWN - 1) + 1):
            self.add(f"line {number}: empty")
        self.count += max(0, last - first + 1 - _SHOWN)


def check_jsonl(path: Path, progress: Callable[[int], None] | None = None) -> FileStamp:
    """Every line a JSON object with a ``messages`` list; the bad lines' numbers if not.
    ``progress``: told the bytes checked so far, every few MiB. The file as checked (its
    stamp), for ``upload`` to send exactly that."""
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    limit = int(os.environ.get("DATASETS_FILE_SIZE_WARNING", _SIZE_LIMIT))
    size = path.stat().st_size
    if size == 0:
        raise DatasetError(f"{path}: the file is empty")
    if size > limit:
        raise DatasetError(f"{path}: {size / 1e6:.1f} MB, over the limit of {limit / 1e6:.1f} MB")
    bad = _Bad()
    blank: tuple[int, int] | None = None  # blank lines are bad only when a record follows
    records = done = reported = 0
    number = 0
    with path.open("rb") as lines:
        before = stamp(os.fstat(lines.fileno()))
        while line := lines.readline(_LINE_LIMIT + 1):
            number += 1
            done += len(line)
            if progress is not None and done - reported >= _EVERY:
                progress(done)
                reported = done
            if not line.strip():
                blank = (blank[0] if blank else number, number)
                continue
            if blank:
                bad.blank(*blank)
                blank = None
            records += 1
            if len(line) > _LINE_LIMIT and not line.endswith(b"\n"):  # skipped, not read
                bad.add(f"line {number}: over {_LINE_LIMIT // 2**20} MiB, not a record")
                while not line.endswith(b"\n") and (line := lines.readline(_EVERY)):
                    done += len(line)
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                bad.add(f"line {number}: not JSON ({str(exc).split(':')[0]})")
                continue
            if not isinstance(record, dict):
                bad.add(f"line {number}: not a JSON object")
            elif not isinstance(record.get("messages"), list) or not record["messages"]:
                bad.add(f"line {number}: no 'messages' list")
            elif not all(isinstance(m, dict) for m in record["messages"]):
                bad.add(f"line {number}: 'messages' must be a list of objects")
        if stamp(os.fstat(lines.fileno())) != before:
            raise DatasetError(f"{path}: changed while it was checked; check it once written")
    if progress is not None:
        progress(done)
    if not records:
        raise DatasetError(f"{path}: no records, only blank lines")
    if bad.count:
        more = f" (and {bad.count - _SHOWN} more)" if bad.count > _SHOWN else ""
        raise DatasetError(f"{path}: {bad.count} bad line(s): " + "; ".join(bad.named) + more)
    return before


def upload(
    platform: Platform,
    path: Path,
    *,
    progress: Callable[[int], None] | None = None,
    checked: FileStamp | None = None,
) -> str:
    """Upload one checked file, streamed from disk; its file id. ``progress``: told the
    bytes sent so far (0 again when a retry starts the file over); ``checked``: the file
    as ``check_jsonl`` read it (a file changed since is refused, not sent)."""
    what = f"uploading {path.name}"
    body = FileBody(path, progress, checked)
    try:
        out = platform.call(
            what,
            "POST",
            platform.url("files"),
            answer=answers.FilesUploaded,
            creates=f"the platform's files for one named {path.name}",
            upload=body,
            files=[
                ("files", (path.name, body, "application/octet-stream")),
                ("purpose", (None, b"fine-tune", "text/plain; charset=utf-8")),
            ],
        )
    finally:
        body.close()
    if out.failed_uploads:
        details = "; ".join(
            orjson.dumps(f).decode() if isinstance(f, (dict, list)) else str(f)
            for f in out.failed_uploads
        )
        raise PlatformError(what, f"the platform refused it: {details}")
    if not out.uploaded_files:
        raise PlatformError(what, "the answer lists no uploaded file")
    return out.uploaded_files[0].file_id
