"""Keeping eval's secrets out of everything it prints or writes.

The secrets are the LLM's API key, every ``model_resource.api_key`` of the data lines and
the password of the LLM URL's userinfo; each is blanked in every form it may travel in
(plain, URL-encoded, base64: ``processors_base.redaction``), and credential-shaped values
(Bearer tokens, URL userinfo) too. A provider's 401 names the key it was sent: that error
reaches the terminal, ``trajectories.jsonl``, ``summary.json`` and the page only blanked.

Values are scrubbed before they are rendered or serialised, never the page or a document:
keys are names and markup is the template's, so a secret equal to a piece of either cannot
delete it. A key under ``MIN_SECRET`` characters is not taken for a secret (blanking ``a``
would blank every word with an a in it), with a warning; an ``api_key`` field is blanked
whole whatever its length.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from processors_base.redaction import REDACTED, redact
from runtime.eval.files import writable

__all__ = ["MIN_SECRET", "Scrubber", "without_userinfo"]

# Shorter keys would blank pieces of other words (as processors_base.redaction keeps encoded
# forms of 8 characters or more).
MIN_SECRET = 8

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
    """Blanks the run's secrets out of text and JSON-like values, which it makes writable."""

    def __init__(
        self, api_key: str | None, base_url: str | None, records: list[tuple[str, Any]]
    ) -> None:
        """``records``: each data line, with where it is (``file.jsonl:3``)."""
        found = [("the LLM key (--llm-api-key, LLM_API_KEY)", api_key or "")]
        for where, record in records:
            found += [(f"model_resource.api_key of {where}", k) for k in _resource_keys(record)]
        if base_url:
            try:
                password = urlsplit(base_url).password
            except ValueError:
                password = None
            if password:
                found += [
                    ("the password of --llm-base-url", p) for p in (password, unquote(password))
                ]
        found = [(where, secret) for where, secret in found if secret not in _NOT_SECRET]
        self.secrets = tuple(dict.fromkeys(s for _, s in found if len(s) >= MIN_SECRET))
        # where each key too short to blank came from (never the key itself)
        self.too_short = list(dict.fromkeys(w for w, s in found if len(s) < MIN_SECRET))

    def warning(self) -> str | None:
        """What the run blanks less than asked, when a key was too short; else None."""
        if not self.too_short:
            return None
        shown = ", ".join(self.too_short[:3])
        if len(self.too_short) > 3:
            shown += f" and {len(self.too_short) - 3} more"
        return (
            f"warning: {shown}: under {MIN_SECRET} characters, too short to blank in text "
            "without blanking pieces of other words, so not taken for a secret (api_key "
            "fields are still blanked)"
        )

    def text(self, text: str) -> str:
        return redact(writable(text), self.secrets)

    def value(self, value: Any) -> Any:
        """A JSON-like value with every string value scrubbed and every ``api_key`` field
        blanked whole; keys are names, kept as they are."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                k: REDACTED
                if k == "api_key" and isinstance(v, str) and v not in _NOT_SECRET
                else self.value(v)
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value
