"""The secret scrubber takes time linear in its text, whatever the text; a text cut before it
is written is cut before it is scrubbed, never splitting a secret so that part of it stays;
and a huge error message or log line neither delays its answer nor blocks the event loop."""

from __future__ import annotations

import base64
import concurrent.futures
import math
import signal
import time
from collections.abc import Callable, Iterator
from urllib.parse import quote

import httpx
import orjson
import pytest
from conftest import Server, reward_body
from opentelemetry.sdk.trace import TracerProvider

from processors_base.observability._core import capture
from processors_base.observability.processor import record_output
from processors_base.redaction import CUT_MARGIN, redact, redact_head, redact_tail, secret_forms

KEY = "sk-Zm9v/YmFy+baz=qux0123"
MB = 1_000_000


def run(unit: str, lead: str = "", size: int = MB) -> str:
    """``lead`` then ``unit`` repeated: ``size`` characters (a megabyte) in all."""
    return lead + (unit * (size // len(unit) + 1))[: size - len(lead)]


# Each alternative's keyword, then long runs of each class of characters it consumes: a
# pattern that rescanned a run from each of its characters would take minutes here.
LEADS = {
    "none": "",
    "a=b;": "a=b;",  # the issue's: "a=b;" + "A" * n took 24.5 s for n = 80,000
    "auth": "Authorization: ",
    "auth=": "authorization='",
    "auth scheme": "Authorization: Basic",
    "bearer": "Bearer ",
    "url": "https://",
    "userinfo": "postgres://alice:",
    "param": "?key=",
    "api param": "&api_key=",
    "conn": "AccountKey=",
    "password": "Password=",
    "token": "Token ",
    "jwt": "eyJhbGci.eyJzdWIi.",
    "jwt header": "x eyJhbGci",
    "pem": "-----BEGIN RSA PRIVATE KEY-----\n",
}
RUNS = {
    "letters": "A",
    "lower": "a",
    "digits": "7",
    "spaces": " ",
    "newlines": "\n",
    "dashes": "-",
    "base64": "Zm9v+/",
    "equals": "=",
    "escapes": "%3D",
    "accents": "é",
    "dotless i": "\u0131",  # lower-cased as "i" (a keyword's letter), as is "\u017f" as "s"
    "long s": "\u017f",
    "dotted I": "İ",  # the one letter whose lower case is two characters
    "eyJ": "eyJ",
}
REPEATED = {
    "Authorization:": "Authorization:",
    "authorization space": "authorization ",
    "Bearer": "Bearer ",
    "bearer": "bearer",
    "schemes": "a://",
    "userinfos": "a://a:",
    "?key=": "?key=",
    "&key=": "&key=",
    "?key": "?key",
    "api_key=": "&api_key",
    "password=": "password=",
    "Password=;": "Password=;",
    "Token": "Token",
    "Token space": "Token ",
    "Token two spaces": "Token  ",
    "Token word": "Token AAAAAAAAAAAAAAAAAAAA ",
    "eyJ": "eyJ",
    "eyJ.": "eyJ.",
    ".eyJ": ".eyJ",
    "%3DeyJ": "%3DeyJ",
    "BEGIN": "-----BEGIN ",
    "BEGIN lines, no END": "-----BEGIN RSA PRIVATE KEY-----\n",
    "END": "-----END ",
    "key, nearly": KEY[:-1],  # the secret-forms loop: each form nearly found everywhere
    "key base64, nearly": base64.b64encode(KEY.encode()).decode()[:-2],
    "key quoted, nearly": quote(KEY, safe="")[:-1],
}
SHAPES = {  # (unit, lead): made in the test, not all held at once
    **{f"{lead} + {name}": (unit, LEADS[lead]) for lead in LEADS for name, unit in RUNS.items()},
    **{f"{name} repeated": (unit, "") for name, unit in REPEATED.items()},
    "ENDs after BEGIN": ("-----END ", "-----BEGIN A PRIVATE KEY-----"),
    "eyJ after a dot": ("eyJ", "."),
}
# Tens of thousands of credentials in a megabyte: each costs microseconds (a match, its
# blanking), not a scan of the text.
CREDENTIALS = {
    "Authorization": "Authorization: '",
    "query parameters": "&key=x",
    "connection strings": "Password=x;",
    "userinfos": "a://b:c@d ",
    "bearer tokens": "Bearer 0123456789ab ",
    "Token values": "Token 0123456789abcdef0 ",
    "JWTs": "eyJAAAA.eyJ",
    "Authorization, dotless i": "author\u0131zation: x ",
    "PEM keys": "-----BEGIN A PRIVATE KEY-----\nMIIE\n-----END A PRIVATE KEY-----\n",
}


class TooSlow(Exception):
    pass


def _interrupt(signum: int, frame: object) -> None:
    raise TooSlow  # the regex engine checks for signals as it runs


@pytest.fixture
def deadline() -> Iterator[Callable[[float], None]]:
    """``deadline(s)``: the test fails (TooSlow) if it still runs ``s`` seconds from now,
    instead of taking minutes on a regression to quadratic time."""
    previous = signal.signal(signal.SIGALRM, _interrupt)
    yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def scrubbed_lengths(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of each text the credential scrubber is given from now on."""
    from processors_base import redaction

    seen: list[int] = []
    scrub = redaction.scrub_credentials

    def spy(text: str, marker: str = redaction.REDACTED) -> str:
        seen.append(len(text))
        return scrub(text, marker)

    monkeypatch.setattr(redaction, "scrub_credentials", spy)
    return seen


def fastest_of_3(text: str) -> float:
    fastest = math.inf
    for _ in range(3):
        started = time.thread_time()  # this thread's CPU time: a busy machine adds none
        redact(text, (KEY,))
        fastest = min(fastest, time.thread_time() - started)
    return fastest


def growth(unit: str, lead: str = "") -> float:
    """How many times longer a megabyte takes to scrub than a sixteenth of one: 16 to 40 in
    linear time (allocations grow a little faster than the text), 256 in quadratic. A ratio
    of two runs on this machine, not seconds, so that a busy machine slowing both alike
    cannot fail it; under a millisecond counts as one."""
    sixteenth = fastest_of_3(run(unit, lead, MB // 16))
    return fastest_of_3(run(unit, lead)) / max(sixteenth, 0.001)


@pytest.mark.parametrize("unit, lead", SHAPES.values(), ids=SHAPES.keys())
def test_a_megabyte_of_any_shape_is_scrubbed_in_linear_time(unit, lead, deadline):
    deadline(60)  # a quadratic regression takes minutes; a busy machine, seconds
    assert growth(unit, lead) < 100


@pytest.mark.parametrize("unit", CREDENTIALS.values(), ids=CREDENTIALS.keys())
def test_a_megabyte_of_credentials_is_scrubbed_in_linear_time(unit, deadline):
    deadline(60)  # a quadratic regression takes minutes; a busy machine, seconds
    assert "*" in redact(run(unit), (KEY,))
    assert growth(unit) < 100


# --- cutting before scrubbing ---------------------------------------------------------------

LIMIT = 1000
FILLER = "."  # in no secret below, and ends none of the shapes
# (text, what must not be seen of it) for each kind of secret: a prefix or suffix of what
# must not be seen, where a cut splits it, must not be seen either.
SECRETS = {
    "key": (KEY, KEY),
    "key url-encoded": (quote(KEY, safe=""), quote(KEY, safe="")),
    "key in basic auth": (
        "Basic " + base64.b64encode(f"alice:{KEY}".encode()).decode(),
        base64.b64encode(f"alice:{KEY}".encode()).decode()[8:],
    ),
    "url password": ("postgres://alice:hunter2hunter2@db ", "alice:hunter2hunter2"),
    "bearer": ("Bearer tok0123456789abcdefghij ", "tok0123456789abcdefghij"),
    "param": ("?token=zyxwvutsrq0987654321 ", "zyxwvutsrq0987654321"),
    "jwt": (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLXZhbHVl ",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLXZhbHVl",
    ),
    "pem": (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0123456789\n"
        "-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEA0123456789",
    ),
}


def pieces(secret: str) -> list[str]:
    """The parts of ``secret`` a cut could leave, long enough to tell (4 characters on)."""
    return [secret[:n] for n in range(4, len(secret) + 1)] + [
        secret[n:] for n in range(len(secret) - 3)
    ]


@pytest.mark.parametrize("text, secret", SECRETS.values(), ids=SECRETS.keys())
def test_a_cut_never_keeps_part_of_a_secret_it_splits(text, secret):
    long = 3 * CUT_MARGIN  # the text is longer than the part kept and its two margins
    for offset in range(-len(text) - 2, 3):  # the secret across the cut, at every place
        head = FILLER * (LIMIT + offset) + text + FILLER * long
        kept = redact_head(head, LIMIT, (KEY,))
        assert len(kept) <= LIMIT
        assert not [p for p in pieces(secret) if kept.endswith(p)], (offset, kept[-80:])
        tail = FILLER * long + text + FILLER * (LIMIT + offset)
        kept = redact_tail(tail, LIMIT, (KEY,))
        assert len(kept) <= LIMIT
        assert not [p for p in pieces(secret) if kept.startswith(p)], (offset, kept[:80])


def test_blanking_more_than_a_margin_keeps_less_never_part_of_a_secret():
    margin = CUT_MARGIN + len(secret_forms((KEY,))[0])
    limit = 4 * margin
    scrubbed = limit + 2 * margin  # characters scrubbed past the cut: two margins
    # the keys blank to "***": the text shrinks by more than a margin, and the end of the
    # part scrubbed splits a password
    keys = KEY * (3 * margin // (len(KEY) - 3))
    before, after = "postgres://alice:hun", "ter2@db"
    head = keys + "." * (scrubbed - len(keys) - len(before)) + before + after + "." * margin
    kept = redact_head(head, limit, (KEY,))
    assert "hun" not in kept and kept.startswith("***"), kept[-60:]
    tail = "." * margin + before + after + "." * (scrubbed - len(after) - len(keys)) + keys
    kept = redact_tail(tail, limit, (KEY,))
    assert "ter2" not in kept and kept.endswith("***"), kept[:60]


def test_a_short_text_is_scrubbed_whole_and_cut_after():
    text = "see postgres://alice:hunter2@db and " + "." * 100
    assert redact_head(text, 20, ()) == redact(text, ())[:20]
    assert redact_tail(text, 20, ()) == redact(text, ())[-20:]


def test_a_captured_string_cut_at_the_limit_keeps_no_part_of_a_password(deadline):
    deadline(60)  # a quadratic regression takes minutes; a busy machine, seconds
    note = "." * 180 + "postgres://alice:hunter2hunter2@db.internal/rl" + "." * MB
    for limit in range(180, 240):  # the cut before, in and after the URL
        text = capture({"note": note}, limit)
        assert "hunter2" not in text and "alice:" not in text, text
        assert text.endswith("...[truncated]")


def test_a_failed_outputs_huge_error_is_cut_before_it_is_scrubbed(deadline):
    deadline(60)  # a quadratic regression takes minutes; a busy machine, seconds
    span = TracerProvider().get_tracer("test").start_span("process")
    error = "could not score: token=abc; Bearer tok0123456789abcdefghij " + "A" * MB
    record_output(span, {"status": "failed", "error": error})
    span.end()
    assert span.status.description == redact(error)[:500]


# --- a huge error message or log line, on a real server -------------------------------------


def keyed() -> dict:
    return {**reward_body(), "model_resource": {"model_name": "m", "api_key": KEY}}


def post_while_health_answers(server: Server) -> httpx.Response:
    """POST a request; meanwhile /health must keep answering (the event loop is free)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(server.post, keyed(), timeout=60)
        while not pending.done():
            assert server.client.get("/health", timeout=10).status_code == 200
        return pending.result()


def test_a_megabyte_error_message_is_answered_cut_and_scrubbed(start_server):
    server = start_server("workspace.scrub_fns:RaisesOnAHugeAnswer")
    response = post_while_health_answers(server)
    assert response.status_code == 500
    body = response.json()
    assert body["error_code"] == "PROCESSOR_ERROR"
    error = body["error"]
    assert error.startswith("ValueError: could not parse the answer (key=**********; AAA")
    assert error.endswith("characters cut]") and len(error) <= 8192
    assert KEY not in response.text
    output = server.wait_output("characters cut] ...")  # the traceback's middle, on its line
    assert "key=**********" in output and KEY not in output


def test_a_megabyte_log_line_is_cut_in_its_middle_and_scrubbed(start_server):
    server = start_server("workspace.scrub_fns:LogsAHugeSequence")
    response = post_while_health_answers(server)
    assert response.status_code == 200 and response.json()["reward"]["reward_score"] == 1.0
    output = server.wait_output("; end of sequence")
    assert "key=**********; sequence=MKVLAAGIVGLLLAQ" in output and KEY not in output
    assert "characters cut] ..." in output and len(output) < 100_000


@pytest.mark.parametrize("at", [480, 490, 495, 510])
def test_a_failed_results_error_cut_on_its_log_line_keeps_no_part_of_a_secret(start_server, at):
    # the request line of a 200 whose result failed shows 500 characters of its error:
    # cut there before it is scrubbed, the key or a password across the cut kept a part
    server = start_server("workspace.scrub_fns:FailsWithTheKeyAtTheCut")
    response = server.post({**keyed(), "at": at})
    assert response.status_code == 200 and response.json()["status"] == "failed"
    assert KEY not in response.text and "hunter2" not in response.text
    output = server.wait_output("failed OTHER")
    line = next(line for line in output.splitlines() if "failed OTHER" in line)
    assert not [p for p in pieces(KEY) if p in line], line[-120:]
    assert not [p for p in pieces("alice:hunter2hunter2") if p in line], line[-120:]


# A keyword of any case, as the scrubber before it matched them (re.IGNORECASE): U+0131
# (dotless i) and U+017F (long s) are i and s there, though neither lower-cases to ASCII.
FOLDED = {
    "dotless i": ("x://a Author\u0131zation: secretvalue1", "secretvalue1"),
    "long s password": ("x=1;pa\u017fsword=hunter2;", "hunter2"),
    "long s secret": ("?\u017fecret=abcdefgh", "abcdefgh"),
    "dotless i sig": ("?s\u0131g=abcdefgh", "abcdefgh"),
    "amz": ("&X-Amz-S\u0131gnature=abcdefgh", "abcdefgh"),
    "long s sharedaccess": ("Endpoint=x;\u017fharedAcce\u017fsKey=abcdefgh;", "abcdefgh"),
}


@pytest.mark.parametrize("text, secret", FOLDED.values(), ids=FOLDED.keys())
def test_a_keyword_with_a_dotless_i_or_a_long_s_is_still_recognised(text, secret):
    assert secret not in redact(text, ()), redact(text, ())
    long = text + " " + "." * 5000  # the long way too (no search for each anchor first)
    assert secret not in redact(long, ())


def test_a_failed_outputs_huge_error_is_cut_to_a_body_before_it_is_scrubbed(scrubbed_lengths):
    # a failed output's error (a sub-reward's failure quoting a model's answer, or one
    # process() returned) leaves in its body: cut to what an error body holds before it is
    # scrubbed, on the event loop (a megabyte of query parameters took 0.4 s there)
    from conftest import TESTS

    from processors_base import Reward, RewardOutput
    from processors_base.redaction import Secrets, request_secrets
    from runtime.execution.function import Function
    from runtime.execution.loading import load_target

    function = Function(load_target("workspace.scrub_fns:FailsWithAHugeError", TESTS))
    error = f"could not parse (key={KEY}): " + "&key=x" * (MB // 6)
    output = RewardOutput(reward=Reward(reward_score=0.0), status="failed", error=error)
    token = request_secrets.set(Secrets((KEY,)))
    try:
        body = function.serialise(output)
    finally:
        request_secrets.reset(token)
    sent = orjson.loads(body)["error"]
    assert KEY not in sent and sent.startswith("could not parse (key=**********): &key=***")
    assert sent.endswith("characters cut]") and len(sent) <= 8192, sent[-60:]
    assert scrubbed_lengths and max(scrubbed_lengths) < MB // 10  # the part cut, not 1 MB


def test_a_huge_exception_recorded_on_a_span_is_cut_before_it_is_scrubbed(scrubbed_lengths):
    # with tracing on, the request span records the failure, its traceback chaining user
    # code's exception: each megabyte of query parameters in its message took 0.46 s to
    # scrub on the event loop, and was exported whole. Cut first, it costs what the part kept
    # costs (thousands of credentials: tens of ms), whatever the message's length.
    from processors_base.observability._spans import record_error
    from processors_base.redaction import Secrets, request_secrets
    from runtime.execution.function import ProcessorFailure

    span = TracerProvider().get_tracer("test").start_span("process")
    token = request_secrets.set(Secrets((KEY,)))
    try:
        try:
            raise ValueError(f"answer (key={KEY}): " + "&key=x" * (4 * MB // 6) + f" {KEY} end")
        except ValueError as exc:
            failure = ProcessorFailure("PROCESSOR_ERROR", "ValueError: answer ... cut")
            failure.__cause__ = exc
            record_error(span, exc)
            record_error(span, failure)
    finally:
        request_secrets.reset(token)
    span.end()
    for event in span.events:
        for name in ("exception.message", "exception.stacktrace"):
            text = event.attributes[name]
            assert KEY not in text and len(text) < 20_000, len(text)
    assert "characters cut] ..." in span.events[0].attributes["exception.message"]
    assert span.events[0].attributes["exception.message"].endswith("*** end")
    assert scrubbed_lengths and max(scrubbed_lengths) < MB // 10  # the parts kept, not 4 MB


def test_a_captured_mappings_keys_are_scrubbed_and_cut_too():
    # a dict keyed by a URL, a header line or the key itself: its keys were captured as
    # they were, whole (a megabyte-long key was escaped whole, then cut)
    from processors_base.redaction import Secrets, request_secrets

    token = request_secrets.set(Secrets((KEY,)))
    try:
        text = capture({KEY: 1, "postgres://alice:hunter2@db": 2, "A" * MB: 3}, 500)
    finally:
        request_secrets.reset(token)
    assert KEY not in text and "hunter2" not in text, text
    assert text.endswith("...[truncated]") and len(text) < 600


@pytest.mark.parametrize("offset", range(100, 129))
def test_a_request_id_cut_to_its_limit_keeps_no_part_of_a_secret(offset):
    # each id on a line is cut to 128 characters: cut before it was scrubbed, a secret the
    # cut split (the key, a password) left its first characters on every line of the request
    from processors_base.redaction import Secrets, request_secrets
    from runtime.logs import _ids

    for secret, value in (
        (KEY, KEY),
        ("alice:hunter2hunter2", "postgres://alice:hunter2hunter2@db"),
    ):
        header = ("." * offset + value + "." * 200).encode("latin-1")
        token = request_secrets.set(Secrets((KEY,)))
        try:
            ids = _ids({"headers": [(b"x-request-id", header)]}, None)
        finally:
            request_secrets.reset(token)
        shown = ids["request_id"]
        assert len(shown) <= 128
        assert not [p for p in pieces(secret) if shown.endswith(p)], shown[-40:]


def test_a_megabyte_key_is_blanked_as_written_without_deriving_its_forms(deadline):
    # a hostile client's 1 MB api_key: deriving its encoded forms cost 2 s of the event loop
    deadline(60)  # a quadratic regression takes minutes; a busy machine, seconds
    huge = "k" * 1_000_000
    assert redact(f"key={huge}; done", (huge,)) == "key=***; done"
    assert secret_forms((huge,)) == (huge,)  # no encoded forms derived from it


# ---- what capture and the text scrubbing recognise ----

PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0123456789\n-----END RSA PRIVATE KEY-----"


JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLXZhbHVl"


@pytest.mark.parametrize(
    "name",
    ["basic_auth", "http_auth", "proxy_auth", "auth_header", "pass", "passphrase", "conn_str"],
)
def test_capture_blanks_values_under_more_secret_names(name):
    from processors_base.observability._core import capture

    text = capture({name: "hunter2-value", "model": "m"})
    assert "hunter2-value" not in text and '"model":"m"' in text


@pytest.mark.parametrize(
    "text, secret",
    [
        ("DefaultEndpointsProtocol=https;AccountName=a;AccountKey=c2VjcmV0a2V5==;E=x", "c2VjcmV0"),
        ("https://b.s3.example/o?X-Amz-Date=1&X-Amz-Signature=0a1b2c3d4e5f6a7b", "0a1b2c3d"),
        ("headers: Token 9f8e7d6c5b4a39281706", "9f8e7d6c"),
        (f"bearer-less token {JWT} in a line", "eyJzdWIi"),
        (f"key file:\n{PEM}\nend", "MIIEowIB"),
    ],
    ids=["conn-str", "x-amz-signature", "token-scheme", "jwt", "pem"],
)
def test_credential_shapes_are_blanked_in_text_and_captures(text, secret):
    from processors_base.observability._core import capture
    from processors_base.redaction import redact

    assert secret not in redact(text, ())
    assert secret not in capture({"note": text})


def test_prose_that_merely_says_token_is_kept():
    from processors_base.redaction import redact

    assert redact("Token generation failed: too many tokens", ()) == (
        "Token generation failed: too many tokens"
    )


def test_mime_base64_and_double_url_encoding_of_the_key_are_blanked():
    import base64

    from processors_base.redaction import redact

    key = "sk-" + "Zm9v/YmFy+baz=" * 8  # long enough for MIME's line breaks
    mime = base64.encodebytes(key.encode()).decode()
    assert "\n" in mime.rstrip("\n")
    twice = quote(quote(key, safe=""), safe="")
    assert "%252F" in twice
    for text in (mime, twice):
        cleaned = redact(f"sent {text} there", (key,))
        assert "***" in cleaned
        for line in text.split():
            assert line not in cleaned, cleaned
