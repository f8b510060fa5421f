"""The code package of a function: a zip of the workspace plus a generated ``start.sh``.

The zip is built in memory, so nothing is written into the workspace. It is reproducible:
entries sorted, fixed timestamps, normalised permissions, so the same workspace gives the
same bytes. By default it carries this runtime's own sources (``runtime/``,
``processors_base/``) and ``start.sh`` runs ``python -m runtime serve``; ``server="sdk"``
keeps the SDK's server instead. The requirements of the layer are the workspace's own
plus the runtime's dependencies, pinned to the versions installed here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import re
import shlex
import stat
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

__all__ = [
    "DEFAULT_EXCLUDES",
    "Package",
    "PackagingError",
    "build_package",
    "layer_requirements",
    "start_script",
    "workspace_files",
]

# The SDK's exclusions (replaceable, as there, by FC_ZIP_EXCLUDE_PATTERNS) ...
DEFAULT_EXCLUDES = [
    ".git",
    ".gitignore",
    ".DS_Store",
    ".vscode",
    ".Python",
    ".env",
    ".venv",
    ".idea",
    "__pycache__",
    "*.swp",
    "*.egg",
    "*.egg-info",
    "*.pyc",
    "*.md",
    "*.log",
    "*.tmp",
    "*.bak",
    "build",
    "develop-eggs",
    ".eggs",
    "test",
    "tests",
    "tmp",
    "temp",
    "data",
]
# ... plus ours, always: other VCS data, virtual environments, tool caches, and a start.sh
# of the workspace's own (the generated one takes its place).
_ALWAYS_EXCLUDED = [
    ".hg",
    ".svn",
    "venv",
    ".tox",
    ".nox",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".ipynb_checkpoints",
    "node_modules",
    "*.pyo",
]
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_SIZE_LIMIT = 200 * 1024 * 1024
REQUIREMENTS_NAME = "agentic-rl-requirements.txt"
SDK_SERVER = "dashscope.finetune.reinforcement.component.server.server"


class PackagingError(Exception):
    pass


@dataclass(frozen=True)
class Package:
    data: bytes
    entries: tuple[str, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _patterns() -> list[str]:
    configured = os.environ.get("FC_ZIP_EXCLUDE_PATTERNS")
    base = [p.strip() for p in configured.split(",") if p.strip()] if configured else []
    return (base if configured else list(DEFAULT_EXCLUDES)) + _ALWAYS_EXCLUDED


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def workspace_files(zipdir: Path) -> list[tuple[str, Path]]:
    """(name in the zip, file) of every file to ship, sorted by name."""
    patterns = _patterns()
    found: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(zipdir):
        here = Path(folder)
        kept = []
        for name in dirs:
            relative = (here / name).relative_to(zipdir).as_posix()
            if _matches(name, patterns) or _matches(relative, patterns):
                continue
            if (here / name / "pyvenv.cfg").exists():  # a virtual environment by any name
                continue
            kept.append(name)
        dirs[:] = kept
        for name in files:
            path = here / name
            arcname = path.relative_to(zipdir).as_posix()
            if _matches(name, patterns) or arcname == "start.sh" or not path.is_file():
                continue
            found.append((arcname, path))
    return sorted(found)


def _runtime_files() -> list[tuple[str, Path]]:
    """This runtime's sources, as they are installed here."""
    import processors_base
    import runtime

    found = []
    for package in (runtime, processors_base):
        root = Path(package.__file__).resolve().parent
        for path in root.rglob("*.py"):
            if "__pycache__" not in path.parts:
                found.append((path.relative_to(root.parent).as_posix(), path))
    return sorted(found)


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _pinned_runtime_dependencies() -> list[str]:
    """The runtime's own dependencies, at the versions installed where this packages."""
    from packaging.requirements import Requirement

    pinned = []
    for line in metadata.requires("agentic-rl-runtime") or []:
        requirement = Requirement(line)
        if requirement.marker is not None and "extra" in str(requirement.marker):
            continue
        version = _installed_version(requirement.name)
        extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
        spec = f"=={version}" if version else str(requirement.specifier)
        marker = f"; {requirement.marker}" if requirement.marker else ""
        pinned.append(f"{requirement.name}{extras}{spec}{marker}")
    return sorted(pinned, key=str.lower)


def layer_requirements(zipdir: Path, requirements_path: str | None, server: str) -> str:
    """The text of the layer's requirements: the workspace's own, then the server's."""
    own = ""
    if requirements_path:
        path = (zipdir / requirements_path).resolve()
        if path.is_file():
            own = path.read_text(encoding="utf-8")
        elif os.path.normpath(requirements_path) != "requirements.txt":
            raise PackagingError(
                f"requirements_path {requirements_path!r} does not exist in {zipdir}"
            )
    lines = [f"# the workspace's requirements ({requirements_path})" if own else ""]
    lines.append(own.rstrip("\n") if own else "")
    if server == "sdk":
        version = _installed_version("dashscope")
        lines.append("# the DashScope SDK's function server")
        lines.append(f"dashscope=={version}" if version else "dashscope")
    else:
        version = _installed_version("agentic-rl-runtime") or "unknown"
        lines.append(
            f"# agentic-rl-runtime {version} (its sources are in the package): its "
            "dependencies, pinned to the versions installed where it was packaged"
        )
        lines.extend(_pinned_runtime_dependencies())
    return "\n".join(line for line in lines if line) + "\n"


def start_script(func_type: str, module: str, class_name: str, server: str) -> str:
    """The launcher the platform runs on an instance, with the function baked in."""
    layer = os.environ.get("FC_LAYER_USED", "true").strip().lower() in ("true", "1", "yes")
    index = os.environ.get("FC_PYPI_REPO", "")
    workers = os.environ.get("FC_WORKERS_COUNT", "1")
    if server == "sdk":
        processor, command = f"{module}.{class_name}", f"-m {SDK_SERVER}"
    else:
        processor, command = f"{module}:{class_name}", "-m runtime serve"
    return f"""#!/usr/bin/env bash
# Generated by agentic-rl-runtime: starts one function on a platform instance.
set -euo pipefail
cd "$(dirname "$0")"
export FUNC_TYPE={shlex.quote(func_type)}
export PROCESSOR_CLASS={shlex.quote(processor)}
export PYTHONPATH=".${{PYTHONPATH:+:$PYTHONPATH}}"
export WORKERS_COUNT="${{WORKERS_COUNT:-{int(workers)}}}"
# the platform names the port in FC_SERVER_PORT; the server reads SERVER_PORT
if [ -n "${{FC_SERVER_PORT:-}}" ] && [ -z "${{SERVER_PORT:-}}" ]; then
  export SERVER_PORT="$FC_SERVER_PORT"
fi
command -v python3 >/dev/null || {{ echo "start.sh: python3 not found" >&2; exit 101; }}
FUNCTION_LAYER={"True" if layer else "False"}
if [ "$FUNCTION_LAYER" != "True" ]; then
  # no dependency layer: install the requirements into a virtual environment first
  python3 -m venv /tmp/agentic-rl-venv || exit 202
  . /tmp/agentic-rl-venv/bin/activate
  INDEX={shlex.quote(index)}
  for try in 1 2 3; do
    pip install -q ${{INDEX:+--index-url "$INDEX"}} -r {REQUIREMENTS_NAME} && break
    [ "$try" = 3 ] && exit 204
    sleep 5
  done
fi
exec python3 {command}
"""


_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def build_package(
    zipdir: Path,
    func_type: str,
    module: str,
    class_name: str,
    requirements: str,
    *,
    server: str = "runtime",
    extra_files: tuple[Path, ...] = (),
) -> Package:
    """The zip of one component, in memory; refused over the platform's size limit."""
    if not _MODULE.match(module):
        raise PackagingError(f"{module!r} is not an importable module path")
    entries: dict[str, bytes | Path] = dict(workspace_files(zipdir))
    patterns = _patterns()
    for extra in extra_files:
        if extra.is_file() and not _matches(extra.name, patterns):
            entries[extra.name] = extra
    if server != "sdk":
        clash = sorted(n for n in entries if n.split("/")[0] in ("runtime", "processors_base"))
        if clash:
            raise PackagingError(
                f"the workspace has its own {clash[0].split('/')[0]}/, which would shadow "
                "the runtime's sources in the package; rename it, or use --server sdk"
            )
        entries.update(dict(_runtime_files()))
    entries[REQUIREMENTS_NAME] = requirements.encode()
    entries["start.sh"] = start_script(func_type, module, class_name, server).encode()

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries):
            source = entries[name]
            executable = name == "start.sh"
            if isinstance(source, Path):
                data = source.read_bytes()
                executable = bool(source.stat().st_mode & stat.S_IXUSR)
            else:
                data = source
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so the permission bits below are honoured
            info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            archive.writestr(info, data)
    data = buffer.getvalue()
    limit = int(os.environ.get("FC_OSS_FILE_SIZE_WARNING", _SIZE_LIMIT))
    if len(data) > limit:
        biggest = sorted(
            ((p.stat().st_size, n) for n, p in entries.items() if isinstance(p, Path)),
            reverse=True,
        )[:3]
        listed = ", ".join(f"{n} ({s / 1e6:.1f} MB)" for s, n in biggest)
        raise PackagingError(
            f"the package of {zipdir} is {len(data) / 1e6:.1f} MB, over the platform's limit "
            f"of {limit / 1e6:.1f} MB; the biggest files: {listed}. Move data out of the "
            "workspace or exclude it (FC_ZIP_EXCLUDE_PATTERNS)"
        )
    return Package(data, tuple(sorted(entries)))
