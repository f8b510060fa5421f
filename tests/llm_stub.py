"""A small OpenAI-compatible chat completions server on loopback, standing in for an LLM.

It plays a fixed agent: asked a question, it calls the calculator tool with the first
arithmetic expression in the question; given the tool's result, it answers with it.
Deterministic, as a seeded sampler is: the same messages and ``seed`` get the same answer
(ids included). A question in ``answers`` is answered at once, with its answer. With an
odd ``seed`` it is careless: it answers at once with the first number of the question; so
K rollouts seeded 0..K-1 of one question disagree whenever the other answer is right.
``broken`` makes it misbehave after its first ``broken_after`` requests: ``"401"`` refuses
the key and names it, as providers do; ``"html"`` answers 200 with a web page;
``"max_tokens"`` refuses (400) a request with ``max_tokens``, as reasoning models do;
``"surrogate"`` ends its answers with half an emoji, a lone surrogate (``\\ud83d``), as a
tokenizer that cut one does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from threaded_server import ThreadedServer

_EXPRESSION = re.compile(r"[\d.]+(?:\s*[-+*/]\s*[\d.]+)+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _digest(body: dict[str, Any]) -> str:
    """The same messages and seed, the same ids."""
    key = json.dumps([body.get("messages"), body.get("seed")], sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()


class LLMStub(ThreadedServer):
    def __init__(
        self,
        port: int,
        answers: dict[str, str] | None = None,
        *,
        broken: str | None = None,
        broken_after: int = 0,
    ) -> None:
        self.port = port
        self.answers = answers or {}  # question -> the answer it "knows", given at once
        self.broken, self.broken_after = broken, broken_after
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str] = []
        super().__init__(port, [Route("/v1/chat/completions", self._chat, methods=["POST"])])

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        authorization = request.headers.get("authorization", "")
        self.authorizations.append(authorization)
        broken = self.broken if len(self.requests) > self.broken_after else None
        if broken == "max_tokens" and "max_tokens" in body:
            error = {"message": "Unsupported parameter: 'max_tokens'", "code": "bad_param"}
            return JSONResponse({"error": error}, 400)
        if broken == "html":
            page = "<html><body><h1>Welcome to nginx!</h1></body></html>"
            return HTMLResponse(page)
        if body["model"] == "reject-key" or broken == "401":  # the error names the key
            key = authorization.removeprefix("Bearer ")
            return JSONResponse(
                {
                    "error": {
                        "message": f"Incorrect API key provided: {key}",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    }
                },
                401,
            )
        if body.get("stream"):
            return StreamingResponse(self._stream(body), media_type="text/event-stream")
        last = body["messages"][-1]
        digest = _digest(body)
        careless = isinstance(body.get("seed"), int) and body["seed"] % 2 == 1
        known = self.answers.get(str(last.get("content")))
        if last["role"] != "tool" and (careless or known is not None):
            found = _NUMBER.search(str(last.get("content", "")))
            guess = found.group(0) if found else 0
            message: dict[str, Any] = {
                "role": "assistant",
                "content": f"The answer is \\boxed{{{guess if careless else known}}}.",
            }
            finish = "stop"
        elif last["role"] == "tool":
            message = {
                "role": "assistant",
                "content": f"The answer is \\boxed{{{last['content']}}}.",
            }
            finish = "stop"
        else:
            found = _EXPRESSION.search(str(last.get("content", "")))
            expression = found.group(0) if found else "0"
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{digest[:8]}",
                        "type": "function",
                        "function": {
                            "name": "calculator",
                            "arguments": f'{{"expression": "{expression}"}}',
                        },
                    }
                ],
            }
            finish = "tool_calls"
        completion = {
            "id": f"chatcmpl-{digest[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30},
        }
        if broken == "surrogate":  # json.dumps escapes it; JSONResponse cannot encode it
            message["content"] = f"{message['content'] or ''} \ud83d"
            return Response(json.dumps(completion), media_type="application/json")
        return JSONResponse(completion)

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[str]:
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body["model"],
        }
        for i, word in enumerate(["The ", "answer ", "is ", "42."]):
            delta = {"role": "assistant", "content": word} if i == 0 else {"content": word}
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            yield f"data: {json.dumps(chunk)}\n\n"
        last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        yield f"data: {json.dumps(last)}\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}
            yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"


def main(argv: list[str] | None = None) -> None:
    """``python tests/llm_stub.py --port 8001``: the stand-in in the foreground, for trying
    the sample rollout by hand (its requests/rollout.json points at port 8001)."""
    import argparse

    parser = argparse.ArgumentParser(
        description="A local OpenAI-compatible stand-in for an LLM: it answers the sample "
        "rollout's calculator task deterministically (no model, no key needed)."
    )
    parser.add_argument("--port", type=int, default=8001, help="port on 127.0.0.1 (8001)")
    args = parser.parse_args(argv)
    stub = LLMStub(args.port)
    print(f"OpenAI-compatible stand-in at {stub.base_url} (Ctrl-C stops it)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises Ctrl-C once stopped
        stub.serve_forever()


if __name__ == "__main__":
    main()
