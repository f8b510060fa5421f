"""The ceiling: a bare ASGI app on the same uvicorn doing the same JSON work (parse the
reward input, count the messages, serialise the output) with nothing else."""

import asyncio
import os
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:  # imported by the first rollout: not in the echo's cold start
    import aiohttp

WAIT = float(os.environ.get("BARE_WAIT", "0"))  # scenario 3: the same 100 ms await

HEADERS = [(b"content-type", b"application/json")]
LLM: "aiohttp.ClientSession | None" = None  # scenario 9: the rollouts' calls to the LLM


async def rollout(data: dict) -> dict:
    """The long rollout's work without a runtime: its one chat completion, its trajectory."""
    global LLM
    if LLM is None:
        import aiohttp

        LLM = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    url = f"{data['model_resource']['base_url']}/chat/completions"
    async with LLM.post(url, json={"messages": data["messages"]}) as answer:
        text = await answer.text()
    messages = [*data["messages"], {"role": "assistant", "content": text}]
    return {"agent_output": {"messages": messages}}


async def answer(data: dict) -> bytes:
    if "model_resource" in data:  # a rollout (scenario 9)
        done = await rollout(data)
    elif "agent_outputs" in data:  # a group reward: a score per trajectory
        rewards = [
            {"reward_score": float(len(o.get("messages") or [])), "reward_metrics": None}
            for o in data["agent_outputs"]
        ]
        done = {"reward": {"rewards": rewards}}
    else:
        messages = (data.get("agent_output") or {}).get("messages") or []
        done = {"reward": {"reward_score": float(len(messages)), "reward_metrics": None}}
    return orjson.dumps({**done, "status": "success", "error": None, "error_code": None})


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/health":
        body = b'{"status":"healthy"}'
    else:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        data = orjson.loads(b"".join(chunks))
        if WAIT:
            await asyncio.sleep(WAIT)
        body = await answer(data)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [*HEADERS, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
