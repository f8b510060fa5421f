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
from collections.abc import Iterator
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


def _job_options(parser: argparse.ArgumentParser, ids: bool) -> None:
    """The options of ``job run`` (``ids``: of ``job submit``): a job file, or a job made of
    options (each of which replaces the file's setting when both are given)."""
    parser.add_argument("-c", "--config", metavar="YAML", help="the job file")
    parser.add_argument("--teacher-model", help="on-policy distillation from this model")
    parser.add_argument("--job-name", help="the job's name, exactly (default: name-XXXXXXXX)")
    parser.add_argument("--model", help="the base model (overrides model.name)")
    many: dict[str, Any] = {"nargs": "+", "action": "extend", "default": []}
    if ids:
        parser.add_argument("--rollout-id", metavar="[NAME=]ID", help="a registered rollout")
        for kind in ("reward", "group-reward"):
            parser.add_argument(
                f"--{kind}-ids", metavar="[NAME=]ID", help=f"registered {kind}s", **many
            )
        parser.add_argument("--training-file-ids", metavar="ID", **many)
        parser.add_argument("--validation-file-ids", metavar="ID", **many)
    else:
        for kind in ("rollout", "reward", "group-reward"):
            parser.add_argument(
                f"--{kind}-classpaths", metavar="CLASSPATH", help=f"{kind} classes", **many
            )
        parser.add_argument(
            "--workspace-dir", default=".", metavar="DIR", help="the classes' workspace"
        )
        parser.add_argument("--training-files", metavar="FILE", **many)
        parser.add_argument("--validation-files", metavar="FILE", **many)
    for kind in ("reward", "group-reward"):
        parser.add_argument(
            f"--{kind}-weights", type=float, metavar="W", help=f"one per {kind}, in order", **many
        )
    parser.add_argument(
        "--runtimes",
        metavar="JSON",
        help="each function's runtime: a JSON object of objects, keyed by "
        + ("its name or id" if ids else "its classpath"),
    )
    parser.add_argument("--hyper-parameters", metavar="JSON", help="a JSON object")
    parser.add_argument("--resources", metavar="JSON", help="a JSON object")
    parser.add_argument("--wait", action="store_true", help="follow the job to a final state")
    _waiting(parser, None)


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
        help="register, upload, submit a job from a job file or from options",
        description="Register the functions of the job file (except those with an entity_id), "
        "upload its datasets (except those with a file_id), submit the job, print its id "
        "and status. Without -c, the job is made of the options (--model, --training-files, "
        "the classpaths...); with it, each one given replaces the file's setting. --wait "
        "follows the job to a final state; exit 0 only when it succeeded.",
        epilog="example: cd sample_functions && python -m runtime job run -c rl-job.yaml --wait",
    )
    job_submit = jobs.add_parser(
        "submit",
        parents=[common],
        help="submit a job of functions registered and files uploaded before",
        description="Submit a job whose functions are registered (entity ids) and whose "
        "datasets are uploaded (file ids): from a job file whose functions have an entity_id "
        "and datasets a file_id, or from the options. Nothing is registered or uploaded.",
        epilog="example: python -m runtime job submit --model qwen3.5-9b --rollout-id ro-1 "
        "--reward-ids answer=rw-1 --training-file-ids file-1",
    )
    for parser, ids in ((job_run, False), (job_submit, True)):
        _job_options(parser, ids)
    _server_option(job_run)

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
    """The Python API's client (``runtime.platform.client``), configured from the command
    line and the environment, each setting checked first (a usage error, nothing sent)."""
    from runtime.platform.client import PlatformClient
    from runtime.platform.http import DEFAULT_BASE_URL

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
    return PlatformClient(
        key,
        base_url=base,
        progress=reporter,
        user_agent=_user_agent(),
        workspace=workspace,
        request_timeout=_request_timeout(args),
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
    if not (args.rollout or args.reward or args.group_reward):
        raise UsageError("nothing to register: pass --rollout, --reward or --group-reward")
    client = _platform(args, reporter)
    with _partial(args.output):
        registered = client.register(
            args.workspace,
            rollout=args.rollout,
            reward=args.reward,
            group_reward=args.group_reward,
            lazy=args.lazy,
            server=args.server,
            poll_interval=args.poll_interval,
            timeout=args.timeout,
        )
    _emit(registered.model_dump(), args.output)
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
    answer = _platform(args, reporter).test_function(args.instance_id, args.type, payload)
    status, output = answer.http_status, answer.output
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
    if answer.failed:
        detail = output.get("error") or output.get("detail") or output.get("message")
        _say(f"error: the function failed (HTTP {status}): {detail}")
        return 1
    return 0


def _upload_data(args: argparse.Namespace, reporter: Any) -> int:
    from runtime.platform.datasets import check_jsonl

    files: dict[str, list[Path]] = {"training": [], "validation": []}
    for kind, given in (("training", args.training), ("validation", args.validation)):
        for name in given:
            path = Path(name)
            if not path.is_file():
                raise UsageError(f"{name}: no such file (nothing was sent)")
            if any(p.samefile(path) for p in files[kind]):
                reporter.note(f"{name} is given twice as {kind} data: uploaded once")
                continue
            files[kind].append(path)
    for path in files["training"] + files["validation"]:
        check_jsonl(path)  # all of them before any upload (and before the key is checked)
    client = _platform(args, reporter)
    with _partial(args.output):
        uploaded = client.upload_datasets(files["training"], files["validation"])
    _emit(uploaded.model_dump(), args.output)
    return 0


def _job_run(args: argparse.Namespace, reporter: Any) -> int:
    """``job run`` and ``job submit``."""
    job = _job_of(args, submitting=args.job_command == "submit")
    if args.job_name is not None and not 1 <= len(args.job_name) <= 256:
        raise UsageError(f"--job-name must be 1 to 256 characters, not {len(args.job_name)}")
    client = _platform(args, reporter)
    result: dict[str, Any]
    if args.job_command == "submit":
        job_ = client.submit(
            job, job_name=args.job_name, model=args.model, teacher_model=args.teacher_model
        )
        result = {"job_id": job_.job_id, "status": job_.status, "job_name": job_.job_name}
        reporter.note(f"submitted job {job_.job_id} ({job_.status})")
    else:
        with _partial(args.output, only=("entity_ids", "file_ids")):
            run = client.run(
                job,
                job_name=args.job_name,
                model=args.model,
                teacher_model=args.teacher_model,
                server=args.server,
            )
        result = {
            "job_id": run.job_id,
            "status": run.status,
            "job_name": run.job_name,
            "entity_ids": run.entity_ids,
            "file_ids": run.file_ids,
        }
    if not args.wait:
        _emit(result, args.output)
        return 0
    with _partial(args.output, shown=result):
        final = _follow(client, str(result["job_id"]), args, reporter)
    result["status"] = final.status
    _emit(result, args.output)
    return 0 if result["status"] == "SUCCEEDED" else 1


def _json_object(text: str | None, option: str) -> dict[str, Any] | None:
    import orjson

    if text is None:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"{option}: not JSON ({exc}) (nothing was sent)") from None
    if not isinstance(value, dict):
        raise UsageError(f"{option}: must be a JSON object (nothing was sent)")
    return value


def _job_of(args: argparse.Namespace, *, submitting: bool) -> Any:
    """The job of ``job run`` / ``job submit``: the job file (``-c``), each option given
    replacing its setting, or, without one, the job the options make."""
    from pydantic import ValidationError

    from runtime.platform.answers import problems
    from runtime.platform.client import job_file
    from runtime.platform.config import Dataset, FunctionSpec, HyperParameters, JobConfig

    job = None
    if args.config is not None:
        if not Path(args.config).is_file():
            raise UsageError(f"{args.config}: no such job file (nothing was sent)")
        job = job_file(args.config)  # its errors before the options'
    runtimes = _json_object(args.runtimes, "--runtimes") or {}
    functions = _functions_of(args, runtimes, submitting)
    if submitting:
        given = [("training", f) for f in args.training_file_ids]
        given += [("validation", f) for f in args.validation_file_ids]
        datasets = [{"type": kind, "file_id": file_id} for kind, file_id in given]
    else:
        given = [("training", f) for f in args.training_files]
        given += [("validation", f) for f in args.validation_files]
        for _, name in given:
            if not Path(name).is_file():
                raise UsageError(f"{name}: no such file (nothing was sent)")
        # relative to the current directory: as given without a job file, else made absolute
        # (the job file's relative paths are relative to it)
        datasets = [
            {"type": k, "file_name": f if job is None else str(Path(f).resolve())} for k, f in given
        ]
    hyper = _json_object(args.hyper_parameters, "--hyper-parameters")
    resources = _json_object(args.resources, "--resources")
    try:
        if job is None:
            if not datasets:
                data = "--training-file-ids" if submitting else "--training-files"
                raise UsageError(
                    f"job {args.job_command} needs -c YAML, or a job made of options: "
                    f"--model, {data} and the functions (nothing was sent)"
                )
            job = job_file(JobConfig.model_validate({"functions": functions}))
        elif functions:
            job.config.functions = [FunctionSpec.model_validate(f) for f in functions]
        if datasets:
            job.config.datasets = [Dataset.model_validate(d) for d in datasets]
        if hyper is not None:
            job.config.training.hyper_parameters = HyperParameters.model_validate(hyper)
        if resources is not None:
            job.config.training.resources = resources
    except ValidationError as exc:
        raise UsageError(
            f"the options make no valid job: {problems(exc)} (nothing was sent)"
        ) from None
    return job


def _functions_of(
    args: argparse.Namespace, runtimes: dict[str, Any], submitting: bool
) -> list[dict[str, Any]]:
    """The functions the options name, each with its weight (in order) and runtime."""
    named: list[tuple[str, str, str | None, str | None]] = []  # kind, key, name, entity id
    if submitting:
        given = [("rollout", args.rollout_id)] if args.rollout_id else []
        given += [("reward", i) for i in args.reward_ids]
        given += [("group_reward", i) for i in args.group_reward_ids]
        for kind, text in given:
            name, _, entity = text.rpartition("=")
            named.append((kind, entity, name or None, entity))
    else:
        for kind in ("rollout", "reward", "group_reward"):
            named += [(kind, c, None, None) for c in getattr(args, f"{kind}_classpaths")]
    functions: list[dict[str, Any]] = []
    for kind, key, name, entity in named:
        spec: dict[str, Any] = {"type": kind}
        if entity is not None:
            spec.update(entity_id=entity, name=name)
        else:
            spec["fcmodel"] = {"zipdir": str(Path(args.workspace_dir).resolve()), "classpath": key}
        runtime = runtimes.get(name) if name in runtimes else runtimes.get(key)
        if runtime is not None:
            spec["runtime"] = runtime
        functions.append(spec)
    keys = {k for _, k, _, _ in named} | {n for _, _, n, _ in named if n}
    unknown = sorted(set(runtimes) - keys)
    if unknown:
        raise UsageError(f"--runtimes names {unknown[0]!r}, which is no function given")
    for kind in ("reward", "group_reward"):
        weights = getattr(args, f"{kind}_weights")
        specs = [f for f in functions if f["type"] == kind]
        if weights and len(weights) != len(specs):
            option = kind.replace("_", "-")
            raise UsageError(
                f"--{option}-weights gives {len(weights)} weight(s) for {len(specs)} "
                f"{kind.replace('_', ' ')}(s): one each, in order (nothing was sent)"
            )
        for spec, weight in zip(specs, weights, strict=False):
            spec["weight"] = weight
    return functions


@contextlib.contextmanager
def _partial(
    fmt: str, *, shown: dict[str, Any] | None = None, only: tuple[str, ...] | None = None
) -> Iterator[None]:
    """On a failure part-way, what was created so far (``shown``, else the error's
    ``partial``, its keys ``only``) goes to stdout (in the format asked for) before the
    error line, so that nothing is orphaned without its id."""
    try:
        yield
    except BaseException as exc:
        partial = getattr(exc, "partial", None)
        created = shown if shown is not None else partial.model_dump() if partial else {}
        if only is not None:
            created = {k: v for k, v in created.items() if k in only}
        if any(created.values()):
            _emit(created, fmt)
        raise


def _follow(client: Any, job_id: str, args: argparse.Namespace, reporter: Any) -> Any:
    return client.wait(
        job_id,
        on_status=lambda status: reporter.note(f"job {job_id}: {status}"),
        on_line=lambda line: reporter.note(f"  | {line}"),
        on_retry=reporter.note,
        interval=args.poll_interval,
        timeout=args.timeout,
    )


def _job_simple(args: argparse.Namespace, reporter: Any) -> int:
    client = _platform(args, reporter)
    action = args.job_command
    if action == "get":
        result = client.get(args.job_id)
    elif action == "list":
        result = client.list_page(args.page, args.size)
    elif action == "cancel":
        result = client.cancel(args.job_id)
    else:
        result = client.delete(args.job_id)
    _emit(result.model_dump(exclude_unset=True), args.output)
    return 0


def _job_logs(args: argparse.Namespace, reporter: Any) -> int:
    client = _platform(args, reporter)
    if not args.follow:
        lines = client.logs_page(args.job_id, args.offset, args.lines)
        _emit({"job_id": args.job_id, "logs": lines}, args.output, lines=True)
        return 0
    final = client.wait(
        args.job_id,
        on_status=lambda status: reporter.note(f"job {args.job_id}: {status}"),
        on_line=lambda line: _emit({"logs": [line]}, "table", lines=True),
        on_retry=reporter.note,
        interval=args.poll_interval,
        timeout=None,
        offset=args.offset,
    )
    return 0 if final.status == "SUCCEEDED" else 1


def _job_wait(args: argparse.Namespace, reporter: Any) -> int:
    final = _follow(_platform(args, reporter), args.job_id, args, reporter)
    _emit(final.model_dump(exclude_unset=True), args.output)
    return 0 if final.status == "SUCCEEDED" else 1


def _instance(args: argparse.Namespace, reporter: Any) -> int:
    client = _platform(args, reporter)
    if args.instance_command == "logs":
        lines = client.instance_logs(args.instance_id)
        _emit({"instance_id": args.instance_id, "logs": lines}, args.output, lines=True)
    else:
        _emit(client.delete_instance(args.instance_id), args.output)
    return 0


_HANDLERS = {
    "register": _register,
    "test-function": _test_function,
    "upload-data": _upload_data,
    "job run": _job_run,
    "job submit": _job_run,
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
