"""A stand-in for the training platform, implementing the client-side contract of
``docs/platform-api.md`` with its response quirks (envelopes in ``output`` or
``data``, camelCase ``instanceId`` and log pages, numeric instance ``status``, ``status``
objects, ``code: 0`` on deletion), recording every request.

Its function instances serve for real: starting one unpacks the uploaded zip into a
temporary directory and runs its ``start.sh`` with ``bash``, the way the platform does,
with the port in ``FC_SERVER_PORT`` and the component's runtime ``env``; ``python3`` on
``PATH`` is this test environment's, which stands for the dependency layer. Calls to the
instance go through ``{url}/fc/{instance}/api/v1``, which checks the trigger token and
forwards to the instance. Leaving the ``with`` block stops every instance and removes
every file.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from conftest import free_port
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from threaded_server import ThreadedServer

API = "/api/v1"


@dataclass
class Instance:
    instance_id: str
    entity_id: str
    token: str
    port: int
    directory: tempfile.TemporaryDirectory
    process: subprocess.Popen
    log: Any
    body: dict[str, Any]

    @property
    def log_path(self) -> Path:
        return Path(self.directory.name) / "instance.log"


@dataclass
class Job:
    job_id: str
    body: dict[str, Any]
    status: str = "PENDING"
    polls: int = 0
    logs: list[str] = field(default_factory=list)


class PlatformStandIn(ThreadedServer):
    def __init__(
        self,
        api_key: str = "sk-standin-test",
        *,
        busy: dict[str, int] | None = None,
        job_outcome: str = "SUCCEEDED",
        slow: dict[str, float] | None = None,
        port: int | None = None,
    ) -> None:
        port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{port}"
        self.base_url = self.url + API
        self.api_key = api_key
        self.busy = dict(busy or {})  # path prefix -> how many 503s to answer first
        self.slow = dict(slow or {})  # path prefix -> seconds held before answering
        self.job_outcome = job_outcome
        self.echo_key = False  # answer a wrong key by echoing it back
        self.flaky: dict[str, int] = {}  # "METHOD path prefix" -> how many 502s to answer
        self.cut_puts = 0  # how many PUTs to fail part-way: half the body read, then a 500
        self.requests: list[dict[str, Any]] = []
        self.uploads: dict[str, bytes] = {}  # object name -> zip bytes
        self.layers: dict[str, dict[str, Any]] = {}
        self.entities: dict[str, dict[str, Any]] = {}
        self.instances: dict[str, Instance] = {}
        self.started: list[Instance] = []  # every instance ever started, to check cleanup
        self.files: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, Job] = {}
        fc = f"{API}/fine-tunes"
        super().__init__(
            port,
            [
                Route(f"{fc}/generate/faas/upload/url", self._upload_url, methods=["POST"]),
                Route("/oss/{name}", self._oss_put, methods=["PUT"]),
                Route(f"{fc}/create/faas/layer", self._layer_create, methods=["POST"]),
                Route(f"{fc}/query/faas/layer/status", self._layer_status, methods=["GET"]),
                Route(f"{fc}/create/{{kind}}", self._register, methods=["POST"]),
                Route(f"{fc}/online/faas/{{job}}/{{entity}}", self._load, methods=["POST"]),
                Route(f"{fc}/query/faas/log/{{iid}}", self._instance_logs, methods=["POST"]),
                Route(f"{fc}/query/faas/{{iid}}", self._query, methods=["POST"]),
                Route(f"{fc}/delete/faas/{{iid}}", self._delete_instance, methods=["POST"]),
                Route("/fc/{iid}/api/v1", self._invoke, methods=["POST"]),
                Route(f"{API}/files", self._files, methods=["POST"]),
                Route(fc, self._submit, methods=["POST"]),
                Route(fc, self._list, methods=["GET"]),
                Route(f"{fc}/{{job_id}}", self._get, methods=["GET"]),
                Route(f"{fc}/{{job_id}}", self._delete_job, methods=["DELETE"]),
                Route(f"{fc}/{{job_id}}/cancel", self._cancel, methods=["POST"]),
                Route(f"{fc}/{{job_id}}/logs", self._logs, methods=["GET"]),
            ],
        )

    # ---- lifecycle -------------------------------------------------------------------

    def __exit__(self, *exc: object) -> None:
        self.stop_instances()
        super().__exit__(*exc)

    def stop_instances(self) -> None:
        for instance in list(self.instances.values()):
            self._stop(instance)

    def _stop(self, instance: Instance) -> None:
        if instance.process.poll() is None:
            os.killpg(instance.process.pid, signal.SIGTERM)
            try:
                instance.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(instance.process.pid, signal.SIGKILL)
                instance.process.wait(10)
        instance.log.close()
        instance.directory.cleanup()
        self.instances.pop(instance.instance_id, None)

    # ---- helpers ---------------------------------------------------------------------

    async def _record(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        entry: dict[str, Any] = {
            "method": request.method,
            "path": request.url.path,
            "query": dict(request.query_params),
            "authorization": request.headers.get("authorization"),
            "workspace": request.headers.get("x-dashscope-workspace"),
            "content_type": request.headers.get("content-type"),
            "size": len(raw),
        }
        if "json" in (request.headers.get("content-type") or ""):
            try:
                entry["json"] = httpx.Response(200, content=raw).json()
            except ValueError:
                entry["json"] = None
        self.requests.append(entry)
        return entry

    def _denied(self, entry: dict[str, Any]) -> Response | None:
        if entry["authorization"] != f"Bearer {self.api_key}" and self.echo_key:
            # a careless platform echoing the credential back, in the forms seen in the wild
            bearer = str(entry["authorization"])
            key = bearer.removeprefix("Bearer ")
            if entry["path"].startswith(f"{API}/fine-tunes/query/"):
                message = f"bad credential {urllib.parse.quote(key, safe='')} in {bearer}"
                return JSONResponse({"status": {"code": 401, "message": message}})
            encoded = base64.b64encode(key.encode()).decode()
            page = f"<html><body>500 {bearer} key={urllib.parse.quote_plus(key)} {encoded}"
            return Response(page + "</body></html>", 500, media_type="text/html")
        if entry["authorization"] != f"Bearer {self.api_key}":
            return JSONResponse(
                {"request_id": _rid(), "code": "InvalidApiKey", "message": "Invalid API-key."},
                401,
            )
        return None

    async def _gate(self, request: Request) -> tuple[dict[str, Any], Response | None]:
        entry = await self._record(request)
        denied = self._denied(entry)
        if denied is not None:
            return entry, denied
        for prefix, count in self.busy.items():
            if count > 0 and request.url.path.startswith(prefix):
                self.busy[prefix] = count - 1
                return entry, JSONResponse(
                    {"request_id": _rid(), "code": "Throttling", "message": "busy"},
                    503,
                    headers={"Retry-After": "1"},
                )
        for prefix, count in self.flaky.items():
            if count > 0 and f"{request.method} {request.url.path}".startswith(prefix):
                self.flaky[prefix] = count - 1
                return entry, Response("<html>502 Bad Gateway</html>", 502)
        for prefix, seconds in list(self.slow.items()):
            if request.url.path.startswith(prefix):
                await self._held(prefix, seconds)
        return entry, None

    async def _held(self, prefix: str, seconds: float) -> None:
        """``seconds``, or until the test removes ``prefix`` from ``slow`` (a call held
        for as long as the test needs, however loaded the machine)."""
        deadline = time.monotonic() + seconds
        while prefix in self.slow and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def paths(self) -> list[str]:
        """``METHOD path`` of every request, in order (the signed URL's query left out)."""
        return [f"{r['method']} {r['path']}" for r in self.requests]

    # ---- functions -------------------------------------------------------------------

    async def _upload_url(self, request: Request) -> Response:
        entry, early = await self._gate(request)
        if early:
            return early
        key = (entry.get("json") or {}).get("unique_key")
        if not key:
            return JSONResponse({"status": {"code": 400, "message": "unique_key required"}})
        url = f"{self.url}/oss/{key}.zip?Expires=1999999999&OSSAccessKeyId=AK&Signature=s1g"
        return JSONResponse({"request_id": _rid(), "output": {"url": url}})

    async def _oss_put(self, request: Request) -> Response:
        if self.cut_puts > 0:  # a storage node failing part-way through the body
            self.cut_puts -= 1
            half, got = int(request.headers.get("content-length", 0)) // 2, 0
            async for chunk in request.stream():
                got += len(chunk)
                if got >= half:
                    break
            self.requests.append({"method": "PUT", "path": request.url.path, "cut_at": got})
            return Response("<Error><Code>InternalError</Code></Error>", 500)
        entry = await self._record(request)
        if entry["authorization"] is not None:  # a signed URL refuses any other credential
            return Response("<Error><Code>InvalidArgument</Code></Error>", 400)
        if request.query_params.get("Signature") != "s1g":
            return Response("<Error><Code>SignatureDoesNotMatch</Code></Error>", 403)
        self.uploads[request.path_params["name"]] = await request.body()
        return Response(b"", 200)

    async def _layer_create(self, request: Request) -> Response:
        entry, early = await self._gate(request)
        if early:
            return early
        body = entry.get("json") or {}
        if not body.get("layer_name") or not isinstance(body.get("requirements_content"), str):
            return JSONResponse({"status": {"code": 400, "message": "bad layer request"}})
        code = f"layer-{len(self.layers) + 1:04d}"
        self.layers[code] = {**body, "queries": 0}
        return JSONResponse({"request_id": _rid(), "output": {"layer_code": code}})

    async def _layer_status(self, request: Request) -> Response:
        _, early = await self._gate(request)
        if early:
            return early
        layer = self.layers.get(request.query_params.get("layer_code", ""))
        if layer is None:
            return JSONResponse({"status": {"code": 404, "message": "no such layer"}})
        layer["queries"] += 1
        state = "SUCCESS" if layer["queries"] > 1 else "BUILDING"
        return JSONResponse({"request_id": _rid(), "output": {"status": state}})

    async def _register(self, request: Request) -> Response:
        entry, early = await self._gate(request)
        if early:
            return early
        kind = request.path_params["kind"]
        prefixes = {"rollout": "ro", "reward": "rw", "group-reward": "grw"}
        if kind not in prefixes:
            return JSONResponse({"request_id": _rid(), "message": "not found"}, 404)
        body = entry.get("json") or {}
        if set(body) != {"name", "func", "unique_key", "code_url"}:
            return JSONResponse({"status": {"code": 400, "message": f"bad body {sorted(body)}"}})
        name = httpx.URL(body["code_url"]).path.rsplit("/", 1)[-1]
        if name not in self.uploads:
            return JSONResponse({"status": {"code": 400, "message": "code_url not uploaded"}})
        entity = f"{prefixes[kind]}-{uuid.uuid4()}"
        self.entities[entity] = {**body, "kind": kind, "zip": self.uploads[name]}
        key = {"group-reward": "group_reward_id"}.get(kind, f"{kind}_id")
        return JSONResponse({"request_id": _rid(), "output": {key: entity}})

    async def _load(self, request: Request) -> Response:
        entry, early = await self._gate(request)
        if early:
            return early
        entity = self.entities.get(request.path_params["entity"])
        if entity is None or not request.path_params["job"].startswith("jobId-"):
            return JSONResponse({"status": {"code": 404, "message": "no such entity"}})
        body = entry.get("json") or {}
        instance_id = f"{request.path_params['entity'].split('-')[0]}-ins-{uuid.uuid4().hex[:8]}"
        directory = tempfile.TemporaryDirectory(prefix="standin-instance-")
        with zipfile.ZipFile(io.BytesIO(entity["zip"])) as archive:
            archive.extractall(directory.name)
        port = free_port()
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "FC_SERVER_PORT": str(port),
            **{k: _env_text(v) for k, v in (body.get("env") or {}).items()},
        }
        log = open(Path(directory.name) / "instance.log", "wb")  # noqa: SIM115
        process = subprocess.Popen(
            ["bash", "start.sh"],
            cwd=directory.name,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.instances[instance_id] = started = Instance(
            instance_id,
            request.path_params["entity"],
            uuid.uuid4().hex,
            port,
            directory,
            process,
            log,
            body,
        )
        self.started.append(started)
        return JSONResponse(
            {
                "request_id": _rid(),
                "output": {
                    "instanceId": instance_id,
                    "trigger_url": f"{self.url}/fc/{instance_id}",
                    "trigger_token": self.instances[instance_id].token,
                },
            }
        )

    async def _query(self, request: Request) -> Response:
        _, early = await self._gate(request)
        if early:
            return early
        instance = self.instances.get(request.path_params["iid"])
        if instance is None:
            return JSONResponse({"status": {"code": 404, "message": "no such instance"}})
        status = 1
        if instance.process.poll() is not None:
            status = -1
        else:
            try:
                async with httpx.AsyncClient(timeout=2) as client:
                    health = await client.get(f"http://127.0.0.1:{instance.port}/health")
                status = 2 if health.status_code == 200 else 1
            except httpx.TransportError:
                status = 1
        return JSONResponse(
            {
                "request_id": _rid(),
                "output": {
                    "status": status,
                    "trigger_url": f"{self.url}/fc/{instance.instance_id}",
                    "trigger_token": instance.token,
                },
            }
        )

    async def _instance_logs(self, request: Request) -> Response:
        entry, early = await self._gate(request)
        if early:
            return early
        instance = self.instances.get(request.path_params["iid"])
        if instance is None:
            return JSONResponse({"status": {"code": 404, "message": "no such instance"}})
        body = entry.get("json") or {}
        page, size = int(body.get("pageNumber", 1)), int(body.get("pageSize", 100))
        instance.log.flush()
        lines = instance.log_path.read_text(errors="replace").splitlines()
        chosen = lines[(page - 1) * size : page * size]
        # the second of the two answer shapes the contract allows: camelCase under data
        return JSONResponse(
            {
                "success": True,
                "data": {
                    "pageNumber": page,
                    "pageSize": size,
                    "totalCount": len(lines),
                    "logEntries": [
                        {"instanceId": instance.instance_id, "message": m, "timestamp": 0}
                        for m in chosen
                    ],
                },
            }
        )

    async def _delete_instance(self, request: Request) -> Response:
        _, early = await self._gate(request)
        if early:
            return early
        instance = self.instances.get(request.path_params["iid"])
        if instance is None:
            return JSONResponse({"code": 404, "message": "no such instance", "data": None})
        await asyncio.to_thread(self._stop, instance)
        return JSONResponse(
            {"code": 0, "message": "success", "data": {"status": "deleted", "sandbox_code": "sb-1"}}
        )

    async def _invoke(self, request: Request) -> Response:
        entry = await self._record(request)
        instance = self.instances.get(request.path_params["iid"])
        if instance is None or entry["authorization"] != f"Bearer {instance.token}":
            return JSONResponse(
                {"Code": "Unauthorized", "Message": "AuthError: bad trigger token"}, 401
            )
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.post(
                f"http://127.0.0.1:{instance.port}/api/v1",
                content=await request.body(),
                headers={"content-type": "application/json"},
            )
        return Response(answer.content, answer.status_code, media_type="application/json")

    # ---- files -----------------------------------------------------------------------

    async def _files(self, request: Request) -> Response:
        entry, early = await self._gate(request)
        if early:
            return early
        form = await request.form()
        upload = form.get("files")
        if form.get("purpose") != "fine-tune" or upload is None or isinstance(upload, str):
            return JSONResponse({"status": {"code": 400, "message": "files and purpose needed"}})
        data = await upload.read()
        if "refused" in str(upload.filename):
            failed = {"name": upload.filename, "code": "InvalidFile", "message": "bad encoding"}
            return JSONResponse(
                {"request_id": _rid(), "data": {"uploaded_files": [], "failed_uploads": [failed]}}
            )
        file_id = f"file-{uuid.uuid4()}"
        digest = hashlib.sha256(data).hexdigest()
        self.files[file_id] = {"name": upload.filename, "size": len(data), "sha256": digest}
        entry["file"] = {"name": upload.filename, "size": len(data)}
        return JSONResponse(
            {
                "request_id": _rid(),
                "data": {
                    "uploaded_files": [{"file_id": file_id, "name": upload.filename}],
                    "failed_uploads": [],
                },
            }
        )

    # ---- jobs ------------------------------------------------------------------------

    def _job_view(self, job: Job) -> dict[str, Any]:
        return {
            "job_id": job.job_id,
            "job_name": job.body.get("job_name"),
            "status": job.status,
            "model": job.body.get("model"),
            "base_model": job.body.get("model"),
            "training_type": job.body.get("training_type"),
            "hyper_parameters": job.body.get("hyper_parameters", {}),
            "create_time": "2026-11-30 12:00:00",
            "creator": "standin",
        }

    async def _submit(self, request: Request) -> Response:
        entry, early = await self._gate(request)
        if early:
            return early
        body = entry.get("json") or {}
        problems = []
        if not body.get("training_datasets"):
            problems.append("training_datasets is required")
        if body.get("training_type") not in ("reinforcement", "pg_opd"):
            problems.append("training_type must be reinforcement or pg_opd")
        if body.get("training_type") == "reinforcement" and not (
            body.get("rollout") and body.get("rewards")
        ):
            problems.append("reinforcement needs a rollout and rewards")
        for dataset in body.get("training_datasets", []) + body.get("validation_datasets", []):
            uploaded = dataset.get("file_id") in self.files
            if dataset.get("data_source_type") == "file_id" and not uploaded:
                problems.append(f"unknown file_id {dataset.get('file_id')}")
        if problems:
            return JSONResponse(
                {"request_id": _rid(), "code": "InvalidParameter", "message": "; ".join(problems)},
                400,
            )
        job_id = f"ft-202611301200-{uuid.uuid4().hex[:4]}"
        self.jobs[job_id] = Job(job_id, body)
        view = self._job_view(self.jobs[job_id])
        return JSONResponse({"request_id": _rid(), "output": view, "usage": None})

    def _job(self, request: Request) -> Job | JSONResponse:
        job = self.jobs.get(request.path_params["job_id"])
        if job is None:
            return JSONResponse(
                {"request_id": _rid(), "code": "NotFound", "message": "job not found"}, 404
            )
        return job

    async def _get(self, request: Request) -> Response:
        _, early = await self._gate(request)
        if early:
            return early
        job = self._job(request)
        if isinstance(job, JSONResponse):
            return job
        if job.status not in ("SUCCEEDED", "FAILED", "CANCELED"):
            job.polls += 1  # the job moves on by one step per query
            if job.polls == 1:
                job.status = "RUNNING"
                job.logs += ["job started", "step 1 loss=0.50 reward=0.10"]
            elif job.polls == 2:
                job.logs += ["step 2 loss=0.40 reward=0.35"]
            else:
                job.status = self.job_outcome
                job.logs += [f"job {self.job_outcome.lower()}"]
        return JSONResponse({"request_id": _rid(), "output": self._job_view(job)})

    async def _list(self, request: Request) -> Response:
        _, early = await self._gate(request)
        if early:
            return early
        page = int(request.query_params.get("page_no", 1))
        size = int(request.query_params.get("page_size", 10))
        jobs = [self._job_view(j) for j in self.jobs.values()]
        chosen = jobs[(page - 1) * size : page * size]
        return JSONResponse(
            {
                "request_id": _rid(),
                "output": {"page_no": page, "page_size": size, "total": len(jobs), "jobs": chosen},
            }
        )

    async def _cancel(self, request: Request) -> Response:
        _, early = await self._gate(request)
        if early:
            return early
        job = self._job(request)
        if isinstance(job, JSONResponse):
            return job
        job.status = "CANCELED"
        return JSONResponse(
            {"request_id": _rid(), "output": {"status": "success"}, "message": "canceled"}
        )

    async def _delete_job(self, request: Request) -> Response:
        _, early = await self._gate(request)
        if early:
            return early
        job = self._job(request)
        if isinstance(job, JSONResponse):
            return job
        if job.status in ("PENDING", "RUNNING"):
            return JSONResponse(
                {
                    "request_id": _rid(),
                    "code": "InvalidOperation",
                    "message": f"cannot delete a {job.status} job: cancel it first",
                },
                400,
            )
        del self.jobs[job.job_id]
        return JSONResponse({"request_id": _rid(), "output": {"status": "success"}})

    async def _logs(self, request: Request) -> Response:
        _, early = await self._gate(request)
        if early:
            return early
        job = self._job(request)
        if isinstance(job, JSONResponse):
            return job
        offset = int(request.query_params.get("offset", 1))
        count = int(request.query_params.get("line", 1000))
        return JSONResponse(
            {"request_id": _rid(), "output": {"logs": job.logs[offset - 1 : offset - 1 + count]}}
        )


def _env_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _rid() -> str:
    return uuid.uuid4().hex[:16]


def clean_copy(source: Path, target: Path) -> Path:
    """A copy of a workspace without caches, for tests that must not touch the original."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def main(argv: list[str] | None = None) -> None:
    """``python tests/platform_standin.py --port 8765``: the stand-in in the foreground, for
    trying the platform commands by hand, until Ctrl-C or SIGTERM (which stop its instances)."""
    import argparse

    parser = argparse.ArgumentParser(
        description="A local stand-in for the training platform's API (no account needed): "
        "it registers functions, starts their instances from the uploaded zips, takes "
        "datasets and runs each job to SUCCEEDED in three status queries."
    )
    parser.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (8765)")
    args = parser.parse_args(argv)
    standin = PlatformStandIn(port=args.port)
    print(
        f"platform stand-in at {standin.base_url}, API key {standin.api_key} (Ctrl-C stops it)",
        flush=True,
    )
    # uvicorn stops on SIGINT and SIGTERM, then raises the signal again: both as
    # KeyboardInterrupt, so that SIGTERM too stops the instances instead of killing this.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        standin.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        standin.stop_instances()


if __name__ == "__main__":
    main()
