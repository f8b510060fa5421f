"""The README, the pages of docs/ and CONTRIBUTING.md, checked against behaviour: every code
block is run or checked, and a block of a kind no check knows fails.

- Python blocks: no undefined names or unused imports (ruff's F821, F401), and each runs as
  a script from a copy of ``sample_functions/`` (so a processor block is imported, its
  decorators applied); one importing ``dashscope`` runs under ``python -m runtime.compat``.
- Bash blocks: every command is one a check knows (an unknown one fails, naming it). Every
  ``python -m runtime`` (or ``agentic-rl-runtime``) subcommand and flag exists in its
  ``--help``; files named by ``--input``, ``-c``, ``-d @file``, ``-r`` exist in the working
  directory the page states (``sample_functions/``, or the root for a block that does
  ``cd sample_functions``, and for CONTRIBUTING.md); scripts run with ``python`` exist; pip
  extras exist; tools (``ruff``, ``mypy``, ``lint-imports``) are installed; a trainer's
  config overrides name a function the page saved.
- The walk-through, page by page: ``invoke`` and ``eval`` lines run, and ``curl`` lines are
  sent to a real ``python -m runtime serve`` of the last processor the page served (the LLM
  stand-in started from its command line where the page starts it); where the page shows
  the answer (a ``# {...}`` line, ``...`` standing for anything, or a ``text`` block right
  after the block), the answer must match it.
- ``job run`` runs against the platform stand-in started from its command line, when its
  block exports ``DASHSCOPE_HTTP_BASE_URL`` (a block without is for the real platform: only
  its flags and files are checked). What it prints must match the ``text`` block right
  after its block, apart from numbers and hex ids (sizes, times, ids).
- ``text`` blocks: each is compared with what the walk printed (above); one that no command
  printed fails. ``yaml`` blocks parse, and a job file's functions validate against the job
  file's model and name classes that exist. ``json`` blocks parse (``…`` placeholders of
  docs/platform-api.md read as empty).
- The generated tables (options, error codes: ``doc_tables.py``) are current, the layout in
  docs/architecture.md names every module, and every relative link and anchor resolves.

A Python block may be left out with an HTML comment just before it, with a reason:
``<!-- docs-test: skip (needs a GPU endpoint) -->``; only its imports are run then. A bash
block may be skipped the same way: its flags and files are still checked, only its walk is
not. ``<!-- docs-test: save as NAME -->`` saves a Python block under NAME in the workspace
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

import doc_tables
import httpx
import pytest
import yaml
from conftest import ROOT, SAMPLES, TESTS, Server, free_port
from markdown_it import MarkdownIt

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib  # type: ignore[no-redef]

from runtime.cli import _parser
from runtime.config import OPTIONS
from runtime.platform.config import FunctionSpec

README = ROOT / "README.md"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md")), CONTRIBUTING]
_MARKER = re.compile(r"<!--\s*docs-test:\s*(skip|save as)\s*(.*?)\s*-->", re.S)


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@dataclass
class Block:
    page: Path
    lang: str
    text: str
    line: int  # 1-based line of the opening fence
    skip: str | None = None  # the reason given
    save_as: str | None = None
    output: Block | None = None  # a ``text`` block right after: what the last command prints

    @property
    def id(self) -> str:
        return f"{name(self.page)}:{self.line}:{self.lang or 'plain'}"

    @property
    def where(self) -> str:
        return f"{name(self.page)} line {self.line}"


def page_blocks(page: Path) -> list[Block]:
    blocks: list[Block] = []
    marker: tuple[str, str] | None = None
    for token in MarkdownIt().parse(page.read_text()):
        if token.type == "html_block" and (found := _MARKER.search(token.content)):
            marker = (found.group(1), found.group(2))
            continue
        if token.type != "fence":
            if token.type.endswith("_open") or token.type == "inline":
                marker = None  # a marker applies to the block right after it
            continue
        assert token.map is not None
        block = Block(page, token.info.strip().split(" ")[0], token.content, token.map[0] + 1)
        if block.lang == "text" and blocks and blocks[-1].lang == "bash":
            blocks[-1].output = block
        if marker is not None:
            kind, value = marker
            if kind == "skip":
                reason = value.strip("() ")
                assert reason, f"{block.where}: a skip marker needs a reason"
                block.skip = reason
            else:
                block.save_as = value
        marker = None
        blocks.append(block)
    return blocks


BLOCKS = [block for page in PAGES for block in page_blocks(page)]
PYTHON = [b for b in BLOCKS if b.lang == "python"]
BASH = [b for b in BLOCKS if b.lang == "bash"]
CHECKED_LANGUAGES = {"python", "bash", "text", "yaml", "json"}


def test_every_block_is_of_a_kind_a_check_knows() -> None:
    unknown = [f"{b.where}: ```{b.lang}" for b in BLOCKS if b.lang not in CHECKED_LANGUAGES]
    assert not unknown, "blocks no test checks (give them a language below):\n" + "\n".join(unknown)
    saved = [b.save_as for b in PYTHON if b.save_as]
    assert len(saved) == len(set(saved)), f"two blocks saved under one name: {saved}"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the sample workspace, with the pages' saved blocks in it."""
    path = tmp_path_factory.mktemp("docs") / "sample_functions"
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


# A block that talks to the platform (the Python API, an SDK Tuning script) runs against
# the stand-in, its key and URL where the platform's would be (DASHSCOPE_*).
_TALKS_TO_PLATFORM = re.compile(r"\b(?:Async)?PlatformClient\(|\bAgenticRL\(")


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_block_runs_as_written(
    block: Block, workspace: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    source = _imports_only(block.text) if block.skip else block.text
    env = {**os.environ, "PYTHONPATH": f"{workspace}{os.pathsep}{ROOT}"}
    env = {k: v for k, v in env.items() if not k.startswith(("DASHSCOPE_", "FC_"))}
    if not block.skip and _TALKS_TO_PLATFORM.search(source):
        platform = request.getfixturevalue("platform")
        env.update(DASHSCOPE_API_KEY=platform.api_key, DASHSCOPE_HTTP_BASE_URL=platform.base_url)
    if not block.skip:
        lint = subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "F821,F401",
             "--output-format", "concise", "--stdin-filename", "block.py", "-"],
            input=source, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert lint.returncode == 0, f"{block.where}:\n{lint.stdout}"
    script = tmp_path / "doc_block.py"
    script.write_text(source)
    # a block written for the DashScope SDK runs as its page says: under runtime.compat
    runner = ["-m", "runtime.compat"] if re.search(r"^from dashscope\b", source, re.M) else []
    done = subprocess.run(
        [sys.executable, *runner, str(script)],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"{block.where}:\n{done.stderr[-3000:]}"


# ---------------------------------------------------------------- other blocks


def _json_placeholders(text: str) -> str:
    """docs/platform-api.md's elisions made JSON: ``[…]``, ``{…}`` and ``[Job, …]`` empty."""
    text = re.sub(r"\[(?:\s*[A-Z]\w*\s*,)?\s*…\s*\]", "[]", text)
    return re.sub(r"\{\s*…\s*\}", "{}", text)


JSON = [b for b in BLOCKS if b.lang == "json"]
YAML = [b for b in BLOCKS if b.lang == "yaml"]


@pytest.mark.parametrize("block", JSON, ids=[b.id for b in JSON])
def test_json_block_parses(block: Block) -> None:
    try:
        json.loads(_json_placeholders(block.text))
    except ValueError as exc:
        pytest.fail(f"{block.where}: not JSON: {exc}")


def _class_exists(target: str, workspace: Path) -> bool:
    """``pkg.module:Class`` (or ``pkg.module.Class``) defined in ``workspace``'s source."""
    module, _, cls = target.replace(":", ".").rpartition(".")
    path = workspace / (module.replace(".", "/") + ".py")
    if not path.is_file():
        return False
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.ClassDef) and node.name == cls for node in tree.body)


@pytest.mark.parametrize("block", YAML, ids=[b.id for b in YAML])
def test_yaml_block_is_a_valid_job_file_piece(block: Block) -> None:
    data = yaml.safe_load(block.text)
    functions = data if isinstance(data, list) else data.get("functions", [])
    assert functions, f"{block.where}: no job file functions in it: add a check for it"
    for item in functions:
        spec = FunctionSpec.model_validate(item)
        assert _class_exists(spec.fcmodel.classpath, SAMPLES), (
            f"{block.where}: {spec.fcmodel.classpath} is not in sample_functions/"
        )


# ---------------------------------------------------------------- bash blocks


def commands(block: Block) -> Iterator[tuple[list[str], str | None]]:
    """Each simple command of a block as its words (leading VAR=value dropped; a redirect as
    ``__redirect__ FILE``), with the expected answer shown on the ``# {...}`` line right
    after it, if any; the block's last command without one has the block's ``output``."""
    lines = block.text.replace("\\\n", " ").splitlines()
    command_lines = [i for i, line in enumerate(lines) if line.strip() and line.lstrip()[0] != "#"]
    for i in command_lines:
        line = lines[i]
        following = lines[i + 1].strip() if i + 1 < len(lines) else ""
        expected = following[1:].strip() if following.startswith("# {") else None
        if i == command_lines[-1] and expected is None and block.output is not None:
            expected = block.output.text
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


def _default_cwd(block: Block) -> Path:
    if block.page == CONTRIBUTING or "cd sample_functions" in block.text:
        return ROOT
    return SAMPLES


def located(block: Block) -> Iterator[tuple[list[str], str | None, Path | None]]:
    """``commands`` with the working directory of each: ``sample_functions/`` (the one the
    pages state), the root (CONTRIBUTING.md), or where the block's ``cd`` leads; None after
    a ``cd`` into a placeholder (``cd my_sdk_workspace``)."""
    cwd: Path | None = _default_cwd(block)
    for words, expected in commands(block):
        if words[0] == "cd":
            cwd = (cwd / words[1]) if cwd is not None else None
            cwd = cwd if cwd is not None and cwd.is_dir() else None
            continue
        yield words, expected, cwd


def _python(word: str) -> bool:
    return re.fullmatch(r"(.*/)?python3?", word) is not None


def runtime_args(words: list[str]) -> list[str] | None:
    """The arguments of a ``python -m runtime`` or ``agentic-rl-runtime`` command."""
    if _python(words[0]) and words[1:3] == ["-m", "runtime"]:
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


PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
TOOLS = ("ruff", "mypy", "lint-imports")


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


def _overrides(words: list[str]) -> dict[str, str] | None:
    """A trainer's config overrides (``key.sub=value`` words, hydra's), or None."""
    pairs = [re.fullmatch(r"\+?([a-z_][\w.]*\.[\w.]+)=(.*)", word) for word in words]
    if not all(pairs):
        return None
    return {m.group(1): m.group(2) for m in pairs if m is not None}


@dataclass
class Written:
    """What a block's earlier commands made: files (``> FILE``) and images, by the
    workspace each was built from (None: a placeholder of the reader's)."""

    files: set[str]
    images: dict[str, Path | None]


def _docker(words: list[str], cwd: Path | None, made: Written) -> list[str]:
    """``docker build`` builds the Dockerfile (its default workspace, the sample's);
    ``docker run IMAGE [TARGET]`` or ``-e PROCESSOR_CLASS=TARGET`` names a class of the
    workspace IMAGE was built from."""
    if words[1] == "build":
        tag = words[words.index("-t") + 1] if "-t" in words else ""
        made.images[tag] = SAMPLES
        return [] if (ROOT / "Dockerfile").is_file() else ["no Dockerfile"]
    if words[1] in ("stop", "push"):
        return []
    if words[1] != "run":
        return [f"no check for `docker {words[1]}`"]
    rest, image, targets = words[2:], None, []
    while rest:
        word = rest.pop(0)
        if word in ("-p", "-e", "--stop-timeout", "--name"):
            value = rest.pop(0)
            if value.startswith("PROCESSOR_CLASS="):
                targets.append(value.split("=", 1)[1])
        elif image is None and not word.startswith("-"):
            image = word
        elif image is not None:
            targets.append(word)
    if image not in made.images:
        return [f"docker run {image}: no image of that name built above"]
    workspace = made.images[image]
    return [f"no class {t} in the image's workspace" for t in targets
            if workspace is not None and not _class_exists(t, workspace)]  # fmt: skip


def check_command(words: list[str], cwd: Path | None, made: Written) -> list[str]:
    """What a command names that does not exist; a command no check knows is a problem."""
    problems: list[str] = []
    while words[0] == "timeout" or re.fullmatch(r"\d+", words[0]):
        words = words[1:]  # `timeout 900 CMD`: CMD is checked
    if (args := runtime_args(words)) is not None:
        problems += check_runtime_command(args)
        if args[:1] == ["build"] and "--image" in args:
            workspace = cwd / args[1] if cwd is not None else None
            made.images[args[args.index("--image") + 1]] = (
                workspace if workspace is not None and workspace.is_dir() else None
            )
    elif words[0] == "pip" and words[1:2] == ["install"]:
        for word in words:
            if (extras := re.fullmatch(r"\.\[([\w,-]+)\]", word)) is not None:
                missing = [e for e in extras.group(1).split(",") if e not in EXTRAS]
                problems += [f"no extra {e!r} in pyproject.toml" for e in missing]
    elif _python(words[0]) and words[1:3] in (["-m", "venv"], ["-m", "pytest"]):
        if words[2] == "pytest" and cwd is not None:
            given = [
                w for i, w in enumerate(words[3:], 3) if words[i - 1] not in ("-k", "-m", "-p")
            ]
            paths = [w.split("::")[0] for w in given if not w.startswith("-")]
            problems += [f"no {p!r} in {cwd}" for p in paths if not (cwd / p).exists()]
    elif _python(words[0]) and len(words) > 1 and words[1].endswith(".py"):
        if cwd is not None and not (cwd / words[1]).is_file():
            problems.append(f"no script {words[1]!r} in {cwd}")
    elif words[0] in TOOLS:
        if shutil.which(words[0], path=str(Path(sys.executable).parent)) is None:
            problems.append(f"{words[0]} is not installed in {sys.prefix}")
    elif words[0] == "docker":
        problems += _docker(words, cwd, made)
    elif words[0] == "kubectl":
        if not (words[1:3] == ["apply", "-f"] and words[3] in made.files):
            problems.append("kubectl applies only what the block wrote")
    elif words[0] == "__redirect__":
        made.files.add(words[1])
    elif words[0] in ("curl", "export", "."):
        pass  # curl: sent by the walk; export: read by the walk; `.`: activates the venv
    elif (overrides := _overrides(words)) is not None:
        problems += _check_overrides(overrides)
    else:
        problems.append(f"no check for `{shlex.join(words)}`: add one to tests/docs/test_docs.py")
    if cwd is not None and (args is not None or words[0] in ("curl", "pip")):
        missing = [f for f in file_arguments(words) if not (cwd / f).exists()]
        problems += [f"{f!r} is not in {cwd}" for f in missing]
    return problems


def _check_overrides(overrides: dict[str, str]) -> list[str]:
    """verl's ``custom_reward_function.path``/``.name``: a file a page saved, defining it."""
    saved = {b.save_as: b.text for b in PYTHON if b.save_as}
    path = overrides.get("custom_reward_function.path")
    if path not in saved:
        return [f"custom_reward_function.path={path}: no page saves it"]
    fn = overrides.get("custom_reward_function.name", "compute_score")
    tree = ast.parse(saved[path])
    defined = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
               if isinstance(t, ast.Name)} | {n.name for n in tree.body
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}  # fmt: skip
    return [] if fn in defined else [f"{path} defines no {fn}"]


@pytest.mark.parametrize("block", BASH, ids=[b.id for b in BASH])
def test_bash_block_names_what_exists(block: Block) -> None:
    problems: list[str] = []
    made = Written(set(), {})
    for words, _, cwd in located(block):
        problems += check_command(words, cwd, made)
    assert not problems, f"{block.where}:\n" + "\n".join(problems)


def test_the_command_checks_fail_on_what_does_not_exist() -> None:
    """The checks above, each shown a command naming what is not there."""
    for words, cwd in [
        ("python -m runtime serve --nope", SAMPLES),
        ("python -m runtime nope", SAMPLES),
        ("curl -d @requests/nope.json x", SAMPLES),
        ("pip install -e .[nope]", ROOT),
        ("python benchmarks/nope.py", ROOT),
        ("kubectl apply -f x.yaml", SAMPLES),
        ("docker run rl-fn", SAMPLES),
        ("make all", SAMPLES),
        ("a.path=nope.py a.name=f", SAMPLES),
    ]:
        assert check_command(words.split(), cwd, Written(set(), {})), words
    built = Written(set(), {"rl-fn": SAMPLES})
    assert check_command(["docker", "run", "rl-fn", "functions.reward.nope:X"], SAMPLES, built)
    assert not check_command(["docker", "run", "rl-fn", "functions.reward.safety:SafetyProcessor"],
                             SAMPLES, built)  # fmt: skip


def test_the_console_script_is_the_cli() -> None:
    scripts = PYPROJECT["project"]["scripts"]
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


def _eval_lines(text: str) -> list[str]:
    """eval's output as compared: numbers alike, runs of spaces and rules one space, and
    without the progress bars, which a terminal shows and a pipe does not."""
    lines = []
    for line in re.sub(r"\d+(?:\.\d+)?", "N", _varying(text)).splitlines():
        line = re.sub(r"[─━]+", "-", line)
        line = re.sub(r"\s+", " ", line).strip()
        if line and not re.search(r"N/N N failed", line):
            lines.append(line)
    return lines


def _compact(text: str) -> str:
    try:
        return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        return text


class Walk:
    """A page's commands run in order, in one workspace, as a user would."""

    def __init__(self, workspace: Path, tmp: Path) -> None:
        self.workspace = workspace
        self.tmp = tmp
        self.serve: list[str] | None = None  # the serve arguments last shown
        self.server: Server | None = None
        self.server_args: list[str] | None = None
        self.stand_ins: list[subprocess.Popen[bytes]] = []
        self.llm: tuple[str, int] | None = None  # the page's port, the stand-in's
        self.platform: tuple[str, int] | None = None
        self.ran: list[str] = []
        self.compared: set[int] = set()  # lines of the text blocks compared
        self.outs: dict[str, str] = {}  # eval's --out as shown -> where it went

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for process in self.stand_ins:
            process.send_signal(signal.SIGINT)  # Ctrl-C, as the pages say
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
        assert self.platform is not None, f"{block.where}: no stand-in platform yet"
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
        assert done.returncode == 0, f"{block.where}:\n{done.stderr}"
        return done.stderr + done.stdout

    def _eval(self, block: Block, args: list[str]) -> str:
        """What ``eval`` prints, against the LLM stand-in the page started, into a fresh
        ``--out`` (the page's is on a user's machine)."""
        assert self.llm is not None, f"{block.where}: eval before the LLM stand-in started"
        written, port = self.llm
        args = [a.replace(f":{written}/", f":{port}/") for a in args]
        out = shown = ""
        if "--out" in args:
            shown, out = args[args.index("--out") + 1], str(self.tmp / f"eval-{block.line}")
            args[args.index("--out") + 1] = out
            self.outs[shown] = out
        if "--compare" in args:  # two runs this page made, in the --out it gave each
            at = args.index("--compare")
            for i in (at + 1, at + 2):
                assert args[i] in self.outs, f"{block.where}: --compare of a run not made"
                args[i] = self.outs[args[i]]
        done = subprocess.run(
            [sys.executable, "-m", "runtime", *args],
            cwd=self.workspace,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # stderr and stdout in their order
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{block.where}:\n{done.stdout[-3000:]}"
        return done.stdout.replace(out, shown) if out else done.stdout

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
            self.llm = written, port = self._start(words)
            sample = (SAMPLES / "requests" / "rollout.json").read_text()  # an earlier page's
            request = self.workspace / "requests" / "rollout.json"  # stand-in is gone
            request.write_text(sample.replace(f":{written}/", f":{port}/"))
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
            assert done.returncode == 0, f"{block.where}: {line}\n{done.stderr}"
            output = _compact(done.stdout)
        elif words[0] == "curl":
            server = self._server()
            here = f"127.0.0.1:{server.port}"
            sent = [re.sub(r"(localhost|127\.0\.0\.1):8000\b", here, w) for w in words]
            done = subprocess.run(
                sent, cwd=self.workspace, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0 and done.stdout, f"{block.where}: {line}"
            output = done.stdout
        elif args is not None and args[:2] == ["job", "run"]:
            if (printed := self._job_run(block, args)) is None:
                return
            output, expected = _varying(printed), expected and _varying(expected)
        elif args is not None and args[:1] == ["eval"]:
            printed = self._eval(block, args)
            self.ran.append(line)
            if expected is not None:
                assert _eval_lines(printed) == _eval_lines(expected), (
                    f"{block.where}: {line}\nshows:\n{expected}\nprinted:\n{printed}"
                )
                self._compared(block)
            return
        else:
            return
        self.ran.append(line)
        if expected is not None:
            assert _matches(expected, output), (
                f"{block.where}: {line}\nshows:  {expected}\nanswer: {output}"
            )
            self._compared(block)

    def _compared(self, block: Block) -> None:
        if block.output is not None:
            self.compared.add(block.output.line)


WALKED = [page for page in PAGES if any(b.page == page and not b.skip for b in BASH)]


@pytest.mark.parametrize("page", WALKED, ids=name)
def test_the_walk_through_answers_as_shown(page: Path, workspace: Path, tmp_path: Path) -> None:
    """A page's commands, run in order as a reader would (a page a test, so that the pages
    run side by side)."""
    walk = Walk(workspace, tmp_path)
    try:
        for block in BASH:
            if block.page != page or block.skip:
                continue
            for words, expected, cwd in located(block):
                if cwd is not None:  # not in a placeholder workspace of the reader's
                    walk.run(block, words, expected)
    finally:
        walk.close()
    # every text block was compared with what its command printed
    texts = {b.line for b in BLOCKS if b.lang == "text" and b.page == page}
    unchecked = sorted(texts - walk.compared)
    assert not unchecked, f"{name(page)}: text blocks that no command printed: {unchecked}"


def test_the_walk_through_covers_what_a_new_user_does() -> None:
    """What the pages promise a new user is among the commands the walk runs."""
    runnable = [
        shlex.join(words)
        for block in BASH
        if not block.skip
        for words, _, cwd in located(block)
        if cwd is not None
    ]
    assert sum(line.startswith("curl") for line in runnable) >= 5, runnable
    for promised in ("llm_stub", "platform_standin", " job run ", " invoke ", " eval "):
        assert any(promised in line for line in runnable), (promised, runnable)
    # a text block shows what a command printed: its page is walked, so it is compared
    unwalked = {name(b.page) for b in BLOCKS if b.lang == "text" and b.page not in WALKED}
    assert not unwalked, f"pages with text blocks and no command run: {sorted(unwalked)}"


# ---------------------------------------------------------------- generated tables


@pytest.mark.parametrize("table", sorted(doc_tables.TABLES))
def test_generated_table_is_current(table: str) -> None:
    page, render = doc_tables.TABLES[table]
    expected = render()
    assert doc_tables.current(table) == expected, (
        f"{name(page)}: the {table} table differs from the code; regenerate it with "
        f"`python tests/docs/doc_tables.py`. Expected:\n{expected}"
    )


def test_serve_help_and_the_why_list_name_only_the_options() -> None:
    options = {option.flag: option.env for option in OPTIONS}
    serve_help = _subcommands(_parser())["serve"].format_help()
    named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", serve_help)) - {"--help"}
    assert named == set(options)
    for option in OPTIONS:
        for env in option.env:
            assert re.search(rf"\b{env}\b", serve_help), f"serve --help does not name {env}"
    text = (DOCS / "serving.md").read_text()
    why = text[text.index("Why these defaults:") :].split("\n\n", 2)[1]
    flags = set(re.findall(r"`(--[\w-]+)`", why))
    assert flags and flags <= set(options), flags - set(options)


# ---------------------------------------------------------------- layout and links


def _bullets(text: str) -> dict[str, str]:
    """The layout's bullets, by the folder they start with (``- `runtime/serving/`: ...``)."""
    found = re.findall(r"^- `([\w/]+/)`: (.*?)(?=^- |^\n|\Z)", text, re.S | re.M)
    return dict(found)


def test_the_layout_names_every_module() -> None:
    text = (DOCS / "architecture.md").read_text()
    bullets = _bullets(text[text.index("## Layout") : text.index("## A request's lifecycle")])
    missing = []
    for package in [ROOT / "processors_base", ROOT / "runtime"]:
        for folder in sorted({p.parent for p in package.rglob("*.py")}):
            key = f"{folder.relative_to(ROOT)}/"
            named = set(re.findall(r"`([\w/.]+)`", bullets.get(key, "")))
            modules = [
                p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")
            ]
            missing += [f"{key}{m}" for m in sorted(modules) if m not in named]
    assert not missing, f"docs/architecture.md's layout does not name: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    tokens = MarkdownIt().parse(page.read_text())
    return {_slug(tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"}


@pytest.mark.parametrize("page", PAGES, ids=[name(p) for p in PAGES])
def test_links_and_anchors_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
            broken.append(target)
    assert not broken, f"{name(page)}: links that lead nowhere: {broken}"


# Paths the pages name that are not in this repository, on purpose.
ELSEWHERE = {"tests/unit/test_agentic_rl_components.py"}  # the DashScope SDK's own tests


@pytest.mark.parametrize("page", PAGES, ids=[name(p) for p in PAGES])
def test_named_paths_exist(page: Path) -> None:
    """Every repository path a page names in code (`runtime/serving/app.py`) exists, or is
    one a page tells the reader to make (a saved block)."""
    saved = {f"sample_functions/{b.save_as}" for b in PYTHON if b.save_as}
    roots = "tests|runtime|processors_base|benchmarks|sample_functions|docs"
    named = set(re.findall(rf"`((?:{roots})/[\w/.-]*)`", page.read_text()))
    missing = sorted(p for p in named - saved - ELSEWHERE if not (ROOT / p).exists())
    assert not missing, f"{name(page)} names paths that do not exist: {missing}"
