"""``serve --ray``: the same ASGI app as a Ray Serve application.

Each replica builds the app the way a worker does (import the target, one ``setup()``),
and only counts as started once ``setup()`` has finished, so Serve routes no request to
a replica that would answer "starting". Serve's router and proxy do the rest: at most
``--concurrency`` requests in flight per replica (``max_ongoing_requests``), ``--queue``
more waiting (``max_queued_requests``, then 503), replicas fixed (``--replicas N``) or
autoscaled on requests in flight (``--replicas auto``, target 70% of ``--concurrency``),
a replica that dies replaced. ``/health``, ``/metrics`` and the trainer protocols are
served through Serve's HTTP proxy on ``--host``/``--port``; ``/metrics`` is the answering
replica's own.

With ``RAY_ADDRESS`` set, the application joins that cluster; otherwise a local cluster is
started in this process. Either way the workspace travels to the replicas as their
``working_dir`` and this project's packages (``runtime``, ``processors_base``) as
``py_modules``, so a node needs only their dependencies installed, not this project. A
replica whose app is not healthy, as ``/health`` decides (setup() not done, a broken
pool, every thread stuck), fails Serve's health check and is replaced.
SIGTERM or SIGINT deletes the application (and stops a cluster started here).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runtime.config import Settings
from runtime.logs import quiet_libraries
from runtime.serving.health import Health

__all__ = ["serve_on_ray"]

log = logging.getLogger("runtime")

PROXY_WAIT = 120.0  # for a replaced proxy: Serve waits longer for each new one


def serve_on_ray(settings: Settings) -> int:
    """Deploy, serve until SIGTERM/SIGINT, then delete the application; the exit code."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no reporting home
    try:
        import ray
        from ray import serve
    except ImportError:
        log.error("--ray needs Ray Serve: pip install -e '.[ray]' (or pip install 'ray[serve]')")
        return 2
    if settings.workers > 1:
        log.warning("--workers is ignored with --ray: Ray Serve runs --replicas instead")
    joined = bool(os.environ.get("RAY_ADDRESS"))
    # Replicas import the target from their working directory (the workspace) and the
    # runtime from its packages, both shipped: a node needs only the dependencies.
    runtime_env = {
        "working_dir": os.path.abspath(settings.workspace),
        "py_modules": _packages(),
        "excludes": ["__pycache__", "*.pyc"],
    }
    # SIGTERM or SIGINT sets ``stop``. While Ray starts, it is held until Ray has (an
    # interrupted start of a local cluster orphans its agents); while serve.run() waits
    # for the replicas, it interrupts that wait (Serve may route to replicas before
    # serve.run() returns), once; after that, it ends the serving.
    stop = _StopSignal()
    try:
        with _ray_keeps_our_sigterm_handler():
            if joined:
                ray.init(runtime_env=runtime_env, logging_level=logging.WARNING)
            else:
                ray.init(  # "local": a cluster of its own, never one `ray start` left here
                    address="local",
                    runtime_env=runtime_env,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                )
    except (SystemExit, KeyboardInterrupt):  # a Ray whose handlers we could not keep out
        stop.set()
    # Ray's core worker put in a C++ handler that logs the signal, then aborts the process:
    # ours goes back in front of it.
    stop.install()
    if stop.is_set():
        log.info("stopped while connecting to Ray")
        ray.shutdown()
        return 0
    name = settings.target.replace(":", ".").rsplit(".", 1)[-1]
    deployed = False  # serve.run() began: the application of this name is ours
    try:
        refused = _refusal(settings, name)
        if refused:
            log.error("%s", refused)
            return 2
        try:
            _start_serve(settings, stop)
            if not stop.is_set():
                stop.interrupt()
                deployed = True
                serve.run(_application(settings, name), name=name, route_prefix="/")
                stop.interrupts = False
                log.info(
                    "ready: %s on Ray Serve at http://%s:%d (%s replicas)",
                    name,
                    settings.host,
                    settings.port,
                    settings.replicas,
                )
                while not stop.wait(1.0):
                    pass
        except _Stopped:
            pass
        stop.interrupts = False
        sys.stdout.flush()
        if deployed:
            log.info(
                "stopping: deleting the Ray Serve application %s (its replicas get --grace, "
                "%gs, to finish)",
                name,
                settings.grace,
            )
            serve.delete(name)
        else:
            log.info("stopped before deploying anything")
    except Exception as exc:  # a replica's setup() failed, a port was taken...
        log.error("Ray Serve: %s: %s", type(exc).__name__, exc)
        return 3
    finally:
        if not joined:
            serve.shutdown()
        ray.shutdown()
    return 0


def _start_serve(settings: Settings, stop: _StopSignal) -> None:
    """``serve.start()``, and where Serve replaced its HTTP proxy while that waited on it,
    a wait for the new proxy (or for SIGTERM/SIGINT).

    Serve's controller gives a starting proxy 5 s to be ready, three times; on a busy
    machine it takes longer, and is killed and started again, with longer waits each time.
    ``serve.start()`` then fails with the first proxy's death although Serve runs.
    """
    import ray
    from ray import serve

    http = {"host": settings.host, "port": settings.port}
    try:
        serve.start(http_options=http)
        return
    except ray.exceptions.RayActorError as exc:
        if exc.actor_init_failed:  # its __init__ raised: a new one would too
            raise
        log.warning(
            "Ray Serve replaced its HTTP proxy while it started (%s: %s): waiting for the new one",
            type(exc).__name__,
            " ".join(str(exc).split()),
        )
    serve.start(http_options=http)  # connects to the Serve that runs (or starts a new one)
    deadline = time.monotonic() + PROXY_WAIT
    while not stop.wait(0.5):
        proxies = serve.status().proxies
        # DRAINING: a proxy on a node without replicas, serving still
        if proxies and all(status in ("HEALTHY", "DRAINING") for status in proxies.values()):
            return
        if time.monotonic() > deadline:
            states = sorted(str(getattr(state, "value", state)) for state in proxies.values())
            raise TimeoutError(
                f"Ray Serve's HTTP proxy was not healthy {PROXY_WAIT:g}s after it was "
                f"replaced (proxies: {', '.join(states) or 'none'}): see Ray's log above"
            )


def _refusal(settings: Settings, name: str) -> str:
    """Why the function cannot be deployed on this cluster ("" when it can): Serve runs
    here already with its proxy elsewhere, or an application of the same name runs
    (another process's: stopping this one would delete it), or the port is taken."""
    from ray import serve

    where = f"--host {settings.host} --port {settings.port}"
    serving_at = _proxy_address()
    if serving_at is None:  # no Serve on this cluster yet: its proxy will bind the port
        if not _port_free(settings.host, settings.port):
            return (
                f"{where} is in use (another server, or the Serve proxy of another Ray "
                "cluster: Ray's proxy would share the port with it)"
            )
        return ""
    if serving_at != (settings.host, settings.port):
        host, port = serving_at
        return (
            f"Serve already runs on this cluster, its proxy on {host}:{port}: it cannot move "
            f"to {where}; serve there (--host/--port), or stop Serve and every application "
            "on it first: RAY_ADDRESS=... python -c 'import ray; from ray import serve; "
            "ray.init(); serve.shutdown()'"
        )
    running = serve.status().applications.get(name)
    if running is not None and running.status != "DELETING":
        return (
            f"an application named {name} already runs on this cluster (another `serve "
            "--ray` of this function?): stop that process, or delete it with "
            "RAY_ADDRESS=... python -c 'import ray; from ray import serve; ray.init(); "
            f'serve.delete("{name}")\''
        )
    return ""


@contextlib.contextmanager
def _ray_keeps_our_sigterm_handler() -> Iterator[None]:
    """ray.init() puts in SIGTERM handlers of its own (exit 15; or, starting a local
    cluster, stop it and exit 1): kept out while it runs, where Ray allows it."""
    try:
        from ray._private import utils
    except ImportError:
        yield
        return
    setter = getattr(utils, "set_sigterm_handler", None)
    if setter is None:
        yield
        return
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = setter


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no owner
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _application(settings: Settings, name: str) -> Any:
    from ray import serve

    replica_settings = dataclasses.replace(settings, workspace=".", workers=1)
    options: dict[str, Any] = {
        "name": name,
        "max_ongoing_requests": settings.concurrency,
        "max_queued_requests": settings.queue if settings.queue > 0 else 1,
        "graceful_shutdown_timeout_s": settings.grace,
        "ray_actor_options": {"num_cpus": settings.ray_replica_cpus},
    }
    if settings.replicas == "auto":
        options["autoscaling_config"] = {
            "min_replicas": settings.min_replicas,
            "max_replicas": settings.max_replicas,
            "target_ongoing_requests": max(1, round(settings.concurrency * 0.7)),
        }
    else:
        options["num_replicas"] = int(settings.replicas)
    deployment = serve.deployment(**options)(serve.ingress()(FunctionReplica))
    return deployment.bind(dataclasses.asdict(replica_settings))


class FunctionReplica:
    """One Serve replica: the function's app, as one worker of ``serve`` would run it."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._function_settings = Settings(**settings)
        self._function_app: Any = None  # not "app": the Serve wrapper has one

    def __serve_build_asgi_app__(self) -> Any:
        from runtime.serving.server import build_app

        settings = self._function_settings
        level = logging.getLevelName(settings.log_level.upper())
        logging.getLogger("runtime").setLevel(level)  # Ray owns handlers
        quiet_libraries(level)
        self._function_app = build_app(settings)
        return _StartedWhenReady(self._function_app)

    async def check_health(self) -> None:
        """Serve's health check, /health's decision: a replica that cannot serve is replaced."""
        app = self._function_app
        if app is None:
            raise RuntimeError("the function is not built")
        status, reason = app.health()
        if status is not Health.READY:
            raise RuntimeError(f"the function is {status}" + (f": {reason}" if reason else ""))


class _StartedWhenReady:
    """The app, whose lifespan startup completes only once ``setup()`` has finished (and
    fails if it failed), so that Serve counts the replica as started only then."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        failed = asyncio.Event()
        self.app.on_fatal = failed.set

        async def send_when_ready(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                while self.app.state == Health.STARTING and not failed.is_set():
                    await asyncio.sleep(0.05)
                if failed.is_set():
                    message = {"type": "lifespan.startup.failed", "message": "setup() failed"}
            await send(message)

        await self.app(scope, receive, send_when_ready)


def _proxy_address() -> tuple[str, int] | None:
    """Where the cluster's Serve proxy listens: fixed by whoever started Serve first."""
    try:
        from ray.serve.context import _get_global_client

        config = _get_global_client().http_config
        return str(config.host), int(config.port)
    except Exception:  # a Ray whose private API moved: skip the check
        return None


def _packages() -> list[str]:
    """This project's packages, as directories for Ray's ``py_modules``."""
    import processors_base
    import runtime

    return [str(Path(p.__path__[0])) for p in (runtime, processors_base)]  # their directories


class _Stopped(BaseException):
    """A signal while serve.run() waits: not an Exception, so that no handler in Ray's
    code swallows it."""


class _StopSignal:
    """Set by SIGTERM or SIGINT: a plain flag, as a signal handler must take no lock (a
    threading.Event's set() there deadlocks when the signal lands while the wait() it
    interrupts holds the Event's lock). While ``interrupts`` is true, the first signal also
    raises ``_Stopped`` in the main thread (once: a second must not break the cleanup)."""

    def __init__(self) -> None:
        self.received = False
        self.interrupts = False
        self.install()

    def set(self) -> None:
        self.received = True

    def is_set(self) -> bool:
        return self.received

    def wait(self, timeout: float) -> bool:
        """Whether a signal came, waiting up to ``timeout`` for one (seen within 0.1 s)."""
        end = time.monotonic() + timeout
        while not self.received and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
        return self.received

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._received)

    def interrupt(self) -> None:
        """From now on a signal raises ``_Stopped``; at once if one came already."""
        self.interrupts = True
        if self.is_set():
            self.interrupts = False
            raise _Stopped

    def _received(self, signum: int, frame: object) -> None:
        self.received = True
        if self.interrupts:
            self.interrupts = False
            raise _Stopped(signal.Signals(signum).name)
