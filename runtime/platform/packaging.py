"""The code package of a function: a zip of the workspace plus a generated ``start.sh``.

The zip is written to a temporary file (``build_package_file``, what ``register`` uploads,
streamed: memory does not grow with the workspace) or, for a small one, built in memory
(``build_package``); nothing is written into the workspace. It is reproducible:
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
import tempfile
import zipfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO

from runtime.platform.shadowing import shadowed_package

__all__ = [
    "DEFAULT_EXCLUDES",
    "Package",
    "PackageFile",
    "PackagingError",
    "WorkspaceFileError",
    "build_package",
    "build_package_file",
    "check_environment",
    "layer_requirements",
    "scan_workspace",
    "start_script",
    "workspace_files",
]

# What is never shipped, at any depth, whatever FC_ZIP_EXCLUDE_PATTERNS says: VCS data,
# virtual environments, tool caches, editor state (the SDK's base-name list, less the code
# directory names, plus ours). FC_ZIP_EXCLUDE_PATTERNS only adds to it.
DEFAULT_EXCLUDES = [
    ".git",
    ".hg",
    ".svn",
    ".gitignore",
    ".DS_Store",
    ".vscode",
    ".idea",
    ".Python",
    ".venv",
    "venv",
    ".conda",
    ".tox",
    ".nox",
    "__pycache__",
    ".cache",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".hypothesis",
    ".ipynb_checkpoints",
    "node_modules",
    ".eggs",
    "develop-eggs",
    ".coverage",
    ".coverage.*",
    "*.swp",
    "*.egg",
    "*.egg-info",
    "*.pyc",
    "*.pyo",
    "*.md",
    "*.log",
    "*.tmp",
    "*.bak",
]
# The SDK also drops directories with these names at any depth (bug B18: a package
# ``functions/reward/data/`` silently disappears). Here they are dropped only at the top of
# the workspace, and only when they are not a Python package.
TOP_LEVEL_EXCLUDES = ["data", "test", "tests", "build", "tmp", "temp"]
# Files that hold credentials: left out, with a warning naming each, unless named in
# FC_ZIP_INCLUDE (or in a function's extra_files). By base name, by path at any depth,
# and by content (a private key block, a cloud service-account key) for small files.
SECRET_PATTERNS = [
    ".env",
    ".env.*",
    "*.env",
    ".netrc",
    "_netrc",
    ".npmrc",
    ".pypirc",
    ".pgpass",
    ".git-credentials",
    "kubeconfig",
    "kubeconfig.*",
    "*.kubeconfig",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "credentials.json",
    "application_default_credentials.json",  # gcloud's
    ".vault-token",
    ".s3cfg",
    ".boto",
    ".dockercfg",
    ".htpasswd",
    "*.pem",
    "*.p12",
    "*.pfx",
    "*.ppk",
    "*.key",
]
SECRET_PATHS = [
    ".aws/credentials",
    ".aws/config",
    ".docker/config.json",
    ".kube/config",
    ".config/gh/hosts.yml",  # the GitHub CLI's token
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".azure/accessTokens.json",
    ".azure/msal_token_cache.json",
    ".config/gcloud/credentials.db",
    ".config/gcloud/access_tokens.db",
]
_SNIFFED_SIZE = 1024 * 1024  # larger files are not looked into
_SNIFFED_PREFIX = 64 * 1024
_PRIVATE_KEY = re.compile(rb"^-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----\r?$", re.M)
# a cloud key file: every pattern of one of these found in its first bytes
_KEY_FILES = (
    (  # a Google service-account key
        re.compile(rb'"type"\s*:\s*"service_account"'),
        re.compile(rb'"private_key"\s*:'),
    ),
    (  # Google user credentials (gcloud auth application-default login)
        re.compile(rb'"type"\s*:\s*"authorized_user"'),
        re.compile(rb'"refresh_token"\s*:'),
    ),
    # AWS keys, in a file of any name (an .ini, a .cfg)
    (re.compile(rb"^[ \t]*aws_secret_access_key[ \t]*[=:]", re.M | re.I),),
)
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_CHUNK = 1024 * 1024  # bytes of a workspace file read at a time
_SIZE_LIMIT = 200 * 1024 * 1024
REQUIREMENTS_NAME = "agentic-rl-requirements.txt"
SDK_SERVER = "dashscope.finetune.reinforcement.component.server.server"


class PackagingError(Exception):
    pass


class WorkspaceFileError(PackagingError):
    """A file that cannot be packaged as it is (its name is not UTF-8, it cannot be read):
    a local mistake, found before anything is sent."""


@dataclass(frozen=True)
class Package:
    data: bytes
    entries: tuple[str, ...]
    left_out_secrets: tuple[str, ...] = ()  # credential files found and not shipped

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class PackageFile:
    """A package whose zip is a temporary file, for one of any size: ``remove()``, or the
    end of its ``with`` block, deletes it."""

    path: Path
    size: int
    entries: tuple[str, ...]
    left_out_secrets: tuple[str, ...] = ()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> PackageFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _env_list(name: str) -> list[str]:
    return [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]


def _patterns() -> list[str]:
    return DEFAULT_EXCLUDES + _env_list("FC_ZIP_EXCLUDE_PATTERNS")


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _shown(name: str) -> str:
    """A file name as it may be printed: bytes that are not UTF-8 as ``\\xff``."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _credentials(name: str, arcname: str, path: Path) -> bool:
    """A credentials file: by its name (in any case), its path, or (a small file) a private
    key block, a Google service-account or user key, or AWS keys in its first bytes."""
    if _matches(name.lower(), SECRET_PATTERNS) or any(  # ID_RSA, .ENV: any case
        f"/{arcname}".endswith(f"/{p}") for p in SECRET_PATHS
    ):
        return True
    try:
        if path.stat().st_size > _SNIFFED_SIZE:
            return False
        with path.open("rb") as file:
            head = file.read(_SNIFFED_PREFIX)
    except OSError as exc:
        raise WorkspaceFileError(f"{_shown(arcname)}: cannot read it: {exc.strerror}") from None
    return bool(_PRIVATE_KEY.search(head)) or any(
        all(p.search(head) for p in patterns) for patterns in _KEY_FILES
    )


@dataclass
class _Walk:
    root: Path  # the workspace, resolved
    patterns: list[str]
    included: set[str]  # FC_ZIP_INCLUDE: paths shipped even when they look like secrets
    files: list[tuple[str, Path]] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)

    def directory(self, real: Path, prefix: str, chain: tuple[Path, ...]) -> None:
        try:
            entries = sorted(os.scandir(real), key=lambda e: e.name)
        except OSError as exc:
            raise WorkspaceFileError(
                f"{_shown(prefix or '.')}: cannot read it: {exc.strerror}"
            ) from None
        for entry in entries:
            arcname = prefix + entry.name
            path = Path(entry.path)
            if entry.is_symlink():
                target = Path(os.path.realpath(path))
                if not _inside(target, self.root):
                    raise PackagingError(
                        f"{arcname} is a symbolic link to {target}, outside the workspace "
                        f"{self.root}: refusing to ship what it points to; copy what the "
                        "function needs into the workspace, or remove the link"
                    )
                if not target.exists():
                    raise PackagingError(f"{arcname} is a broken symbolic link: remove it")
                path = target
            if path.is_dir():
                if self._skip_dir(entry.name, arcname, path, top=not prefix):
                    continue
                if path in chain:
                    raise PackagingError(
                        f"{arcname} is a symbolic link to a directory that contains it: "
                        "a loop; remove the link"
                    )
                self.directory(path, arcname + "/", (*chain, path))
            elif path.is_file():
                if arcname == "start.sh" or self._excluded(entry.name, arcname):
                    continue
                if _shown(arcname) != arcname:  # undecodable bytes, kept as surrogates
                    raise WorkspaceFileError(
                        f"{_shown(arcname)}: the file name is not valid UTF-8, which a name "
                        "in the zip must be: rename the file or exclude it "
                        "(FC_ZIP_EXCLUDE_PATTERNS)"
                    )
                if arcname not in self.included and _credentials(entry.name, arcname, path):
                    self.secrets.append(arcname)
                    continue
                self.files.append((arcname, path))

    def _excluded(self, name: str, arcname: str) -> bool:
        return _matches(name, self.patterns) or _matches(arcname, self.patterns)

    def _skip_dir(self, name: str, arcname: str, path: Path, *, top: bool) -> bool:
        if self._excluded(name, arcname) or os.path.exists(path / "pyvenv.cfg"):
            return True  # pyvenv.cfg: a virtual environment by any name
        return top and name in TOP_LEVEL_EXCLUDES and not (path / "__init__.py").is_file()


def scan_workspace(zipdir: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """(name in the zip, file) of every file to ship, sorted by name, and the credential
    files left out. Symbolic links inside the workspace ship as what they point to; one
    that leads outside it is refused."""
    root = Path(os.path.realpath(zipdir))
    if not root.is_dir():
        raise PackagingError(f"the workspace {zipdir} is not a directory")
    walk = _Walk(root, _patterns(), set(_env_list("FC_ZIP_INCLUDE")))
    walk.directory(root, "", (root,))
    return sorted(walk.files), sorted(walk.secrets)


def workspace_files(zipdir: Path) -> list[tuple[str, Path]]:
    """(name in the zip, file) of every file to ship, sorted by name."""
    return scan_workspace(zipdir)[0]


def check_environment() -> None:
    """The packaging settings of the environment, checked before anything is done."""
    for name in ("FC_WORKERS_COUNT", "FC_OSS_FILE_SIZE_WARNING", "DATASETS_FILE_SIZE_WARNING"):
        value = os.environ.get(name)
        if value is not None and not (value.strip().isdigit() and int(value) > 0):
            raise PackagingError(f"{name} must be a positive whole number, not {value!r}")


def _runtime_files() -> list[tuple[str, Path]]:
    """This runtime's sources, as they are installed here."""
    import processors_base
    import runtime

    found = []
    for package in (runtime, processors_base):
        root = Path(package.__path__[0]).resolve()  # the package's directory
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
    check_environment()
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
    """The zip of one component, in memory (a small one: ``build_package_file`` for one of
    any size); refused over the platform's size limit."""
    entries, secrets, sizes, limit = _contents(
        zipdir, func_type, module, class_name, requirements, server, extra_files
    )
    buffer = io.BytesIO()
    _write_zip(entries, buffer)
    data = buffer.getvalue()
    if len(data) > limit:
        _refuse(zipdir, len(data), limit, sizes, "the package is")
    return Package(data, tuple(sorted(entries)), tuple(secrets))


def build_package_file(
    zipdir: Path,
    func_type: str,
    module: str,
    class_name: str,
    requirements: str,
    *,
    server: str = "runtime",
    extra_files: tuple[Path, ...] = (),
) -> PackageFile:
    """The zip of one component, written to a temporary file a chunk at a time (the same
    bytes as ``build_package``'s); refused over the platform's size limit. The file is
    removed if anything fails (Ctrl-C too); else by the caller (``PackageFile.remove``)."""
    entries, secrets, sizes, limit = _contents(
        zipdir, func_type, module, class_name, requirements, server, extra_files
    )
    handle, name = tempfile.mkstemp(prefix="agentic-rl-package-", suffix=".zip")
    path = Path(name)
    try:
        with os.fdopen(handle, "w+b") as file:
            try:
                _write_zip(entries, file)
            except OSError as exc:  # reading a workspace file is a WorkspaceFileError
                raise PackagingError(
                    f"cannot write the package to {path.parent}: {exc.strerror}"
                ) from None
            size = file.tell()
        if size > limit:
            _refuse(zipdir, size, limit, sizes, "the package is")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return PackageFile(path, size, tuple(sorted(entries)), tuple(secrets))


def _contents(
    zipdir: Path,
    func_type: str,
    module: str,
    class_name: str,
    requirements: str,
    server: str,
    extra_files: tuple[Path, ...],
) -> tuple[dict[str, bytes | Path], list[str], dict[str, int], int]:
    """What goes into the zip (name: bytes or file), the credential files left out, the
    files' sizes and the size limit; refused before anything is read over the limit."""
    if not _MODULE.match(module):
        raise PackagingError(f"{module!r} is not an importable module path")
    found, secrets = scan_workspace(zipdir)
    entries: dict[str, bytes | Path] = dict(found)
    for extra in extra_files:  # named explicitly: shipped even when it looks like a secret
        if not extra.is_file():  # a typo must not ship a function without it, silently
            raise WorkspaceFileError(
                f"fcmodel.extra_files names {extra}, which is not a file: fix the path, or "
                "remove it from extra_files"
            )
        entries[extra.name] = extra
    if server != "sdk":
        # start.sh runs `python -m runtime serve` from the top of the package, where the
        # runtime's sources go: a workspace module of the same name would be run instead
        clash = sorted({name.split("/")[0] for name in entries if shadowed_package(name)})
        if clash:
            named = ", ".join(c if "." in c else f"{c}/" for c in clash)
            raise PackagingError(
                f"the workspace has {named} at its top, which would shadow the runtime's "
                "sources in the package (its start.sh, `python -m runtime serve`, would import "
                "that instead of them): rename it, or use --server sdk"
            )
        entries.update(dict(_runtime_files()))
    check_environment()
    limit = int(os.environ.get("FC_OSS_FILE_SIZE_WARNING", _SIZE_LIMIT))
    sizes = {n: p.stat().st_size for n, p in entries.items() if isinstance(p, Path)}
    total = sum(sizes.values())
    if total > limit:  # refused before anything is read or compressed
        _refuse(zipdir, total, limit, sizes, "its files add up to")
    entries[REQUIREMENTS_NAME] = requirements.encode()
    entries["start.sh"] = start_script(func_type, module, class_name, server).encode()
    return entries, secrets, sizes, limit


def _write_zip(entries: dict[str, bytes | Path], dest: IO[bytes]) -> None:
    """The zip of ``entries``, in name order, each file copied a chunk at a time."""
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries):
            source = entries[name]
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so the permission bits below are honoured
            if not isinstance(source, Path):
                info.external_attr = (stat.S_IFREG | (0o755 if name == "start.sh" else 0o644)) << 16
                archive.writestr(info, source)
                continue
            try:
                file = source.open("rb")
            except OSError as exc:
                raise WorkspaceFileError(f"{name}: cannot read it: {exc.strerror}") from None
            with file:
                found = os.fstat(file.fileno())
                executable = bool(found.st_mode & stat.S_IXUSR)
                info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
                info.file_size = found.st_size  # decides zip64 before the entry is written
                with archive.open(info, "w") as entry:
                    while True:
                        try:
                            chunk = file.read(_CHUNK)
                        except OSError as exc:
                            raise WorkspaceFileError(
                                f"{name}: cannot read it: {exc.strerror}"
                            ) from None
                        if not chunk:
                            break
                        entry.write(chunk)


def _refuse(zipdir: Path, size: int, limit: int, sizes: dict[str, int], what: str) -> None:
    biggest = sorted(((s, n) for n, s in sizes.items()), reverse=True)[:3]
    listed = ", ".join(f"{n} ({s / 1e6:.1f} MB)" for s, n in biggest)
    raise PackagingError(
        f"{zipdir}: {what} {size / 1e6:.1f} MB, over the platform's limit of "
        f"{limit / 1e6:.1f} MB; the biggest files: {listed}. Move data out of the "
        "workspace or exclude it (FC_ZIP_EXCLUDE_PATTERNS)"
    )
