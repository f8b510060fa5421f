"""``python -m runtime``: serve a function over HTTP, or invoke it once without HTTP; build
its image; and the platform's commands (register, test, upload data, run and manage jobs),
whose options and output live in ``runtime.platform.cli``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import anyio
import anyio.to_thread
import orjson

from runtime.config import Settings, SettingsError, add_options, resolve
from runtime.deploy.manifests import add_manifests_command, run_manifests
from runtime.eval import cli as eval_cli
from runtime.platform import cli as platform_cli

if TYPE_CHECKING:
    from runtime.execution.function import ProcessorFailure
    from runtime.execution.loading import Target

__all__ = ["main"]

_TARGET_HELP = (
    "the processor class: package.module:Class, package.module.Class or path/to/file.py:Class, "
    "imported from the workspace [env PROCESSOR_CLASS]"
)


def _parser(prog: str = "python -m runtime") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve the Rollout, Reward and GroupReward functions of agentic RL, and "
        "train with them on the platform.",
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
        "fails. Exit codes: 1: the processor failed or returned status failed (its traceback "
        "goes to stderr); 2: invalid input, target or setting; 3: setup() failed.",
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
    add_options(invoke, ("func_type", "workspace", "threads", "log_level", "sub_reward_errors"))

    build = commands.add_parser(
        "build",
        help="build a function image from a workspace (docker CLI)",
        description="Build the function image of a workspace: the runtime plus the workspace, "
        "its requirements.txt installed at build time.",
        epilog="example: python -m runtime build sample_functions --image rl-fn",
    )
    build.add_argument("workspace", metavar="WORKSPACE", help="the directory of your functions")
    build.add_argument("--image", required=True, help="tag of the image to build")
    build.add_argument(
        "--target",
        metavar="TARGET",
        help="the image's default processor (its PROCESSOR_CLASS), checked locally first: "
        "a plain `docker run IMAGE` serves it, `docker run IMAGE other.module:Class` "
        "another (default: the sample's functions.reward.reward:DemoRewardProcessor)",
    )
    build.add_argument("--push", action="store_true", help="push the image and print it by digest")

    # the platform client: register, test-function, upload-data, job ..., instance ...
    platform_cli.add_commands(commands)
    add_manifests_command(commands)
    eval_cli.add_command(commands)
    return parser


def _fail(code: int, message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    # usage lines name the command as it was typed: the console script, or python -m runtime
    script = Path(sys.argv[0]).name == "agentic-rl-runtime"
    args = _parser("agentic-rl-runtime" if script else "python -m runtime").parse_args(argv)
    if args.command == "build":
        from runtime.deploy.images import run_build

        sys.exit(run_build(args.workspace, args.image, args.target, args.push))
    if args.command in platform_cli.COMMANDS:
        sys.exit(platform_cli.run(args))
    if args.command == "manifests":
        sys.exit(run_manifests(args))
    if args.command == eval_cli.COMMAND:
        sys.exit(eval_cli.run(args))
    _run_function(args)


def _run_function(args: argparse.Namespace) -> None:
    """``serve`` or ``invoke``: the user's class loaded, then served or called once. (What
    only these two need is imported here: the platform's commands start faster without.)"""
    from runtime.compat import sdk as sdk_compat
    from runtime.execution.loading import TargetError, load_target
    from runtime.logs import setup_logging

    try:
        settings = resolve(args)
    except SettingsError as exc:
        _fail(2, f"invalid setting {exc}")
    setup_logging(settings.log_level, settings.log_format)
    _check_shadowing(settings.workspace)
    # what runs the class is imported before load_target puts the workspace first on
    # sys.path, where a uvicorn.py or orjson.py of the user's would stand in for ours
    if args.command == "invoke":
        import runtime.execution.function
    elif settings.ray:
        import runtime.deploy.ray_serve
    else:
        import runtime.serving.server
        import runtime.serving.supervisor

        if settings.tracing and settings.workers == 1:  # spawned workers import it themselves
            import runtime.tracing.spans  # noqa: F401 (OpenTelemetry's SDK: only to trace)
    try:
        target = load_target(settings.target, settings.workspace, settings.func_type)
    except TargetError as exc:
        _fail(2, str(exc))
    if settings.sub_reward_errors != "zero" and sdk_compat.runs_the_sdks_reward_processing(
        target.cls
    ):
        _fail(2, sdk_compat.SDK_REWARD_PROCESSING)

    if args.command == "serve":
        startup = logging.getLogger("runtime.startup")
        startup.setLevel(logging.INFO)  # the effective configuration shows at any log level
        startup.info(
            "serving %s (%s): %s", target.spec, target.func_type.value, settings.describe()
        )
        if settings.workers > 1 and str(target.workspace) in sys.path:  # spawned workers
            sys.path.remove(str(target.workspace))  # start on this sys.path: the runtime's first
        _serve(settings)
        return

    try:
        body = sys.stdin.buffer.read() if args.input == "-" else Path(args.input).read_bytes()
    except OSError as exc:
        _fail(2, f"cannot read {args.input}: {exc.strerror}")
    sys.exit(anyio.run(_invoke_once, target, body, settings.threads, settings.sub_reward_errors))


async def _invoke_once(
    target: Target, body: bytes, threads: int, sub_reward_errors: str = "zero"
) -> int:
    from runtime.execution.function import Function, ProcessorFailure, RequestError
    from runtime.logs import bind_secrets

    anyio.to_thread.current_default_thread_limiter().total_tokens = threads
    try:
        function = Function(target, threads=threads, sub_reward_errors=sub_reward_errors)
        await function.setup()
    except ProcessorFailure as exc:
        _print_user_traceback(exc, None)
        print(f"error: {exc}", file=sys.stderr)
        return 3
    try:
        input_data = function.parse(body)
    except RequestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bind_secrets(input_data)
    try:
        output = await function.process(input_data)
        code = 1 if orjson.loads(output).get("status") == "failed" else 0
    except ProcessorFailure as exc:
        output, code = function.failure(exc.code, str(exc)), 1
        _print_user_traceback(exc, input_data)
        print(f"error: {exc}", file=sys.stderr)
    finally:
        await function.shutdown()
    sys.stdout.buffer.write(orjson.dumps(orjson.loads(output), option=orjson.OPT_INDENT_2) + b"\n")
    return code


def _print_user_traceback(failure: ProcessorFailure, input_data: object) -> None:
    """The traceback of the user code that raised (the runtime's frames left out), scrubbed."""
    from runtime.errors import PROCESSOR_ERROR, SETUP_FAILED
    from runtime.execution.function import redact
    from runtime.logs import user_traceback

    if failure.__cause__ is not None and failure.code in (PROCESSOR_ERROR, SETUP_FAILED):
        sys.stderr.write(redact(user_traceback(failure.__cause__), input_data))


def _check_shadowing(workspace: str) -> None:
    """Refuse to run on a ``processors_base`` that is not this runtime's own; warn of the
    workspace's modules that the runtime's packages hide.

    A ``processors_base`` found before the runtime's own (a copy on PYTHONPATH, say) would
    have the server run on models and a registry it was not written with, so it stops.
    A workspace's own module of either name is only hidden from the functions (they get the
    runtime's package: ``python -m runtime`` takes the current directory off ``sys.path``
    first), which may be harmless (a stray file nothing imports), so a warning names it."""
    import processors_base
    import runtime
    from runtime.platform.shadowing import workspace_shadows

    home = Path(runtime.__path__[0]).resolve().parent
    imported = Path(processors_base.__file__ or "").resolve()
    if imported.parent != home / "processors_base":
        _fail(
            2,
            f"processors_base was imported from {imported}, not from this runtime's own "
            f"installation ({home}): a module of that name earlier on sys.path (PYTHONPATH, "
            "say) shadows it; start the agentic-rl-runtime command instead, or rename the "
            "module",
        )
    hidden = workspace_shadows(Path(workspace))
    if hidden:
        logging.getLogger("runtime.startup").warning(
            "the workspace %s has %s, named as the runtime's own packages: the functions "
            "importing that name get the runtime's package, not it (and a runtime.py there "
            "would run in place of `python -m runtime`); rename it",
            Path(workspace).resolve(),
            " and ".join(hidden),
        )


def _serve(settings: Settings) -> None:
    """Serve until SIGTERM/SIGINT in the mode asked: on Ray Serve, one worker in this
    process, or --workers under a supervisor; exits non-zero if setup() fails."""
    if settings.ray:
        from runtime.deploy.ray_serve import serve_on_ray  # Ray is an optional extra

        sys.exit(serve_on_ray(settings))
    from runtime.serving import server  # uvicorn is only needed to serve

    if settings.workers == 1:
        server.run_worker(settings)
        return
    from runtime.serving.supervisor import supervise

    code = supervise(settings, server.bind(settings))
    if code:
        sys.exit(code)
