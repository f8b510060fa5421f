"""Side-by-side benchmark: this runtime, the DashScope SDK's function server, and a bare
ASGI app on the same uvicorn, one worker each, in one run, on loopback.

    python benchmarks/run.py                 # about 4 minutes; writes benchmarks/RESULTS.md
    python benchmarks/run.py --duration 5    # shorter runs

The SDK is installed into a scratch virtual environment (benchmarks/.sdk-venv) at
benchmark time only; it is never a dependency of the project. Load comes from wrk
(Debian's package) and, for the overload scenario, benchmarks/loadgen.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SDK_VENV = HERE / ".sdk-venv"
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
TARGETS = {"s1_ratio": 6.0, "s3_fraction": 0.9, "cold_ratio": 0.5, "rss_ratio": 1.0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_sdk() -> Path:
    python = SDK_VENV / "bin" / "python"
    if not python.exists():
        print("installing the DashScope SDK into benchmarks/.sdk-venv ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(SDK_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "dashscope"], check=True)
    return python


def ensure_wrk() -> str:
    wrk = shutil.which("wrk")
    if wrk is None:
        sys.exit("wrk is missing: apt-get install wrk")
    return wrk


@dataclass
class Server:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

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
        deadline = started + 60
        while time.perf_counter() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return time.perf_counter() - started
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            time.sleep(0.005)
        raise RuntimeError(f"{self.name} did not start")

    def peak_rss_mb(self) -> float:
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def runtime_server(cls: str, *extra: str) -> Server:
    return Server(
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


def sdk_server(cls: str, sdk_python: Path, logging: bool = True) -> Server:
    env = {
        "FUNC_TYPE": "reward",
        "PROCESSOR_CLASS": f"functions.sdk.{cls}",
        "WORKERS_COUNT": "1",
        "PYTHONPATH": str(HERE),
    }
    if not logging:
        env["ENABLE_LOGGING"] = "false"
    server = Server(
        "sdk" if logging else "sdk (logging off)",
        [str(sdk_python), "-m", "dashscope.finetune.reinforcement.component.server.server"],
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


def wrk(wrk_bin: str, url: str, connections: int, seconds: float, script: Path) -> dict[str, float]:
    out = subprocess.run(
        [
            wrk_bin,
            "-t1",
            f"-c{connections}",
            f"-d{seconds:g}s",
            "--latency",
            "-s",
            str(script),
            f"{url}/api/v1",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

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
    }


def loadgen(url: str, connections: int, seconds: float, body_file: Path) -> dict[str, float]:
    out = subprocess.run(
        [
            PY,
            str(HERE / "loadgen.py"),
            f"{url}/api/v1",
            str(body_file),
            str(connections),
            str(seconds),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    results = json.loads(out)
    accepted = sorted(latency for status, latency in results if status == 200)
    rejected = sum(1 for status, _ in results if status == 503)
    total = len(results)

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")

    return {
        "rps": total / seconds,
        "accepted_rps": len(accepted) / seconds,
        "p50": pct(accepted, 0.50),
        "p99": pct(accepted, 0.99),
        "non_2xx": float(total - len(accepted)),
        "share_503": rejected / total if total else 0.0,
    }


def measure(server: Server, run: callable, warmup: callable | None = None) -> dict[str, float]:  # type: ignore[valid-type]
    server.start()
    try:
        if warmup is not None:
            warmup(server)
        result = run(server)
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measured run")
    parser.add_argument("--output", default=str(HERE / "RESULTS.md"))
    args = parser.parse_args()
    seconds = args.duration
    sdk_python = ensure_sdk()
    wrk_bin = ensure_wrk()
    work = Path(tempfile.mkdtemp(prefix="rl-bench-"))
    script = work / "post.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(BODY)}\n"
    )
    body_file = work / "body.json"
    body_file.write_text(BODY)

    def drive(connections: int) -> callable:  # type: ignore[valid-type]
        return lambda server: wrk(wrk_bin, server.url, connections, seconds, script)

    def warm(connections: int) -> callable:  # type: ignore[valid-type]
        return lambda server: wrk(wrk_bin, server.url, connections, 2, script)

    rows: list[tuple[str, str, dict[str, float]]] = []

    def record(
        scenario: str, server: Server, run: callable, warmup: callable | None = None
    ) -> dict[str, float]:  # type: ignore[valid-type]
        print(f"  {scenario}: {server.name} ...", file=sys.stderr)
        result = measure(server, run, warmup)
        rows.append((scenario, server.name, result))
        return result

    print("scenario 1: async echo reward, 32 connections", file=sys.stderr)
    s1 = {
        "runtime": record("1 async echo", runtime_server("EchoReward"), drive(32), warm(32)),
        "sdk": record("1 async echo", sdk_server("EchoReward", sdk_python), drive(32), warm(32)),
    }
    record("1 async echo", sdk_server("EchoReward", sdk_python, logging=False), drive(32), warm(32))
    s1["bare"] = record("1 async echo", bare_server(), drive(32), warm(32))

    print("scenario 2: sync echo reward, 32 connections", file=sys.stderr)
    s2 = {
        "runtime": record("2 sync echo", runtime_server("SyncEchoReward"), drive(32), warm(32)),
        "sdk": record("2 sync echo", sdk_server("SyncEchoReward", sdk_python), drive(32), warm(32)),
    }

    print("scenario 3: I/O-bound async reward (100 ms), 400 connections", file=sys.stderr)
    s3 = {
        "runtime": record(
            "3 async wait 100ms",
            runtime_server("WaitReward", "--concurrency", "400", "--queue", "400"),
            drive(400),
            warm(400),
        ),
        "sdk": record(
            "3 async wait 100ms", sdk_server("WaitReward", sdk_python), drive(400), warm(400)
        ),
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
            sdk_server("WaitReward", sdk_python),
            lambda server: loadgen(server.url, 200, seconds, body_file),
        ),
    }

    print("scenario 5: tracing on (exporting to a local OTLP sink) against off", file=sys.stderr)
    sink = uvicorn_server("otlp sink", "otlp_sink:app")
    sink.start_listening()
    try:
        traced = runtime_server("EchoReward", "--tracing")
        traced.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.url
        traced.name = "runtime, tracing on"
        s5 = {"on": record("5 tracing on vs off", traced, drive(32), warm(32))}
    finally:
        sink.stop()
    s5["off"] = s1["runtime"]

    print("scenario 6: cold start (process start to the first 200 from /health)", file=sys.stderr)
    cold = {
        "runtime": cold_start(lambda: runtime_server("EchoReward")),
        "sdk": cold_start(lambda: sdk_server("EchoReward", sdk_python)),
        "bare": cold_start(bare_server),
    }

    report = render(rows, s1, s2, s3, s4, s5, cold, seconds)
    Path(args.output).write_text(report)
    print(report)
    shutil.rmtree(work, ignore_errors=True)


def render(rows, s1, s2, s3, s4, s5, cold, seconds) -> str:  # type: ignore[no-untyped-def]
    lines = [
        "# Benchmark results",
        "",
        f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine()}.",
        f"One worker per server; load from wrk (1 thread) or benchmarks/loadgen.py on the same machine, "
        f"{seconds:g} s per run after a 2 s warm-up. Produced by `python benchmarks/run.py`.",
        "",
        "| scenario | server | req/s | p50 ms | p99 ms | non-2xx | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for scenario, name, r in rows:
        extra = f" ({r['share_503']:.0%} 503)" if "share_503" in r else ""
        lines.append(
            f"| {scenario} | {name} | {r['rps']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} | "
            f"{r['non_2xx']:.0f}{extra} | {r['rss_mb']:.0f} |"
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
    ratio2 = s2["runtime"]["rps"] / s2["sdk"]["rps"]
    fraction3 = s3["runtime"]["rps"] / 4000
    cold_ratio = cold["runtime"] / cold["sdk"]
    rss_ratio = s1["runtime"]["rss_mb"] / s1["sdk"]["rss_mb"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    lines += [
        "| ratio | value | target | |",
        "|---|---:|---:|---|",
        f"| scenario 1: runtime / SDK req/s | {ratio1:.1f}x | >= {TARGETS['s1_ratio']:g}x | "
        f"{verdict(ratio1 >= TARGETS['s1_ratio'])} |",
        f"| scenario 1: runtime / bare ASGI ceiling req/s | {s1['runtime']['rps'] / s1['bare']['rps']:.2f} | | |",
        f"| scenario 2: runtime / SDK req/s (sync) | {ratio2:.1f}x | | |",
        f"| scenario 3: runtime req/s / bound (400 / 0.1 s) | {fraction3:.2f} | >= {TARGETS['s3_fraction']:g} | "
        f"{verdict(fraction3 >= TARGETS['s3_fraction'])} |",
        f"| scenario 3: SDK req/s / bound | {s3['sdk']['rps'] / 4000:.2f} | | |",
        f"| scenario 4: runtime share of 503 / p99 of accepted ms | {s4['runtime']['share_503']:.0%} / "
        f"{s4['runtime']['p99']:.0f} | | |",
        f"| scenario 4: runtime peak RSS under overload MB | {s4['runtime']['rss_mb']:.0f} | bounded | |",
        f"| cold start: runtime / SDK | {cold_ratio:.2f} | <= {TARGETS['cold_ratio']:g} | "
        f"{verdict(cold_ratio <= TARGETS['cold_ratio'])} |",
        f"| peak RSS per worker: runtime / SDK | {rss_ratio:.2f} | <= {TARGETS['rss_ratio']:g} | "
        f"{verdict(rss_ratio <= TARGETS['rss_ratio'])} |",
        f"| scenario 5: tracing on / off req/s (echo reward) | {s5['on']['rps'] / s5['off']['rps']:.2f} | >= 0.85 | "
        f"{verdict(s5['on']['rps'] / s5['off']['rps'] >= 0.85)} |",
        "",
        "Notes: the SDK server logs a line per request by default (the `sdk (logging off)` row sets its",
        "`ENABLE_LOGGING=false`); this runtime logs only failed and slow requests by default. The SDK",
        "server has no admission limit for async processors, so in scenario 4 it queues every request",
        "instead of answering 503. In scenario 5 the OTLP sink (benchmarks/otlp_sink.py) accepts and",
        "discards every export, so the figure is the exporting server's own cost: creating one span per",
        "request and encoding it to OTLP protobuf in the batch processor's thread, which shares the",
        "GIL with the event loop.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
