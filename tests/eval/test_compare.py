"""``eval --compare OLD NEW`` over two hand-written ``--out`` directories: no server, no
LLM. 8 data lines x 2 rollouts; in NEW the judge is right on lines 1 to 6 where OLD was
wrong (a significant change), its format sub-reward and safety are the same, and line 8
scored lower."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_eval import _env, chromium

from runtime.eval import compare
from runtime.eval.stats import score_stats

PROMPT = "What is 2 + <script>alert(1)</script>?"


def _write(folder: Path, judge: dict[int, float], *, lines: range = range(1, 9)) -> Path:
    """An eval run's --out: judge's score per line (both rollouts alike), safety 1."""
    folder.mkdir()
    trajectories = []
    for number in lines:
        for rollout in range(2):
            score = judge.get(number, 0.0)
            trajectories.append(
                {
                    "file": "/data/calc.jsonl",
                    "line": number,
                    "rollout": rollout,
                    "messages": [
                        {"role": "user", "content": f"{PROMPT} (line {number})\nmore"},
                        {"role": "assistant", "content": "4"},
                    ],
                    "scores": {"judge": score, "safety": 1.0},
                    "sub_rewards": {"judge": {"format": 1.0}, "safety": {}},
                    "total": score + 0.2,
                }
            )
    judges = [t["scores"]["judge"] for t in trajectories]
    summary = {
        "samples": len(lines),
        "rollouts_per_sample": 2,
        "run": {
            "started_at": "2026-12-01T10:00:00+00:00",
            "seed": 0,
            "workspaces": [{"path": "/ws", "git_commit": "a" * 40, "git_dirty": True}],
            "job_file": {"path": "/ws/job.yaml", "sha256": "b" * 64},
        },
        "functions": {
            "judge": {"calls": 16, "failures": 2, "failure_rate": 0.125},
            "safety": {"calls": 16, "failures": 0, "failure_rate": 0.0},
        },
        "rewards": {
            "judge": {
                "scores": score_stats(judges),
                "groups": 8,
                "zero_variance_groups": 8,
                "sub_rewards": {
                    "format": {
                        **score_stats([1.0] * 16),
                        "calls": 16,
                        "failures": 0,
                        "groups": 8,
                        "zero_variance_groups": 8,
                    }
                },
            },
            "safety": {
                "scores": score_stats([1.0] * 16),
                "groups": 8,
                "zero_variance_groups": 8,
                "sub_rewards": {},
            },
        },
        "total": {
            "scores": score_stats([j + 0.2 for j in judges]),
            "groups": 8,
            "zero_variance_groups": 8,
        },
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "trajectories.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trajectories))
    return folder


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    old = _write(tmp_path / "old", {8: 1.0})
    new = _write(tmp_path / "new", {n: 1.0 for n in range(1, 7)})
    return old, new


def _row(result: dict[str, Any], label: str) -> dict[str, Any]:
    return next(r for r in result["metrics"] if r["label"] == label)


def test_changes_side_by_side_with_a_paired_bootstrap(runs: tuple[Path, Path]) -> None:
    old, new = runs
    result = compare.compare(compare.load(old), compare.load(new))
    assert result["samples_in_common"] == 8
    assert [r["label"] for r in result["metrics"]] == [
        "judge", "judge └ format", "safety", "weighted total",
    ]  # fmt: skip
    judge = _row(result, "judge")
    assert judge["old"]["mean"] == pytest.approx(1 / 8)
    assert judge["new"]["mean"] == pytest.approx(6 / 8)
    assert judge["change"] == pytest.approx(5 / 8)
    assert judge["old"]["failure_rate"] == 0.125 and judge["old"]["zero_variance_share"] == 1.0
    paired = judge["paired"]
    assert paired["samples"] == 8 and paired["mean_change"] == pytest.approx(5 / 8)
    low, high = paired["ci95"]
    assert 0 < low <= 5 / 8 <= high <= 1 and paired["significant"] is True
    # the same seed, the same interval: two comparisons of the same runs agree
    again = compare.compare(compare.load(old), compare.load(new))
    assert _row(again, "judge")["paired"]["ci95"] == paired["ci95"]
    for unchanged in ("judge └ format", "safety"):
        row = _row(result, unchanged)
        assert row["change"] == 0 and row["paired"]["ci95"] == [0, 0]
        assert row["paired"]["significant"] is False
    assert _row(result, "weighted total")["paired"]["significant"] is True
    changed = result["changed"]
    assert [c["sample"] for c in changed] == [f"calc.jsonl:{n}" for n in (1, 2, 3, 4, 5, 6, 8)]
    assert changed[-1]["change"] == pytest.approx(-1.0)
    assert changed[0]["prompt"] == f"{PROMPT} (line 1)" and changed[0]["score"] == "weighted total"


def test_few_samples_are_never_significant(tmp_path: Path) -> None:
    changes = [0.1, -0.2, 0.3, 0.0, -0.1, 0.2]
    low, high = compare.bootstrap(changes)
    assert low < 0 < high  # no direction: not significant
    # 3 samples, each up by 1: the interval is [1, 1], yet 3 samples prove nothing
    old = _write(tmp_path / "old", {}, lines=range(1, 4))
    new = _write(tmp_path / "new", dict.fromkeys(range(1, 4), 1.0), lines=range(1, 4))
    judge = _row(compare.compare(compare.load(old), compare.load(new)), "judge")
    assert judge["paired"]["ci95"] == [1.0, 1.0] and judge["paired"]["significant"] is False


def test_compare_writes_a_table_and_a_page(runs: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    old, new = runs
    assert compare.run(str(old), str(new), None) == 0
    shown = capsys.readouterr()
    assert "judge" in shown.out and "significant" in shown.out and "+0.625" in shown.out
    assert f"wrote {new / 'compare.html'}" in shown.err
    page = (new / "compare.html").read_text()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert "a" * 12 in page and "(uncommitted changes)" in page
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))
    assert "judge 0.125 ± 0.331 0.75 ± 0.433 +0.625" in text
    assert "calc.jsonl:8 1.2 0.2 -1" in text  # the weighted total
    # --out elsewhere: NEW is left alone
    (new / "compare.html").unlink()
    assert compare.run(str(old), str(new), str(tmp_path / "cmp")) == 0
    assert (tmp_path / "cmp" / "compare.html").is_file() and not (new / "compare.html").exists()
    shot = tmp_path / "compare.png"
    chromium(
        tmp_path,
        tmp_path / "cmp" / "compare.html",
        f"--screenshot={shot}",
        "--window-size=1200,900",
    )
    from PIL import Image

    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50
    # the significant rise is marked green ("significant" on #e3f4e8)
    assert any(abs(c[0] - 0xE3) + abs(c[1] - 0xF4) + abs(c[2] - 0xE8) < 6 for _, c in colours)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "eval", *args],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_compare_usage_errors_exit_2(runs: tuple[Path, Path], tmp_path: Path) -> None:
    old, _ = runs
    (tmp_path / "empty").mkdir()
    half = tmp_path / "half"
    half.mkdir()
    (half / "summary.json").write_text((old / "summary.json").read_text())
    elsewhere = _write(tmp_path / "elsewhere", {}, lines=range(20, 24))
    cases = {
        "missing": "error: missing: no such directory (the --out of an eval run)",
        "empty": "error: empty: has no summary.json: not the --out of an eval run",
        "half": "error: half: has no trajectories.jsonl: not the --out of an eval run",
        elsewhere.name: "error: old and elsewhere have no sample in common",
    }
    for name, message in cases.items():
        first = "old" if name == elsewhere.name else name
        done = _cli("--compare", first, name, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(message), done.stderr
        assert "Traceback" not in done.stderr
    done = _cli("--compare", "old", "new", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "8 samples in common; paired bootstrap" in done.stdout
    done = _cli(cwd=tmp_path)  # neither a job file nor --compare
    assert done.returncode == 2 and "-c/--config (or --compare)" in done.stderr
    done = _cli("--help", cwd=tmp_path)
    text = " ".join(done.stdout.split())
    assert "--compare OLD NEW" in text and "compare.html written into NEW" in text
