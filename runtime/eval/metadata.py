"""What tells one run from another: when it ran, with what seed, job file, code, runtime
and LLM (``summary.json``'s ``run``; the page's header)."""

from __future__ import annotations

import hashlib
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from runtime.eval.plan import Plan
from runtime.eval.runner import Results
from runtime.eval.secrets import without_userinfo

__all__ = ["GIT_TIMEOUT", "describe", "git_state"]

GIT_TIMEOUT = 5.0  # seconds for each git command: a slow or odd repository costs no more


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(folder: Path) -> dict[str, Any]:
    """``{"git_commit": ..., "git_dirty": ...}`` of the repository ``folder`` is in; empty
    when it is in none (or git is not there). Dirty: a file under ``folder`` changed or
    untracked, as what ``register`` would package differs from the commit."""
    commit = _git(folder, "rev-parse", "HEAD")
    changes = _git(folder, "status", "--porcelain", "--", ".")
    if commit is None or changes is None:
        return {}
    return {"git_commit": commit.strip(), "git_dirty": bool(changes.strip())}


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _version() -> str | None:
    try:
        return metadata.version("agentic-rl-runtime")
    except metadata.PackageNotFoundError:
        return None


def describe(plan: Plan, results: Results) -> dict[str, Any]:
    workspaces = dict.fromkeys(f.component.zipdir for f in plan.functions)
    assert plan.llm is not None
    return {
        "started_at": datetime.fromtimestamp(results.started_at, timezone.utc).isoformat(
            timespec="seconds"
        ),
        "duration_s": results.elapsed,
        "seed": plan.seed,
        "job_file": {"path": str(plan.job.path), "sha256": _sha256(Path(plan.job.path))},
        "workspaces": [{"path": str(w), **git_state(Path(w))} for w in workspaces],
        "runtime_version": _version(),
        "python_version": platform.python_version(),
        "llm": {"base_url": without_userinfo(plan.llm.base_url), "model": plan.llm.model},
    }
