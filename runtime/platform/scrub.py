"""The API key never printed: every text the platform commands print goes through ``scrub``.

The platform may echo the key back (a 401 body, an HTML error page, a URL-encoded
``status.message``); the key is blanked in all its forms (plain, URL-encoded, base64:
``processors_base.redaction`` derives them), and so is any ``Bearer ...`` value.
"""

from __future__ import annotations

from processors_base.redaction import redact

__all__ = ["add_secret", "scrub"]

_secrets: tuple[str, ...] = ()


def add_secret(secret: str) -> None:
    """Blank ``secret`` from everything printed from now on (this process)."""
    global _secrets
    if secret and secret not in _secrets:
        _secrets = (*_secrets, secret)


def scrub(text: str) -> str:
    return redact(text, _secrets)
