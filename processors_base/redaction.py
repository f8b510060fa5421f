"""Blanking secrets out of text the runtime writes: error bodies, log lines, span attributes.

Two kinds of secret are recognised:

- the current request's own secrets (its ``model_resource.api_key``), in every form they
  travel in: plain, URL-encoded (``quote``, ``quote_plus``, lower-case hex) and base64
  (also inside a longer base64 text such as a Basic ``Authorization`` value);
- credentials recognisable by their shape: ``Authorization`` values, ``Bearer`` tokens,
  the userinfo of a URL and secret-named query parameters.

The request's secrets live in a context variable that the runtime sets per request, so
work in the request's task and in the threads it starts sees them. Their encoded forms are
derived only when some text is actually scrubbed, at most once per request (and once per
key while it keeps coming, since a job sends the same key with every request).
"""

from __future__ import annotations

import base64
import functools
import re
import threading
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = [
    "REDACTED",
    "Secrets",
    "in_flight",
    "redact",
    "request_secrets",
    "scrub_credentials",
    "secret_forms",
]

REDACTED = "***"

_MIN_DERIVED = 8  # shorter encoded fragments would blank unrelated text


class Secrets(tuple):  # type: ignore[type-arg]
    """The request's secret values; their encoded forms are derived on first use."""

    _forms: tuple[str, ...] | None = None

    @classmethod
    def of(cls, input_data: Any) -> Secrets:
        """The secrets a request carries: its ``model_resource.api_key`` (a SecretStr on a
        rollout; a plain string where another input carries a model_resource as an extra)."""
        # Read the model's fields and extras directly: a getattr that misses costs a raised
        # AttributeError inside pydantic, microseconds on every reward request.
        fields = getattr(input_data, "__dict__", None) or {}
        resource = fields.get("model_resource")
        if resource is None:
            extra = getattr(input_data, "__pydantic_extra__", None)
            resource = extra.get("model_resource") if extra else None
        if resource is None:
            return _NONE
        key = (
            resource.get("api_key")
            if isinstance(resource, dict)
            else getattr(resource, "api_key", None)
        )
        value = key.get_secret_value() if hasattr(key, "get_secret_value") else key
        return cls((value,)) if isinstance(value, str) and value else _NONE

    def forms(self) -> tuple[str, ...]:
        if self._forms is None:
            self._forms = _derive(self)
        return self._forms


_NONE = Secrets()

# The current request's secrets. A plain tuple is accepted too (its forms are then
# derived at each use).
request_secrets: ContextVar[tuple[str, ...]] = ContextVar("request_secrets", default=())


class _InFlight:
    """The secrets of every request in flight in this process, for text written where no
    request's context is visible (a thread the runtime did not start, a warning): the
    request path adds and removes its own (a counted set, a lock held for a dict update);
    readers take an immutable snapshot without locking."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.snapshot: Secrets = Secrets()

    def add(self, secrets: tuple[str, ...]) -> None:
        with self._lock:
            for secret in secrets:
                count = self._counts.get(secret, 0)
                self._counts[secret] = count + 1
                if not count:
                    self.snapshot = Secrets(self._counts)

    def discard(self, secrets: tuple[str, ...]) -> None:
        with self._lock:
            for secret in secrets:
                count = self._counts.pop(secret, 0) - 1
                if count > 0:
                    self._counts[secret] = count
                else:
                    self.snapshot = Secrets(self._counts)


in_flight = _InFlight()


def _derive(secrets: Iterable[str]) -> tuple[str, ...]:
    forms: set[str] = set()
    for secret in secrets:
        if secret:
            forms.update(_forms_of(secret))
    return tuple(sorted(forms, key=len, reverse=True))  # longest first: no partial leftovers


@functools.lru_cache(maxsize=16)  # a job sends one key with every request: derive it once
def _forms_of(secret: str) -> frozenset[str]:
    forms = {secret}
    derived = {quote(secret, safe=""), quote(secret), quote_plus(secret)}
    derived |= {quote(text, safe="") for text in derived}  # encoded twice: %252F
    derived |= {_lower_hex(text) for text in derived}
    raw = secret.encode()
    # MIME base64 (base64.encodebytes): a line break every 76 characters
    derived.add(base64.encodebytes(raw).decode().rstrip("\n"))
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        derived.add(encode(raw).decode())
        # Inside a longer base64 text the secret's encoding depends on its offset
        # modulo 3; keep, for each offset, the characters that depend on it alone.
        for shift in range(3):
            text = encode(b"\0" * shift + raw).decode()
            derived.add(text[(shift * 8 + 5) // 6 : (shift + len(raw)) * 8 // 6])
    forms |= {form for form in derived if len(form) >= _MIN_DERIVED}
    return frozenset(forms)


def _lower_hex(text: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), text)


def secret_forms(secrets: tuple[str, ...]) -> tuple[str, ...]:
    """Every form of ``secrets`` that is blanked, longest first."""
    return secrets.forms() if isinstance(secrets, Secrets) else _derive(secrets)


_CREDENTIALS = re.compile(
    # an Authorization value: "Authorization: Bearer x", "'authorization': 'Basic x'", ...
    r"(?P<auth>(?i:proxy-)?(?i:authorization)[\"']?\s*[:=]\s*[\"']?)(?:[A-Za-z]+\s+)?[^\s\"',;}\]]+"
    # a bearer token anywhere
    r"|(?P<bearer>(?i:bearer)\s+)[A-Za-z0-9\-._~+/]{8,}=*"
    # the userinfo of a URL: scheme://user:password@host
    r"|(?P<url>[A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s@\"']+@"
    # secret-named query parameters: ?key=..., &access_token=..., &X-Amz-Signature=...
    r"|(?P<param>[?&](?i:api[_-]?key|key|token|access[_-]?token|password|secret|sig|signature"
    r"|x-amz-signature|x-amz-credential|x-amz-security-token)=)[^&#\s\"']+"
    # secrets of a connection string: ...;AccountKey=...;Password=...
    r"|(?P<conn>(?i:accountkey|sharedaccesskey|sharedaccesssignature|password|pwd)=)[^;&\s\"']+"
    # a "Token" scheme value (with a digit: prose such as "Token generation" stays)
    r"|(?P<token>\bToken\s+)(?=[A-Za-z\-._~+/]*[0-9])[A-Za-z0-9\-._~+/]{16,}=*"
    # a JSON Web Token: header.payload.signature, both first parts JSON objects in base64url
    r"|(?P<jwt>)eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"
    # a PEM private key, whole
    r"|(?P<pem>)-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"
)


def _may_hold_credentials(text: str) -> bool:
    return (
        "://" in text
        or "uthorization" in text
        or "UTHORIZATION" in text
        or "earer" in text
        or "EARER" in text
        or ("=" in text and ("?" in text or "&" in text or ";" in text))
        or "eyJ" in text
        or "Token" in text
        or "PRIVATE KEY" in text
        or "ccountKey" in text
        or "assword=" in text
    )


def scrub_credentials(text: str, marker: str = REDACTED) -> str:
    """Blank credentials recognisable by their shape (Authorization, Bearer, URL userinfo)."""

    if not _may_hold_credentials(text):  # most lines: skip the regex (a few microseconds)
        return text

    def blank(match: re.Match[str]) -> str:
        kind = match.lastgroup or ""
        return match.group(kind) + marker + ("@" if kind == "url" else "")

    return _CREDENTIALS.sub(blank, text)


def redact(
    text: str,
    secrets: tuple[str, ...] | None = None,
    marker: str = REDACTED,
    credentials: bool = True,
) -> str:
    """``text`` with the request's secrets (all their forms) and, unless ``credentials`` is
    false, credential-shaped values blanked. ``secrets`` defaults to the current request's."""
    found = request_secrets.get() if secrets is None else secrets
    if not found and secrets is None:  # no request's context here: all requests' secrets
        found = in_flight.snapshot
    if found:
        for form in secret_forms(found):
            if form in text:
                text = text.replace(form, marker)
    return scrub_credentials(text, marker) if credentials else text
