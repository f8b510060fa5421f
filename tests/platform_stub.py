"""A stand-in for the training platform's function registry, implementing the contract
documented in the README (the real one is remote and cannot be reached from here)."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from threaded_server import ThreadedServer


class PlatformStub(ThreadedServer):
    def __init__(self, port: int, api_key: str = "sk-platform-test", busy_first: int = 0) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.api_key = api_key
        self.busy_left = busy_first  # answer this many registrations with 503 + Retry-After first
        self.functions: dict[str, dict[str, Any]] = {}
        self.registrations: list[dict[str, Any]] = []
        self.authorizations: list[str] = []
        super().__init__(
            port,
            [
                Route("/api/v1/functions", self._register, methods=["POST"]),
                Route("/api/v1/functions/{name}", self._get, methods=["GET"]),
            ],
        )

    def _denied(self, request: Request) -> JSONResponse | None:
        header = request.headers.get("authorization", "")
        self.authorizations.append(header)
        if header != f"Bearer {self.api_key}":
            return JSONResponse(
                {"code": "Unauthorized", "message": "invalid API key", "request_id": "req-denied"},
                401,
            )
        return None

    async def _get(self, request: Request) -> JSONResponse:
        denied = self._denied(request)
        if denied:
            return denied
        function = self.functions.get(request.path_params["name"])
        if function is None:
            return JSONResponse(
                {"code": "NotFound", "message": "no such function", "request_id": "req-404"}, 404
            )
        return JSONResponse({"function": function, "request_id": f"req-{uuid.uuid4().hex[:6]}"})

    async def _register(self, request: Request) -> JSONResponse:
        denied = self._denied(request)
        if denied:
            return denied
        if self.busy_left > 0:
            self.busy_left -= 1
            return JSONResponse(
                {"code": "Throttled", "message": "busy", "request_id": "req-busy"},
                503,
                headers={"Retry-After": "0.1"},
            )
        payload = await request.json()
        missing = {"function_type", "name", "image", "target", "runtime"} - set(payload)
        if missing or "@sha256:" not in payload.get("image", ""):
            return JSONResponse(
                {
                    "code": "InvalidParameter",
                    "message": f"missing {sorted(missing)} or image not by digest",
                    "request_id": "req-bad",
                },
                400,
            )
        self.registrations.append(payload)
        previous = self.functions.get(payload["name"], {})
        function = {
            **payload,
            "entity_id": previous.get("entity_id") or f"fn-{uuid.uuid4().hex[:10]}",
            "instance_ids": [
                f"inst-{uuid.uuid4().hex[:8]}"
                for _ in range(payload["runtime"].get("min_instances", 1))
            ],
        }
        self.functions[payload["name"]] = function
        return JSONResponse(
            {"function": function, "request_id": f"req-{uuid.uuid4().hex[:6]}"}, 201
        )
