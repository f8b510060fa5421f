"""One quick chat completion before anything starts: a hanging, unreachable or refusing LLM
is named at once (by its URL, without userinfo), not after every rollout timed out."""

from __future__ import annotations

import httpx
import orjson

from runtime.eval.plan import LLM
from runtime.eval.secrets import Scrubber, without_userinfo

__all__ = ["ProbeError", "probe"]

_PROMPT = "Reply with OK."


class ProbeError(Exception):
    """Exit 1: the LLM did not answer the test completion as an OpenAI endpoint does."""


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
        with httpx.Client(timeout=llm.timeout) as client:
            response = client.post(
                url, json=body, headers={"authorization": f"Bearer {llm.api_key}"}
            )
    except httpx.TimeoutException:
        raise ProbeError(
            f"the LLM at {shown} did not answer a one-token test completion within "
            f"{llm.timeout:g} s (--llm-timeout): is it up, and is the URL right?"
        ) from None
    except httpx.HTTPError as exc:  # refused, DNS, TLS, a malformed URL
        raise ProbeError(
            scrub.text(f"cannot reach the LLM at {shown}: {type(exc).__name__}: {exc}")
        ) from None
    text = scrub.text(response.text[:300].strip())
    if response.status_code in (400, 422):
        return (
            f"warning: the LLM at {shown} refused the one-token test completion with HTTP "
            f"{response.status_code} ({text}); it is up, so the run goes on"
        )
    if response.status_code != 200:
        raise ProbeError(
            f"the LLM at {shown} answered a test completion (model {llm.model}) with HTTP "
            f"{response.status_code}: {text}"
        )
    try:
        answer = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        kind = response.headers.get("content-type", "no content-type")
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
