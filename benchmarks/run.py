"""Side-by-side benchmark: this runtime, the DashScope SDK's function server, and a bare
ASGI app on the same uvicorn, one worker each, in one run, on loopback.

    python benchmarks/run.py                 # about 10 minutes; writes benchmarks/RESULTS.md
    python benchmarks/run.py --duration 5    # shorter runs
    python benchmarks/run.py --profile       # also py-spy profiles of the echo scenario
    python benchmarks/run.py --profile --profile-before COMMIT   # and of COMMIT's runtime

The SDK is compared at its best: its server on ``uvicorn[standard]`` (uvloop and
httptools, as this runtime runs), with the plain install as a second row. Both are
installed into scratch virtual environments (benchmarks/.sdk-*-venv) at benchmark time
only; the SDK is never a dependency of the project. Load comes from wrk (Debian's
package) and, for the overload and fixed-rate scenarios, benchmarks/loadgen.py. Scenario
10 (Ray Serve) runs where a Python with Ray is found: this one, or RAY_PYTHON's.
"""

from __future__ import annotations

import argparse
import atexit
import compileall
import contextlib
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SDK_VENVS = {"best": HERE / ".sdk-std-venv", "plain": HERE / ".sdk-plain-venv"}
SDK_INSTALL = {"best": ["dashscope", "uvicorn[standard]"], "plain": ["dashscope"]}
PY = sys.executable
BODY = json.dumps(
    {
        "func_type": "reward",
        "ground_truth": "42",
        "agent_output": {
            "messages": [
                {"role": "user", "content": "What is 6 times 7?"},
                {"role": "assistant", "content": "The answer is 42."},
            ]
        },
    }
)
TARGETS = {
    "s1_ratio": 6.0,
    "s1_bare": 0.6,
    "s2_ratio": 4.0,
    "s3_fraction": 0.9,
    "cold_ratio": 0.5,
    "rss_ratio": 1.0,
    "tracing": 0.8,
    "group_bare": 0.6,
    "group_ratio": 6.0,
    "long_bare": 0.95,
    "long_p99": 1.05,
    "long_rss_mb": 300,
}


def group_body(outputs: int = 64, answer_chars: int = 3000) -> str:
    """A group reward request of realistic size: ``outputs`` trajectories of a few KB."""
    answer = ("Let us work through it step by step. " * (answer_chars // 37 + 1))[:answer_chars]
    return json.dumps(
        {
            "func_type": "group_reward",
            "ground_truth": "42",
            "agent_outputs": [
                {
                    "messages": [
                        {"role": "system", "content": "You are a careful math tutor."},
                        {"role": "user", "content": f"Problem {i}: what is 6 times 7?"},
                        {"role": "assistant", "content": f"{answer} The answer is 42."},
                    ],
                    "rollout_extra": {"index": i, "tool_calls": 2},
                    "rollout_metrics": {"turns": 3.0, "tokens": 812.0},
                }
                for i in range(outputs)
            ],
        }
    )


LONG_CONNECTIONS = 5000  # scenario 9: rollouts in flight at once, each awaiting the LLM
LONG_WAIT = 5.0  # seconds the stand-in LLM takes to answer
# Its latency under a steady load: rollouts arriving evenly at the bound, LONG_CONNECTIONS
# in flight (wrk's closed loop sends them in waves of thousands), over a tenth more
# connections so that none waits for one while the server keeps up (one that does not
# makes them wait: counted as latency); counted once the connections are open and the
# first answers are back.
LONG_RATE = LONG_CONNECTIONS / LONG_WAIT
LONG_STEADY_CONNECTIONS = LONG_CONNECTIONS + LONG_CONNECTIONS // 10
LONG_WARMUP = 2 * LONG_WAIT
# the runtime's defaults (128 requests at once, 1,024 connections) would queue or refuse most
LONG_OPTIONS = (
    "--concurrency",
    str(LONG_STEADY_CONNECTIONS),
    "--max-connections",
    str(LONG_STEADY_CONNECTIONS + 100),
)


def rollout_body(llm_url: str) -> str:
    """A rollout request naming the stand-in LLM as its model (scenario 9)."""
    return json.dumps(
        {
            "func_type": "rollout",
            "messages": [{"role": "user", "content": "What is 6 times 7? Think it over."}],
            "ground_truth": "42",
            "sampling_params": {"temperature": 0.7, "max_tokens": 256},
            "model_resource": {
                "model_name": "stand-in",
                "base_url": f"{llm_url}/v1",
                "api_key": "sk-stand-in",
            },
        }
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_sdk(kind: str) -> Path:
    venv = SDK_VENVS[kind]
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"installing the DashScope SDK into {venv.name} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *SDK_INSTALL[kind]], check=True
        )
    return python


def lua_post(path: Path, body: str) -> Path:
    """A wrk script at ``path`` that POSTs ``body`` as JSON."""
    path.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(body)}\n"
    )
    return path


def ensure_wrk() -> str:
    wrk = shutil.which("wrk")
    if wrk is None:
        sys.exit("wrk is missing: apt-get install wrk")
    return wrk


def ensure_py_spy() -> str:
    """py-spy, looked for before the first run rather than at the first profile."""
    py_spy = shutil.which("py-spy", path=f"{Path(PY).parent}:{os.environ.get('PATH', '')}")
    if py_spy is None:
        sys.exit("py-spy is missing (for --profile): pip install py-spy")
    return py_spy


@dataclass
class Server:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    startup: float = 60.0  # seconds it may take to answer /health (a Ray cluster: more)
    tree: bool = False  # its figures sum its process tree (Ray's raylet, proxy, replica...)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_listening(self) -> None:
        """Start a server without a /health (the OTLP sink) and wait for its port."""
        self.proc = subprocess.Popen(
            [part.replace("{port}", str(self.port)) for part in self.command],
            cwd=HERE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not start")

    def start(self) -> float:
        """Start and wait for the first 200 from /health; the seconds that took."""
        env = {**os.environ, **self.env}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            [part.replace("{port}", str(self.port)) for part in self.command],
            cwd=HERE,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = started + self.startup
        while time.perf_counter() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return time.perf_counter() - started
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            time.sleep(0.005)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer /health within {self.startup:g} s")

    def pids(self) -> list[int]:
        """The server's process, and with ``tree`` every process under it."""
        assert self.proc is not None
        return process_tree(self.proc.pid) if self.tree else [self.proc.pid]

    def peak_rss_mb(self) -> float:
        """Peak RSS; with ``tree``, the sum of each process's own peak."""
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{pid}/status").read_text()
                total += int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]
        return total / 1024

    def cpu(self) -> float:
        """CPU seconds its processes have used so far."""
        total = 0.0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                total += process_cpu(pid)
        return total

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


RUNTIME_ROOT: str | None = None  # --root: serve the runtime from another checkout


def runtime_server(cls: str, *extra: str, root: str | None = None) -> Server:
    server = Server(
        "runtime",
        [
            PY,
            "-m",
            "runtime",
            "serve",
            f"functions.ours:{cls}",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--log-level",
            "warning",
            *extra,
        ],
    )
    if root or RUNTIME_ROOT:
        server.env["PYTHONPATH"] = root or RUNTIME_ROOT  # type: ignore[assignment]
    return server


def sdk_server(
    cls: str, sdk: dict[str, Path], kind: str = "best", func_type: str = "reward"
) -> Server:
    env = {
        "FUNC_TYPE": func_type,
        "PROCESSOR_CLASS": f"functions.sdk.{cls}",
        "WORKERS_COUNT": "1",
        "PYTHONPATH": str(HERE),
    }
    name = "sdk, uvicorn[standard]" if kind == "best" else "sdk, plain uvicorn"
    server = Server(
        name,
        [str(sdk[kind]), "-m", "dashscope.finetune.reinforcement.component.server.server"],
        env,
    )
    server.env["SERVER_PORT"] = str(server.port)
    return server


def uvicorn_server(name: str, app: str, env: dict[str, str] | None = None) -> Server:
    """A plain ASGI app (from benchmarks/) on the same uvicorn, as a reference point."""
    command = [PY, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", "{port}",
               "--log-level", "warning", "--no-access-log"]  # fmt: skip
    return Server(name, command, env or {})


def bare_server(wait: float = 0.0) -> Server:
    return uvicorn_server("bare", "bare_app:app", {"BARE_WAIT": str(wait)})


def ray_python() -> tuple[str | None, str]:
    """A Python with Ray Serve and this runtime: RAY_PYTHON's (as .ci/run names it), else
    this one if it has Ray; else None and why scenario 10 is not run."""
    python = os.environ.get("RAY_PYTHON") or (PY if importlib.util.find_spec("ray") else None)
    if python is None:
        return None, "no Python with Ray Serve here (set RAY_PYTHON)"
    try:
        check = subprocess.run(
            [python, "-c", "import ray.serve, orjson, runtime"], capture_output=True, text=True
        )
    except OSError as exc:
        return None, f"RAY_PYTHON {python}: {exc.strerror}"
    if check.returncode != 0:
        return None, f"{python} cannot import ray.serve, orjson and runtime"
    return python, ""


# no usage reports; no token auth, which Ray 2.60 turns on for a local cluster, writing
# ~/.ray/auth_token (a later `ray start` on this machine would then require it)
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def ray_servers(python: str, workspace: Path) -> list[Server]:
    """Scenario 10: a plain Ray Serve deployment of the echo (benchmarks/bare_ray.py), and
    ``serve --ray`` of the runtime's, one replica each on a local cluster of its own."""
    bare = Server("bare Ray Serve", [python, str(HERE / "bare_ray.py"), "{port}"], dict(RAY_ENV))
    ours = Server(
        "runtime, serve --ray",
        [python, "-m", "runtime", "serve", "functions.ours:EchoReward", "--ray",
         "--replicas", "1", "--workspace", str(workspace), "--host", "127.0.0.1",
         "--port", "{port}", "--log-level", "warning"],
        dict(RAY_ENV),
    )  # fmt: skip
    if RUNTIME_ROOT:
        ours.env["PYTHONPATH"] = RUNTIME_ROOT
    for server in (bare, ours):
        server.startup, server.tree = 180.0, True
    return [bare, ours]


CLIENT_BOUND = 0.9  # a load generator using this share of its cores limits the figure


def children_cpu() -> float:
    """CPU seconds of this process's ended children: the load generator, once it exits."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, as /proc lists their children now."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(child) for child in (task / "children").read_text().split()]
    return found


def process_cpu(pid: int) -> float:
    """CPU seconds a running process has used so far (a server)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def generated(
    command: list[str], threads: int, timeout: float | None = None
) -> tuple[str, dict[str, float]]:
    """Run a load generator; its output, and the share of its cores it used (``client_cpu``
    in cores, ``client_bound`` when it is over CLIENT_BOUND of them)."""
    cpu, started = children_cpu(), time.monotonic()
    out = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=timeout
    ).stdout
    cores = (children_cpu() - cpu) / (time.monotonic() - started)
    return out, {"client_cpu": cores, "client_bound": float(cores >= CLIENT_BOUND * threads)}


def wrk(
    wrk_bin: str,
    url: str,
    connections: int,
    seconds: float,
    script: Path,
    timeout: float | None = None,
) -> dict[str, float]:
    out, cpu = generated(
        [
            wrk_bin,
            "-t1",
            f"-c{connections}",
            f"-d{seconds:g}s",
            *([f"--timeout={timeout:g}s"] if timeout else []),
            "--latency",
            "-s",
            str(script),
            f"{url}/api/v1",
        ],
        threads=1,
    )

    def latency(label: str) -> float:
        found = re.search(rf"{label}\s+([\d.]+)(us|ms|s)\b", out)
        if not found:
            return float("nan")
        return float(found.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[found.group(2)]

    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50": latency("50%"),
        "p99": latency("99%"),
        "non_2xx": float(non_2xx.group(1)) if non_2xx else 0.0,
        "socket_errors": float(sum(int(g) for g in errors.groups())) if errors else 0.0,
        **cpu,
    }


def loadgen(
    url: str,
    connections: int,
    seconds: float,
    body_file: Path,
    rate: float | None = None,
    warmup: float = 0.0,
) -> dict[str, float]:
    """``connections`` posting for ``seconds``; with ``rate``, open-loop at that rate, the
    latencies of the requests due in the first ``warmup`` seconds not counted (a failure
    is), and req/s what was answered."""
    out, cpu = generated(
        [
            PY,
            str(HERE / "loadgen.py"),
            f"{url}/api/v1",
            str(body_file),
            str(connections),
            str(seconds),
            *([f"{rate:.0f}", f"{warmup:g}"] if rate else []),
        ],
        threads=1,
        timeout=seconds + 120,  # a request that never ends would hang the run
    )
    results = json.loads(out)
    accepted = sorted(latency for status, latency, _ in results if status == 200)
    rejected = sum(1 for status, _, _ in results if status == 503)
    total = len(results)
    if rate:  # what the server answered a second, not what was sent: from first to last answer
        answered = [at for status, _, at in results if status == 200]
        seconds = max(answered) - min(answered) if len(answered) > 1 else float("nan")

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")

    return {
        "rps": total / seconds,
        "accepted_rps": len(accepted) / seconds,
        "p50": pct(accepted, 0.50),
        "p99": pct(accepted, 0.99),
        "non_2xx": float(total - len(accepted)),
        "share_503": rejected / total if total else 0.0,
        **cpu,
    }


def measure(server: Server, run: callable, warmup: callable | None = None) -> dict[str, float]:  # type: ignore[valid-type]
    server.start()
    try:
        if warmup is not None:
            warmup(server)
        cpu, started = server.cpu(), time.monotonic()
        result = run(server)
        result["server_cpu"] = (server.cpu() - cpu) / (time.monotonic() - started)
        result["rss_mb"] = server.peak_rss_mb()
        return result
    finally:
        server.stop()


def cold_start(make: callable, runs: int = 3) -> float:  # type: ignore[valid-type]
    times = []
    for _ in range(runs):
        server = make()
        try:
            times.append(server.start())
        finally:
            server.stop()
    return statistics.median(times)


def machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) // (
        1024 * 1024
    )  # type: ignore[union-attr]
    return f"{os.cpu_count()} cores ({cpu}), {mem} GiB, Linux {platform.release()}, Python {platform.python_version()}"


def profile(py_spy: str, server: Server, seconds: float, out: Path) -> list[tuple[str, float]]:
    """py-spy's samples of ``server`` over ``seconds``: the top frames by own time."""
    assert server.proc is not None
    done = subprocess.run(
        [py_spy, "record", "--pid", str(server.proc.pid), "--duration", f"{seconds:.0f}",
         "--rate", "250", "--format", "raw", "--nonblocking", "--output", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:  # not allowed to trace (ptrace in a container, say): say why
        sys.exit(f"py-spy failed: {done.stderr.strip()}")
    own: dict[str, int] = {}
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        leaf = re.sub(r":\d+\)$", ")", stack.rsplit(";", 1)[-1])  # per function, not line
        leaf = re.sub(r" \(/.*?site-packages/", " (", leaf)
        leaf = re.sub(r" \(/[^)]*/(runtime|processors_base)/", r" (\1/", leaf)
        leaf = leaf or "(unreadable sample: py-spy --nonblocking)"  # read while it changed
        own[leaf] = own.get(leaf, 0) + int(count)
        total += int(count)
    return [(frame, n / total) for frame, n in sorted(own.items(), key=lambda x: -x[1])[:15]]


CODEC_PROBE = r"""
import json, sys, time
body = open(sys.argv[1], "rb").read()
from {package} import GroupRewardInput, GroupRewardOutput, GroupReward, Reward
def once():
    data = json.loads(body)
    model = GroupRewardInput.model_validate(data)
    out = GroupRewardOutput(reward=GroupReward(rewards=[Reward(reward_score=1.0) for _ in model.agent_outputs]))
    return {serialise}
for _ in range(20): once()
started = time.perf_counter()
for _ in range(200): once()
print((time.perf_counter() - started) / 200)
"""


def codec_seconds(python: str, package: str, body_file: Path, serialise: str) -> float:
    """Seconds one group request spends in JSON parsing, validation and serialisation."""
    code = CODEC_PROBE.replace("{package}", package).replace("{serialise}", serialise)
    out = subprocess.run(
        [python, "-c", code, str(body_file)], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": RUNTIME_ROOT or str(ROOT)},
    )  # fmt: skip
    return float(out.stdout.strip())


def main() -> None:
    global RUNTIME_ROOT
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measured run")
    parser.add_argument("--output", default=str(HERE / "RESULTS.md"))
    parser.add_argument(
        "--profile", action="store_true", help="profile the runtime in scenario 1 with py-spy"
    )
    parser.add_argument(
        "--profile-only",
        action="store_true",
        help="only profile the runtime on the echo reward; print the top frames",
    )
    parser.add_argument("--root", help="serve the runtime from this checkout (profile a commit)")
    parser.add_argument(
        "--profile-before",
        metavar="COMMIT",
        help="with --profile: also profile the runtime of COMMIT (a git worktree) on the same "
        "load, for a before and after table",
    )
    args = parser.parse_args()
    if args.profile_before and not args.profile:
        parser.error("--profile-before profiles beside --profile: give both")
    RUNTIME_ROOT = args.root
    seconds = args.duration
    wrk_bin = ensure_wrk()
    py_spy = ensure_py_spy() if args.profile or args.profile_only else ""
    work = Path(tempfile.mkdtemp(prefix="rl-bench-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # a failed run's too
    script = lua_post(work / "post.lua", BODY)
    body_file = work / "body.json"
    body_file.write_text(BODY)
    group_file = work / "group.json"
    group_file.write_text(group_body())
    group_script = lua_post(work / "group.lua", group_file.read_text())
    # 64 trajectories of 32 KB: 2 MB a request
    big_group_script = lua_post(work / "group32.lua", group_body(answer_chars=32_000))

    def drive(connections: int, lua: Path = script) -> callable:  # type: ignore[valid-type]
        return lambda server: wrk(wrk_bin, server.url, connections, seconds, lua)

    def warm(connections: int, lua: Path = script) -> callable:  # type: ignore[valid-type]
        return lambda server: wrk(wrk_bin, server.url, connections, 2, lua)

    if args.profile_only:
        server = runtime_server("EchoReward")
        server.start()
        try:
            warm(32)(server)
            load = subprocess.Popen(
                [wrk_bin, "-t1", "-c32", f"-d{seconds + 2:g}s", "-s", str(script),
                 f"{server.url}/api/v1"], stdout=subprocess.DEVNULL,
            )  # fmt: skip
            frames = profile(py_spy, server, seconds, work / "profile.txt")
            load.wait()
        finally:
            server.stop()
        for frame, share in frames:
            print(f"{share:6.1%}  {frame}")
        return

    sdk = {kind: ensure_sdk(kind) for kind in SDK_VENVS}
    # Bytecode of the runtime served, as `pip install` writes it for an installed runtime
    # (the image's) and for the SDK: without it each cold start would also compile the
    # runtime's sources (about 40 ms here when PYTHONDONTWRITEBYTECODE is set).
    root = Path(RUNTIME_ROOT or ROOT)
    for package in ("runtime", "processors_base"):
        compileall.compile_dir(root / package, quiet=1)
    rows: list[tuple[str, str, dict[str, float]]] = []
    profiled: list[tuple[str, float]] = []

    def record(
        scenario: str, server: Server, run: callable, warmup: callable | None = None
    ) -> dict[str, float]:  # type: ignore[valid-type]
        print(f"  {scenario}: {server.name} ...", file=sys.stderr)
        result = measure(server, run, warmup)
        rows.append((scenario, server.name, result))
        return result

    def profile_under_load(server: Server) -> list[tuple[str, float]]:
        load = subprocess.Popen(
            [wrk_bin, "-t1", "-c32", f"-d{seconds + 2:g}s", "-s", str(script),
             f"{server.url}/api/v1"], stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            return profile(py_spy, server, seconds, work / "profile.txt")
        finally:
            load.wait()

    def echo_with_profile(server: Server) -> dict[str, float]:
        result = drive(32)(server)
        if args.profile:
            profiled.extend(profile_under_load(server))
        return result

    before: tuple[str, float, list[tuple[str, float]]] | None = None
    if args.profile and args.profile_before:
        print(f"profile of the runtime at {args.profile_before}", file=sys.stderr)
        checkout = work / "before"
        git = ["git", "-C", str(ROOT)]
        subprocess.run([*git, "worktree", "add", "--detach", str(checkout), args.profile_before],
                       check=True, capture_output=True)  # fmt: skip
        try:
            old = runtime_server("EchoReward", root=str(checkout))
            old.start()
            try:
                warm(32)(old)
                rate = drive(32)(old)["rps"]
                before = (args.profile_before, rate, profile_under_load(old))
            finally:
                old.stop()
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(checkout)], check=False)

    print("scenario 1: async echo reward, 32 connections", file=sys.stderr)
    s1 = {  # in this order, the runtime's two ratios each compare runs back to back
        "bare": record("1 async echo", bare_server(), drive(32), warm(32)),
        "runtime": record(
            "1 async echo", runtime_server("EchoReward"), echo_with_profile, warm(32)
        ),
        "sdk": record("1 async echo", sdk_server("EchoReward", sdk), drive(32), warm(32)),
        "sdk plain": record(
            "1 async echo", sdk_server("EchoReward", sdk, "plain"), drive(32), warm(32)
        ),
    }

    print("scenario 2: sync echo reward, 32 connections", file=sys.stderr)
    s2 = {
        "runtime": record("2 sync echo", runtime_server("SyncEchoReward"), drive(32), warm(32)),
        "sdk": record("2 sync echo", sdk_server("SyncEchoReward", sdk), drive(32), warm(32)),
        "sdk plain": record(
            "2 sync echo", sdk_server("SyncEchoReward", sdk, "plain"), drive(32), warm(32)
        ),
    }

    print("scenario 3: I/O-bound async reward (100 ms), 400 connections", file=sys.stderr)
    s3 = {
        "runtime": record(
            "3 async wait 100ms",
            runtime_server("WaitReward", "--concurrency", "400", "--queue", "400"),
            drive(400),
            warm(400),
        ),
        "sdk": record("3 async wait 100ms", sdk_server("WaitReward", sdk), drive(400), warm(400)),
        "bare": record("3 async wait 100ms", bare_server(wait=0.1), drive(400), warm(400)),
    }

    print(
        "scenario 4: overload at twice the capacity (100 slots, 200 connections)", file=sys.stderr
    )
    s4 = {
        "runtime": record(
            "4 overload 2x",
            runtime_server("WaitReward", "--concurrency", "100", "--queue", "0"),
            lambda server: loadgen(server.url, 200, seconds, body_file),
        ),
        "sdk": record(
            "4 overload 2x",
            sdk_server("WaitReward", sdk),
            lambda server: loadgen(server.url, 200, seconds, body_file),
        ),
    }

    print("scenario 5: tracing on (exporting to a local OTLP sink) against off", file=sys.stderr)
    sink = uvicorn_server("otlp sink", "otlp_sink:app")
    sink.start_listening()
    try:
        # off, then on, back to back: the ratio's two sides under the same conditions (a
        # shared machine's speed drifts between scenarios minutes apart)
        untraced = runtime_server("EchoReward")
        untraced.name = "runtime, tracing off"
        s5 = {"off": record("5 tracing on vs off", untraced, drive(32), warm(32))}
        traced = runtime_server("EchoReward", "--tracing")
        traced.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.url
        traced.name = "runtime, tracing on"
        s5["on"] = record("5 tracing on vs off", traced, drive(32), warm(32))
    finally:
        sink.stop()

    print("scenario 6: group reward, 64 trajectories of 3 KB and of 32 KB", file=sys.stderr)
    s6 = {
        "bare": record(
            "6 group reward 64x3KB", bare_server(), drive(8, group_script), warm(8, group_script)
        ),
        "runtime": record(
            "6 group reward 64x3KB",
            runtime_server("GroupEcho"),
            drive(8, group_script),
            warm(8, group_script),
        ),
        "sdk": record(
            "6 group reward 64x3KB",
            sdk_server("GroupEcho", sdk, func_type="group_reward"),
            drive(8, group_script),
            warm(8, group_script),
        ),
    }
    for name, server in (
        ("bare", bare_server),
        ("runtime", lambda: runtime_server("GroupEcho")),
        ("sdk", lambda: sdk_server("GroupEcho", sdk, func_type="group_reward")),
    ):
        s6[f"{name} 32KB"] = record(
            "6 group reward 64x32KB",
            server(),
            drive(8, big_group_script),
            warm(8, big_group_script),
        )
    s6["runtime codec"] = codec_seconds(
        PY, "processors_base", group_file, "out.__pydantic_serializer__.to_json(out)"
    )
    s6["sdk codec"] = codec_seconds(
        str(sdk["best"]), "dashscope.finetune.reinforcement", group_file,
        "json.dumps(out.model_dump())",
    )  # fmt: skip

    print("scenario 7: latency at half of each server's echo maximum", file=sys.stderr)
    s7 = {
        "runtime": record(
            "7 echo at half max rate",
            runtime_server("EchoReward"),
            lambda server: loadgen(server.url, 32, seconds, body_file, s1["runtime"]["rps"] / 2),
        ),
        "sdk": record(
            "7 echo at half max rate",
            sdk_server("EchoReward", sdk),
            lambda server: loadgen(server.url, 32, seconds, body_file, s1["sdk"]["rps"] / 2),
        ),
    }

    print("scenario 8: cold start (process start to the first 200 from /health)", file=sys.stderr)
    cold = {
        "runtime": cold_start(lambda: runtime_server("EchoReward")),
        "sdk": cold_start(lambda: sdk_server("EchoReward", sdk)),
        "bare": cold_start(bare_server),
    }

    print(
        f"scenario 9: {LONG_CONNECTIONS} rollouts held {LONG_WAIT:g} s each by a stand-in LLM",
        file=sys.stderr,
    )
    llm = bare_server(wait=LONG_WAIT)
    llm.name = "stand-in LLM"
    llm.start()
    try:
        rollout = rollout_body(llm.url)
        rollout_file = work / "rollout.json"
        rollout_file.write_text(rollout)
        rollout_script = lua_post(work / "rollout.lua", rollout)
        long_seconds = max(30.0, 3 * seconds)

        def hold(server: Server) -> dict[str, float]:
            return wrk(wrk_bin, server.url, LONG_CONNECTIONS, long_seconds, rollout_script, 60)

        def steady(server: Server) -> dict[str, float]:
            return loadgen(
                server.url, LONG_STEADY_CONNECTIONS, long_seconds + LONG_WARMUP, rollout_file,
                LONG_RATE, LONG_WARMUP,
            )  # fmt: skip

        servers = {
            "bare": bare_server,
            "runtime": lambda: runtime_server("LongRollout", *LONG_OPTIONS),
            "sdk": lambda: sdk_server("LongRollout", sdk, func_type="rollout"),
        }
        s9 = {name: record("9 rollouts held 5 s", make(), hold) for name, make in servers.items()}
        for name, make in servers.items():
            s9[f"{name} steady"] = record(
                f"9 the same, {LONG_RATE:.0f} a second, evenly", make(), steady
            )
        s9["llm rss"] = {"rss_mb": llm.peak_rss_mb()}
    finally:
        llm.stop()

    s10: dict[str, Any] = {}
    ray, s10["skipped"] = ray_python()
    if ray is not None:
        print(
            "scenario 10: the echo reward through Ray Serve's proxy, one replica", file=sys.stderr
        )
        workspace = work / "ray-workspace"  # only the functions travel to the replica
        shutil.copytree(HERE / "functions", workspace / "functions")
        try:
            for name, server in zip(("bare", "runtime"), ray_servers(ray, workspace), strict=True):
                s10[name] = record("10 echo via Ray Serve", server, drive(32), warm(32))
        except (RuntimeError, subprocess.CalledProcessError) as exc:  # the rest still counts
            s10["skipped"] = f"failed: {exc}"
    if s10["skipped"]:
        print(f"scenario 10 not run: {s10['skipped']}", file=sys.stderr)

    report = render(rows, s1, s2, s3, s4, s5, s6, s7, cold, s9, s10, seconds, profiled, before)
    Path(args.output).write_text(report)
    print(report)


def bound(*results: dict[str, float]) -> str:
    """The mark of a figure drawn from a client-bound run."""
    return " *client-bound*" if any(r.get("client_bound") for r in results) else ""


def render(rows, s1, s2, s3, s4, s5, s6, s7, cold, s9, s10, seconds, profiled, before=None) -> str:  # type: ignore[no-untyped-def]
    lines = [
        "# Benchmark results",
        "",
        f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine()}.",
        f"One worker per server; load from wrk (1 thread) or benchmarks/loadgen.py on the same machine, "
        f"{seconds:g} s per run after a 2 s warm-up. Produced by `python benchmarks/run.py`. "
        "The SDK's server runs at its best, on `uvicorn[standard]` (uvloop, httptools) as this runtime "
        "does; `sdk, plain uvicorn` is its default install.",
        "",
        "CPU columns: cores the load generator and the server used during the run. A row whose",
        f"load generator used over {CLIENT_BOUND:.0%} of its one thread's core is marked",
        "*client-bound*: its req/s is the generator's limit, not the server's, and so is any ratio",
        "drawn from it (marked the same way below).",
        "",
        "| scenario | server | req/s | p50 ms | p99 ms | non-2xx, errors | peak RSS MB | "
        "load gen CPU | server CPU |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario, name, r in rows:
        extra = f" ({r['share_503']:.0%} 503)" if "share_503" in r else ""
        errors = f", {r['socket_errors']:.0f}" if r.get("socket_errors") else ""
        lines.append(
            f"| {scenario} | {name} | {r['rps']:.0f}{bound(r)} | {r['p50']:.1f} | {r['p99']:.1f} | "
            f"{r['non_2xx']:.0f}{errors}{extra} | {r['rss_mb']:.0f} | {r['client_cpu']:.2f} | "
            f"{r['server_cpu']:.2f} |"
        )
    lines += [
        "",
        "| cold start | runtime | sdk | bare |",
        "|---|---:|---:|---:|",
        f"| seconds to first 200 on /health (median of 3) | {cold['runtime']:.2f} | {cold['sdk']:.2f} | "
        f"{cold['bare']:.2f} |",
        "",
    ]
    ratio1 = s1["runtime"]["rps"] / s1["sdk"]["rps"]
    bare1 = s1["runtime"]["rps"] / s1["bare"]["rps"]
    ratio2 = s2["runtime"]["rps"] / s2["sdk"]["rps"]
    fraction3 = s3["runtime"]["rps"] / 4000
    cold_ratio = cold["runtime"] / cold["sdk"]
    rss_ratio = s1["runtime"]["rss_mb"] / s1["sdk"]["rss_mb"]
    tracing = s5["on"]["rps"] / s5["off"]["rps"]
    share = {k: s6[f"{k} codec"] * s6[k]["rps"] for k in ("runtime", "sdk")}
    group_bare = s6["runtime"]["rps"] / s6["bare"]["rps"]
    group_ratio = s6["runtime"]["rps"] / s6["sdk"]["rps"]
    group_bare32 = s6["runtime 32KB"]["rps"] / s6["bare 32KB"]["rps"]
    group_ratio32 = s6["runtime 32KB"]["rps"] / s6["sdk 32KB"]["rps"]
    long_bound = LONG_CONNECTIONS / LONG_WAIT
    long_bare = s9["runtime"]["rps"] / s9["bare"]["rps"]

    def held(r: dict[str, float]) -> float:  # a p99 as a multiple of the LLM's wait
        return r["p99"] / 1000 / LONG_WAIT

    def failures(name: str) -> float:  # non-2xx and socket errors, both loads
        return sum(
            r["non_2xx"] + r.get("socket_errors", 0.0) for r in (s9[name], s9[f"{name} steady"])
        )

    long_p99 = held(s9["runtime steady"])
    long_rss = {k: max(s9[k]["rss_mb"], s9[f"{k} steady"]["rss_mb"]) for k in ("runtime", "sdk")}
    long_errors = failures("runtime")

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    lines += [
        "| ratio | value | target | |",
        "|---|---:|---:|---|",
        f"| scenario 1: runtime / SDK at its best, req/s | {ratio1:.1f}x{bound(s1['runtime'], s1['sdk'])} | >= {TARGETS['s1_ratio']:g}x | "
        f"{verdict(ratio1 >= TARGETS['s1_ratio'])} |",
        f"| scenario 1: runtime / SDK on plain uvicorn, req/s | {s1['runtime']['rps'] / s1['sdk plain']['rps']:.1f}x{bound(s1['runtime'], s1['sdk plain'])} | | |",
        f"| scenario 1: runtime / bare ASGI app, req/s | {bare1:.2f}{bound(s1['runtime'], s1['bare'])} | >= {TARGETS['s1_bare']:g} | "
        f"{verdict(bare1 >= TARGETS['s1_bare'])} |",
        f"| scenario 2: runtime / SDK at its best, req/s (sync) | {ratio2:.1f}x{bound(s2['runtime'], s2['sdk'])} | >= {TARGETS['s2_ratio']:g}x | "
        f"{verdict(ratio2 >= TARGETS['s2_ratio'])} |",
        f"| scenario 3: runtime req/s / bound (400 / 0.1 s) | {fraction3:.2f} | >= {TARGETS['s3_fraction']:g} | "
        f"{verdict(fraction3 >= TARGETS['s3_fraction'])} |",
        f"| scenario 3: SDK req/s / bound | {s3['sdk']['rps'] / 4000:.2f} | | |",
        f"| scenario 4: runtime share of 503 / p99 of accepted ms | {s4['runtime']['share_503']:.0%} / "
        f"{s4['runtime']['p99']:.0f} | | |",
        f"| scenario 4: runtime peak RSS under overload MB | {s4['runtime']['rss_mb']:.0f} | bounded | |",
        f"| scenario 5: tracing on / off req/s (echo reward) | {tracing:.2f}{bound(s5['on'], s5['off'])} | >= {TARGETS['tracing']:g} | "
        f"{verdict(tracing >= TARGETS['tracing'])} |",
        f"| scenario 6: runtime / bare ASGI app, req/s (group reward, 64 x 3 KB) | "
        f"{group_bare:.2f}{bound(s6['runtime'], s6['bare'])} | >= {TARGETS['group_bare']:g} | "
        f"{verdict(group_bare >= TARGETS['group_bare'])} |",
        f"| scenario 6: runtime / SDK at its best, req/s (group reward, 64 x 3 KB) | "
        f"{group_ratio:.1f}x{bound(s6['runtime'], s6['sdk'])} | >= {TARGETS['group_ratio']:g}x | "
        f"{verdict(group_ratio >= TARGETS['group_ratio'])} |",
        f"| scenario 6: runtime / bare ASGI app, req/s (group reward, 64 x 32 KB) | "
        f"{group_bare32:.2f}{bound(s6['runtime 32KB'], s6['bare 32KB'])} | >= {TARGETS['group_bare']:g} | "
        f"{verdict(group_bare32 >= TARGETS['group_bare'])} |",
        f"| scenario 6: runtime / SDK at its best, req/s (group reward, 64 x 32 KB) | "
        f"{group_ratio32:.1f}x{bound(s6['runtime 32KB'], s6['sdk 32KB'])} | >= {TARGETS['group_ratio']:g}x | "
        f"{verdict(group_ratio32 >= TARGETS['group_ratio'])} |",
        f"| scenario 6: share of time in JSON, validation, serialisation: runtime / SDK | "
        f"{share['runtime']:.0%} / {share['sdk']:.0%} | | |",
        f"| scenario 7: p50 / p99 ms at half max rate: runtime ({s7['runtime']['rps']:.0f} req/s) | "
        f"{s7['runtime']['p50']:.2f} / {s7['runtime']['p99']:.2f} | | |",
        f"| scenario 7: p50 / p99 ms at half max rate: SDK ({s7['sdk']['rps']:.0f} req/s) | "
        f"{s7['sdk']['p50']:.2f} / {s7['sdk']['p99']:.2f} | | |",
        f"| scenario 9: runtime / bare ASGI app, req/s ({LONG_CONNECTIONS} rollouts held "
        f"{LONG_WAIT:g} s) | {long_bare:.2f}{bound(s9['runtime'], s9['bare'])} | "
        f">= {TARGETS['long_bare']:g} | {verdict(long_bare >= TARGETS['long_bare'])} |",
        f"| scenario 9: runtime req/s / bound ({LONG_CONNECTIONS} / {LONG_WAIT:g} s); bare; SDK | "
        f"{s9['runtime']['rps'] / long_bound:.2f}; {s9['bare']['rps'] / long_bound:.2f}; "
        f"{s9['sdk']['rps'] / long_bound:.2f} | | |",
        f"| scenario 9: runtime p99 / {LONG_WAIT:g} s, {LONG_RATE:.0f} rollouts a second evenly; "
        f"bare; SDK | {long_p99:.3f}{bound(s9['runtime steady'])}; "
        f"{held(s9['bare steady']):.3f}; {held(s9['sdk steady']):.3f} | "
        f"<= {TARGETS['long_p99']:g} | "
        f"{verdict(long_p99 <= TARGETS['long_p99'])} |",
        f"| scenario 9: runtime p99 / {LONG_WAIT:g} s, wrk's closed loop (in waves); bare; SDK | "
        f"{held(s9['runtime']):.3f}; {held(s9['bare']):.3f}; {held(s9['sdk']):.3f} | | |",
        f"| scenario 9: runtime non-2xx and socket errors (both loads); SDK | {long_errors:.0f}; "
        f"{failures('sdk'):.0f} | 0 | "
        f"{verdict(long_errors == 0)} |",
        f"| scenario 9: runtime peak RSS MB (both loads); SDK | {long_rss['runtime']:.0f}; "
        f"{long_rss['sdk']:.0f} | < {TARGETS['long_rss_mb']:g} | "
        f"{verdict(long_rss['runtime'] < TARGETS['long_rss_mb'])} |",
        *(
            [
                f"| scenario 10: serve --ray / bare Ray Serve deployment, req/s (echo, one replica) | "
                f"{s10['runtime']['rps'] / s10['bare']['rps']:.2f}{bound(s10['runtime'], s10['bare'])} | | |",
                f"| scenario 10: serve --ray / served directly (scenario 1), req/s | "
                f"{s10['runtime']['rps'] / s1['runtime']['rps']:.3f} | | |",
            ]
            if not s10["skipped"]
            else [f"| scenario 10 (Ray Serve): not run, {s10['skipped']} | | | |"]
        ),
        f"| cold start: runtime / SDK | {cold_ratio:.2f} | <= {TARGETS['cold_ratio']:g} | "
        f"{verdict(cold_ratio <= TARGETS['cold_ratio'])} |",
        f"| peak RSS per worker: runtime / SDK | {rss_ratio:.2f} | <= {TARGETS['rss_ratio']:g} | "
        f"{verdict(rss_ratio <= TARGETS['rss_ratio'])} |",
        "",
        "Notes: the SDK server logs a line per request by default; this runtime logs only failed and",
        "slow requests by default. The SDK server has no admission limit for async processors, so in",
        "scenario 4 it queues every request instead of answering 503. Scenario 5 runs tracing off,",
        "then on, back to back (the ratio's two sides under the same conditions); the OTLP sink",
        "(benchmarks/otlp_sink.py) accepts and discards every export; the spans are encoded (straight",
        "to OTLP protobuf, runtime/tracing/otlp.py) and sent by the runtime's exporter process, which",
        "shares the machine's 2 cores with the worker and wrk. In scenario 6 the",
        "share is the time one request spends in JSON parsing, model validation and serialisation",
        "(measured in-process, on each side's own models) times the served rate. Scenario 7 is an",
        "open-loop load (benchmarks/loadgen.py with a rate) at half of each server's scenario-1 rate.",
        f"In scenario 9 each of {LONG_CONNECTIONS} wrk connections posts a rollout whose processor",
        f"awaits one chat completion from a stand-in LLM that answers after {LONG_WAIT:g} s (the bare app",
        "of benchmarks/bare_app.py with a wait, its own process); the bare app serves the same",
        "rollout (parse, the same call through the same aiohttp pool, answer) without a runtime; the",
        f"runtime runs with --concurrency {LONG_STEADY_CONNECTIONS} and --max-connections "
        f"{LONG_STEADY_CONNECTIONS + 100} (the defaults, 128 and 1024, would queue or refuse most of them);",
        "wrk opens its connections over the first seconds, so even the bare app stays under the bound,",
        "and its closed loop sends the rollouts in waves of thousands at once. The latency target is",
        f"read under a steady load instead: benchmarks/loadgen.py, open-loop, {LONG_RATE:.0f} rollouts a",
        f"second evenly (the bound: {LONG_CONNECTIONS} in flight) over {LONG_STEADY_CONNECTIONS} connections, the first",
        f"{LONG_WARMUP:g} s (connections opening, the first answers) left out of the latencies, not of the errors.",
        "Scenario 10 serves the echo on a local Ray cluster of its own, one replica (1 CPU), through",
        "Serve's proxy: benchmarks/bare_ray.py (the bare app's echo as a plain Serve deployment)",
        "against `serve --ray`; its RSS and server CPU sum every process of the cluster (the driver,",
        "Ray's own, Serve's proxy and controller, the replica), each RSS at its own peak.",
        "",
    ]
    if profiled:
        lines += [
            "## Profile of scenario 1 (this runtime, py-spy, own time per frame)",
            "",
            "| share | frame |",
            "|---:|---|",
            *(f"| {share:.1%} | `{frame}` |" for frame, share in profiled),
            "",
        ]
    if before:
        commit, rate, frames = before
        lines += [
            f"## The same profile of the runtime at {commit} (before), same load, same run",
            "",
            f"Its async echo rate in this run: {rate:.0f} req/s (scenario 1 above: "
            f"{s1['runtime']['rps']:.0f}).",
            "",
            "| share | frame |",
            "|---:|---|",
            *(f"| {share:.1%} | `{frame}` |" for frame, share in frames),
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
