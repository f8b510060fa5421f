"""Training data: check JSONL files locally, then upload them one by one (``POST /files``)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from runtime.platform import answers
from runtime.platform.http import Platform, PlatformError

__all__ = ["DatasetError", "check_jsonl", "upload"]

_SIZE_LIMIT = 1024 * 1024 * 1024
_SHOWN = 5  # bad lines named in one message


class DatasetError(Exception):
    pass


def check_jsonl(path: Path) -> None:
    """Every line a JSON object with a ``messages`` list; the bad lines' numbers if not."""
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    limit = int(os.environ.get("DATASETS_FILE_SIZE_WARNING", _SIZE_LIMIT))
    size = path.stat().st_size
    if size == 0:
        raise DatasetError(f"{path}: the file is empty")
    if size > limit:
        raise DatasetError(f"{path}: {size / 1e6:.1f} MB, over the limit of {limit / 1e6:.1f} MB")
    bad: list[str] = []
    blank: list[int] = []  # blank lines are bad only when a record follows them
    records = 0
    with path.open("rb") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                blank.append(number)
                continue
            bad.extend(f"line {n}: empty" for n in blank)
            blank.clear()
            records += 1
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                bad.append(f"line {number}: not JSON ({str(exc).split(':')[0]})")
                continue
            if not isinstance(record, dict):
                bad.append(f"line {number}: not a JSON object")
            elif not isinstance(record.get("messages"), list) or not record["messages"]:
                bad.append(f"line {number}: no 'messages' list")
            elif not all(isinstance(m, dict) for m in record["messages"]):
                bad.append(f"line {number}: 'messages' must be a list of objects")
    if not records:
        raise DatasetError(f"{path}: no records, only blank lines")
    if bad:
        more = f" (and {len(bad) - _SHOWN} more)" if len(bad) > _SHOWN else ""
        raise DatasetError(f"{path}: {len(bad)} bad line(s): " + "; ".join(bad[:_SHOWN]) + more)


def upload(platform: Platform, path: Path) -> str:
    """Upload one checked file; its file id."""
    what = f"uploading {path.name}"
    out = platform.call(
        what,
        "POST",
        platform.url("files"),
        answer=answers.FilesUploaded,
        creates=f"the platform's files for one named {path.name}",
        files=[
            ("files", (path.name, path.read_bytes(), "application/octet-stream")),
            ("purpose", (None, b"fine-tune", "text/plain; charset=utf-8")),
        ],
    )
    if out.failed_uploads:
        details = "; ".join(
            orjson.dumps(f).decode() if isinstance(f, (dict, list)) else str(f)
            for f in out.failed_uploads
        )
        raise PlatformError(what, f"the platform refused it: {details}")
    if not out.uploaded_files:
        raise PlatformError(what, "the answer lists no uploaded file")
    return out.uploaded_files[0].file_id
