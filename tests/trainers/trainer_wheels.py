"""A trainer's own module, read from its released wheel, for the tests that prove the hooks
and protocols with the trainer's code (issue 22).

The trainers that cannot install here (they pull GPU stacks) are fetched at a pinned version
with ``pip download --no-deps NAME==VERSION -d DIR``; ``TRAINER_WHEELS`` names DIR
(``.ci/run`` makes it). A test loads the one module that calls the reward, as written; only
the trainer's own light helpers that module imports (a logger factory) are given, so that
the package's ``__init__`` (which starts torch, Ray, vLLM) never runs.
"""

from __future__ import annotations

import os
import sys
import types
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

WHEELS = os.environ.get("TRAINER_WHEELS") or None


def needs_wheel(name: str, version: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        WHEELS is None,
        reason=f"{name}'s wheel is not here: pip download --no-deps {name}=={version} -d DIR "
        "and name DIR in TRAINER_WHEELS (.ci/run does)",
    )


def wheel(name: str, version: str) -> Path:
    assert WHEELS is not None
    found = sorted(Path(WHEELS).glob(f"{name}-{version}-*.whl"))
    assert found, f"no {name}-{version}-*.whl in TRAINER_WHEELS={WHEELS}"
    with zipfile.ZipFile(found[0]) as archive:
        metadata = archive.read(f"{name}-{version}.dist-info/METADATA").decode()
    assert f"\nVersion: {version}\n" in metadata, f"{found[0]} is not {name} {version}"
    return found[0]


def load_module(
    path: Path, member: str, name: str, helpers: dict[str, dict[str, Callable[..., object]]]
) -> types.ModuleType:
    """``member`` of the wheel at ``path`` executed as module ``name``; ``helpers``: the
    modules it imports from its own package, each given as {attribute: value}, present in
    ``sys.modules`` only while it runs (with their parent packages)."""
    with zipfile.ZipFile(path) as archive:
        source = archive.read(member)
    given: dict[str, types.ModuleType] = {}
    for dotted, attributes in helpers.items():
        parts = dotted.split(".")
        for depth in range(1, len(parts) + 1):
            given.setdefault(".".join(parts[:depth]), types.ModuleType(".".join(parts[:depth])))
        given[dotted].__dict__.update(attributes)
    for dotted, module in given.items():  # `from package import module` reads the attribute
        parent, _, child = dotted.rpartition(".")
        if parent:
            setattr(given[parent], child, module)
    saved = {key: sys.modules.get(key) for key in given}
    sys.modules.update(given)
    try:
        module = types.ModuleType(name)
        module.__file__ = f"{path}/{member}"
        exec(compile(source, module.__file__, "exec"), module.__dict__)
    finally:
        for key, old in saved.items():
            if old is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = old
    return module
