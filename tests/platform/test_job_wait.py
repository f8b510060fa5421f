"""``job run --wait`` and ``job wait``: transient errors ridden out, and exit codes that tell
the outcomes apart. The real CLI (a subprocess) against the stand-in platform."""

from __future__ import annotations

import json

from helpers import FT, cli, one_error_line, opd_job


def test_waiting_rides_out_transient_errors_and_exit_codes_tell_the_outcomes_apart(
    platform, workspace
):
    opd = opd_job(platform, workspace)
    platform.flaky[f"GET {FT}/ft-"] = 2  # two 502s on the job's status
    done = cli(platform, "job", "run", "-c", str(opd), "--wait", "--poll-interval", "0.05")
    assert done.returncode == 0, done.stderr
    assert "HTTP 502: <html>502 Bad Gateway</html>; retrying in 0.05 s" in done.stderr
    assert done.stdout.splitlines()[1].split() == ["status", "SUCCEEDED"]

    platform.job_outcome = "FAILED"
    failed = cli(platform, "job", "run", "-c", str(opd), "--wait", "--poll-interval", "0.05")
    assert failed.returncode == 1 and "status      FAILED" in failed.stdout

    platform.job_outcome = "RUNNING"  # never ends
    submitted = cli(platform, "job", "run", "-c", str(opd), "-o", "json")
    job_id = json.loads(submitted.stdout)["job_id"]
    # deadlines of seconds: a loaded machine may take most of one to answer the first poll
    late = cli(platform, "job", "wait", job_id, "--timeout", "3", "--poll-interval", "0.05")
    assert late.returncode == 124
    assert one_error_line(late) == f"error: job {job_id} is still RUNNING after 3 s"

    platform.slow[f"{FT}/{job_id}/logs"] = 30.0  # the deadline cuts a poll short
    cut = cli(platform, "job", "wait", job_id, "--timeout", "3", "--poll-interval", "0.05")
    assert cut.returncode == 124, cut.stderr
    assert one_error_line(cut) == f"error: job {job_id} is still RUNNING after 3 s"
    del platform.slow[f"{FT}/{job_id}/logs"]

    platform.flaky[f"GET {FT}/{job_id}"] = 1000  # the platform keeps failing
    lost = cli(platform, "job", "wait", job_id, "--timeout", "5", "--poll-interval", "0.05")
    assert lost.returncode == 3
    assert "HTTP 502" in one_error_line(lost) and "its state is unknown" in lost.stderr
