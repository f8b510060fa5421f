"""What the platform commands print: never the API key, never a control sequence.

The platform may echo the key back (a 401 body, an HTML error page, a URL-encoded
``status.message``); ``scrub`` blanks the key in all its forms (plain, URL-encoded, base64:
``processors_base.redaction`` derives them), and any ``Bearer ...`` value. What the
platform says (log lines, messages, names) may also carry terminal control sequences (a
window title, a cleared screen, colours); ``printable`` shows them escaped.
"""

from __future__ import annotations

from processors_base.redaction import redact

__all__ = ["add_secret", "printable", "scrub", "shown"]

_secrets: tuple[str, ...] = ()


def add_secret(secret: str) -> None:
    """Blank ``secret`` from everything printed from now on (this process)."""
    global _secrets
    if secret and secret not in _secrets:
        _secrets = (*_secrets, secret)


def scrub(text: str) -> str:
    return redact(text, _secrets)


# C0 (ESC, BEL, line breaks...), DEL and C1 (CSI, OSC, ST... as single characters)
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_CONTROL |= {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
_CONTROL_BUT_TAB = {c: text for c, text in _CONTROL.items() if c != 0x09}


def printable(text: str, *, tabs: bool = False) -> str:
    """``text`` on one line with every control character shown escaped (``\\x1b``,
    ``\\n``), so that none reaches the terminal; tabs kept when ``tabs``."""
    return text.translate(_CONTROL_BUT_TAB if tabs else _CONTROL)


def shown(text: str) -> str:
    """A line as the platform commands print it: the key blanked, controls escaped."""
    return printable(scrub(text), tabs=True)
