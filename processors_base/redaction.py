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

Scrubbing takes time linear in the text's length, whatever the text (a long run of letters,
a DNA sequence, a base64 dump). A text that is cut before it is written is cut before it is
scrubbed (``redact_head``, ``redact_tail``): only the part kept, and a margin past the cut
so that a secret the cut splits is still recognised whole.
"""

from __future__ import annotations

import base64
import functools
import itertools
import operator
import re
import threading
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any, NamedTuple
from urllib.parse import quote, quote_plus

__all__ = [
    "CUT_MARGIN",
    "REDACTED",
    "Secrets",
    "in_flight",
    "redact",
    "redact_head",
    "redact_tail",
    "request_secrets",
    "scrub_credentials",
    "secret_forms",
]

REDACTED = "***"
# How far past a cut a text is scrubbed with the part kept (twice: see redact_head), with
# the longest form of a secret besides: a credential that the cut splits is recognised whole
# there (a URL's password only with the "@" after it, a JWT with its second dot).
CUT_MARGIN = 8192

_MIN_DERIVED = 8  # shorter encoded fragments would blank unrelated text
# A longer key (no real one is; a hostile client can send megabytes) is blanked as written,
# its encoded forms not derived: that costs seconds a megabyte, on the request's path.
_MAX_DERIVED = 4096


class Secrets(tuple[str, ...]):
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
        reveal = getattr(key, "get_secret_value", None)  # a SecretStr's
        value = reveal() if reveal is not None else key
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
    if len(secret) > _MAX_DERIVED:
        return frozenset(forms)
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


def _whole(name: str, body: str) -> str:
    """``body`` matched as a whole and never backtracked into: an atomic group (which
    Python < 3.11 lacks) made of a lookahead and a back-reference to what it captured."""
    return f"(?=(?P<{name}>{body}))(?P={name})"


class _Shape(NamedTuple):
    """A credential shape. ``pattern`` starts with the literal ``anchor`` (the regex engine
    finds it by a fast scan, where an alternation would be tried at every position) and
    blanks its group ``v``; ``lowered``: it runs on the lower-cased text (a keyword of any
    case); ``needs``: strings of characters, of each of which the text must hold one (a
    fast test), else the shape is skipped; ``keyed``: its keyword ends with "=", so its
    anchor is within _KEYED characters before a "="."""

    needs: tuple[str, ...]
    anchor: str
    pattern: re.Pattern[str]
    lowered: bool
    keyed: bool


def _shape(
    needs: tuple[str, ...], anchor: str, pattern: str, lowered: bool = True, keyed: bool = False
) -> _Shape:
    return _Shape(needs, anchor, re.compile(pattern), lowered, keyed)


# Linear time: every run a pattern repeats over is followed by a literal (which the engine
# checks before it backtracks a step), or taken whole (_whole), or ends the pattern; and no
# run is scanned from each of its characters (a JWT, whose header may follow anything, is
# found from its first dot: see _jwts).
# What ends a value: whitespace (ASCII and Latin-1: a class the engine checks as a bitmap;
# a value running on over a rarer space only blanks more), quotes, and its separators.
_SPACE = r"\t-\r \x1c-\x1f\x85\xa0"
_PARAM = f"""(?P<v>[^&#{_SPACE}"']+)"""  # a query parameter's value
_CONN = f"""(?P<v>[^;&{_SPACE}"']+)"""  # a connection-string field's value
_B64URL = "A-Za-z0-9_-"
_TOKEN = r"A-Za-z0-9\-._~+/"
_QUERY = ("=", "?&")  # a query parameter: "=" and "?" or "&"


def _keyed(needs: tuple[str, ...], anchor: str, pattern: str) -> _Shape:
    return _shape(needs, anchor, pattern, keyed=True)


_SHAPES = (
    # an Authorization value: "Authorization: Bearer x", "'authorization': 'Basic x'", ...
    _shape(
        (":=", "zZ"),
        "authorization",
        "authorization[\"']?" + _whole("s", r"\s*") + "[:=]" + _whole("t", r"\s*") + "[\"']?"
        "(?P<v>(?:" + _whole("w", "[a-z]+") + _whole("u", r"\s+") + ")?"
        f"""[^,;}}\\]{_SPACE}"']+)""",
    ),
    # a bearer token anywhere
    _shape(("bB",), "bearer", "bearer" + _whole("s", r"\s+") + r"(?P<v>[a-z0-9\-._~+/]{8,}=*)"),
    # a "Token" scheme value (with a digit: prose such as "Token generation" stays)
    _shape(
        ("T",),
        "Token",
        # the cheapest test first, which most "Token"s fail: 16 characters after a few
        # spaces (or many: rare, the long way)
        rf"Token(?=\s{{1,8}}[{_TOKEN}]{{16}}|\s{{9}})(?<!\wToken)"
        + _whole("s", r"\s+")
        + "(?P<v>"
        + _whole("t", r"[A-Za-z\-._~+/]*")
        + f"[0-9][{_TOKEN}]*=*)",
        lowered=False,
    ),
    # the userinfo of a URL: scheme://user:password@host
    _shape(
        (":",),
        "://",
        f"""://(?=[^/?#@{_SPACE}"']+@)(?P<v>[^/?#@{_SPACE}"']+)""",
        lowered=False,
    ),
    # secret-named query parameters: ?key=..., &access_token=..., &X-Amz-Signature=...
    _keyed(_QUERY, "api", "api(?<=[?&]api)[_-]?key=" + _PARAM),
    _keyed(_QUERY, "access", "access(?<=[?&]access)[_-]?token=" + _PARAM),
    _keyed(_QUERY, "key=", "key=(?<=[?&]key=)" + _PARAM),
    _keyed(_QUERY, "token=", "token=(?<=[?&]token=)" + _PARAM),
    _keyed(_QUERY, "secret=", "secret=(?<=[?&]secret=)" + _PARAM),
    _keyed(_QUERY, "sig", "sig(?<=[?&]sig)(?:nature)?=" + _PARAM),
    _keyed(
        _QUERY,
        "x-amz-",
        "x-amz-(?<=[?&]x-amz-)(?:signature|credential|security-token)=" + _PARAM,
    ),
    # a password as a query parameter or in a connection string: ...;Password=...
    _keyed(
        ("=",),
        "password=",
        f"""password=(?P<v>(?<=[?&]password=)[^&#{_SPACE}"']+|[^;&{_SPACE}"']+)""",
    ),
    # the other secrets of a connection string: ...;AccountKey=...
    _keyed(("=",), "accountkey=", "accountkey=" + _CONN),
    _keyed(("=",), "sharedaccess", "sharedaccess(?:key|signature)=" + _CONN),
    _keyed(("=",), "pwd=", "pwd=" + _CONN),
)
# A JSON Web Token: header.payload.signature, both first parts JSON objects in base64url
# ("eyJ..."). It is found from its first dot on (".eyJ" is rare: "eyJeyJ..." is not), its
# header then back from that dot; the search goes on at the payload's second dot, which may
# start the payload of a JWT whose header this payload is.
_JWT_PAYLOAD = re.compile(rf"\.eyJ(?=[{_B64URL}]{{4,}}\.)[{_B64URL}]*")
_B64URL_RUN = re.compile(f"[{_B64URL}]*")
# A PEM private key, whole (to its END line, else to the end of the text).
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
_PEM_END = re.compile(r"-----END [A-Z ]*PRIVATE KEY-----")
_SPAN = operator.methodcaller("span", "v")
_SHORT = 4096  # a text this short is searched for each pattern's anchor first
_KEYED = 32  # characters before its "=" that hold a keyed shape's anchor, and the [?&]
_FEW_EQUALS = 256


def _lowered(text: str) -> str:
    """``text`` lower-cased, each character at its place ("İ", the only character whose
    lower case is two, as "i"); U+0131 and U+017F (dotless i, long s) as "i" and "s" (a
    case-insensitive regex matches them so, as the scrubber before this one did)."""
    if not text.isascii():
        try:  # Latin-1 (no letter of it lower-cases to ASCII but A-Z): 10 times faster
            return text.encode("latin-1").lower().decode("latin-1")
        except UnicodeEncodeError:
            if "\u0130" in text:  # replaced first: lower-cased, a megabyte of it took 23 ms
                text = text.replace("\u0130", "i")
            low = text.lower()
            if len(low) != len(text):  # a letter of a later Unicode: each at its place
                low = "".join(char if len(char.lower()) != 1 else char.lower() for char in text)
            if "\u0131" in low:
                low = low.replace("\u0131", "i")
            return low.replace("\u017f", "s") if "\u017f" in low else low
    return text.lower()


def _jwts(text: str) -> list[tuple[int, int]]:
    """Where the JWTs of ``text`` are: each from the first dot of what may be one."""
    spans: list[tuple[int, int]] = []
    backwards = text[::-1]  # the header's run of base64url, back from its dot
    for payload in _JWT_PAYLOAD.finditer(text):
        dot, end = payload.span()
        run = len(text) - _run_end(backwards, len(text) - dot)
        # the header: the run's first "eyJ" with 4 more characters before the dot
        start = text.find("eyJ", run, dot - 4) if dot - run >= 7 else -1
        if start >= 0:
            end = _run_end(text, end + 1)  # and the signature
            if spans and start < spans[-1][1]:  # its header is the last one's signature
                start = spans.pop()[0]
            spans.append((start, end))
    return spans


def _run_end(text: str, at: int) -> int:
    """Where the run of base64url characters that starts at ``at`` ends."""
    run = _B64URL_RUN.match(text, at)  # matches the empty run too: never None
    return run.end() if run is not None else at


def _pem_keys(text: str) -> list[tuple[int, int]]:
    """Where the PEM private keys of ``text`` are (a BEGIN line found in a regex scan; its END
    line found in another, from there on)."""
    spans = []
    start = text.find("-----BEGIN ")
    while start >= 0 and (begin := _PEM_BEGIN.search(text, start)) is not None:
        end = _PEM_END.search(text, begin.end())
        start = end.end() if end is not None else len(text)
        spans.append((begin.start(), start))
    return spans


def scrub_credentials(text: str, marker: str = REDACTED) -> str:
    """Blank credentials recognisable by their shape (Authorization, Bearer, URL userinfo,
    ...), in time linear in the length of ``text``. Each shape is looked for in the whole
    text, and all that any of them finds is blanked (one never hides another's keyword)."""
    found = [_pem_keys(text)] if "-----BEGIN " in text else []
    if ".eyJ" in text:
        found.append(_jwts(text))
    short = len(text) < _SHORT
    # a long text is lowered only once a lowered shape needs it ("" until then; lowering
    # never empties a text that long)
    low = _lowered(text) if short else ""
    near = None
    for needs, anchor, pattern, lowered, keyed in _SHAPES:
        if short:  # most lines: no anchor is found, no pattern runs
            if keyed and "=" not in text:
                break  # the keyed shapes come last
            if anchor not in (low if lowered else text):
                continue
        elif not all(any(char in text for char in chars) for chars in needs):
            continue
        elif lowered and not low:
            low = _lowered(text)
            near = _before_equals(low)
        if keyed and near is not None and anchor not in near:
            continue
        found.append(list(map(_SPAN, pattern.finditer(low if lowered else text))))
    spans = [some for some in found if some]
    if not spans:
        return text
    starts, ends = zip(*(spans[0] if len(spans) == 1 else _union(spans)), strict=True)
    return marker.join(map(text.__getitem__, map(slice, (0, *ends), (*starts, None))))


def _union(spans: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """The spans of all lists (each in order, apart), in order, overlapping ones joined."""
    union: list[tuple[int, int]] = []
    for start, end in sorted(itertools.chain.from_iterable(spans)):
        if union and start < union[-1][1]:
            if end > union[-1][1]:
                union[-1] = (union[-1][0], end)
        else:
            union.append((start, end))
    return union


def _before_equals(low: str) -> str | None:
    """The text just before each "=" in ``low``, where a keyed shape's anchor must be (a
    few short searches instead of a search of the whole text for each); None for many."""
    if low.count("=") > _FEW_EQUALS:
        return None
    before = []
    at = low.find("=")
    while at >= 0:
        before.append(low[max(0, at - _KEYED) : at + 1])
        at = low.find("=", at + 1)
    return "\n".join(before)


def redact(
    text: str,
    secrets: tuple[str, ...] | None = None,
    marker: str = REDACTED,
    credentials: bool = True,
) -> str:
    """``text`` with the request's secrets (all their forms) and, unless ``credentials`` is
    false, credential-shaped values blanked. ``secrets`` defaults to the current request's."""
    found = _secrets(secrets)
    if found:
        for form in secret_forms(found):
            if form in text:
                text = text.replace(form, marker)
    return scrub_credentials(text, marker) if credentials else text


def redact_head(
    text: str,
    limit: int,
    secrets: tuple[str, ...] | None = None,
    marker: str = REDACTED,
    credentials: bool = True,
) -> str:
    """``redact(text)`` cut to at most ``limit`` characters from its start, scrubbing only
    that and twice ``CUT_MARGIN`` more of ``text``: the first margin so that a secret the
    cut splits is recognised whole; the second holds what is left of a secret the end of
    the scrubbed part splits, never kept (so less is kept where blanking shortened the
    text by more than a margin)."""
    found = _secrets(secrets)
    margin = _margin(found)
    if len(text) <= limit + 2 * margin:
        return redact(text, found, marker, credentials)[:limit]
    scrubbed = redact(text[: limit + 2 * margin], found, marker, credentials)
    return scrubbed[: max(0, min(limit, len(scrubbed) - margin))]


def redact_tail(
    text: str,
    limit: int,
    secrets: tuple[str, ...] | None = None,
    marker: str = REDACTED,
    credentials: bool = True,
) -> str:
    """``redact(text)`` cut to at most ``limit`` characters from its end: ``redact_head``
    from the other side."""
    found = _secrets(secrets)
    margin = _margin(found)
    if len(text) <= limit + 2 * margin:
        scrubbed = redact(text, found, marker, credentials)
        return scrubbed[max(0, len(scrubbed) - limit) :]
    scrubbed = redact(text[len(text) - limit - 2 * margin :], found, marker, credentials)
    return scrubbed[max(margin, len(scrubbed) - limit) :]


def _secrets(secrets: tuple[str, ...] | None) -> tuple[str, ...]:
    if secrets is not None:
        return secrets
    # no request's context here (a thread of the user's): every request's secrets
    return request_secrets.get() or in_flight.snapshot


def _margin(secrets: tuple[str, ...]) -> int:
    forms = secret_forms(secrets) if secrets else ()
    return CUT_MARGIN + (len(forms[0]) if forms else 0)  # forms: longest first
