"""What goes into a function's package: code directories at any depth, symbolic links,
credential files, the exclusions that always apply, and the size limit checked first."""

from __future__ import annotations

import os
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from runtime.platform import packaging


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _names(ws: Path) -> set[str]:
    package = packaging.build_package(
        ws, "reward", "functions.fn", "Fn", "", server="sdk"
    )  # sdk: the workspace's files only
    return set(zipfile.ZipFile(BytesIO(package.data)).namelist()) - {
        "start.sh",
        packaging.REQUIREMENTS_NAME,
    }


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return _write(
        tmp_path / "ws",
        {"functions/__init__.py": "", "functions/fn.py": "X = 1\n", "requirements.txt": ""},
    )


def test_code_directories_named_like_data_ship_below_the_top_and_as_packages(ws):
    _write(
        ws,
        {
            "functions/reward/data/__init__.py": "",
            "functions/reward/data/loader.py": "Y = 2\n",
            "functions/tests/helpers.py": "",
            "build/__init__.py": "",  # a top-level package named build: code
            "build/steps.py": "",
            "data/train.jsonl": "{}",  # top-level data, not a package: left out
            "tmp/scratch.py": "",
        },
    )
    names = _names(ws)
    assert {
        "functions/reward/data/__init__.py",
        "functions/reward/data/loader.py",
        "functions/tests/helpers.py",
        "build/__init__.py",
        "build/steps.py",
    } <= names
    assert not any(n.startswith(("data/", "tmp/")) for n in names)


def test_symbolic_links_inside_ship_as_content_and_outside_are_refused(ws, tmp_path):
    _write(ws, {"shared/common.py": "Z = 3\n"})
    (ws / "functions" / "common").symlink_to(ws / "shared", target_is_directory=True)
    (ws / "functions" / "alias.py").symlink_to(ws / "functions" / "fn.py")
    names = _names(ws)
    assert {"functions/common/common.py", "functions/alias.py", "shared/common.py"} <= names

    outside = _write(tmp_path / "elsewhere", {"secret.txt": "s3cr3t", "lib/mod.py": ""})
    (ws / "functions" / "leak.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(packaging.PackagingError, match=r"functions/leak.txt is a symbolic link"):
        _names(ws)
    (ws / "functions" / "leak.txt").unlink()
    (ws / "vendored").symlink_to(outside / "lib", target_is_directory=True)
    with pytest.raises(packaging.PackagingError, match=r"vendored is a symbolic link to .*outside"):
        _names(ws)
    (ws / "vendored").unlink()
    (ws / "functions" / "loop").symlink_to(ws / "functions", target_is_directory=True)
    with pytest.raises(packaging.PackagingError, match="a loop"):
        _names(ws)


SECRETS = (
    ".env",
    ".env.production",
    "functions/.netrc",
    ".npmrc",
    ".pypirc",
    "keys/id_rsa",
    "keys/id_ed25519.pub",
    "credentials.json",
    "certs/server.pem",
)
CACHES = (".cache/pip/x", ".hypothesis/db", ".coverage", ".conda/pkgs/x", ".git/config")


def test_credential_files_are_left_out_with_their_names_unless_included(ws, monkeypatch):
    _write(ws, dict.fromkeys(SECRETS + CACHES, "secret") | {"functions/id_map.py": ""})
    names = _names(ws)
    assert not set(SECRETS) & names
    assert not any(n.startswith(c.split("/")[0]) for c in CACHES for n in names)
    assert "functions/id_map.py" in names  # a module, not a key
    package = packaging.build_package(ws, "reward", "functions.fn", "Fn", "", server="sdk")
    assert package.left_out_secrets == tuple(sorted(SECRETS))

    monkeypatch.setenv("FC_ZIP_INCLUDE", "certs/server.pem")
    assert "certs/server.pem" in _names(ws)


def test_fc_zip_exclude_patterns_only_adds(ws, monkeypatch):
    _write(ws, {"functions/table.csv": "a,b", ".git/config": "x", ".env": "KEY=1"})
    monkeypatch.setenv("FC_ZIP_EXCLUDE_PATTERNS", "*.csv")
    names = _names(ws)
    assert "functions/table.csv" not in names
    assert ".git/config" not in names and ".env" not in names


def test_an_oversized_workspace_is_refused_before_anything_is_compressed(ws, monkeypatch):
    with open(ws / "functions" / "weights.bin", "wb") as big:
        big.truncate(300 * 1024 * 1024)  # sparse: no disk used, 300 MB to read

    def no_zip(*args: object, **kwargs: object) -> None:
        raise AssertionError("compressed before the size was checked")

    monkeypatch.setattr(packaging.zipfile, "ZipFile", no_zip)
    with pytest.raises(packaging.PackagingError, match=r"files add up to 314.6 MB, over .* 209.7"):
        _names(ws)


def test_a_bad_workers_count_is_one_clear_error(ws, monkeypatch):
    monkeypatch.setenv("FC_WORKERS_COUNT", "abc")
    with pytest.raises(packaging.PackagingError, match="FC_WORKERS_COUNT must be a positive"):
        _names(ws)
    assert os.environ["FC_WORKERS_COUNT"] == "abc"
