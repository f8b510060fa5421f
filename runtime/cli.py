"""``python -m runtime``: serve a function over HTTP, or invoke it once without HTTP."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import anyio
import anyio.to_thread
import orjson

from runtime.config import SettingsError, add_options, resolve
from runtime.function import Function, ProcessorFailure, RequestError
from runtime.loading import Target, TargetError, load_target
from runtime.logs import setup_logging
from runtime.ship import add_ship_arguments

__all__ = ["main"]

_TARGET_HELP = (
    "the processor class: package.module:Class, package.module.Class or path/to/file.py:Class, "
    "imported from the workspace [env PROCESSOR_CLASS]"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m runtime",
        description="Serve the Rollout, Reward and GroupReward functions of agentic RL.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="serve one processor over HTTP (POST /api/v1, GET /health)",
        description="Serve one processor over HTTP: POST /api/v1 takes the function's input "
        "JSON and answers its output JSON; GET /health answers 200 once setup() has finished. "
        "Every option falls back to the environment variable named in its help, then to "
        "its default.",
        epilog="example: cd sample_functions && python -m runtime serve "
        "functions.reward.reward:DemoRewardProcessor",
    )
    serve.add_argument("target", nargs="?", metavar="TARGET", help=_TARGET_HELP)
    add_options(serve)

    invoke = commands.add_parser(
        "invoke",
        help="run one request through a processor without HTTP and print the output JSON",
        description="Run one request through the same validation, setup() and process() as "
        "serve, print the output JSON, and exit non-zero if the request or the processor "
        "fails (2: invalid input, 1: the processor failed or returned status failed).",
        epilog="example: python -m runtime invoke functions.reward.reward:DemoRewardProcessor "
        "--input requests/reward.json",
    )
    invoke.add_argument("target", nargs="?", metavar="TARGET", help=_TARGET_HELP)
    invoke.add_argument(
        "--input",
        "-i",
        required=True,
        metavar="FILE",
        help="request JSON file, or - for standard input",
    )
    add_options(invoke, ("func_type", "workspace", "threads", "log_level"))

    build = commands.add_parser(
        "build",
        help="build a function image from a workspace (docker CLI)",
        description="Build the function image of a workspace: the runtime plus the workspace, "
        "its requirements.txt installed at build time.",
        epilog="example: python -m runtime build sample_functions --image rl-fn",
    )
    build.add_argument("workspace", metavar="WORKSPACE", help="the directory of your functions")
    build.add_argument("--image", required=True, help="tag of the image to build")
    build.add_argument("--target", help="check locally first that this module:Class imports")

    ship = commands.add_parser(
        "ship",
        help="build, push and register a function with the platform",
        description="Check the target locally, build the workspace's image, push it, and "
        "register it with the platform by digest (skipped when the same image and settings "
        "are already registered). --local runs the built image here instead.",
        epilog="example: python -m runtime ship sample_functions --target "
        "functions.reward.reward:DemoRewardProcessor --image 127.0.0.1:5000/demo-reward:v1 "
        "--platform-url https://platform.example",
    )
    add_ship_arguments(ship)
    return parser


def _fail(code: int, message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command in ("build", "ship"):
        from runtime.ship import run_build, run_ship

        if args.command == "build":
            sys.exit(run_build(args.workspace, args.image, args.target))
        sys.exit(run_ship(args))
    try:
        settings = resolve(args)
    except SettingsError as exc:
        _fail(2, f"invalid setting {exc}")
    setup_logging(settings.log_level)
    try:
        target = load_target(settings.target, settings.workspace, settings.func_type)
    except TargetError as exc:
        _fail(2, str(exc))

    if args.command == "serve":
        from runtime.server import serve  # uvicorn is only needed to serve

        startup = logging.getLogger("runtime.startup")
        startup.setLevel(logging.INFO)  # the effective configuration shows at any log level
        startup.info(
            "serving %s (%s): %s", target.spec, target.func_type.value, settings.describe()
        )
        serve(settings)
        return

    try:
        body = sys.stdin.buffer.read() if args.input == "-" else Path(args.input).read_bytes()
    except OSError as exc:
        _fail(2, f"cannot read {args.input}: {exc.strerror}")
    sys.exit(anyio.run(_invoke_once, target, body, settings.threads))


async def _invoke_once(target: Target, body: bytes, threads: int) -> int:
    anyio.to_thread.current_default_thread_limiter().total_tokens = threads
    try:
        function = Function(target)
        await function.setup()
    except ProcessorFailure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    try:
        input_data = function.parse(body)
    except RequestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        output = await function.process(input_data)
        code = 1 if orjson.loads(output).get("status") == "failed" else 0
    except ProcessorFailure as exc:
        output, code = function.failure(exc.code, str(exc)), 1
        print(f"error: {exc}", file=sys.stderr)
    finally:
        await function.shutdown()
    sys.stdout.buffer.write(orjson.dumps(orjson.loads(output), option=orjson.OPT_INDENT_2) + b"\n")
    return code
