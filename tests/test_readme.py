"""The README, checked against behaviour: its code blocks run as written.

- Python blocks: no undefined names (ruff's F821), and each runs as a script from a copy of
  ``sample_functions/`` (so a processor block is imported, its decorators applied).
- Bash blocks: every ``python -m runtime`` (or ``agentic-rl-runtime``) subcommand and flag
  exists in its ``--help``; files named by ``--input``, ``-d @file`` and ``-r`` exist in the
  working directory the README states (``sample_functions/``); pip extras exist.
- The walk-through: ``invoke`` lines run, and ``curl`` lines are sent to a real
  ``python -m runtime serve`` of the last processor the README served (and, for the rollout,
  the LLM stand-in started from its command line); where the README shows the answer
  (a ``# {...}`` line, ``...`` standing for anything), the answer must match it.
- ``job run`` runs against the platform stand-in started from its command line, when its
  block exports ``DASHSCOPE_HTTP_BASE_URL`` (a block without is for the real platform: only
  its flags are checked). What it prints must match the ``text`` block right after its
  block, apart from numbers and hex ids (sizes, times, ids).

A block may be left out with an HTML comment just before it, with a reason:
``<!-- readme-test: skip (needs a GPU endpoint) -->``; only its imports are run then.
``<!-- readme-test: save as NAME -->`` saves a Python block under NAME in the workspace
copy, for the commands after it that use it.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, SAMPLES, TESTS, Server, free_port
from markdown_it import MarkdownIt

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib  # type: ignore[no-redef]

from runtime.cli import _parser
from runtime.config import OPTIONS

README = ROOT / "README.md"
_MARKER = re.compile(r"<!--\s*readme-test:\s*(skip|save as)\s*(.*?)\s*-->", re.S)


@dataclass
class Block:
    lang: str
    text: str
    line: int  # 1-based line of the opening fence
    skip: str | None = None  # the reason given
    save_as: str | None = None
    output: str | None = None  # a ``text`` block right after: what the last command prints

    @property
    def id(self) -> str:
        return f"{self.lang}-line{self.line}"


def readme_blocks() -> list[Block]:
    blocks: list[Block] = []
    marker: tuple[str, str] | None = None
    for token in MarkdownIt().parse(README.read_text()):
        if token.type == "html_block" and (found := _MARKER.search(token.content)):
            marker = (found.group(1), found.group(2))
            continue
        if token.type != "fence":
            if token.type.endswith("_open") or token.type == "inline":
                marker = None  # a marker applies to the block right after it
            continue
        block = Block(token.info.strip().split(" ")[0], token.content, token.map[0] + 1)
        if block.lang == "text" and blocks and blocks[-1].lang == "bash":
            blocks[-1].output = block.text
        if marker is not None:
            kind, value = marker
            if kind == "skip":
                reason = value.strip("() ")
                assert reason, f"README line {block.line}: a skip marker needs a reason"
                block.skip = reason
            else:
                block.save_as = value
        marker = None
        blocks.append(block)
    return blocks


BLOCKS = readme_blocks()
PYTHON = [b for b in BLOCKS if b.lang == "python"]
BASH = [b for b in BLOCKS if b.lang == "bash"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the sample workspace, with the README's saved blocks in it."""
    path = tmp_path_factory.mktemp("readme") / "sample_functions"
    shutil.copytree(SAMPLES, path, ignore=shutil.ignore_patterns("__pycache__"))
    for block in PYTHON:
        if block.save_as:
            (path / block.save_as).write_text(block.text)
    return path


# ---------------------------------------------------------------- Python blocks


def _imports_only(source: str) -> str:
    tree = ast.parse(source)
    return "\n".join(
        ast.get_source_segment(source, node) or ""
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
    )


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_block_runs_as_written(block: Block, workspace: Path, tmp_path: Path) -> None:
    source = _imports_only(block.text) if block.skip else block.text
    if not block.skip:
        lint = subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "F821,F401",
             "--output-format", "concise", "--stdin-filename", "block.py", "-"],
            input=source, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert lint.returncode == 0, f"README line {block.line}:\n{lint.stdout}"
    script = tmp_path / "readme_block.py"
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=workspace,
        env={**os.environ, "PYTHONPATH": f"{workspace}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"README line {block.line}:\n{done.stderr[-3000:]}"


# ---------------------------------------------------------------- bash blocks


def commands(block: Block) -> Iterator[tuple[list[str], str | None]]:
    """Each simple command of a block as its words (leading VAR=value dropped), with the
    expected answer shown on the ``# {...}`` line right after it, if any; the block's last
    command without one has the block's ``output``."""
    lines = block.text.replace("\\\n", " ").splitlines()
    command_lines = [i for i, line in enumerate(lines) if line.strip() and line.lstrip()[0] != "#"]
    for i in command_lines:
        line = lines[i]
        following = lines[i + 1].strip() if i + 1 < len(lines) else ""
        expected = following[1:].strip() if following.startswith("# {") else None
        if i == command_lines[-1] and expected is None:
            expected = block.output
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word and set(word) <= set(";&|<>"):
                while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                    words.pop(0)
                if words:
                    yield words, expected
                words = []
                if word.startswith(">"):
                    words = ["__redirect__"]
            else:
                words.append(word)


def located(block: Block) -> Iterator[tuple[list[str], str | None, Path | None]]:
    """``commands`` with the working directory of each: ``sample_functions/`` (the one the
    README states), or where the block's ``cd`` leads; None after a ``cd`` into a
    placeholder (``cd my_sdk_workspace``)."""
    cwd: Path | None = ROOT if "cd sample_functions" in block.text else SAMPLES
    for words, expected in commands(block):
        if words[0] == "cd":
            cwd = (cwd / words[1]) if cwd is not None else None
            cwd = cwd if cwd is not None and cwd.is_dir() else None
            continue
        yield words, expected, cwd


def runtime_args(words: list[str]) -> list[str] | None:
    """The arguments of a ``python -m runtime`` or ``agentic-rl-runtime`` command."""
    if words[:3] in (["python", "-m", "runtime"], ["python3", "-m", "runtime"]):
        return words[3:]
    if words[0] == "agentic-rl-runtime":
        return words[1:]
    return None


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check_runtime_command(args: list[str]) -> list[str]:
    """What does not exist of a runtime command line: its subcommands, then its flags."""
    parser, path = _parser(), ["python -m runtime"]
    rest = list(args)
    while rest and (found := _subcommands(parser)) and not rest[0].startswith("-"):
        if rest[0] not in found:
            return [f"no subcommand {rest[0]!r} in `{' '.join(path)} --help`"]
        path.append(rest[0])
        parser = found[rest.pop(0)]
    help_text = parser.format_help()
    flags = {word.split("=", 1)[0] for word in rest if word.startswith("--")}
    return [f"`{' '.join(path)} --help` has no {flag}" for flag in sorted(flags)
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text)]  # fmt: skip


EXTRAS = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)


def file_arguments(words: list[str]) -> list[str]:
    """Files a command reads, relative to its working directory."""
    files = []
    for i, word in enumerate(words):
        following = words[i + 1] if i + 1 < len(words) else ""
        if word in ("--input", "-i", "-r", "-c", "--training", "--validation") and following != "-":
            files.append(following)
        elif word in ("-d", "--data", "--data-binary") and following.startswith("@"):
            files.append(following[1:])
    return files


@pytest.mark.parametrize("block", BASH, ids=[b.id for b in BASH])
def test_bash_block_names_what_exists(block: Block) -> None:
    if block.skip:
        pytest.skip(block.skip)
    problems = []
    for words, _, cwd in located(block):
        args = runtime_args(words)
        if args is not None:
            problems += check_runtime_command(args)
        if words[:2] == ["pip", "install"]:
            for word in words:
                if (extras := re.fullmatch(r"\.\[([\w,-]+)\]", word)) is not None:
                    missing = [e for e in extras.group(1).split(",") if e not in EXTRAS]
                    problems += [f"no extra {e!r} in pyproject.toml" for e in missing]
        if cwd is not None and (args is not None or words[0] in ("curl", "pip")):
            missing = [name for name in file_arguments(words) if not (cwd / name).exists()]
            problems += [f"{name!r} is not in {cwd.relative_to(ROOT)}/" for name in missing]
    assert not problems, f"README line {block.line}:\n" + "\n".join(problems)


def test_the_console_script_is_the_cli() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"agentic-rl-runtime": "runtime.cli:main"}
    assert "agentic-rl-runtime" in README.read_text()  # documented
    script = Path(sys.executable).parent / "agentic-rl-runtime"
    if not script.exists():
        pytest.skip(f"the package is not installed in {sys.prefix} (pip install -e .)")
    done = subprocess.run([str(script), "serve", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--concurrency" in done.stdout
    assert done.stdout.startswith("usage: agentic-rl-runtime serve ")


# ---------------------------------------------------------------- the walk-through


def _matches(expected: str, text: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.strip().split("..."))
    return re.fullmatch(pattern, text.strip(), re.S) is not None


def _varying(text: str) -> str:
    """Numbers and hex ids made alike: sizes, times and ids differ from run to run."""
    return re.sub(r"\b[0-9a-f]+\b", "N", text)


def _compact(text: str) -> str:
    try:
        return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        return text


class Walk:
    """The README's commands run in order, in one workspace, as a user would."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.serve: list[str] | None = None  # the serve arguments last shown
        self.server: Server | None = None
        self.server_args: list[str] | None = None
        self.stand_ins: list[subprocess.Popen[bytes]] = []
        self.platform: tuple[str, int] | None = None  # the README's port, the stand-in's
        self.ran: list[str] = []

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for process in self.stand_ins:
            process.send_signal(signal.SIGINT)  # Ctrl-C, as the README says
            process.wait(30)

    def _server(self) -> Server:
        assert self.serve is not None, "a curl line before any serve line"
        if self.server is None or self.server_args != self.serve:
            if self.server is not None:
                self.server.close()
            target, *options = self.serve
            self.server = Server(target, *options, workspace=self.workspace)
            self.server_args = self.serve
            self.server.wait_ready(60)
        return self.server

    def _start(self, words: list[str]) -> tuple[str, int]:
        """A stand-in started from its command line (``python ../tests/NAME --port N``), on
        a free port: N is for a user's machine. Returns N and the port."""
        script = (SAMPLES / words[1]).resolve()  # the workspace is a copy of sample_functions/
        assert script.parent == TESTS, f"{words[1]} is not in tests/"
        port = free_port()
        process = subprocess.Popen([sys.executable, str(script), "--port", str(port)])
        self.stand_ins.append(process)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                return words[words.index("--port") + 1], port
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)

    def _job_run(self, block: Block, args: list[str]) -> str | None:
        """What ``job run`` prints, progress then result, against the stand-in platform; None
        for a block that does not export its URL (the real platform's)."""
        exported = dict(
            word.split("=", 1) for words, _ in commands(block) if words[0] == "export"
            for word in words[1:]
        )  # fmt: skip
        if "DASHSCOPE_HTTP_BASE_URL" not in exported:
            return None
        assert self.platform is not None, f"README line {block.line}: no stand-in platform yet"
        written, port = self.platform
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DASHSCOPE_", "FC_"))}
        env.update({k: v.replace(f":{written}/", f":{port}/") for k, v in exported.items()})
        done = subprocess.run(
            [sys.executable, "-m", "runtime", *args],
            cwd=self.workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"README line {block.line}:\n{done.stderr}"
        return done.stderr + done.stdout

    def run(self, block: Block, words: list[str], expected: str | None) -> None:
        args = runtime_args(words)
        line = shlex.join(words)
        if args is not None and args[:1] == ["serve"] and "--ray" not in args:
            # the test's server binds its own loopback port
            serve = args[1:]
            for flag in ("--port", "--host"):
                while flag in serve:
                    del serve[serve.index(flag) : serve.index(flag) + 2]
            self.serve = serve
            return
        if words[:2] == ["python", "../tests/llm_stub.py"]:
            written, port = self._start(words)
            request = self.workspace / "requests" / "rollout.json"
            request.write_text(request.read_text().replace(f":{written}/", f":{port}/"))
            self.ran.append(line)
            return
        if words[:2] == ["python", "../tests/platform_standin.py"]:
            self.platform = self._start(words)
            self.ran.append(line)
            return
        if args is not None and args[:1] == ["invoke"]:
            done = subprocess.run(
                [sys.executable, "-m", "runtime", *args],
                cwd=self.workspace,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, f"README line {block.line}: {line}\n{done.stderr}"
            output = _compact(done.stdout)
        elif words[0] == "curl":
            server = self._server()
            here = f"127.0.0.1:{server.port}"
            sent = [re.sub(r"(localhost|127\.0\.0\.1):8000\b", here, w) for w in words]
            done = subprocess.run(
                sent, cwd=self.workspace, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0 and done.stdout, f"README line {block.line}: {line}"
            output = done.stdout
        elif args is not None and args[:2] == ["job", "run"]:
            if (printed := self._job_run(block, args)) is None:
                return
            output, expected = _varying(printed), expected and _varying(expected)
        else:
            return
        self.ran.append(line)
        if expected is not None:
            assert _matches(expected, output), (
                f"README line {block.line}: {line}\nshows:  {expected}\nanswer: {output}"
            )


def test_the_walk_through_answers_as_shown(workspace: Path) -> None:
    walk = Walk(workspace)
    try:
        for block in BASH:
            if block.skip:
                continue
            for words, expected, cwd in located(block):
                if cwd is not None:  # not in a placeholder workspace of the reader's
                    walk.run(block, words, expected)
    finally:
        walk.close()
    # what the README promises to a new user was really exercised
    assert sum(line.startswith("curl") for line in walk.ran) >= 5, walk.ran
    assert any("llm_stub" in line for line in walk.ran), walk.ran
    assert any("platform_standin" in line for line in walk.ran), walk.ran
    assert any(" job run " in line for line in walk.ran), walk.ran
    assert any(" invoke " in line for line in walk.ran), walk.ran


# ---------------------------------------------------------------- settings


def _settings_table() -> dict[str, tuple[str, ...]]:
    """The README's settings table: each flag with its environment names, in order."""
    text = README.read_text()
    section = text[text.index("\n## Serving") :]
    section = section[: section.index("\n### ")]
    rows: dict[str, tuple[str, ...]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`--"):
            continue
        flags = re.findall(r"`(--[\w-]+)`", cells[0])
        envs = re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[1])
        assert len(envs) % len(flags) == 0, line
        per = len(envs) // len(flags)
        for i, flag in enumerate(flags):
            rows[flag] = tuple(envs[i * per : (i + 1) * per])
    return rows


def test_readme_settings_table_and_serve_help_list_exactly_the_options() -> None:
    options = {option.flag: option.env for option in OPTIONS}
    assert _settings_table() == options
    serve_help = _subcommands(_parser())["serve"].format_help()
    named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", serve_help)) - {"--help"}
    assert named == set(options)
    for option in OPTIONS:
        for env in option.env:
            assert re.search(rf"\b{env}\b", serve_help), f"serve --help does not name {env}"
