"""Serving settings: one table of options, each with its environment fallback and default.

Precedence: command-line option, then the first environment variable set, then the
default. The table drives the CLI's options, its help text and the startup line that
prints the effective configuration, so the three cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["OPTIONS", "Settings", "SettingsError", "add_options", "resolve"]


class SettingsError(Exception):
    pass


@dataclass(frozen=True)
class Settings:
    target: str = ""
    func_type: str | None = None
    workspace: str = "."
    host: str = "0.0.0.0"
    port: int = 8000
    workers: int = 1
    heartbeat_timeout: float = 30.0
    concurrency: int = 128
    queue: int = 256
    threads: int = 32
    timeout: float = 600.0
    grace: float = 30.0
    max_body: int = 10 * 1024 * 1024
    max_buffered: int = 8 * 10 * 1024 * 1024  # 8 x max_body unless given
    body_timeout: float = 10.0
    max_connections: int = 1024
    log_level: str = "info"
    log_format: str = "text"
    access_log: bool = False
    slow_request: float = 10.0
    tracing: bool = False
    flush_spans: str = "shutdown"  # with tracing: "request" exports after each response
    isolation: str = "thread"
    processes: int = 0  # 0: the CPUs this process may use (affinity, cgroup quota)
    sub_reward_errors: str = "zero"
    # the trainer protocols (runtime.serving.trainers)
    trainer_errors: str = "reward"
    trainer_timeout: float = 100.0
    trainer_prefix: str = ""
    ground_truth_field: str = "expected_answer"
    # OpenRLHF: end-of-turn tokens stripped from the end of a response, comma-separated
    trainer_end_tokens: str = "<|im_end|>,<|endoftext|>,</s>,<|eot_id|>,<|end_of_text|>,<|end|>"
    # OpenRLHF: samples in one request; a batch at the limit costs about one --max-body body
    trainer_max_samples: int = 8192
    # replicas: --ray (runtime.deploy.ray_serve), and the autoscaler of `manifests`
    ray: bool = False
    replicas: str = "1"
    min_replicas: int = 1
    max_replicas: int = 8
    ray_replica_cpus: float = 1.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        return " ".join(
            f"{o.dest}={_show(getattr(self, o.dest), o)}" for o in OPTIONS if o.dest != "func_type"
        )


def _show(value: Any, option: Option) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}s" if option.parse is _seconds else f"{value:g}"
    return str(value)


def _int(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError("not an integer") from None
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a positive number of seconds")
    return value


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false")


def _func_type(text: str) -> str:
    lowered = text.strip().lower()
    if lowered not in ("rollout", "reward", "group_reward"):
        raise ValueError("must be rollout, reward or group_reward")
    return lowered


_LEVELS = ("debug", "info", "warning", "error", "critical")


def _isolation(text: str) -> str:
    lowered = text.strip().lower()
    if lowered not in ("thread", "process"):
        raise ValueError("must be thread or process")
    return lowered


def _sub_reward_errors(text: str) -> str:
    lowered = text.strip().lower()
    if lowered not in ("zero", "fail", "renormalize"):
        raise ValueError("must be zero, fail or renormalize")
    return lowered


def _replicas(text: str) -> str:
    lowered = text.strip().lower()
    if lowered != "auto" and not (lowered.isdigit() and int(lowered) >= 1):
        raise ValueError("must be a number of replicas (1 or more) or auto")
    return lowered


def _cpus(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if not 0 < value < float("inf"):
        raise ValueError("must be a positive number of CPUs")
    return value


def _trainer_errors(text: str) -> str:
    lowered = text.strip().lower()
    if lowered not in ("reward", "error"):
        raise ValueError("must be reward or error")
    return lowered


def _prefix(text: str) -> str:
    prefix = text.strip().rstrip("/")
    if prefix and not prefix.startswith("/"):
        raise ValueError("must start with /")
    return prefix


def _flush_spans(text: str) -> str:
    lowered = text.strip().lower()
    if lowered not in ("shutdown", "request", "none"):  # the SDK's three values
        raise ValueError("must be shutdown or request")
    return "shutdown" if lowered == "none" else lowered  # the exporter always drains at stop


def _log_format(text: str) -> str:
    lowered = text.strip().lower()
    if lowered not in ("text", "json"):
        raise ValueError("must be text or json")
    return lowered


def _level(text: str) -> str:
    lowered = text.strip().lower()
    if lowered not in _LEVELS:
        raise ValueError("must be debug, info, warning, error or critical")
    return lowered


@dataclass(frozen=True)
class Option:
    flag: str
    dest: str
    env: tuple[str, ...]
    parse: Callable[[str], Any]
    help: str
    metavar: str | None = None
    bare: bool = False  # may be given without a value: --tracing means --tracing=true


# fmt: off
OPTIONS: tuple[Option, ...] = (
    Option("--type", "func_type", ("FUNC_TYPE",), _func_type,
           "function type; taken from the class's base, and must agree with it if given",
           "{rollout,reward,group_reward}"),
    Option("--workspace", "workspace", ("WORKSPACE_DIR",), str,
           "directory the target is imported from (put first on sys.path)", "DIR"),
    Option("--host", "host", ("HOST",), str, "address to bind"),
    Option("--port", "port", ("PORT", "SERVER_PORT"), _int(0), "port to bind"),
    Option("--workers", "workers", ("WORKERS_COUNT",), _int(1),
           "worker processes; each runs setup() and has its own slots, queue and threads", "N"),
    Option("--heartbeat-timeout", "heartbeat_timeout", ("HEARTBEAT_TIMEOUT",), _seconds,
           "with --workers N: a worker whose event loop has not run for this long (sync code "
           "blocking an async def) is killed and replaced", "SECONDS"),
    Option("--concurrency", "concurrency", ("CONCURRENCY",), _int(1),
           "requests processed at once per worker", "N"),
    Option("--queue", "queue", ("THREAD_POOL_QUEUE",), _int(0),
           "requests waiting for a slot per worker; beyond it, 503 + Retry-After", "N"),
    Option("--threads", "threads", ("THREAD_POOL_WORKERS",), _int(1),
           "threads that run sync user code (process, setup, sub-rewards) per worker", "N"),
    Option("--isolation", "isolation", ("ISOLATION",), _isolation,
           "where sync user code runs: thread (a shared pool) or process (child processes; "
           "a call past its deadline is killed and its child replaced)", "{thread,process}"),
    Option("--processes", "processes", ("ISOLATION_PROCESSES",), _int(0),
           "child processes per worker with --isolation process; 0: as many as the CPUs "
           "this process may use (CPU affinity and cgroup quota)", "N"),
    Option("--sub-reward-errors", "sub_reward_errors", ("SUB_REWARD_ERRORS",), _sub_reward_errors,
           "a sub-reward that fails: zero (scores 0, the result succeeds, as in the SDK), "
           "fail (the whole result fails with SUB_REWARD_ERROR) or renormalize (it is left out "
           "and the weights of the others scaled to the same sum; all failed: fail); logged "
           "and counted either way", "{zero,fail,renormalize}"),
    Option("--timeout", "timeout", ("REQUEST_TIMEOUT",), _seconds,
           "per-request deadline in seconds, queueing included; then 504", "SECONDS"),
    Option("--grace", "grace", ("GRACE_PERIOD",), _seconds,
           "on SIGTERM, how long requests in flight may take to finish", "SECONDS"),
    Option("--max-body", "max_body", ("MAX_BODY_BYTES",), _int(1),
           "largest request body in bytes; beyond it, 413", "BYTES"),
    Option("--max-buffered", "max_buffered", ("MAX_BUFFERED_BYTES",), _int(1),
           "request-body bytes a worker holds at once (bodies being received or served, one "
           "of tiny JSON values as what it parses into); beyond it, 503 + Retry-After, and 413 "
           "for a body that alone is more; 8 x --max-body unless given", "BYTES"),
    Option("--body-timeout", "body_timeout", ("BODY_TIMEOUT",), _seconds,
           "seconds a client has to send a request's headers, and then its body; "
           "then 408 and the connection is closed", "SECONDS"),
    Option("--max-connections", "max_connections", ("MAX_CONNECTIONS",), _int(1),
           "open connections per worker (kept below the open-files limit); beyond it, "
           "a new connection is answered 503 and closed", "N"),
    Option("--log-level", "log_level", ("LOG_LEVEL",), _level, "debug, info, warning or error"),
    Option("--log-format", "log_format", ("LOG_FORMAT",), _log_format,
           "text lines, or json: one JSON object per line, the request's ids as fields",
           "{text,json}"),
    Option("--access-log", "access_log", ("ACCESS_LOG",), _bool,
           "log every request, not only failed and slow ones", "{true,false}", bare=True),
    Option("--tracing", "tracing", ("ENABLE_TRAJECTORY",), _bool,
           "export OpenTelemetry traces over OTLP/HTTP (OTEL_EXPORTER_OTLP_* configure it; "
           "OTEL_SDK_DISABLED=true wins)", "{true,false}", bare=True),
    Option("--flush-spans", "flush_spans", ("AGENTIC_RL_FORCE_FLUSH_MODE",), _flush_spans,
           "with --tracing: export spans in batches and at a graceful stop (shutdown), or "
           "after each response as well (request: for instances that may be frozen or "
           "killed between requests)", "{shutdown,request}"),
    Option("--slow-request", "slow_request", ("SLOW_REQUEST_SECONDS",), _seconds,
           "requests slower than this are logged", "SECONDS"),
    Option("--trainer-errors", "trainer_errors", ("TRAINER_ERRORS",), _trainer_errors,
           "on the trainer protocols, a failed or late reward answers reward 0.0 and a mark "
           "(reward) or an HTTP error (error)", "{reward,error}"),
    Option("--trainer-timeout", "trainer_timeout", ("TRAINER_TIMEOUT",), _seconds,
           "deadline of a trainer-protocol request (and --timeout if shorter); below the "
           "trainers' own (slime 120s, OpenRLHF 180s)", "SECONDS"),
    Option("--trainer-prefix", "trainer_prefix", ("TRAINER_PREFIX",), _prefix,
           "path prefix of the trainer protocols, e.g. /trainers", "PATH"),
    Option("--ground-truth-field", "ground_truth_field", ("GROUND_TRUTH_FIELD",), str,
           "NeMo Gym /verify: the row field passed as ground_truth", "NAME"),
    Option("--trainer-end-tokens", "trainer_end_tokens", ("TRAINER_END_TOKENS",), str,
           "OpenRLHF: special tokens stripped from the end of a response, comma-separated "
           "(empty: keep them)", "TOKENS"),
    Option("--trainer-max-samples", "trainer_max_samples", ("TRAINER_MAX_SAMPLES",), _int(1),
           "OpenRLHF: most samples in one request; beyond it, 413. A batch at the limit "
           "holds as much of the body budget as a whole body of the largest size", "N"),
    Option("--ray", "ray", ("SERVE_ON_RAY",), _bool,
           "serve on Ray Serve: join the cluster at RAY_ADDRESS, or start a local one "
           "(pip install -e '.[ray]')", "{true,false}", bare=True),
    Option("--replicas", "replicas", ("RAY_REPLICAS",), _replicas,
           "--ray: replicas of the function, or auto (between --min-replicas and "
           "--max-replicas, on requests in flight)", "{N,auto}"),
    Option("--min-replicas", "min_replicas", ("MIN_REPLICAS",), _int(1),
           "with --replicas auto, and the autoscaler of `manifests`", "N"),
    Option("--max-replicas", "max_replicas", ("MAX_REPLICAS",), _int(1),
           "with --replicas auto, and the autoscaler of `manifests`", "N"),
    Option("--ray-replica-cpus", "ray_replica_cpus", ("RAY_REPLICA_CPUS",), _cpus,
           "--ray: CPUs Ray reserves for each replica", "CPUS"),
)
# fmt: on

_DEFAULTS = Settings()


def add_options(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
    for option in OPTIONS:
        if names is not None and option.dest not in names:
            continue
        default = getattr(_DEFAULTS, option.dest)
        env = " or ".join(option.env)
        shown = "from the class" if default is None else _show(default, option)
        bare: dict[str, Any] = {"nargs": "?", "const": "true"} if option.bare else {}
        parser.add_argument(
            option.flag,
            dest=option.dest,
            default=None,
            metavar=option.metavar,
            help=f"{option.help} [env {env}; default {shown}]",
            **bare,
        )


def resolve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> Settings:
    """Settings from parsed arguments, the environment and the defaults, validated."""
    values: dict[str, Any] = {}
    target = getattr(args, "target", None) or environ.get("PROCESSOR_CLASS", "")
    values["target"] = target.strip()
    for option in OPTIONS:
        raw = getattr(args, option.dest, None)
        source = option.flag
        if raw is None:
            for name in option.env:
                if environ.get(name, "").strip():
                    raw, source = environ[name], name
                    break
        if raw is None:
            continue
        try:
            values[option.dest] = option.parse(str(raw))
        except ValueError as exc:
            raise SettingsError(f"{source}={raw!r}: {exc}") from None
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        values["tracing"] = False  # OpenTelemetry's own off switch wins over --tracing
    # The SDK's switch: ENABLE_LOGGING=false hides info lines, unless --log-level says otherwise.
    quiet = environ.get("ENABLE_LOGGING", "").strip().lower() in ("false", "0", "no", "off")
    if quiet and getattr(args, "log_level", None) is None:
        values["log_level"] = max(values.get("log_level", "info"), "warning", key=_LEVELS.index)
    max_body = values.get("max_body", _DEFAULTS.max_body)
    values.setdefault("max_buffered", 8 * max_body)
    if values["max_buffered"] < max_body:
        raise SettingsError("--max-buffered must be at least --max-body (one whole body)")
    return Settings(**values)
