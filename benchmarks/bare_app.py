"""The ceiling: a bare ASGI app on the same uvicorn doing the same JSON work (parse the
reward input, count the messages, serialise the output) with nothing else."""

import asyncio
import os

import orjson

WAIT = float(os.environ.get("BARE_WAIT", "0"))  # scenario 3: the same 100 ms await

HEADERS = [(b"content-type", b"application/json")]


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
        if "agent_outputs" in data:  # a group reward: a score per trajectory
            rewards = [
                {"reward_score": float(len(o.get("messages") or [])), "reward_metrics": None}
                for o in data["agent_outputs"]
            ]
            reward: dict = {"rewards": rewards}
        else:
            messages = (data.get("agent_output") or {}).get("messages") or []
            reward = {"reward_score": float(len(messages)), "reward_metrics": None}
        body = orjson.dumps(
            {"reward": reward, "status": "success", "error": None, "error_code": None}
        )
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [*HEADERS, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
