"""``serve --ray`` on a real local Ray cluster: two replicas serve, the trainer protocols
work through Serve's proxy, a killed replica is replaced while requests keep being
answered, and stopping leaves nothing running.

Ray is an optional extra: this runs with the Python that has it (this one, or the one
named in ``RAY_PYTHON``, as ``.ci/run`` sets), and is skipped, saying so, without it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import TESTS, Server, free_port

RAY_PYTHON = (
    sys.executable if importlib.util.find_spec("ray") else os.environ.get("RAY_PYTHON") or None
)
# They use the whole machine (the container engine with fixed image tags and registry
# port, a local Ray cluster): one xdist group, so that no two of them run at once.
pytestmark = [
    pytest.mark.xdist_group("machine"),
    pytest.mark.skipif(
        RAY_PYTHON is None,
        reason="Ray is not installed here: pip install -e '.[ray]', or name a Python that has it "
        "in RAY_PYTHON (.ci/run does)",
    ),
]
# No usage reports; no token auth (Ray 2.60 turns it on for a local cluster and writes
# ~/.ray/auth_token, which a later `ray start` then requires of every driver)
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


@contextlib.contextmanager
def ray_cluster() -> Iterator[tuple[str, str]]:
    """``ray start --head`` on loopback with 2 CPUs; its address, and the directory that
    holds its temp dir (``ray``, with the address file a driver reads when it looks for a
    cluster on the machine: set RAY_TMPDIR to it). Stopped and gone after."""
    assert RAY_PYTHON is not None
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must be short
    port = free_port()
    log = open(Path(temp) / "head.log", "wb")  # noqa: SIM115
    head = subprocess.Popen(
        [
            str(Path(RAY_PYTHON).parent / "ray"),
            "start",
            "--head",
            "--block",
            "--port",
            str(port),
            "--num-cpus",
            "2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--node-ip-address",
            "127.0.0.1",
            "--temp-dir",
            f"{temp}/ray",
            # Ray's own servers on ports from the run's counter: by default they take a fixed
            # port (10001; 52365, in the kernel's ephemeral range, where the suite's outgoing
            # connections take theirs) or one found free first and bound later
            *(
                f"--{name}-port={free_port()}"
                for name in (
                    "dashboard-agent-listen",
                    "dashboard-agent-grpc",
                    "metrics-export",
                    "runtime-env-agent",
                    "ray-client-server",
                )
            ),
        ],
        env={**os.environ, **RAY_ENV},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped as one below
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert head.poll() is None, (Path(temp) / "head.log").read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert time.monotonic() < deadline, "the Ray head did not listen"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}", temp
    finally:
        head.send_signal(signal.SIGTERM)  # --block: stops the processes it started
        try:
            head.wait(60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)  # whatever of its group is left
            log.close()
            shutil.rmtree(temp, ignore_errors=True)


def on_ray(target: str, *args: str, module: str = "runtime", **env: str) -> Server:
    """``serve TARGET --ray ARGS`` in Ray's Python, with RAY_ENV and ``env``."""
    python = RAY_PYTHON or sys.executable
    return Server(target, "--ray", *args, python=python, module=module, env={**RAY_ENV, **env})


def ray_script(address: str, code: str) -> str:
    """Run ``code`` in a Ray driver attached to the cluster; its standard output."""
    assert RAY_PYTHON is not None
    prelude = f"import ray\nfrom ray import serve\nray.init(address={address!r})\n"
    done = subprocess.run(
        [RAY_PYTHON, "-c", prelude + code],
        env={**os.environ, **RAY_ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def live_serve_actors(address: str) -> list[str]:
    code = (
        "names = ray.util.list_named_actors(all_namespaces=True)\n"
        "print('\\n'.join(a['name'] for a in names if 'SERVE' in a['name']))\n"
    )
    return [line for line in ray_script(address, code).splitlines() if line.strip()]


def answer_pid(client: httpx.Client) -> int:
    body = {"agent_output": {"messages": [{"role": "assistant", "content": "x"}]}}
    answer = client.post("/api/v1", json=body, timeout=30)
    answer.raise_for_status()
    metrics = answer.json()["reward"]["reward_metrics"]
    assert metrics["setups"] == 1.0  # setup() ran once in this replica
    return int(metrics["pid"])


def test_two_replicas_trainer_protocols_replacement_and_shutdown() -> None:
    with ray_cluster() as (address, temp):
        server = on_ray(
            "workspace.trainer_fns:PidReward",
            "--replicas",
            "2",
            "--ray-replica-cpus",
            "0.5",
            RAY_ADDRESS=address,
        )
        try:
            server.wait_ready(timeout=240)
            client = server.client

            # two replicas answer, each its own process with its own setup()
            pids: set[int] = set()
            deadline = time.monotonic() + 60
            while len(pids) < 2 and time.monotonic() < deadline:
                pids.add(answer_pid(client))
            assert len(pids) == 2, pids
            print(f"\nreplicas serving: pids {sorted(pids)}")

            # the trainer protocols through Serve's proxy
            rlhf = client.post(
                "/openrlhf/get_reward",
                json={"query": ["q42"], "prompts": ["q"], "labels": ["42"]},
            )
            assert rlhf.status_code == 200
            assert rlhf.json()["rewards"] == [1.0]
            assert rlhf.json()["extra_logs"]["reward_failed"] == [0.0]
            slime = client.post(
                "/slime/reward", json={"prompt": "q", "response": "42", "label": "42"}
            )
            assert slime.json() == 1.0
            verify = client.post(
                "/nemo-gym/verify",
                json={
                    "responses_create_params": {"input": [{"role": "user", "content": "q"}]},
                    "response": {"output": [{"type": "message", "role": "assistant"}]},
                },
            )
            assert verify.json()["reward"] == 1.0

            # kill one replica: requests keep being answered, and a new replica takes its place
            killed = min(pids)
            answered: list[int] = []
            failed: list[str] = []
            stop = threading.Event()

            def keep_asking() -> None:
                while not stop.is_set():
                    try:
                        answered.append(answer_pid(client))
                    except (httpx.HTTPError, KeyError, ValueError) as exc:
                        failed.append(f"{type(exc).__name__}: {exc}"[:200])

            asker = threading.Thread(target=keep_asking)
            asker.start()
            try:
                os.kill(killed, signal.SIGKILL)
                killed_at, since_kill = time.monotonic(), len(answered)
                deadline = killed_at + 180
                while not (set(answered) - pids) and time.monotonic() < deadline:
                    time.sleep(0.1)
                replaced_after = time.monotonic() - killed_at
            finally:
                stop.set()
                asker.join(60)
            new = set(answered) - pids
            assert new, f"no replacement replica answered; answered by {set(answered)}"
            first_new = min(i for i, pid in enumerate(answered) if pid in new)
            during = answered[since_kill:first_new]
            print(
                f"killed replica pid {killed}; replacement pid {sorted(new)} answered after "
                f"{replaced_after:.1f}s; {len(answered)} requests answered meanwhile "
                f"({len(during)} before the replacement, all by pid {sorted(set(during))}), "
                f"{len(failed)} failed: {failed[:3]}"
            )
            assert during and set(during) <= pids - {killed}  # the survivor kept answering
            assert len(failed) <= 5  # at most the calls caught on the dying replica

            # a second copy of the function, on the same proxy, is refused: stopping it
            # must not delete the application the first one serves
            command = ["-m", "runtime", "serve", "workspace.trainer_fns:PidReward", "--ray"]
            second = subprocess.run(
                [
                    RAY_PYTHON or sys.executable,
                    *command,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(server.port),
                ],
                cwd=TESTS,
                env={**os.environ, **RAY_ENV, "RAY_ADDRESS": address},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=120,
            )
            assert second.returncode == 2, second.stdout[-3000:]
            assert "an application named PidReward already runs" in second.stdout
            assert client.get("/health").status_code == 200

            # without RAY_ADDRESS, where this cluster is the machine's (as `ray start` leaves
            # one, where a driver looks first): a cluster of its own, and after it stopped
            # the application here still runs (it once joined, and deleted it on leaving).
            # Its first HTTP proxy dies while serve.start() waits for it, as on a busy
            # machine Serve kills a proxy slow to start: it serves on the next one
            own = on_ray(
                "workspace.trainer_fns:PidReward",
                "--replicas",
                "1",
                "--ray-replica-cpus",
                "0.5",
                module="serve_losing_first_proxy",
                RAY_TMPDIR=temp,
            )
            try:
                own.wait_ready(timeout=240)
                own.wait_output("replaced its HTTP proxy while it started")
                answer_pid(own.client)
                assert own.terminate(timeout=120) == 0, own.output()[-5000:]
            finally:
                own.close()
            applications = "print(sorted(serve.status().applications))"
            assert ray_script(address, applications).split() == ["['PidReward']"]
            answer_pid(client)  # (from any replica: a busy machine may have replaced one)

            # SIGTERM deletes the application: no replica is left
            assert server.terminate(timeout=120) == 0, server.output()[-5000:]
            assert not [a for a in live_serve_actors(address) if "REPLICA" in a]
            # and serve shutdown leaves no Serve actor at all
            ray_script(address, "serve.shutdown()\n")
            assert live_serve_actors(address) == []
        finally:
            server.close()


def pid_of(answer: httpx.Response) -> int:
    return int(answer.json()["reward"]["reward_metrics"]["pid"])


def test_an_unhealthy_replica_is_replaced_and_sigterm_while_deploying_stops_cleanly() -> None:
    # every thread stuck: /health says unhealthy, and so must Serve's health check
    with ray_cluster() as (address, _):
        server = on_ray(
            "workspace.trainer_fns:PidHangReward",
            "--threads",
            "1",
            "--timeout",
            "2",
            "--ray-replica-cpus",
            "0.5",
            RAY_ADDRESS=address,
        )
        try:
            server.wait_ready(timeout=240)
            client = server.client
            body = {"agent_output": {"messages": [{"role": "assistant", "content": "x"}]}}
            first = pid_of(client.post("/api/v1", json=body, timeout=30))
            hang = {"agent_output": {"messages": [{"role": "assistant", "content": "HANG"}]}}
            assert client.post("/api/v1", json=hang, timeout=30).status_code == 504
            deadline = time.monotonic() + 30
            while client.get("/health").json()["status"] != "unhealthy":
                assert time.monotonic() < deadline, "the stuck thread never made it unhealthy"
                time.sleep(0.1)
            deadline = time.monotonic() + 180
            while True:  # Serve's health check fails; a fresh replica takes its place
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    answer = client.post("/api/v1", json=body, timeout=10)
                    if answer.status_code == 200 and pid_of(answer) != first:
                        break
                assert time.monotonic() < deadline, "the unhealthy replica was never replaced"
                time.sleep(0.5)
            assert client.get("/health").json()["status"] == "healthy"
            assert server.terminate(timeout=120) == 0, server.output()[-5000:]
        finally:
            server.close()

        # Serve outlives the deleted application, its proxy on the first port: a function
        # asked to serve on another port is refused, saying where Serve listens
        elsewhere = on_ray(
            "workspace.trainer_fns:PidReward",
            RAY_ADDRESS=address,
        )
        try:
            assert elsewhere.proc.wait(120) == 2, elsewhere.output()[-5000:]
            assert f"its proxy on 127.0.0.1:{server.port}" in elsewhere.output()
        finally:
            elsewhere.close()
        ray_script(address, "serve.shutdown()\n")

        # SIGTERM while Serve still deploys (the proxy listens, setup() takes a minute):
        # the deployment is interrupted, the application deleted, and the exit is clean
        slow = on_ray(
            "workspace.trainer_fns:SlowSetupReward",
            "--ray-replica-cpus",
            "0.5",
            RAY_ADDRESS=address,
        )
        try:
            slow.wait_listening(timeout=240)
            assert slow.terminate(timeout=120) == 0, slow.output()[-5000:]
            assert "ready:" not in slow.output()
            assert not [a for a in live_serve_actors(address) if "REPLICA" in a]
        finally:
            slow.close()
