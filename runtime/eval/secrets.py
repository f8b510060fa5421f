"""Keeping eval's secrets out of everything it prints or writes.

The secrets are the LLM's API key, every ``model_resource.api_key`` of the data lines and
the password of the LLM URL's userinfo; each is blanked in every form it may travel in
(plain, URL-encoded, base64: ``processors_base.redaction``), and credential-shaped values
(Bearer tokens, URL userinfo) too. A provider's 401 names the key it was sent: that error
reaches the terminal, ``trajectories.jsonl``, ``summary.json`` and the page only blanked.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from processors_base.redaction import redact

__all__ = ["Scrubber", "without_userinfo"]

# The default key of an endpoint that needs none: not a secret, and blanking the word
# everywhere would mangle text.
_NOT_SECRET = frozenset(("", "EMPTY"))


def without_userinfo(url: str) -> str:
    """``url`` as shown: without ``user:password@``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url, ())
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _resource_keys(value: Any) -> list[str]:
    """Every ``model_resource.api_key`` string anywhere in a data line."""
    found: list[str] = []
    if isinstance(value, dict):
        resource = value.get("model_resource")
        if isinstance(resource, dict) and isinstance(resource.get("api_key"), str):
            found.append(resource["api_key"])
        for item in value.values():
            found += _resource_keys(item)
    elif isinstance(value, list):
        for item in value:
            found += _resource_keys(item)
    return found


class Scrubber:
    """Blanks the run's secrets out of text and JSON-like values."""

    def __init__(self, api_key: str | None, base_url: str | None, records: list[Any]) -> None:
        secrets = [api_key or ""]
        for record in records:
            secrets += _resource_keys(record)
        if base_url:
            try:
                password = urlsplit(base_url).password
            except ValueError:
                password = None
            if password:
                secrets += [password, unquote(password)]
        self.secrets = tuple(dict.fromkeys(s for s in secrets if s not in _NOT_SECRET))

    def text(self, text: str) -> str:
        return redact(text, self.secrets)

    def value(self, value: Any) -> Any:
        """A JSON-like value with every string (keys too) scrubbed."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value
