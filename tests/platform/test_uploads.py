"""Datasets and packages of any size: streamed from disk, sent again whole when a try
fails, shown in bytes, never sent cut; the JSONL check names the first bad lines without
holding them all; the package's temporary zip never stays behind. In-process against the
stand-in platform (its memory figures: benchmarks/upload_memory.py)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from conftest import free_port
from helpers import FT, interruptible, wait_for

from runtime.platform import datasets, functions, packaging
from runtime.platform.http import FileBody, FileChanged, Platform, PlatformError
from runtime.platform.progress import Reporter

LINE = b'{"messages": [{"role": "user", "content": "' + b"x" * 1000 + b'"}]}\n'


def _dataset(tmp_path: Path, lines: int = 3000) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_bytes(LINE * lines)  # about 3 MB
    return path


def _client(platform, reporter: Reporter) -> Platform:
    return Platform(platform.base_url, platform.api_key, notify=reporter.note)


def test_a_dataset_arrives_intact_with_its_progress_in_bytes(platform, tmp_path):
    path = _dataset(tmp_path)
    out = io.StringIO()
    reporter = Reporter(out, tty=False, every=0)  # a line for every chunk
    platform.busy["/api/v1/files"] = 1  # one 503 first
    size = path.stat().st_size
    with _client(platform, reporter) as client, reporter.transfer("uploading", size) as sent:
        file_id = datasets.upload(client, path, progress=sent)
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert platform.files[file_id]["sha256"] == expected  # sent again whole after the 503
    posts = [r for r in platform.requests if r["path"].endswith("/files")]
    assert len(posts) == 2 and posts[0]["size"] == posts[1]["size"] > path.stat().st_size
    lines = out.getvalue().splitlines()
    assert lines[0] == "uploading ..."
    assert any("platform busy (HTTP 503), retry 1" in line for line in lines)
    assert any(line.startswith("uploading: 1.5 MiB of 3.0 MiB (") for line in lines)
    assert "MiB/s, 0:00:0" in lines[-2] and " left" in lines[-2]
    assert lines[-1].startswith("uploading: done (")


def test_a_put_cut_part_way_is_sent_again_from_the_start(platform, tmp_path):
    path = _dataset(tmp_path)
    platform.cut_puts = 2  # half the body read, then a 500: twice
    seen: list[int] = []
    with _client(platform, Reporter(io.StringIO(), tty=False)) as client:
        url = f"{platform.url}/oss/p.zip?Signature=s1g"
        client.put_file("uploading the package", url, path, progress=seen.append)
    assert platform.uploads["p.zip"] == path.read_bytes()
    cuts = [r["cut_at"] for r in platform.requests if "cut_at" in r]
    assert len(cuts) == 2 and all(0 < cut < path.stat().st_size for cut in cuts)
    # the progress went back to 0 for each new try, and reached the whole file
    drops = [i for i in range(1, len(seen)) if seen[i] < seen[i - 1]]
    assert len(drops) == 2 and all(seen[i] == 0 for i in drops)
    assert seen[-1] == path.stat().st_size


def test_a_dataset_post_cut_before_the_file_went_out_is_sent_again(tmp_path):
    """A creating POST is never repeated once it may have arrived; one cut while its file
    was still going out cannot have been, and is sent again whole."""
    path = tmp_path / "train.jsonl"
    with path.open("wb") as file:  # more than loopback's socket buffers hold
        file.truncate(32 * 1024 * 1024)
    bodies: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
        if not bodies:
            bodies.append(await reader.readexactly(1024 * 1024))
            writer.transport.abort()  # the connection reset, part-way
            return
        bodies.append(await reader.readexactly(length))
        answer = b'{"data": {"uploaded_files": [{"file_id": "file-1"}], "failed_uploads": []}}'
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
        writer.write(b"content-length: %d\r\n\r\n%s" % (len(answer), answer))
        await writer.drain()
        writer.close()

    async def server(ready: threading.Event, stop: asyncio.Event) -> None:
        listening = await asyncio.start_server(serve, "127.0.0.1", port)
        ready.set()
        await stop.wait()
        listening.close()

    port, ready, loop = free_port(), threading.Event(), asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(server(ready, stop),))
    thread.start()
    notes = io.StringIO()
    try:
        assert ready.wait(10)
        reporter = Reporter(notes, tty=False)
        with Platform(f"http://127.0.0.1:{port}/api/v1", "sk-x", notify=reporter.note) as client:
            assert datasets.upload(client, path) == "file-1"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
    assert len(bodies) == 2 and len(bodies[1]) > path.stat().st_size
    assert bodies[1].count(b"\0") == path.stat().st_size  # the whole file, from its start
    assert "the file cut short: sent again, retry 1" in notes.getvalue()


def test_a_file_that_changes_while_it_is_sent_fails_and_is_never_sent_cut(platform, tmp_path):
    path = _dataset(tmp_path)

    def shrink(sent: int) -> None:
        if sent > 1024 * 1024:
            os.truncate(path, 1024 * 1024)

    with _client(platform, Reporter(io.StringIO(), tty=False)) as client:
        url = f"{platform.url}/oss/p.zip?Signature=s1g"
        with pytest.raises(PlatformError, match="changed while it was being sent"):
            client.put_file("uploading the package", url, path, progress=shrink)
    assert not platform.uploads


def test_the_check_names_the_first_bad_lines_and_keeps_no_more(tmp_path):
    path = tmp_path / "bad.jsonl"
    with path.open("wb") as file:
        file.write(LINE + b"\n\n" + LINE + b"[1]\n" + b"not json\n" + LINE)
        file.write(b'{"messages": []}\n' * 20_000 + LINE)
    seen: list[int] = []
    tracemalloc.start()
    try:
        with pytest.raises(datasets.DatasetError) as error:
            datasets.check_jsonl(path, progress=seen.append)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(error.value) == (
        f"{path}: 20004 bad line(s): line 2: empty; line 3: empty; line 5: not a JSON "
        "object; line 6: not JSON (invalid literal, expected 'null'); line 8: no "
        "'messages' list (and 19999 more)"
    )
    assert peak < 512 * 1024  # a line at a time, and only the first bad ones named
    assert seen[-1] == path.stat().st_size
    # a line longer than a record can be is named, not parsed
    too_long = tmp_path / "long.jsonl"
    too_long.write_bytes(LINE + b"x" * (33 * 1024 * 1024) + b"\n" + LINE + b"\n" * 100_000)
    with pytest.raises(datasets.DatasetError, match=r"1 bad line\(s\): line 2: over 32 MiB"):
        datasets.check_jsonl(too_long)


def _own_tmp(tmp_path: Path, monkeypatch) -> Path:
    """A temporary directory of the test's own, where the packages' zips are written."""
    own = tmp_path / "tmp"
    own.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own))
    return own


def test_the_zip_is_streamed_from_a_temporary_file_that_never_stays(
    platform, workspace, tmp_path, monkeypatch
):
    own = _own_tmp(tmp_path, monkeypatch)
    (workspace / "asset.bin").write_bytes(os.urandom(3 * 1024 * 1024))  # over a chunk
    reward = "functions.reward.reward:DemoRewardProcessor"
    components = [
        functions.resolve("reward", reward, workspace),
        functions.resolve("rollout", "functions.rollout.rollout:DemoRolloutProcessor", workspace),
    ]
    platform.cut_puts = 1
    with _client(platform, Reporter(io.StringIO(), tty=False)) as client:
        functions.register(client, components[:1], Reporter(io.StringIO(), tty=False))
    assert components[0].entity_id and components[0].package is None
    (uploaded,) = platform.uploads.values()
    with zipfile.ZipFile(io.BytesIO(uploaded)) as archive:  # whole after the cut try
        assert archive.testzip() is None
        assert archive.read("asset.bin") == (workspace / "asset.bin").read_bytes()
    assert not list(own.iterdir())
    # streamed to its file, the zip has the same bytes as one built in memory
    c = components[0]
    built = (c.zipdir, c.kind, c.module, c.class_name, c.requirements)
    with packaging.build_package_file(*built, server="sdk") as package:
        assert package.path.parent == own
        assert package.path.read_bytes() == packaging.build_package(*built, server="sdk").data
    assert not list(own.iterdir())

    # a failure part-way: the zips not uploaded yet are removed too
    platform.flaky[f"POST {FT}/create/reward"] = 1
    fresh = [functions.resolve("reward", reward, workspace), components[1]]
    with (
        _client(platform, Reporter(io.StringIO(), tty=False)) as client,
        pytest.raises(PlatformError, match="HTTP 502"),
    ):
        functions.register(client, fresh, Reporter(io.StringIO(), tty=False))
    assert not list(own.iterdir())


def test_ctrl_c_says_what_may_have_been_created_and_leaves_no_zip(platform, workspace, tmp_path):
    own = tmp_path / "tmp"
    own.mkdir()
    held = f"{FT}/create/rollout"
    platform.slow[held] = 600.0  # the first register call hangs until the test is done
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASHSCOPE_", "FC_"))}
    env.update(
        DASHSCOPE_HTTP_BASE_URL=platform.base_url,
        DASHSCOPE_API_KEY=platform.api_key,
        TMPDIR=str(own),
    )
    with subprocess.Popen(
        [sys.executable, "-m", "runtime", "register",
         "--rollout", "functions.rollout.rollout:DemoRolloutProcessor",
         "--reward", "functions.reward.reward:DemoRewardProcessor"],
        cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=interruptible,
    ) as process:  # fmt: skip
        try:
            wait_for(lambda: f"POST {held}" in platform.paths(), "the register call")
            assert len(list(own.glob("agentic-rl-package-*.zip"))) == 1  # the reward's, waiting
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:  # not stopped by SIGINT: not left behind either
                process.kill()
            del platform.slow[held]  # released: the stand-in's handler ends
    assert process.returncode == 130, err
    assert (
        "interrupted while registering functions.rollout.rollout:DemoRolloutProcessor: the "
        "request may have reached the platform and been carried out: check for a rollout "
        "entity named functions/rollout/rollout.py with unique_key rollout-"
    ) in err
    assert err.rstrip().endswith("interrupted")
    assert not list(own.iterdir())


def test_a_file_written_over_in_place_since_its_check_is_not_sent(tmp_path):
    path = _dataset(tmp_path)
    checked = datasets.check_jsonl(path)
    data = bytearray(path.read_bytes())
    data[-3:-1] = b"{{"  # the same size, a line no longer JSON
    path.write_bytes(bytes(data))
    os.utime(path, ns=(checked[1] + 10**9, checked[1] + 10**9))  # however coarse the clock
    body = FileBody(path, checked=checked)
    with pytest.raises(FileChanged, match="written over in place"):
        while body.read(FileBody.CHUNK):
            pass
    body.close()
