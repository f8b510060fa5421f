"""Build and push a function's container image with the ``docker`` CLI, as a user would.

The build context is assembled in a temporary directory: the runtime's sources and the
repository's Dockerfile, plus the user's workspace under ``workspace/``. Files are copied
with their modification times, so an unchanged workspace hits the build cache layer for
layer and yields the same image, and so the same digest when pushed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["ImageError", "build", "build_context", "push", "run_build", "source_root"]

# What never belongs in an image (the same spirit as .dockerignore).
_IGNORED = shutil.ignore_patterns(
    ".git",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".venv",
    "venv",
    "*.egg-info",
    ".DS_Store",
    "node_modules",
)
_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")


class ImageError(Exception):
    pass


def source_root() -> Path:
    """The runtime's source tree (a checkout or an editable install), with its Dockerfile."""
    root = Path(__file__).resolve().parents[2]  # runtime/deploy/images.py -> the tree
    if not (root / "Dockerfile").is_file() or not (root / "pyproject.toml").is_file():
        raise ImageError(
            f"no Dockerfile and pyproject.toml beside the runtime in {root}: building images "
            "needs the runtime's source tree (git clone it and pip install -e it)"
        )
    return root


@contextmanager
def build_context(workspace: Path) -> Iterator[Path]:
    root = source_root()
    with tempfile.TemporaryDirectory(prefix="rl-fn-context-") as tmp:
        context = Path(tmp)
        for name in ("Dockerfile", "pyproject.toml", "README.md", ".dockerignore"):
            shutil.copy2(root / name, context / name)
        for package in ("processors_base", "runtime"):
            shutil.copytree(root / package, context / package, ignore=_IGNORED)
        shutil.copytree(workspace, context / "workspace", ignore=_IGNORED)
        yield context


def _docker(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker") is None:
        raise ImageError("the docker CLI is not on PATH")
    try:
        return subprocess.run(
            ["docker", *args],
            check=True,
            text=True,
            stdout=subprocess.PIPE if capture else sys.stderr,
            stderr=subprocess.STDOUT if capture else None,
        )
    except subprocess.CalledProcessError as exc:
        tail = (exc.stdout or "").strip().splitlines()[-5:]
        raise ImageError(
            f"docker {args[0]} failed (exit {exc.returncode})"
            + (": " + " | ".join(tail) if tail else "")
        ) from None


def build(workspace: Path, image: str, target: str | None = None) -> None:
    """Build ``image`` from ``workspace``; docker's progress goes to stderr. ``target``
    becomes the image's default processor (``PROCESSOR_CLASS``); a ``docker run``
    argument or ``-e PROCESSOR_CLASS`` still overrides it."""
    if not workspace.is_dir():
        raise ImageError(f"workspace {str(workspace)!r} is not a directory")
    default = ["--build-arg", f"PROCESSOR_CLASS={target}"] if target else []
    with build_context(workspace) as context:
        _docker("build", "--build-arg", "WORKSPACE=workspace", *default, "-t", image, str(context))


def push(image: str) -> str:
    """Push ``image`` and return the digest the registry reported for it."""
    done = _docker("push", image, capture=True)
    sys.stderr.write(done.stdout)
    found = _DIGEST.findall(done.stdout)
    if not found:
        raise ImageError(f"docker push {image} reported no digest")
    return found[-1]


def run_build(workspace: str, image: str, target: str | None, push_it: bool = False) -> int:
    """``python -m runtime build``: check the target, build, optionally push; exit status."""
    if target:
        from runtime.execution.loading import TargetError, load_target

        try:
            load_target(target, workspace)
        except TargetError as exc:
            print(f"error: {exc} (checked locally before building)", file=sys.stderr)
            return 2
    try:
        build(Path(workspace), image, target)
        if push_it:
            digest = push(image)
            name = image.split("@", 1)[0]
            last = name.rsplit("/", 1)[-1]
            repository = name.rsplit(":", 1)[0] if ":" in last else name
            print(f"{repository}@{digest}")
            return 0
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(image)
    return 0
