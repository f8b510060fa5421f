"""One quick chat completion before anything starts: a hanging, unreachable or refusing LLM
is named at once (by its URL, without userinfo), not after every rollout timed out."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx

from runtime.eval.plan import LLM
from runtime.eval.secrets import Scrubber, without_userinfo

__all__ = ["ProbeError", "probe"]

_PROMPT = "Reply with OK."
_MAX_ANSWER = 1024 * 1024  # bytes of the test completion's answer read


class ProbeError(Exception):
    """Exit 1: the LLM did not answer the test completion as an OpenAI endpoint does."""


async def _ask(llm: LLM, url: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    """The status, content type and body (its first ``_MAX_ANSWER`` bytes) of the answer,
    all of it within ``llm.timeout``: httpx's timeouts are per read, which an endpoint
    sending a byte a second never trips."""
    headers = {"authorization": f"Bearer {llm.api_key}"}
    content = bytearray()
    async with httpx.AsyncClient(timeout=llm.timeout) as client:
        with anyio.fail_after(llm.timeout):
            async with client.stream("POST", url, json=body, headers=headers) as response:
                async for chunk in response.aiter_bytes():
                    content += chunk
                    if len(content) > _MAX_ANSWER:  # no test completion is that long
                        break
    kind = response.headers.get("content-type", "no content-type")
    return response.status_code, kind, bytes(content)


def probe(llm: LLM, scrub: Scrubber) -> str | None:
    """None when the LLM answered; a warning when it refused only the request's form (400,
    422: a model that wants ``max_completion_tokens``, say), since it did answer; else
    ProbeError, scrubbed and naming the URL."""
    shown = without_userinfo(llm.base_url)
    url = llm.base_url.rstrip("/") + "/chat/completions"
    body = {
        "model": llm.model,
        "messages": [{"role": "user", "content": _PROMPT}],
        "max_tokens": 1,
    }
    try:
        status, kind, content = anyio.run(_ask, llm, url, body)
    except (TimeoutError, httpx.TimeoutException):
        raise ProbeError(
            f"the LLM at {shown} did not answer a one-token test completion within "
            f"{llm.timeout:g} s (--llm-timeout): is it up, and is the URL right?"
        ) from None
    except httpx.HTTPError as exc:  # refused, DNS, TLS, a malformed URL
        raise ProbeError(
            scrub.text(f"cannot reach the LLM at {shown}: {type(exc).__name__}: {exc}")
        ) from None
    text = scrub.text(content[:1200].decode("utf-8", "replace")[:300].strip())
    if status in (400, 422):
        return (
            f"warning: the LLM at {shown} refused the one-token test completion with HTTP "
            f"{status} ({text}); it is up, so the run goes on"
        )
    if status != 200:
        raise ProbeError(
            f"the LLM at {shown} answered a test completion (model {llm.model}) with HTTP "
            f"{status}: {text}"
        )
    try:  # json, not orjson: half an emoji (a lone surrogate) in one token is still JSON
        answer = json.loads(content)
    except (ValueError, RecursionError):
        raise ProbeError(
            f"the LLM at {shown} answered a test completion with {kind}, not JSON: is it an "
            f"OpenAI-compatible endpoint (its base URL usually ends in /v1)? It said: {text}"
        ) from None
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        raise ProbeError(
            f"the LLM at {shown} answered a test completion without 'choices': not an "
            f"OpenAI-compatible chat completions endpoint? It said: {text}"
        )
    return None
