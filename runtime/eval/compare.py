"""``python -m runtime eval --compare OLD NEW``: two runs' ``--out`` directories side by side.

For each reward, sub-reward and the weighted total: the mean, std, failure rate and share
of zero-variance groups of each run, the change of the mean, and whether it is significant
over the samples (data lines) both runs scored: a paired bootstrap of the per-sample change
(each sample's mean over its rollouts, new minus old), ``RESAMPLES`` resamples seeded with
``SEED``; significant when the 95% interval leaves 0 out. Then the samples whose score
changed most. A table on the terminal, and ``compare.html`` in the report's style.
"""

from __future__ import annotations

import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from runtime.eval.files import OutDir, terminal
from runtime.eval.stats import prompt_line

__all__ = ["MIN_SAMPLES", "RESAMPLES", "SEED", "CompareError", "Run", "compare", "load", "run"]

RESAMPLES = 2000
SEED = 0  # the bootstrap's: the same two runs always compare the same
MIN_SAMPLES = 5  # samples in common below which no change is called significant
CHANGED_SHOWN = 10  # samples whose score changed most


class CompareError(Exception):
    """Exit 2: a directory that is not an eval run's ``--out``, or runs with nothing in
    common."""


@dataclass
class Run:
    path: Path
    summary: dict[str, Any]
    lines: list[dict[str, Any]]


def load(path: Path) -> Run:
    """The run whose ``--out`` is ``path``; CompareError when it is not one."""
    if not path.is_dir():
        raise CompareError(f"{path}: no such directory (the --out of an eval run)")
    found = {}
    for name in ("summary.json", "trajectories.jsonl"):
        if not (path / name).is_file():
            raise CompareError(f"{path}: has no {name}: not the --out of an eval run")
        try:
            text = (path / name).read_bytes()
            if name == "summary.json":
                found[name] = orjson.loads(text)
            else:
                found[name] = [orjson.loads(line) for line in text.splitlines() if line.strip()]
        except (OSError, orjson.JSONDecodeError) as exc:
            raise CompareError(f"{path / name}: cannot be read: {exc}") from None
    summary, lines = found["summary.json"], found["trajectories.jsonl"]
    if not isinstance(summary, dict) or not isinstance(summary.get("rewards"), dict):
        raise CompareError(f"{path / 'summary.json'}: not an eval run's summary")
    if not all(isinstance(line, dict) for line in lines):
        raise CompareError(f"{path / 'trajectories.jsonl'}: not an eval run's trajectories")
    return Run(path, summary, lines)


def _sample(line: dict[str, Any]) -> str:
    return f"{Path(str(line.get('file'))).name}:{line.get('line')}"


Value = Callable[[dict[str, Any]], Any]


def _per_sample(run: Run, value: Value) -> dict[str, float]:
    """Sample id -> the mean of ``value`` over its rollouts that have one."""
    found: dict[str, list[float]] = {}
    for line in run.lines:
        got = value(line)
        if isinstance(got, (int, float)) and not isinstance(got, bool):
            found.setdefault(_sample(line), []).append(float(got))
    return {sample: statistics.fmean(values) for sample, values in found.items()}


def bootstrap(changes: list[float], resamples: int = RESAMPLES, seed: int = SEED) -> list[float]:
    """The 95% interval of the mean of ``changes`` (a paired bootstrap: resampled whole)."""
    rng = random.Random(seed)
    count = len(changes)
    means = sorted(sum(rng.choices(changes, k=count)) / count for _ in range(resamples))
    return [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]]


def _rate(part: Any, whole: Any) -> float | None:
    return part / whole if isinstance(whole, int) and whole else None


def _side(
    run: Run, where: str, reward: str | None, sub: str | None = None
) -> dict[str, Any] | None:
    """One run's numbers of a reward, a sub-reward or the total; None when it has none."""
    summary = run.summary
    if where == "total":
        total = summary.get("total")
        if not isinstance(total, dict):
            return None
        scores, failure = total["scores"], None
        groups = total
    else:
        row = summary["rewards"].get(reward)
        if row is None:
            return None
        if sub is None:
            scores, groups = row["scores"], row
            function = summary.get("functions", {}).get(reward) or {}
            failure = function.get("failure_rate")
        else:
            scores = groups = row["sub_rewards"].get(sub)
            if scores is None:
                return None
            failure = _rate(scores.get("failures"), scores.get("calls"))
    return {
        "count": scores.get("count"),
        "mean": scores.get("mean"),
        "std": scores.get("std"),
        "failure_rate": failure,
        "zero_variance_share": _rate(groups.get("zero_variance_groups"), groups.get("groups")),
    }


def _value(where: str, reward: str | None, sub: str | None) -> Value:
    if where == "total":
        return lambda line: line.get("total")
    if sub is None:
        return lambda line: (line.get("scores") or {}).get(reward)
    return lambda line: ((line.get("sub_rewards") or {}).get(reward) or {}).get(sub)


def _metrics(old: Run, new: Run) -> list[tuple[str, str, str | None, str | None]]:
    """(label, where, reward, sub) of everything either run scored: each reward followed by
    its sub-rewards, the old run's order first, the weighted total last."""
    subs: dict[str, dict[str, None]] = {}
    for run in (old, new):
        for name, row in run.summary["rewards"].items():
            subs.setdefault(name, {}).update(dict.fromkeys(row.get("sub_rewards") or {}))
    found: list[tuple[str, str, str | None, str | None]] = []
    for name, names in subs.items():
        found.append((name, "reward", name, None))
        found += [(f"{name} └ {sub}", "sub_reward", name, sub) for sub in names]
    if "total" in old.summary or "total" in new.summary:
        found.append(("weighted total", "total", None, None))
    return found


def compare(old: Run, new: Run) -> dict[str, Any]:
    """The comparison, as ``compare.html`` and the table show it."""
    common = {_sample(line) for line in old.lines} & {_sample(line) for line in new.lines}
    if not common:
        raise CompareError(
            f"{old.path} and {new.path} have no sample in common (samples are data lines: "
            "file name and line number): compare runs over the same data"
        )
    rows = []
    for label, where, reward, sub in _metrics(old, new):
        before, after = _side(old, where, reward, sub), _side(new, where, reward, sub)
        value = _value(where, reward, sub)
        olds, news = _per_sample(old, value), _per_sample(new, value)
        paired = sorted(set(olds) & set(news))
        changes = [news[s] - olds[s] for s in paired]
        interval = bootstrap(changes) if changes else None
        significant = (
            interval is not None
            and len(changes) >= MIN_SAMPLES
            and (interval[0] > 0 or interval[1] < 0)
        )
        change = None
        if before and after and before["mean"] is not None and after["mean"] is not None:
            change = after["mean"] - before["mean"]
        rows.append(
            {
                "label": label,
                "kind": where,
                "old": before,
                "new": after,
                "change": change,
                "paired": {
                    "samples": len(changes),
                    "mean_change": statistics.fmean(changes) if changes else None,
                    "ci95": interval,
                    "significant": significant,
                },
            }
        )
    return {
        "old": _about(old),
        "new": _about(new),
        "samples_in_common": len(common),
        "method": f"paired bootstrap over the samples both runs scored ({RESAMPLES} resamples, "
        f"seed {SEED}); significant: the 95% interval of the mean change leaves 0 out, "
        f"with {MIN_SAMPLES} samples or more",
        "metrics": rows,
        "changed": _changed(old, new),
    }


def _about(run: Run) -> dict[str, Any]:
    meta = run.summary.get("run") or {}
    workspaces = meta.get("workspaces") or [{}]
    return {
        "path": str(run.path),
        "started_at": meta.get("started_at"),
        "seed": meta.get("seed"),
        "git_commit": workspaces[0].get("git_commit"),
        "git_dirty": workspaces[0].get("git_dirty"),
        "job_sha256": (meta.get("job_file") or {}).get("sha256"),
        "samples": run.summary.get("samples"),
        "rollouts": run.summary.get("rollouts_per_sample"),
    }


def _changed(old: Run, new: Run) -> list[dict[str, Any]]:
    """The samples whose score (the weighted total, else the first reward) changed most."""
    if "total" in old.summary and "total" in new.summary:
        label, value = "weighted total", _value("total", None, None)
    else:
        names = [n for n in old.summary["rewards"] if n in new.summary["rewards"]]
        if not names:
            return []
        label, value = names[0], _value("reward", names[0], None)
    olds, news = _per_sample(old, value), _per_sample(new, value)
    prompts = {_sample(line): prompt_line(line.get("messages")) for line in new.lines}
    changes: list[dict[str, Any]] = [
        {
            "sample": s,
            "score": label,
            "old": olds[s],
            "new": news[s],
            "change": news[s] - olds[s],
            "prompt": prompts.get(s, ""),
        }
        for s in sorted(set(olds) & set(news))
        if news[s] != olds[s]
    ]
    changes.sort(key=lambda c: (-abs(c["change"]), c["sample"]))
    return changes[:CHANGED_SHOWN]


# ---- the table and the page ------------------------------------------------------------


def _num(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}"


def _signed(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:+.3g}"


def _share(value: Any) -> str:
    return "-" if value is None else f"{value:.0%}"


def _mean_std(side: dict[str, Any] | None) -> str:
    if side is None or side["mean"] is None:
        return "-"
    return f"{_num(side['mean'])} ± {_num(side['std'])}"


def print_table(result: dict[str, Any], stream: Any = None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    stream = stream or sys.stdout
    result = terminal(result)
    console = Console(
        file=stream, width=None if stream.isatty() else 160, highlight=False, markup=False
    )
    for side in ("old", "new"):
        about = result[side]
        commit = about["git_commit"][:12] if about["git_commit"] else "no git commit"
        dirty = " (uncommitted changes)" if about["git_dirty"] else ""
        console.print(
            f"{side.upper()} {about['path']}: {about['started_at'] or 'start unknown'}, "
            f"{commit}{dirty}, {about['samples']} samples x {about['rollouts']} rollouts"
        )
    table = Table(title="Compared", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    columns = ["score", "old mean ± std", "new mean ± std", "change", "95% interval", ""]
    columns += ["failed: old → new", "zero-var groups: old → new"]
    for column in columns:
        table.add_column(column, justify="left" if column == "score" else "right", no_wrap=True)
    for row in result["metrics"]:
        paired = row["paired"]
        interval = paired["ci95"]
        old, new = row["old"] or {}, row["new"] or {}
        table.add_row(
            row["label"],
            _mean_std(row["old"]),
            _mean_std(row["new"]),
            _signed(row["change"]),
            f"[{_signed(interval[0])}, {_signed(interval[1])}]" if interval else "-",
            "significant" if paired["significant"] else "",
            f"{_share(old.get('failure_rate'))} → {_share(new.get('failure_rate'))}",
            f"{_share(old.get('zero_variance_share'))} → {_share(new.get('zero_variance_share'))}",
        )
    console.print(table)
    if result["changed"]:
        changed = Table(
            title=f"Changed most ({result['changed'][0]['score']}, mean over rollouts)",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
        )
        for column in ("sample", "old", "new", "change", "prompt"):
            changed.add_column(
                column, justify="left" if column in ("sample", "prompt") else "right"
            )
        for item in result["changed"]:
            changed.add_row(
                item["sample"],
                _num(item["old"]),
                _num(item["new"]),
                _signed(item["change"]),
                item["prompt"][:80],
            )
        console.print(changed)
    console.print(f"{result['samples_in_common']} samples in common; {result['method']}")


def write_html(result: dict[str, Any], out: OutDir) -> Path:
    """``compare.html`` in ``out``; ReportUnavailable without the eval extra."""
    from runtime.eval.report import templates

    environment = templates()
    environment.filters["signed"] = _signed
    page = environment.get_template("compare.html").render(result=result)
    out.write("compare.html", (page.encode(),))
    return out.path / "compare.html"


def run(old: str, new: str, out: str | None) -> int:
    """The command: 0 when compared, 2 on a CompareError (printed)."""
    from runtime.eval.report import ReportUnavailable

    try:
        result = compare(load(Path(old)), load(Path(new)))
    except CompareError as exc:
        print(f"error: {terminal(str(exc))}", file=sys.stderr)
        return 2
    target = Path(out) if out else Path(new)
    try:
        target.mkdir(parents=True, exist_ok=True)
        with OutDir.open(target) as directory:
            page = write_html(result, directory)
    except ReportUnavailable as exc:
        page = None
        print(f"warning: {str(exc).replace('report.html', 'compare.html')}", file=sys.stderr)
    except OSError as exc:
        print(f"error: --out {target}: cannot write there: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print_table(result)
    if page is not None:
        print(f"wrote {page}", file=sys.stderr)
    return 0
