"""The names in a workspace that would shadow the runtime's own packages.

A workspace goes first on ``sys.path`` wherever its functions run (``serve``, a package's
``start.sh``), and ``python -m runtime`` puts the current directory there before anything
else, so a workspace ``runtime.py`` (or ``runtime/``, ``processors_base.py``,
``processors_base/``) is imported in place of the runtime, or of the package that its
functions import. Packaging refuses such a workspace; ``serve`` warns of one.
"""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

__all__ = ["RUNTIME_PACKAGES", "shadowed_package", "workspace_shadows"]

RUNTIME_PACKAGES = ("runtime", "processors_base")
# what the import system loads a module from: .py, .pyc and the extension modules' suffixes
_MODULE_SUFFIXES = tuple(importlib.machinery.all_suffixes())


def shadowed_package(name: str) -> str | None:
    """The runtime package that a workspace path (``/``-separated, relative to the top of
    the workspace) would be imported as, or merged into; None for any other path."""
    top, slash, _ = name.partition("/")
    if slash:  # inside a top-level directory
        return top if top in RUNTIME_PACKAGES else None
    stem, dot, _ = top.partition(".")
    if dot and stem in RUNTIME_PACKAGES and top.endswith(_MODULE_SUFFIXES):
        return stem
    return None


def workspace_shadows(workspace: Path) -> list[str]:
    """The top-level entries of ``workspace`` that Python would import as ``runtime`` or
    ``processors_base`` (a module file, or a directory with an ``__init__``), as
    ``runtime.py`` or ``processors_base/``; sorted. Empty when the workspace is where this
    runtime itself is imported from (a checkout of it)."""
    root = workspace.resolve()
    import runtime

    if Path(runtime.__path__[0]).resolve().parent == root:
        return []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []  # an unreadable workspace is reported where it is read
    found = []
    for entry in entries:
        if entry.name in RUNTIME_PACKAGES and entry.is_dir():
            if any((Path(entry.path) / f"__init__{s}").is_file() for s in _MODULE_SUFFIXES):
                found.append(f"{entry.name}/")  # without one, a namespace portion: it loses
        elif shadowed_package(entry.name) and entry.is_file():
            found.append(entry.name)
    return sorted(found)
