"""``eval --compare OLD NEW`` over two hand-written ``--out`` directories: no server, no
LLM. 8 data lines x 2 rollouts; in NEW the judge is right on lines 1 to 6 where OLD was
wrong (a significant change), its format sub-reward and safety are the same, and line 8
scored lower."""

from __future__ import annotations

import json
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_eval import chromium, eval_env

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


def test_changes_side_by_side_with_a_paired_test(runs: tuple[Path, Path]) -> None:
    old, new = runs
    result = compare.compare(compare.load(old), compare.load(new))
    assert result["samples_in_common"] == 8 and result["warnings"] == []
    assert [r["label"] for r in result["metrics"]] == [
        "judge", "judge └ format", "safety", "weighted total",
    ]  # fmt: skip
    judge = _row(result, "judge")
    assert judge["old"]["mean"] == pytest.approx(1 / 8)
    assert judge["new"]["mean"] == pytest.approx(6 / 8)
    assert judge["change"] == pytest.approx(5 / 8) and judge["samples"] == 8
    assert judge["old"]["failure_rate"] == 0.125 and judge["old"]["zero_variance_share"] == 1.0
    # 7 changes of size 1, 6 up: p = P(|sum of 7 random signs| >= 5) = 2 * 8 / 128
    assert judge["p"] == pytest.approx(16 / 128) and judge["significant"] is False
    low, high = judge["ci95"]
    assert low <= 5 / 8 <= high <= 1
    # the same seed, the same interval: two comparisons of the same runs agree
    again = compare.compare(compare.load(old), compare.load(new))
    assert _row(again, "judge")["ci95"] == judge["ci95"]
    for unchanged in ("judge └ format", "safety"):
        row = _row(result, unchanged)
        assert row["change"] == 0 and row["ci95"] == [0, 0] and row["p"] == 1.0
        assert row["significant"] is False
    changed = result["changed"]
    assert [c["sample"] for c in changed] == [f"calc.jsonl:{n}" for n in (1, 2, 3, 4, 5, 6, 8)]
    assert changed[-1]["change"] == pytest.approx(-1.0)
    assert changed[0]["prompt"] == f"{PROMPT} (line 1)" and changed[0]["score"] == "weighted total"


def test_few_samples_are_never_significant(tmp_path: Path) -> None:
    # 5 samples, each up by 1: the bootstrap interval is [1, 1], yet the sign-flip test's
    # smallest p over 5 samples is 2/32
    old = _write(tmp_path / "old", {}, lines=range(1, 6))
    new = _write(tmp_path / "new", dict.fromkeys(range(1, 6), 1.0), lines=range(1, 6))
    judge = _row(compare.compare(compare.load(old), compare.load(new)), "judge")
    assert judge["ci95"] == [1.0, 1.0] and judge["p"] == pytest.approx(2 / 32)
    assert judge["significant"] is False


def test_the_sign_flip_test_holds_its_level_and_finds_a_clear_shift() -> None:
    rng = random.Random(1)

    def scores(rollouts: int) -> float:  # a sample's mean over its rollouts, p = 0.5
        return statistics.fmean(float(rng.random() < 0.5) for _ in range(rollouts))

    for samples, rollouts in ((8, 8), (5, 1), (20, 4)):
        called = 0
        for _ in range(400):  # two runs of the same model: no real change
            changes = [scores(rollouts) - scores(rollouts) for _ in range(samples)]
            called += compare.sign_flip(changes) < compare.ALPHA
        assert called / 400 <= 0.06, (samples, rollouts, called)
    assert compare.sign_flip([0.0] * 8) == 1.0  # identical runs
    assert compare.sign_flip([1e-12] * 30) == 1.0  # float noise is no change
    assert compare.sign_flip([0.5] * 8) == pytest.approx(2 / 256)  # a clear shift
    assert compare.sign_flip([0.5] * 5) == pytest.approx(2 / 32)  # too few to tell
    shifted = [0.5 + 0.1 * rng.random() for _ in range(40)]  # random flips above 16
    assert compare.sign_flip(shifted) == pytest.approx(1 / (compare.FLIPS + 1))
    assert compare.sign_flip(shifted) == compare.sign_flip(shifted)  # seeded


def test_float_noise_and_identical_runs_are_not_significant(tmp_path: Path) -> None:
    old = _write(tmp_path / "old", dict.fromkeys(range(1, 9), 0.5))
    new = _write(tmp_path / "new", dict.fromkeys(range(1, 9), 0.5 + 1e-12))
    result = compare.compare(compare.load(old), compare.load(new))
    judge = _row(result, "judge")
    assert judge["change"] == 0 and judge["p"] == 1.0 and judge["significant"] is False
    assert result["changed"] == []
    same = compare.compare(compare.load(old), compare.load(old))
    assert same["same_directory"] is True
    assert not any(row["significant"] for row in same["metrics"])


def test_the_change_is_paired_over_the_samples_in_common(tmp_path: Path) -> None:
    """OLD scored lines 1-10 (0.1 on 1-5, 0.9 on 6-10), NEW only 6-10, each 0.8: the means
    of the runs rise (0.5 -> 0.8), the samples both scored fell by 0.1 each."""
    scores = {**dict.fromkeys(range(1, 6), 0.1), **dict.fromkeys(range(6, 11), 0.9)}
    old = _write(tmp_path / "old", scores, lines=range(1, 11))
    new = _write(tmp_path / "new", dict.fromkeys(range(6, 11), 0.8), lines=range(6, 11))
    result = compare.compare(compare.load(old), compare.load(new))
    judge = _row(result, "judge")
    assert judge["old"]["mean"] == pytest.approx(0.5) and judge["new"]["mean"] == 0.8
    assert judge["change"] == pytest.approx(-0.1) and judge["samples"] == 5
    low, high = judge["ci95"]
    assert low == pytest.approx(-0.1) and high == pytest.approx(-0.1)
    assert result["warnings"] == ["the runs differ in samples (10 vs 5): compare like with like"]
    # 6 samples fell by 0.1: significant, and shown as a fall, red
    new6 = _write(tmp_path / "new6", dict.fromkeys(range(5, 11), 0.8), lines=range(5, 11))
    old5 = _write(tmp_path / "old5", dict.fromkeys(range(5, 11), 0.9), lines=range(5, 11))
    result = compare.compare(compare.load(old5), compare.load(new6))
    judge = _row(result, "judge")
    assert judge["change"] == pytest.approx(-0.1) and judge["significant"] is True
    page = compare.render(result).decode()
    assert '<td class="down">-0.1</td>' in page and '<span class="status bad">' in page


def test_a_failure_leaves_a_sample_out_of_the_pairing(tmp_path: Path) -> None:
    old = _write(tmp_path / "old", dict.fromkeys(range(1, 9), 0.5))
    new = _write(tmp_path / "new", dict.fromkeys(range(1, 9), 0.5))
    lines = [json.loads(x) for x in (old / "trajectories.jsonl").read_text().splitlines()]
    for line in lines:  # line 1 failed on judge in OLD (no score), and 2 scored 0 there
        if line["line"] == 1:
            line["scores"]["judge"] = None
        elif line["line"] == 2:
            line["scores"]["judge"] = 0.0
    (old / "trajectories.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    judge = _row(compare.compare(compare.load(old), compare.load(new)), "judge")
    assert judge["samples"] == 7 and judge["change"] == pytest.approx(0.5 / 7)


def test_a_score_only_one_run_has_is_shown_added_or_removed(
    runs: tuple[Path, Path], tmp_path: Path, capsys, monkeypatch
) -> None:
    old, new = runs
    summary = json.loads((new / "summary.json").read_text())
    summary["rewards"]["extra"] = {
        "scores": score_stats([0.5]), "groups": 1, "zero_variance_groups": 0,
        "sub_rewards": {"part": {**score_stats([0.5]), "calls": 1, "failures": 0}},
    }  # fmt: skip
    del summary["rewards"]["judge"]["sub_rewards"]["format"]
    (new / "summary.json").write_text(json.dumps(summary))
    lines = [json.loads(x) for x in (new / "trajectories.jsonl").read_text().splitlines()]
    for line in lines:
        line["sub_rewards"] = {"judge": {}, "safety": {}, "extra": {"part": 0.5}}
        line["scores"]["extra"] = 0.5
    (new / "trajectories.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = compare.compare(compare.load(old), compare.load(new))
    assert _row(result, "judge └ format")["status"] == "removed"
    assert _row(result, "extra")["status"] == "added"
    assert _row(result, "extra └ part")["status"] == "added"
    assert compare.run(str(old), str(new), str(tmp_path / "cmp")) == 0
    shown = capsys.readouterr().out
    assert re.search(r"extra +- +0\.5 ± 0 +added", shown), shown
    assert re.search(r"judge └ format +1 ± 0 +- +removed", shown), shown
    text = re.sub(
        r"\s+", " ", re.sub(r"<[^>]+>", " ", (tmp_path / "cmp" / "compare.html").read_text())
    )
    assert "extra - 0.5 ± 0 added" in text and "format 1 ± 0 - removed" in text

    def refuse(*args: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(compare.OutDir, "write", refuse)
    assert compare.run(str(old), str(new), str(tmp_path / "made" / "cmp")) == 2
    shown = capsys.readouterr()
    assert "judge" in shown.out  # the table first
    message = f"error: --out {tmp_path / 'made' / 'cmp'}: cannot write compare.html there"
    assert shown.err.startswith(message), shown.err
    assert not (tmp_path / "made").exists()  # no empty directory left behind
    assert compare.run(str(old), str(new), None) == 2  # NEW named as it was given
    assert capsys.readouterr().err.startswith(f"error: {new}: cannot write compare.html")


def test_compare_writes_a_table_and_a_page(tmp_path: Path, capsys) -> None:
    # 16 lines: 12 right in NEW where OLD was wrong, line 16 lower: p = 28 / 2^13
    old = _write(tmp_path / "old", {16: 1.0}, lines=range(1, 17))
    new = _write(tmp_path / "new", dict.fromkeys(range(1, 13), 1.0), lines=range(1, 17))
    assert compare.run(str(old), str(new), None) == 0
    shown = capsys.readouterr()
    assert re.search(r"judge .* \+0\.688 +0\.003 +significant", shown.out), shown.out
    assert "(uncommitted changes), seed 0," in shown.out
    assert f"wrote {new / 'compare.html'}" in shown.err
    # the samples that changed most: the largest change first, ties in file order (2 < 10)
    result = compare.compare(compare.load(old), compare.load(new))
    assert [c["sample"] for c in result["changed"]] == [
        f"calc.jsonl:{n}" for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
    ]
    page = (new / "compare.html").read_text()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert "a" * 12 in page and "(uncommitted changes)" in page
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))
    assert "judge 0.0625 ± 0.242 0.75 ± 0.433 +0.688 0.003 significant" in text
    assert "calc.jsonl:10 0.2 1.2 +1" in text  # the weighted total
    assert "seed 0 · 16 samples" in text
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
        cwd=cwd, env=eval_env(), capture_output=True, text=True, timeout=120,
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
    printed = " ".join(done.stdout.split())
    assert "8 samples in common; n: samples paired on the row" in printed
    assert "paired sign-flip permutation test" in printed
    done = _cli("--compare", "old", "./old", "--out", "same", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "note: old and ./old are the same directory: nothing can have changed" in done.stderr
    for extra in (("-c", "job.yaml"), ("--samples", "3"), ("--llm-base-url", "http://x/v1")):
        done = _cli("--compare", "old", "new", *extra, cwd=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        option = "--config" if extra[0] == "-c" else extra[0]
        assert done.stderr == f"error: {option}: do not apply to --compare (only --out does)\n"
    done = _cli("--compare", "old", "new", "--seed", "1", "--force", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("error: --force, --seed: do not")
    done = _cli(cwd=tmp_path)  # neither a job file nor --compare
    assert done.returncode == 2 and "-c/--config (or --compare)" in done.stderr
    done = _cli("--help", cwd=tmp_path)
    text = " ".join(done.stdout.split())
    assert "--compare OLD NEW" in text and "compare.html written into NEW" in text


def _edit(path: Path, change: Any) -> None:
    """Rewrite a JSON file, or each line of a JSONL file, through ``change``."""
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))
        return
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for line in lines:
        change(line)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _set(*keys: str, value: Any) -> Any:
    def change(data: dict[str, Any]) -> None:
        for key in keys[:-1]:
            data = data[key]
        data[keys[-1]] = value

    return change


def _drop(*keys: str) -> Any:
    def change(data: dict[str, Any]) -> None:
        for key in keys[:-1]:
            data = data[key]
        del data[keys[-1]]

    return change


EDITS = {
    "run is text": ("summary.json", _set("run", value="x"), "run"),
    "functions a list": ("summary.json", _set("functions", value=[]), "functions"),
    "workspaces of text": (
        "summary.json",
        _set("run", "workspaces", value=["a"]),
        "run.workspaces.0",
    ),
    "commit a number": (
        "summary.json",
        _set("run", "workspaces", value=[{"git_commit": 12345}]),
        "run.workspaces.0.git_commit",
    ),
    "reward row null": ("summary.json", _set("rewards", "judge", value=None), "rewards.judge"),
    "no scores": ("summary.json", _drop("rewards", "judge", "scores"), "rewards.judge.scores"),
    "total empty": ("summary.json", _set("total", value={}), "total.scores"),
    "total text": ("summary.json", _set("total", value="x"), "total"),
    "mean text": (
        "summary.json",
        _set("rewards", "judge", "scores", "mean", value="high"),
        "rewards.judge.scores.mean",
    ),
    "sub_rewards a list": (
        "summary.json",
        _set("rewards", "judge", "sub_rewards", value=[]),
        "rewards.judge.sub_rewards",
    ),
    "scores a list": ("trajectories.jsonl", _set("scores", value=[1]), "scores"),
    "sub-reward text": (
        "trajectories.jsonl",
        _set("sub_rewards", value={"r": "x"}),
        "sub_rewards.r",
    ),
    "no line": ("trajectories.jsonl", _drop("line"), "line"),
}


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
def test_a_hand_edited_run_is_named_not_a_traceback(
    edit: str, runs: tuple[Path, Path], capsys
) -> None:
    old, new = runs
    name, change, where = EDITS[edit]
    _edit(new / name, change)
    assert compare.run(str(old), str(new), None) == 2
    shown = capsys.readouterr()
    assert shown.out == "" and not (new / "compare.html").exists()
    what = "summary" if name == "summary.json" else "trajectory"
    line = " line 1" if name == "trajectories.jsonl" else ""
    assert shown.err.startswith(f"error: {new / name}{line}: not an eval run's {what}: {where}: ")
    assert shown.err.count("\n") == 1, shown.err


def test_samples_pair_only_over_the_same_prompt_and_settings_that_differ_warn(
    runs: tuple[Path, Path], capsys
) -> None:
    old, new = runs

    def reword(line: dict[str, Any]) -> None:  # other data, the same file name: lines 1-3
        if line["line"] <= 3:
            line["messages"][0]["content"] = f"What is 3 + 3? (line {line['line']})"

    _edit(new / "trajectories.jsonl", reword)
    _edit(new / "summary.json", _set("run", "seed", value=7))
    _edit(new / "summary.json", _set("rollouts_per_sample", value=4))
    _edit(new / "summary.json", _set("data", value=["/other/calc.jsonl"]))
    _edit(new / "summary.json", _set("run", "job_file", "sha256", value="c" * 64))
    result = compare.compare(compare.load(old), compare.load(new))
    assert result["samples_in_common"] == 5 and result["prompt_differs"] == 3
    assert _row(result, "judge")["samples"] == 5  # lines 4 to 8
    assert [c["sample"] for c in result["changed"]] == [
        "calc.jsonl:4", "calc.jsonl:5", "calc.jsonl:6", "calc.jsonl:8",
    ]  # fmt: skip
    assert compare.run(str(old), str(new), None) == 0
    shown = capsys.readouterr()
    assert (
        "warning: the runs differ in seed (0 vs 7); rollouts (2 vs 4); data file (none vs "
        "/other/calc.jsonl); job file (its sha256): compare like with like"
    ) in shown.err
    printed = " ".join(shown.out.split())
    assert "seed 0, 8 samples x 2 rollouts" in printed and "seed 7, 8 samples x 4" in printed
    assert (
        "5 samples in common (3 more of the same data line with a different prompt: not paired)"
        in printed
    )
    _edit(new / "trajectories.jsonl", lambda line: line["messages"][0].update(content="?"))
    assert compare.run(str(old), str(new), None) == 2
    assert "8 data line(s) of the same file name and line number were asked a different" in (
        capsys.readouterr().err
    )


def test_a_wide_table_wraps_the_names_not_the_numbers(runs: tuple[Path, Path]) -> None:
    import io

    old, new = runs
    result = compare.compare(compare.load(old), compare.load(new))
    for row in result["metrics"]:
        row["label"] = "a-very-long-reward-name-" * 4 + row["label"]
        row["significant"] = True
        row["ci95"] = [-0.123456, 0.654321]
    printed = io.StringIO()  # not a terminal: 160 columns
    compare.print_table(result, printed)
    lines = printed.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 160
    rows = [line for line in lines if "[-0.123, +0.654]" in line]
    assert len(rows) == 4 and all(" significant " in line for line in rows)
    assert all("…" not in line for line in lines)


def test_a_later_run_replaces_compare_html_as_eval_own(runs: tuple[Path, Path]) -> None:
    from test_eval import ANSWER, ROLLOUT, job_file, run_eval

    old, new = runs
    assert compare.run(str(old), str(new), None) == 0 and (new / "compare.html").exists()
    config = job_file(new.parent, [ROLLOUT, ANSWER])
    # eval's files of the last run are removed before it starts; nothing answers at port 9
    done = run_eval(config, "--llm-base-url", "http://127.0.0.1:9/v1", "--out", "new")
    assert done.returncode == 1 and "holds files that are not eval's" not in done.stderr
    assert not (new / "compare.html").exists() and not (new / "summary.json").exists()


def test_without_numpy_the_test_gives_the_same_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy comes with the eval extra; without it, past 16 changed samples the random
    flips are drawn in plain Python: a p of the same size, the same verdict."""
    shifted = [0.5 + 0.01 * i for i in range(20)]  # 20 samples, all up: p = 1 / 20001
    mixed = [(-1) ** i * (1 + 0.01 * i) for i in range(20)]  # no shift: p near 1
    with_numpy = compare.sign_flip(shifted), compare.sign_flip(mixed)
    monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy: ImportError
    without = compare.sign_flip(shifted), compare.sign_flip(mixed)
    assert with_numpy[0] == without[0] == 1 / (compare.FLIPS + 1)
    assert with_numpy[1] > 0.5 and without[1] > 0.5
