"""The docs' generated tables: the serve options (from ``runtime.config.OPTIONS``) and the
error codes (from ``runtime/errors.py``), each between ``<!-- generated: NAME -->`` and
``<!-- /generated -->`` in its page.

``python tests/docs/doc_tables.py`` rewrites them in place; ``tests/docs/test_docs.py``
fails, showing the expected text, when a page's table differs from what this renders.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from processors_base.rewards import SUB_REWARD_ERROR  # noqa: E402
from runtime.config import OPTIONS, add_options  # noqa: E402

ERRORS = ROOT / "runtime" / "errors.py"

# The HTTP status and the "when" of each code: errors.py names the codes, not this. A code
# added there without a line here fails the docs test, naming it.
WHEN: dict[str, tuple[str, str]] = {
    "INVALID_JSON": ("400", "body empty, not valid JSON (`NaN` included), or not valid UTF-8"),
    "NOT_AN_OBJECT": ("400", "body is JSON but not an object"),
    "BAD_REQUEST": (
        "400",
        "not valid HTTP/1.1: a bad or repeated `Content-Length`, both `Content-Length` and "
        "`Transfer-Encoding` (request smuggling), a bad request line; or an `Upgrade` request "
        "with a body (`curl --http2` on `http://` asks for h2c, and what follows its headers "
        "would belong to HTTP/2: use `--http1.1`); the connection is closed",
    ),
    "NOT_FOUND": ("404", "no such endpoint"),
    "METHOD_NOT_ALLOWED": ("405", "e.g. `GET /api/v1` (with `Allow: POST`)"),
    "REQUEST_TIMEOUT": (
        "408",
        "headers, or then the body, not received within `--body-timeout`; the connection is closed",
    ),
    "BODY_TOO_LARGE": (
        "413",
        "body over `--max-body`; decided from `Content-Length` before reading, or while reading "
        "a chunked body; or an OpenRLHF batch of more than `--trainer-max-samples` samples "
        "(decided before any sample is built); or a body that would parse into more than "
        "`--max-buffered` (decided before parsing it)",
    ),
    "INVALID_INPUT": ("422", "body does not fit the function's input model"),
    "FUNC_TYPE_MISMATCH": (
        "422",
        "`func_type` in the body is not the served type (the message names both; a sent value "
        "that is not a short plain word is named by its JSON kind, never echoed)",
    ),
    "HEADERS_TOO_LARGE": (
        "431",
        "more than 100 headers, or more than 64 KiB of request line and headers; the "
        "connection is closed",
    ),
    "PROCESSOR_ERROR": (
        "500",
        "`process()` raised, `SystemExit` and `KeyboardInterrupt` included (they stop "
        "nothing); the message is the exception's, with the request's api_key blanked out",
    ),
    "INVALID_OUTPUT": (
        "500",
        "`process()` returned something that is not its output model (nor a dict of its "
        "shape), or a NaN or infinite score or metric (the message names the field)",
    ),
    "INTERNAL_ERROR": (
        "500",
        "a bug in the runtime (logged with its traceback; the body never has one)",
    ),
    "OVERLOADED": (
        "503",
        "all `--concurrency` slots and the `--queue` are taken (decided before the body is "
        "read); or the bodies held, and what they parse into, reach `--max-buffered`; or "
        "`--max-connections` are open (answered as the connection opens, then closed); "
        "`Retry-After: 1`",
    ),
    "NOT_READY": ("503", "`setup()` has not finished; `Retry-After: 1`"),
    "DRAINING": ("503", "the server is shutting down; `Retry-After: 1`"),
    "UNHEALTHY": (
        "503",
        "every `--threads` thread is held by a stuck call (running on after its request "
        "ended): answered at once instead of waiting out `--timeout`, as `/health` says (with "
        "`--workers`, the worker is replaced); `Retry-After: 1`",
    ),
    "SETUP_FAILED": (
        "(exit 3)",
        "`setup()` or the processor's constructor failed: `serve` stops with exit code 3 "
        "(`invoke` too), saying why; never an HTTP answer",
    ),
    "DEADLINE_EXCEEDED": (
        "504",
        "the request passed `--timeout`; its async work is cancelled",
    ),
    "CLIENT_DISCONNECTED": (
        "(499)",
        "the client went away; processing is cancelled and logged, nothing is sent",
    ),
    SUB_REWARD_ERROR: (
        "200",
        "in an output, not an error body: a sub-reward failed under `--sub-reward-errors fail` "
        "(or every one under `renormalize`); `status` is `failed`, the error names each",
    ),
}


def error_codes() -> list[str]:
    """The codes ``runtime/errors.py`` defines, in its order (``NAME = "NAME"``)."""
    codes = []
    for node in ast.parse(ERRORS.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if names and names[0].isupper() and node.value.value == names[0]:
                codes.append(names[0])
    return codes


def error_table() -> str:
    codes = [*error_codes(), SUB_REWARD_ERROR]
    missing = [code for code in codes if code not in WHEN]
    assert not missing, f"no status and description in tests/docs/doc_tables.py for {missing}"
    stale = sorted(set(WHEN) - set(codes))
    assert not stale, f"tests/docs/doc_tables.py describes codes errors.py lacks: {stale}"
    rows = ["| status | error_code | when |", "|---|---|---|"]
    rows += [f"| {WHEN[code][0]} | `{code}` | {WHEN[code][1]} |" for code in codes]
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def options_table() -> str:
    """TARGET, then each option: its flag, environment names, default and help, as
    ``python -m runtime serve --help`` shows them."""
    parser = argparse.ArgumentParser()
    add_options(parser)
    rows = [
        "| option | environment | default | what it does |",
        "|---|---|---|---|",
        "| `TARGET` | `PROCESSOR_CLASS` | (required) | the processor class: "
        "`package.module:Class`, `package.module.Class` or `path/to/file.py:Class` |",
    ]
    helps = {action.dest: action.help or "" for action in parser._actions}
    for option in OPTIONS:
        found = re.fullmatch(r"(.*) \[env .*; default (.*)\]", helps[option.dest], re.S)
        assert found is not None, f"{option.flag}: its help has no [env ...; default ...]"
        default = found.group(2)
        if default not in ("", "from the class"):
            default = f"`{_cell(default)}`"
        envs = ", then ".join(f"`{env}`" for env in option.env)
        shown = default or "(none)"
        rows.append(f"| `{option.flag}` | {envs} | {shown} | {_cell(option.help)} |")
    return "\n".join(rows)


TABLES: dict[str, tuple[Path, Callable[[], str]]] = {
    "options": (ROOT / "docs" / "serving.md", options_table),
    "error-codes": (ROOT / "docs" / "serving.md", error_table),
}


def _region(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated: {name} -->\n)(.*?)(<!-- /generated -->)", re.S)


def current(name: str) -> str | None:
    """The table as the page holds it now; None when the page has no such region."""
    page, _ = TABLES[name]
    found = _region(name).search(page.read_text())
    return None if found is None else found.group(2).rstrip("\n")


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\")  # a replacement template reads backslashes


def regenerate() -> list[str]:
    """Rewrite every table in place; the names of those that changed."""
    changed = []
    for name, (page, render) in TABLES.items():
        text = page.read_text()
        new, count = _region(name).subn(rf"\g<1>{_escaped(render())}\n\g<3>", text)
        assert count == 1, f"{page.name}: {count} regions <!-- generated: {name} -->"
        if new != text:
            page.write_text(new)
            changed.append(name)
    return changed


if __name__ == "__main__":
    print("regenerated:", ", ".join(regenerate()) or "nothing (all up to date)")
