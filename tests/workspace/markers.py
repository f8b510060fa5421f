"""The marker files test processors write and tests wait on. Each appears whole (written
under a hidden name, then renamed), so a test that sees one can read it at once: a plain
write_text creates the file before it writes, and a test could read it empty between."""

from __future__ import annotations

import os
from pathlib import Path

MARKERS = Path(os.environ.get("TEST_MARKER_DIR", "/tmp"))


def mark(name: str, text: str) -> None:
    hidden = MARKERS / f".{name}.{os.getpid()}.tmp"
    hidden.write_text(text)
    os.replace(hidden, MARKERS / name)
