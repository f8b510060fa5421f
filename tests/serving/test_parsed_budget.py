"""The body budget (--max-buffered) bounds what bodies cost once parsed, not only their
bytes: a body of tiny JSON values (3,000,000 ``{}`` in 9 MB) once parsed into 0.5 to 1.7 GB
on one request, and a body of invalid items into an error per item (a few KB each)."""

from __future__ import annotations

import concurrent.futures
import json
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from conftest import Server, reward_body

OWN_CODE = "workspace.attack_fns:OwnCodeReward"
MiB = 1024 * 1024


def _items(count: int, item: bytes) -> bytes:
    return b",".join([item] * count)


# route -> (path, a body whose list holds the given items where that route parses them)
BODIES: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "api": (
        "/api/v1",
        lambda items: b'{"func_type":"reward","agent_output":{"messages":[' + items + b"]}}",
    ),
    "slime": ("/slime/reward", lambda items: b'{"prompt":[' + items + b'],"response":"x"}'),
    "gym": (
        "/verify",
        lambda items: (
            b'{"responses_create_params":{"input":[' + items + b']},"response":{"output":[]}}'
        ),
    ),
    "seed": ("/seed_session", lambda items: b'{"x":[' + items + b"]}"),
    "openrlhf": (
        "/openrlhf/get_reward",
        lambda items: b'{"query":["a"],"prompts":[""],"labels":[[' + items + b"]]}",
    ),
}


def _peak_mib(server: Server) -> int:
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) // 1024  # type: ignore[union-attr]


def _post_all(server: Server, path: str, body: bytes, count: int) -> list[httpx.Response]:
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        posts = [
            pool.submit(server.client.post, path, content=body, timeout=300) for _ in range(count)
        ]
        return [post.result() for post in posts]


@pytest.mark.parametrize("route", list(BODIES))
def test_a_body_of_tiny_objects_is_a_413_within_the_memory_bound(start_server, route: str) -> None:
    # 9 MB of "{}": parsed, 494 MB of peak RSS on /api/v1, 701 MB on slime, 1.44 GB on Gym
    path, make = BODIES[route]
    server = start_server(OWN_CODE)
    answer = server.client.post(path, content=make(_items(3_000_000, b"{}")), timeout=300)
    peak = _peak_mib(server)
    assert answer.status_code == 413, (answer.status_code, answer.text[:200], f"{peak} MiB")
    assert answer.json()["error_code"] == "BODY_TOO_LARGE"
    assert "--max-buffered" in answer.json()["error"]
    assert peak < 160, f"peak RSS {peak} MiB for one 9 MB body"
    assert server.client.get("/health").status_code == 200


def test_eight_bodies_of_tiny_objects_at_once_keep_to_the_bound(start_server) -> None:
    # once 2.0 GB of RSS: the README's worst case per worker is 0.5 GB
    path, make = BODIES["api"]
    server = start_server(OWN_CODE)
    answers = _post_all(server, path, make(_items(3_000_000, b"{}")), 8)
    peak = _peak_mib(server)
    assert [a.status_code for a in answers] == [413] * 8, f"{peak} MiB"
    assert peak < 512, f"peak RSS {peak} MiB for eight 9 MB bodies"


@pytest.mark.parametrize(("route", "count"), [("api", 300_000), ("gym", 200_000)])
def test_a_body_of_invalid_items_is_one_error_not_one_per_item(
    start_server, route: str, count: int
) -> None:
    # within the budget's charge for its items, but each invalid item was an error of its
    # own (1.5 KB on /api/v1, 2.4 KB on Gym): 0.5 GB for a body of 600 KB
    path, make = BODIES[route]
    server = start_server(OWN_CODE)
    answer = server.client.post(path, content=make(_items(count, b"1")), timeout=300)
    peak = _peak_mib(server)
    assert answer.status_code == 422, (answer.status_code, answer.text[:200], f"{peak} MiB")
    assert len(answer.json()["detail"]) <= 5, f"{peak} MiB"
    assert peak < 160, f"peak RSS {peak} MiB for a {count}-item body"


def test_a_charge_that_does_not_fit_now_is_a_503_and_one_that_never_fits_a_413(
    start_server, tmp_path: Path
) -> None:
    server = start_server(
        "workspace.fns:SleepyReward",
        "--max-body",
        "2000000",
        "--max-buffered",
        "2000000",
        env={"TEST_MARKER_DIR": str(tmp_path)},
    )

    from runtime.serving.admission import PARSE_COSTS

    per_item = sum(PARSE_COSTS["api"][:2])  # a "{}" and its comma

    def body(tag: str, count: int) -> bytes:
        extra = json.dumps({"sleep": 20, "tag": tag}).encode()
        return (
            b'{"func_type":"reward","agent_output":{"rollout_extra":'
            + extra
            + b',"messages":['
            + _items(count, b"{}")
            + b"]}}"
        )

    # each one's parse is charged 1.2 MB of the 2 MB: one fits at a time
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(server.post, body("held", 1_200_000 // per_item))
        while not (tmp_path / "started-held").exists():
            assert not held.done(), held.result().text[:300]
            time.sleep(0.02)
        answer = server.post(body("second", 1_200_000 // per_item))
        assert answer.status_code == 503, answer.text[:300]
        assert answer.headers["retry-after"] == "1"
        assert answer.json()["error_code"] == "OVERLOADED"
        assert "--max-buffered" in answer.json()["error"]
        # one that could never fit is told so, not to retry forever
        never = server.post(body("never", 2_400_000 // per_item))
        assert never.status_code == 413, never.text[:300]
        assert never.json()["error_code"] == "BODY_TOO_LARGE"
        assert "--max-buffered" in never.json()["error"]
        server.close()  # ends the held request too
        with pytest.raises(httpx.HTTPError):
            held.result()


def _messages(count: int, repeat: int) -> list[dict[str, str]]:
    """Messages of what models write: LaTeX, code, JSON tool arguments, prose."""
    texts = [
        r"We have \frac{a}{b} = \sqrt{x^{2} + y^{2}}, so \boxed{\{1, 2\}} is [the] answer.",
        'def f(x: list[int]) -> dict[str, int]:\n    return {"a": x[0], "b": [1, 2, 3]}\n',
        json.dumps({"name": "search", "arguments": {"query": "6 * 7", "k": [1, 2, 3]}}),
        "First, note that the sum, as given, is small; then, by symmetry, it is even.",
    ]
    return [{"role": "assistant", "content": texts[i % len(texts)] * repeat} for i in range(count)]


def _realistic(repeat: int = 4) -> bytes:
    """64 trajectories of 50 messages, with the token logprobs of one."""
    agent_output = {"messages": _messages(64 * 50, repeat), "rollout_extra": {"lp": [-0.25] * 2000}}
    return json.dumps({"func_type": "reward", "agent_output": agent_output}).encode()


def test_realistic_bodies_are_charged_little_or_nothing_beyond_their_bytes() -> None:
    from runtime.serving.admission import PARSE_COSTS, parsed_extra

    # messages of 1.3 KB parse into less than twice their bytes: charged nothing, or little
    # where a route's dicts cost more (a group reward's agent outputs), once the marks in
    # their strings are left out (as they are for a body the first estimate would refuse)
    group = [{"messages": _messages(50, 16)} for _ in range(64)]
    bodies = {
        "api": _realistic(repeat=16),
        "group": json.dumps({"func_type": "group_reward", "agent_outputs": group}),
        "slime": json.dumps({"prompt": _messages(50, 16), "response": "42", "label": "42"}),
        "nemo-gym": json.dumps({"responses_create_params": {"input": _messages(50, 16)}}),
        "plain": json.dumps({"query": [json.dumps(_messages(50, 16))] * 64}),
    }
    for route, costs in PARSE_COSTS.items():
        body = bodies[route]
        body = body if isinstance(body, bytes) else body.encode()
        assert parsed_extra(body, costs, exact=True) < len(body) // 8, route
    assert parsed_extra(bodies["api"], PARSE_COSTS["api"], exact=True) == 0  # type: ignore[arg-type]
    # of 330 bytes they parse into 1.4 times their bytes (of which the strings weigh 1):
    # charged about their length again
    short = _realistic()
    assert 0 < parsed_extra(short, PARSE_COSTS["api"], exact=True) < 1.5 * len(short)
    tiny = _items(len(short) // 3, b"{}")  # as long, all structure: charged a hundredfold
    assert parsed_extra(tiny, PARSE_COSTS["api"]) > len(tiny) * 100


def test_realistic_bodies_at_once_are_all_served(start_server) -> None:
    # 64 trajectories of 50 short messages (1.2 MB), eight at once, with the defaults
    body = _realistic()
    server = start_server("workspace.fns:EchoReward")
    answers = _post_all(server, "/api/v1", body, 8)
    assert [a.status_code for a in answers] == [200] * 8, answers[0].text[:300]
    assert answers[0].json()["reward"]["reward_score"] == 64 * 50


def test_a_body_whose_marks_are_in_its_strings_is_served_within_a_tight_budget(
    start_server,
) -> None:
    from runtime.serving.admission import PARSE_COSTS, PARSED_FLOOR, parsed_extra

    # 4.3 MB of 1.3 KB messages of LaTeX, code and JSON: the first estimate, which counts
    # their braces and commas, is past the whole budget; the second, which does not, is 0
    body = _realistic(repeat=16)
    budget = len(body) + 1_000_000
    assert parsed_extra(body, PARSE_COSTS["api"], PARSED_FLOOR) > budget
    server = start_server(
        "workspace.fns:EchoReward", "--max-body", str(budget), "--max-buffered", str(budget)
    )
    answer = server.post(body)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["reward"]["reward_score"] == 64 * 50


# ---- bytes received, not bytes announced ----

FNS = "workspace.odd_fns"  # user code that leaks its key or fails in odd ways


def test_stalled_large_announcements_do_not_starve_real_requests(start_server):
    server = start_server(f"{FNS}:SleepsSync", "--max-body", "1000000", "--max-buffered", "2000000")
    stalled = []
    for _ in range(8):  # each announces a whole --max-body and sends one byte
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(
            b"POST /api/v1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000\r\n\r\n{"
        )
        stalled.append(sock)
    try:
        # the stalled bodies' first bytes have reached the app once /metrics can be read
        server.client.get("/metrics")
        for _ in range(5):
            response = server.post(reward_body())
            assert response.status_code == 200, response.text
    finally:
        for sock in stalled:
            sock.close()
