"""The platform commands of ``python -m runtime``: their options, and their output.

``register``, ``test-function``, ``upload-data``, ``job run|get|list|cancel|delete|logs|wait``
and ``instance logs|delete``. Every command takes ``--api-key`` (env ``DASHSCOPE_API_KEY``;
the key given is the key sent, on every call), ``--base-url`` (env
``DASHSCOPE_HTTP_BASE_URL``) and ``-o table|json|yaml``. Results go to stdout, progress and
errors to stderr; an error is one line and exit 1, a usage error exit 2.

Only argparse is imported here at module level: ``serve`` builds this parser too, and must
not pay for httpx, pydantic models or rich on a cold start.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["COMMANDS", "add_commands", "keep_workspace_off_path", "run"]

COMMANDS = ("register", "test-function", "upload-data", "job", "instance")


# Exit codes: 0 success (a job that SUCCEEDED), 1 an error or a job that ended otherwise,
# 2 a usage error (nothing sent), 3 following a job failed (its state unknown), 124 a
# wait that ran out of time (as timeout(1) does), 130 interrupted.
EXIT_FOLLOW_ERROR = 3
EXIT_WAIT_TIMEOUT = 124


class UsageError(Exception):
    """Exit 2: the command line (or its input) is wrong; nothing was sent."""


def _lower(text: str) -> str:
    return text.strip().lower()


_MAX_PAUSE = 86400.0  # seconds between two status queries: a day


def _seconds(text: str) -> float:
    """A number of seconds above 0 (a time limit)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text!r}")
    return value


def _pause(text: str) -> float:
    """Seconds between two queries: above 0 (0 would ask the platform in a loop) and at
    most a day (time.sleep cannot wait 1e300 s)."""
    value = _seconds(text)
    if value > _MAX_PAUSE:
        raise argparse.ArgumentTypeError(f"must be at most {_MAX_PAUSE:g} s, not {text!r}")
    return value


def _counting(text: str) -> int:
    """A whole number from 1 (a page, a size, a line)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {text!r}")
    return value


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("platform")
    group.add_argument(
        "--api-key",
        help="the platform's API key, sent as a Bearer token on every call, never printed "
        "[env DASHSCOPE_API_KEY]",
    )
    group.add_argument(
        "--base-url",
        help="the platform's API base URL [env DASHSCOPE_HTTP_BASE_URL; default "
        "https://dashscope.aliyuncs.com/api/v1]",
    )
    group.add_argument(
        "--workspace-id",
        help="the platform workspace, sent as X-DashScope-WorkSpace and put in place of a "
        "{workspace_id} in the base URL [env DASHSCOPE_WORKSPACE_ID]",
    )
    group.add_argument(
        "--request-timeout",
        type=_seconds,
        metavar="S",
        help="seconds to wait for the answer to one request [env HTTP_REQUEST_TIMEOUT; "
        "default 600]",
    )
    group.add_argument(
        "-o",
        "--output",
        type=_lower,
        choices=("table", "json", "yaml"),
        default="table",
        help="table for people (default), json or yaml for scripts",
    )
    return common


def _waiting(parser: argparse.ArgumentParser, timeout: float | None) -> None:
    parser.add_argument(
        "--poll-interval",
        type=_pause,
        default=10.0,
        metavar="S",
        help="seconds between status queries (default 10)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=timeout,
        metavar="S",
        help="give up waiting after S seconds"
        + (f" (default {timeout:g})" if timeout else " (default: no limit)"),
    )


def _server_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        choices=("runtime", "sdk"),
        default="runtime",
        help="what start.sh runs on the instance: this runtime, whose sources travel in the "
        "package (default), or the DashScope SDK's function server",
    )


def add_commands(commands: Any) -> None:
    """Add the platform commands to ``python -m runtime``'s subparsers."""
    common = _common()

    register = commands.add_parser(
        "register",
        parents=[common],
        help="register the workspace's functions on the platform",
        description="Check that each class imports, package the workspace (one zip per "
        "function, one dependency layer per set of requirements), upload and register it. "
        "Prints the entity ids, and the instance ids with --no-lazy-load.",
        epilog="example: cd sample_functions && python -m runtime register "
        "--reward functions.reward.reward:DemoRewardProcessor --no-lazy-load",
    )
    register.add_argument(
        "workspace", nargs="?", default=".", metavar="WORKSPACE", help="default: ."
    )
    for kind in ("rollout", "reward", "group-reward"):
        register.add_argument(
            f"--{kind}",
            f"--{kind}-classpaths",  # the SDK's spelling
            action="append",
            default=[],
            metavar="CLASSPATH",
            help=f"a {kind.replace('-', ' ')} class: pkg.mod:Cls, pkg.mod.Cls or "
            "path/file.py:Cls (repeatable)",
        )
    register.add_argument(
        "--no-lazy-load",
        dest="lazy",
        action="store_false",
        help="start an instance of each function now and wait until it is active",
    )
    _server_option(register)
    _waiting(register, 900.0)
    register.set_defaults(poll_interval=5.0)

    test = commands.add_parser(
        "test-function",
        parents=[common],
        help="send one input to a registered instance and print its output",
        description="Validate the input locally (unknown fields are kept and sent), call the "
        "instance, print its output. Exit 1 when the output's status is failed.",
        epilog="example: python -m runtime test-function rw-ins-123 --type reward "
        "--input requests/reward.json",
    )
    test.add_argument("instance_id", metavar="INSTANCE_ID")
    test.add_argument(
        "-t",
        "--type",
        required=True,
        type=_lower,
        choices=("rollout", "reward", "group_reward"),
        help="the function's type",
    )
    test.add_argument(
        "-i", "--input", required=True, metavar="FILE|-|JSON", help="a JSON file, - or JSON text"
    )

    upload = commands.add_parser(
        "upload-data",
        parents=[common],
        help="check JSONL datasets locally, then upload them",
        description="Check every file first (each line a JSON object with messages; nothing "
        "is uploaded when any file is bad), then upload them and print their file ids.",
    )
    upload.add_argument(
        "--training",
        "--training-files",  # the SDK's spelling
        nargs="+",
        action="extend",
        required=True,
        metavar="FILE",
    )
    upload.add_argument(
        "--validation", "--validation-files", nargs="+", action="extend", default=[], metavar="FILE"
    )

    job = commands.add_parser("job", help="run and manage training jobs")
    jobs = job.add_subparsers(dest="job_command", required=True, metavar="ACTION")
    job_run = jobs.add_parser(
        "run",
        parents=[common],
        help="register, upload, submit a job from a job file",
        description="Register the functions of the job file (except those with an entity_id), "
        "upload its datasets (except those with a file_id), submit the job, print its id "
        "and status. --wait follows it to a final state; exit 0 only when it succeeded.",
        epilog="example: cd sample_functions && python -m runtime job run -c rl-job.yaml --wait",
    )
    job_run.add_argument("-c", "--config", required=True, metavar="YAML", help="the job file")
    job_run.add_argument("--teacher-model", help="on-policy distillation from this model")
    job_run.add_argument("--job-name", help="the job's name, exactly (default: name-XXXXXXXX)")
    job_run.add_argument("--model", help="the base model (overrides model.name)")
    job_run.add_argument("--wait", action="store_true", help="follow the job to a final state")
    _server_option(job_run)
    _waiting(job_run, None)

    for action, text in (
        ("get", "show a job"),
        ("cancel", "cancel a job"),
        ("delete", "delete a job"),
    ):
        sub = jobs.add_parser(action, parents=[common], help=text)
        sub.add_argument("job_id", metavar="JOB_ID")
    job_list = jobs.add_parser("list", parents=[common], help="list jobs, a page at a time")
    job_list.add_argument("-p", "--page", type=_counting, default=1)
    job_list.add_argument("-s", "--size", type=_counting, default=10)
    job_logs = jobs.add_parser("logs", parents=[common], help="print a job's log lines")
    job_logs.add_argument("job_id", metavar="JOB_ID")
    job_logs.add_argument("--offset", type=_counting, default=1, help="first line, from 1")
    job_logs.add_argument("--lines", type=_counting, default=1000, help="how many (default 1000)")
    job_logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines until the job ends"
    )
    job_logs.add_argument("--poll-interval", type=_pause, default=10.0, metavar="S")
    job_wait = jobs.add_parser(
        "wait",
        parents=[common],
        help="follow a job to a final state (exit 0 only when it succeeded)",
    )
    job_wait.add_argument("job_id", metavar="JOB_ID")
    _waiting(job_wait, None)

    instance = commands.add_parser("instance", help="logs and deletion of function instances")
    instances = instance.add_subparsers(dest="instance_command", required=True, metavar="ACTION")
    for action, text in (("logs", "print an instance's logs"), ("delete", "delete an instance")):
        sub = instances.add_parser(action, parents=[common], help=text)
        sub.add_argument("instance_id", metavar="INSTANCE_ID")


def keep_workspace_off_path() -> None:
    """``python -m runtime`` puts the current directory first on ``sys.path``: a workspace
    ``yaml.py`` or ``httpx/`` would then shadow the client's own imports. The client
    imports nothing from the workspace (the import check runs in a subprocess), so the
    current directory goes, unless this runtime itself is imported from it."""
    import runtime

    here = Path.cwd().resolve()
    if Path(runtime.__file__).resolve().parent.parent == here:
        return
    sys.path[:] = [p for p in sys.path if p != "" and Path(p).resolve() != here]


def run(args: argparse.Namespace) -> int:
    """Run a platform command; its exit status."""
    keep_workspace_off_path()
    from runtime.platform.config import ConfigError, JobFileError
    from runtime.platform.datasets import DatasetError
    from runtime.platform.functions import ComponentError
    from runtime.platform.http import PlatformError, RequestNotSent
    from runtime.platform.jobs import FollowError, WaitTimeout
    from runtime.platform.packaging import WorkspaceFileError
    from runtime.platform.scrub import add_secret

    for key in (getattr(args, "api_key", None), os.environ.get("DASHSCOPE_API_KEY")):
        if key:  # blanked from everything printed, even before it is checked
            add_secret(key)
            add_secret(key.strip())
    try:
        return _dispatch(args)
    except (UsageError, RequestNotSent, JobFileError, WorkspaceFileError) as exc:
        _say(f"error: {exc}")
        return 2
    except WaitTimeout as exc:
        _say(f"error: {exc}")
        return EXIT_WAIT_TIMEOUT
    except FollowError as exc:
        _say(f"error: {exc} (while following the job: its state is unknown)")
        return EXIT_FOLLOW_ERROR
    except (PlatformError, ConfigError, ComponentError, DatasetError) as exc:
        _say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _platform(args: argparse.Namespace, reporter: Any) -> Any:
    from runtime.platform.http import DEFAULT_BASE_URL, Platform

    key = args.api_key if args.api_key is not None else os.environ.get("DASHSCOPE_API_KEY", "")
    key = key.strip()
    if not key:
        raise UsageError("no API key: pass --api-key or set DASHSCOPE_API_KEY (nothing was sent)")
    if not all(33 <= ord(c) <= 126 for c in key):
        raise UsageError(
            "the API key has a character that cannot go in an HTTP header (a space, a line "
            "break or a non-ASCII character): check how it was copied (nothing was sent)"
        )
    base = args.base_url or os.environ.get("DASHSCOPE_HTTP_BASE_URL") or DEFAULT_BASE_URL
    _check_url(base, "--base-url (or DASHSCOPE_HTTP_BASE_URL)")
    workspace = args.workspace_id or os.environ.get("DASHSCOPE_WORKSPACE_ID") or None
    return Platform(
        base,
        key,
        notify=reporter.note,
        user_agent=_user_agent(),
        workspace=workspace,
        timeout=_request_timeout(args),
    )


def _check_url(url: str, what: str) -> None:
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise UsageError(f"{what} {url!r} is not an http(s) URL with a host (nothing was sent)")


def _request_timeout(args: argparse.Namespace) -> float:
    given = getattr(args, "request_timeout", None)  # checked by argparse
    if given is not None:
        return float(given)
    text = os.environ.get("HTTP_REQUEST_TIMEOUT")
    if text is None:
        return 600.0
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise UsageError(
            f"the request timeout (--request-timeout or HTTP_REQUEST_TIMEOUT) must be a "
            f"positive number of seconds, not {text!r} (nothing was sent)"
        )
    return value


def _check_environment() -> None:
    """Settings read from the environment, checked before anything is done."""
    from runtime.platform.packaging import PackagingError, check_environment

    try:
        check_environment()
    except PackagingError as exc:
        raise UsageError(f"{exc} (nothing was sent)") from None
    from runtime.platform.http import ENDPOINT_VARIABLES

    for name in ENDPOINT_VARIABLES:
        if os.environ.get(name):
            _check_url(os.environ[name], name)


def _user_agent() -> str:
    from importlib import metadata

    try:
        version = metadata.version("agentic-rl-runtime")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"agentic-rl-runtime/{version}"


def _dispatch(args: argparse.Namespace) -> int:
    from runtime.platform.progress import Reporter

    reporter = Reporter()
    _check_environment()
    command = args.command
    if command == "job":
        command = f"job {args.job_command}"
    elif command == "instance":
        command = f"instance {args.instance_command}"
    handler = _HANDLERS[command]
    return handler(args, reporter)


# ---- commands -------------------------------------------------------------------------


def _register(args: argparse.Namespace, reporter: Any) -> int:
    from runtime.platform.functions import register, resolve

    workspace = Path(args.workspace)
    components = [
        resolve(kind, classpath, workspace)
        for kind, given in (
            ("rollout", args.rollout),
            ("reward", args.reward),
            ("group_reward", args.group_reward),
        )
        for classpath in given
    ]
    if not components:
        raise UsageError("nothing to register: pass --rollout, --reward or --group-reward")

    def created() -> dict[str, Any]:
        result: dict[str, Any] = {}
        for suffix, attr in (("entity_ids", "entity_id"), ("instance_ids", "instance_id")):
            for kind in ("rollout", "reward", "group_reward"):
                result[f"{kind}_{suffix}"] = [
                    getattr(c, attr) for c in components if c.kind == kind and getattr(c, attr)
                ]
        return result

    with _partial(created, args.output), _platform(args, reporter) as platform:
        register(
            platform,
            components,
            reporter,
            lazy=args.lazy,
            server=args.server,
            poll_interval=args.poll_interval,
            wait_timeout=args.timeout,
        )
    _emit(created(), args.output)
    return 0


def _read_input(text: str) -> Any:
    import orjson

    if text == "-":
        raw = sys.stdin.buffer.read()
    elif text.lstrip().startswith(("{", "[")):
        raw = text.encode()
    else:
        try:
            raw = Path(text).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read the input {text}: {exc.strerror}") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"the input is not JSON: {exc}") from None


def _test_function(args: argparse.Namespace, reporter: Any) -> int:
    from pydantic import BaseModel, ValidationError

    from processors_base import models
    from runtime.platform.answers import problems

    pairs: dict[str, tuple[type[BaseModel], type[BaseModel]]] = {
        "rollout": (models.RolloutInput, models.RolloutOutput),
        "reward": (models.RewardInput, models.RewardOutput),
        "group_reward": (models.GroupRewardInput, models.GroupRewardOutput),
    }
    input_model, output_model = pairs[args.type]
    payload = _read_input(args.input)
    if not isinstance(payload, dict):
        raise UsageError("the input must be a JSON object")
    given = payload.setdefault("func_type", args.type)
    if given != args.type:
        raise UsageError(
            f"the input's func_type is {given!r} but --type is {args.type!r}: the instance "
            "would be sent an input of the wrong type (nothing was sent)"
        )
    try:
        input_model.model_validate(payload)
    except ValidationError as exc:
        raise UsageError(f"the input is not a valid {args.type} input: {problems(exc)}") from None
    from runtime.platform.functions import invoke

    with _platform(args, reporter) as platform:
        status, output = invoke(platform, args.instance_id, payload)
    if not isinstance(output, dict):
        _say(f"error: the instance answered HTTP {status} with {output!r}")
        return 1
    try:
        output_model.model_validate(output)
    except ValidationError as exc:
        reporter.note(
            f"warning: the output does not fit the {args.type} output model: {problems(exc)}"
        )
    _emit(output, args.output)
    if status >= 400 or output.get("status") == "failed":
        detail = output.get("error") or output.get("detail") or output.get("message")
        _say(f"error: the function failed (HTTP {status}): {detail}")
        return 1
    return 0


def _upload_data(args: argparse.Namespace, reporter: Any) -> int:
    from runtime.platform.datasets import check_jsonl, upload

    files: list[tuple[str, Path]] = []
    for kind, given in (("training", args.training), ("validation", args.validation)):
        for name in given:
            path = Path(name)
            if not path.is_file():
                raise UsageError(f"{name}: no such file (nothing was sent)")
            if any(k == kind and p.samefile(path) for k, p in files):
                reporter.note(f"{name} is given twice as {kind} data: uploaded once")
                continue
            files.append((kind, path))
    for _, path in files:
        check_jsonl(path)  # all of them before any upload
    result: dict[str, list[str]] = {"training_file_ids": [], "validation_file_ids": []}
    with _partial(lambda: result, args.output), _platform(args, reporter) as platform:
        for kind, path in files:
            with reporter.step(f"uploading {path} ({path.stat().st_size / 1024:.1f} KiB)"):
                result[f"{kind}_file_ids"].append(upload(platform, path))
    _emit(result, args.output)
    return 0


def _job_run(args: argparse.Namespace, reporter: Any) -> int:
    from runtime.platform import jobs
    from runtime.platform.config import load_job_file
    from runtime.platform.datasets import check_jsonl, upload
    from runtime.platform.functions import register

    if not Path(args.config).is_file():
        raise UsageError(f"{args.config}: no such job file (nothing was sent)")
    job = load_job_file(args.config)
    if args.teacher_model:
        job.config.teacher_model = args.teacher_model
    if args.model:
        job.config.model.name = args.model
    job.check()
    # everything local first: a bad dataset or class fails before anything is sent
    if args.job_name is not None and not 1 <= len(args.job_name) <= 256:
        raise UsageError(f"--job-name must be 1 to 256 characters, not {len(args.job_name)}")
    datasets: dict[int, Path] = {}
    for index, dataset in enumerate(job.config.datasets):
        if dataset.needs_upload and dataset.type == "testing":
            reporter.note(
                f"datasets[{index}] ({dataset.file_name}): a testing dataset is not "
                "sent with the job, so it is not uploaded"
            )
        elif dataset.needs_upload:
            assert dataset.file_name is not None
            path = (job.base_dir / dataset.file_name).resolve()
            if not path.is_file():
                where = job.where("datasets", index, "file_name")
                raise UsageError(f"{where}: {path}: no such file (nothing was sent)")
            try:
                check_jsonl(path)
            except Exception as exc:
                raise job.error(str(exc), "datasets", index, "file_name") from None
            datasets[index] = path
    components = jobs.components_of(job)
    file_ids: dict[int, str] = {}
    result: dict[str, Any] = {}

    def created() -> dict[str, Any]:
        return {
            "entity_ids": {c.label: c.entity_id for c in components if c.entity_id},
            "file_ids": {
                job.config.datasets[i].file_name: file_id for i, file_id in file_ids.items()
            },
        }

    with _partial(lambda: result or created(), args.output), _platform(args, reporter) as platform:
        register(platform, components, reporter, lazy=True, server=args.server)
        for index, path in datasets.items():
            with reporter.step(f"uploading {path.name} ({path.stat().st_size / 1024:.1f} KiB)"):
                file_ids[index] = upload(platform, path)
        body = jobs.submit_body(job, components, file_ids, job_name=args.job_name)
        submitted = jobs.submit(platform, body)
        result.update(
            job_id=submitted["job_id"],
            status=submitted.get("status"),
            job_name=submitted.get("job_name", body["job_name"]),
            **created(),
        )
        reporter.note(f"submitted job {result['job_id']} ({result['status']})")
        if not args.wait:
            _emit(result, args.output)
            return 0
        final = _follow(platform, result["job_id"], args, reporter)
    result["status"] = final.get("status")
    _emit(result, args.output)
    return 0 if result["status"] == "SUCCEEDED" else 1


@contextlib.contextmanager
def _partial(created: Callable[[], dict[str, Any]], fmt: str) -> Iterator[None]:
    """On a failure part-way, what was created so far goes to stdout (in the format asked
    for) before the error line, so that nothing is orphaned without its id."""
    try:
        yield
    except BaseException:
        shown = created()
        if any(shown.values()):
            _emit(shown, fmt)
        raise


def _follow(platform: Any, job_id: str, args: argparse.Namespace, reporter: Any) -> dict:
    from runtime.platform import jobs

    return jobs.follow(
        platform,
        job_id,
        on_status=lambda status: reporter.note(f"job {job_id}: {status}"),
        on_line=lambda line: reporter.note(f"  | {line}"),
        interval=args.poll_interval,
        timeout=args.timeout,
        on_retry=reporter.note,
    )


def _job_simple(args: argparse.Namespace, reporter: Any) -> int:
    from runtime.platform import jobs

    with _platform(args, reporter) as platform:
        action = args.job_command
        if action == "get":
            result = jobs.get(platform, args.job_id)
        elif action == "list":
            result = jobs.list_jobs(platform, args.page, args.size)
        elif action == "cancel":
            result = jobs.cancel(platform, args.job_id)
        else:
            result = jobs.delete(platform, args.job_id)
    _emit(result, args.output)
    return 0


def _job_logs(args: argparse.Namespace, reporter: Any) -> int:
    from runtime.platform import jobs

    with _platform(args, reporter) as platform:
        if not args.follow:
            lines = jobs.job_logs(platform, args.job_id, args.offset, args.lines)
            _emit({"job_id": args.job_id, "logs": lines}, args.output, lines=True)
            return 0
        final = jobs.follow(
            platform,
            args.job_id,
            on_status=lambda status: reporter.note(f"job {args.job_id}: {status}"),
            on_line=lambda line: _emit({"logs": [line]}, "table", lines=True),
            interval=args.poll_interval,
            timeout=None,
            offset=args.offset,
            on_retry=reporter.note,
        )
    return 0 if final.get("status") == "SUCCEEDED" else 1


def _job_wait(args: argparse.Namespace, reporter: Any) -> int:
    with _platform(args, reporter) as platform:
        final = _follow(platform, args.job_id, args, reporter)
    _emit(final, args.output)
    return 0 if final.get("status") == "SUCCEEDED" else 1


def _instance(args: argparse.Namespace, reporter: Any) -> int:
    from runtime.platform.functions import delete_instance, instance_logs

    with _platform(args, reporter) as platform:
        if args.instance_command == "logs":
            lines = instance_logs(platform, args.instance_id)
            _emit({"instance_id": args.instance_id, "logs": lines}, args.output, lines=True)
        else:
            _emit(delete_instance(platform, args.instance_id), args.output)
    return 0


_HANDLERS = {
    "register": _register,
    "test-function": _test_function,
    "upload-data": _upload_data,
    "job run": _job_run,
    "job get": _job_simple,
    "job list": _job_simple,
    "job cancel": _job_simple,
    "job delete": _job_simple,
    "job logs": _job_logs,
    "job wait": _job_wait,
    "instance logs": _instance,
    "instance delete": _instance,
}


# ---- output ---------------------------------------------------------------------------


def _emit(result: dict[str, Any], fmt: str, *, lines: bool = False) -> None:
    from runtime.platform.scrub import scrub

    sys.stdout.write(scrub(_render(result, fmt, lines=lines)))
    sys.stdout.flush()


def _say(text: str) -> None:
    """One line on stderr, the key blanked, control characters escaped."""
    from runtime.platform.scrub import shown

    print(shown(text), file=sys.stderr, flush=True)


# JSON escapes C0 itself; DEL and C1 (a one-character CSI, OSC) may only stand in strings
_JSON_CONTROL = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0))}


def _render(result: dict[str, Any], fmt: str, *, lines: bool = False) -> str:
    import orjson

    from runtime.platform.scrub import printable

    if fmt == "json":
        text = orjson.dumps(result, option=orjson.OPT_INDENT_2).decode()
        return text.translate(_JSON_CONTROL) + "\n"
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(result, sort_keys=False, allow_unicode=True)  # escapes them
    if lines:
        logs = result.get("logs") or []
        return "".join(f"{printable(str(line), tabs=True)}\n" for line in logs)
    if isinstance(result.get("jobs"), list):
        columns = ("job_id", "job_name", "status", "model", "create_time")
        text = _table(result["jobs"], columns)
        return text + f"page {result.get('page_no')}, {result.get('total')} job(s) in all\n"
    width = max((len(k) for k in result), default=0)
    return "".join(f"{printable(key):<{width}}  {_cell(value)}\n" for key, value in result.items())


def _cell(value: Any) -> str:
    """A table cell on one line, control characters shown escaped."""
    import orjson

    from runtime.platform.scrub import printable

    if value is None:
        return "-"
    if isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value):
        return printable(", ".join(str(v) for v in value)) or "-"
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode().translate(_JSON_CONTROL)
    return printable(str(value))


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    out = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    for row in cells:
        out.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return "".join(f"{line}\n" for line in out)
