"""``python -m runtime eval --compare OLD NEW``: two runs' ``--out`` directories side by side.

For each reward, sub-reward and the weighted total: each run's own mean ± std (over all its
trajectories), failure rate and share of zero-variance groups; and, over the samples both
runs scored (the same data line with the same prompt), the paired change: the mean over
those samples of new minus old, each sample's score the mean over its rollouts. Whether it
is significant comes from a paired sign-flip permutation test of that mean (exact over all
2^n sign flips up to ``EXACT_UP_TO`` samples, else ``FLIPS`` seeded random flips),
two-sided, significant when p < ``ALPHA``; a bootstrap 95% interval of the mean change is
shown beside it for scale. Then the samples whose score changed most. A table on the
terminal, and ``compare.html`` in the report's style.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.eval.files import OutDir, terminal
from runtime.eval.stats import prompt_line

__all__ = [
    "ALPHA",
    "EXACT_UP_TO",
    "FLIPS",
    "NOISE",
    "RESAMPLES",
    "SEED",
    "CompareError",
    "Run",
    "Summary",
    "Trajectory",
    "bootstrap",
    "compare",
    "load",
    "run",
    "sign_flip",
]

RESAMPLES = 2000  # the bootstrap interval's
SEED = 0  # the bootstrap's and the random flips': the same two runs always compare the same
ALPHA = 0.05  # significant when the sign-flip test's p is below it
EXACT_UP_TO = 16  # samples (changes not 0) up to which all 2^n sign flips are enumerated
FLIPS = 20000  # random sign flips above that
NOISE = 1e-9  # a per-sample change smaller than this is float noise: 0
CHANGED_SHOWN = 10  # samples whose score changed most


class CompareError(Exception):
    """Exit 2: a directory that is not an eval run's ``--out``, or runs with nothing in
    common."""


# ---- what is read of a run: only the parts used, their types checked -------------------


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class _Scores(_Model):
    count: int | None = None
    mean: float | None = None
    std: float | None = None


class _SubReward(_Scores):
    calls: int | None = None
    failures: int | None = None
    groups: int | None = None
    zero_variance_groups: int | None = None


class _Reward(_Model):
    scores: _Scores
    groups: int | None = None
    zero_variance_groups: int | None = None
    sub_rewards: dict[str, _SubReward] = Field(default_factory=dict)


class _Function(_Model):
    failure_rate: float | None = None


class _Total(_Model):
    scores: _Scores
    groups: int | None = None
    zero_variance_groups: int | None = None


class _Workspace(_Model):
    git_commit: str | None = None
    git_dirty: bool | None = None


class _JobFile(_Model):
    sha256: str | None = None


class _RunRecord(_Model):
    started_at: str | None = None
    seed: int | None = None
    workspaces: list[_Workspace] = Field(default_factory=list)
    job_file: _JobFile | None = None


class Summary(_Model):
    rewards: dict[str, _Reward]
    functions: dict[str, _Function] = Field(default_factory=dict)
    total: _Total | None = None
    run: _RunRecord = Field(default_factory=_RunRecord)
    samples: int | None = None
    rollouts_per_sample: int | None = None
    data: list[str] = Field(default_factory=list)


class Trajectory(_Model):
    file: str
    line: int
    scores: dict[str, float | None] = Field(default_factory=dict)
    sub_rewards: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    total: float | None = None
    messages: Any = None


@dataclass
class Run:
    path: Path
    summary: Summary
    lines: list[Trajectory]


def _invalid(where: str, what: str, exc: ValidationError) -> CompareError:
    errors = exc.errors()
    first = errors[0]
    at = ".".join(str(part) for part in first["loc"]) or "the whole file"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return CompareError(f"{where}: not an eval run's {what}: {at}: {first['msg']}{more}")


def load(path: Path) -> Run:
    """The run whose ``--out`` is ``path``; CompareError when it is not one."""
    if not path.is_dir():
        raise CompareError(f"{path}: no such directory (the --out of an eval run)")
    texts = {}
    for name in ("summary.json", "trajectories.jsonl"):
        if not (path / name).is_file():
            raise CompareError(f"{path}: has no {name}: not the --out of an eval run")
        try:
            texts[name] = (path / name).read_bytes()
        except OSError as exc:
            raise CompareError(f"{path / name}: cannot be read: {exc}") from None
    where = path / "summary.json"
    try:
        summary = Summary.model_validate(orjson.loads(texts["summary.json"]))
    except orjson.JSONDecodeError as exc:
        raise CompareError(f"{where}: cannot be read: {exc}") from None
    except ValidationError as exc:
        raise _invalid(str(where), "summary", exc) from None
    lines = []
    for number, text in enumerate(texts["trajectories.jsonl"].splitlines(), 1):
        if not text.strip():
            continue
        where = path / "trajectories.jsonl"
        try:
            lines.append(Trajectory.model_validate(orjson.loads(text)))
        except orjson.JSONDecodeError as exc:
            raise CompareError(f"{where} line {number}: cannot be read: {exc}") from None
        except ValidationError as exc:
            raise _invalid(f"{where} line {number}", "trajectory", exc) from None
    return Run(path, summary, lines)


# ---- the statistics ---------------------------------------------------------------------


def bootstrap(changes: list[float], resamples: int = RESAMPLES, seed: int = SEED) -> list[float]:
    """The 95% interval of the mean of ``changes`` (a paired bootstrap: resampled whole)."""
    rng = random.Random(seed)
    count = len(changes)
    means = sorted(sum(rng.choices(changes, k=count)) / count for _ in range(resamples))
    return [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]]


def sign_flip(changes: list[float], seed: int = SEED) -> float:
    """Two-sided p of a paired sign-flip permutation test of the mean of ``changes``: under
    no change each sample's change is as likely positive as negative, so p is the share of
    sign assignments whose sum is as far from 0 as the one observed. Changes under
    ``NOISE`` are 0, and a 0 (which no flip moves) is left out: p stays the same."""
    kept = [c for c in changes if abs(c) >= NOISE]
    if not kept:
        return 1.0
    sizes = [abs(c) for c in kept]
    bar = abs(sum(kept)) * (1 - 1e-9)  # the same sum added in another order: still as far
    if len(sizes) <= EXACT_UP_TO:
        sums = [0.0]
        for size in sizes:
            sums = [s + size for s in sums] + [s - size for s in sums]
        return sum(abs(s) >= bar for s in sums) / len(sums)
    try:
        import numpy  # the eval extra's (matplotlib's); the same test without, slower
    except ImportError:
        flips = random.Random(seed)
        hits = sum(
            abs(sum(size if flips.random() < 0.5 else -size for size in sizes)) >= bar
            for _ in range(FLIPS)
        )
        return (hits + 1) / (FLIPS + 1)
    rng = numpy.random.default_rng(seed)
    values = numpy.asarray(sizes)
    hits, left = 0, FLIPS
    while left:  # in blocks: FLIPS x n signs at once could be large
        block = min(left, 1000)
        signs = rng.choice((-1.0, 1.0), size=(block, len(sizes)))
        hits += int((numpy.abs(signs @ values) >= bar).sum())
        left -= block
    return (hits + 1) / (FLIPS + 1)  # the observed assignment counts as one


def _quiet(change: float) -> float:
    return 0.0 if abs(change) < NOISE else change


# ---- pairing samples --------------------------------------------------------------------


def _sample(line: Trajectory) -> str:
    return f"{Path(line.file).name}:{line.line}"


def _prompt(messages: Any) -> str:
    """The text of the user messages before the first answer: what was asked."""
    found = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict) or message.get("role") == "assistant":
            break
        if message.get("role") == "user":
            found.append(orjson.dumps(message.get("content")).decode())
    return "\n".join(found)


def _prompts(run: Run) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in run.lines:
        found.setdefault(_sample(line), _prompt(line.messages))
    return found


Value = Callable[[Trajectory], Any]


def _per_sample(run: Run, value: Value, samples: set[str]) -> dict[str, float]:
    """Sample id (of ``samples``) -> the mean of ``value`` over its rollouts that have one."""
    found: dict[str, list[float]] = {}
    for line in run.lines:
        got = value(line)
        if got is not None and (sample := _sample(line)) in samples:
            found.setdefault(sample, []).append(got)
    return {sample: statistics.fmean(values) for sample, values in found.items()}


def _value(where: str, reward: str | None, sub: str | None) -> Value:
    if where == "total":
        return lambda line: line.total
    assert reward is not None
    if sub is None:
        return lambda line: line.scores.get(reward)
    return lambda line: line.sub_rewards.get(reward, {}).get(sub)


# ---- one run's side of a row ------------------------------------------------------------


def _rate(part: int | None, whole: int | None) -> float | None:
    return part / whole if part is not None and whole else None


_ABSENT = {
    "count": None,
    "mean": None,
    "std": None,
    "failure_rate": None,
    "zero_variance_share": None,
}


def _side(run: Run, where: str, reward: str | None, sub: str | None) -> dict[str, Any] | None:
    """One run's numbers of a reward, a sub-reward or the total; None when it has none."""
    summary = run.summary
    scores: _Scores
    if where == "total":
        if summary.total is None:
            return None
        scores, failure = summary.total.scores, None
        groups, flat = summary.total.groups, summary.total.zero_variance_groups
    else:
        assert reward is not None
        row = summary.rewards.get(reward)
        if row is None:
            return None
        if sub is None:
            scores, groups, flat = row.scores, row.groups, row.zero_variance_groups
            function = summary.functions.get(reward)
            failure = function.failure_rate if function else None
        else:
            found = row.sub_rewards.get(sub)
            if found is None:
                return None
            scores, groups, flat = found, found.groups, found.zero_variance_groups
            failure = _rate(found.failures, found.calls)
    return {
        "count": scores.count,
        "mean": scores.mean,
        "std": scores.std,
        "failure_rate": failure,
        "zero_variance_share": _rate(flat, groups),
    }


def _metrics(old: Run, new: Run) -> list[tuple[str, str, str | None, str | None]]:
    """(label, where, reward, sub) of everything either run scored: each reward followed by
    its sub-rewards, the old run's order first, the weighted total last."""
    subs: dict[str, dict[str, None]] = {}
    for run in (old, new):
        for name, row in run.summary.rewards.items():
            subs.setdefault(name, {}).update(dict.fromkeys(row.sub_rewards))
    found: list[tuple[str, str, str | None, str | None]] = []
    for name, names in subs.items():
        found.append((name, "reward", name, None))
        found += [(f"{name} └ {sub}", "sub_reward", name, sub) for sub in names]
    if old.summary.total is not None or new.summary.total is not None:
        found.append(("weighted total", "total", None, None))
    return found


# ---- the comparison ---------------------------------------------------------------------


def compare(old: Run, new: Run) -> dict[str, Any]:
    """The comparison, as ``compare.html`` and the table show it."""
    before_prompts, after_prompts = _prompts(old), _prompts(new)
    both = set(before_prompts) & set(after_prompts)
    common = {s for s in both if before_prompts[s] == after_prompts[s]}
    differ = len(both) - len(common)
    if not common:
        why = (
            f"{differ} data line(s) of the same file name and line number were asked a "
            "different prompt"
            if differ
            else "samples are data lines: file name and line number"
        )
        raise CompareError(
            f"{old.path} and {new.path} have no sample in common ({why}): compare runs over "
            "the same data"
        )
    rows = []
    for label, where, reward, sub in _metrics(old, new):
        before, after = _side(old, where, reward, sub), _side(new, where, reward, sub)
        value = _value(where, reward, sub)
        olds, news = _per_sample(old, value, common), _per_sample(new, value, common)
        changes = [_quiet(news[s] - olds[s]) for s in sorted(set(olds) & set(news))]
        p = sign_flip(changes) if changes else None
        rows.append(
            {
                "label": label,
                "kind": where,
                # a reward or sub-reward only one run has
                "status": "added" if before is None else "removed" if after is None else None,
                "old": before or dict(_ABSENT),
                "new": after or dict(_ABSENT),
                "change": statistics.fmean(changes) if changes else None,
                "samples": len(changes),
                "ci95": bootstrap(changes) if changes else None,
                "p": p,
                "significant": p is not None and p < ALPHA,
            }
        )
    return {
        "old": _about(old),
        "new": _about(new),
        "same_directory": old.path.resolve() == new.path.resolve(),
        "samples_in_common": len(common),
        "prompt_differs": differ,
        "warnings": _differences(old, new),
        "method": f"change: the mean over the samples in common of new minus old (each "
        f"sample's score: the mean over its rollouts); old and new mean ± std: each run over "
        f"all its trajectories. p: a paired sign-flip permutation test of the mean change "
        f"(exact up to {EXACT_UP_TO} changed samples, else {FLIPS} random flips, seed {SEED}); "
        f"significant when p < {ALPHA}. 95% interval: a bootstrap of the mean change "
        f"({RESAMPLES} resamples, seed {SEED})",
        "metrics": rows,
        "changed": _changed(old, new, common),
    }


def _about(run: Run) -> dict[str, Any]:
    meta = run.summary.run
    workspace = meta.workspaces[0] if meta.workspaces else _Workspace()
    return {
        "path": str(run.path),
        "started_at": meta.started_at,
        "seed": meta.seed,
        "git_commit": workspace.git_commit,
        "git_dirty": workspace.git_dirty,
        "job_sha256": meta.job_file.sha256 if meta.job_file else None,
        "samples": run.summary.samples,
        "rollouts": run.summary.rollouts_per_sample,
        "data": run.summary.data,
    }


def _differences(old: Run, new: Run) -> list[str]:
    """What differs between the runs' settings and may make their samples not comparable."""
    before, after = _about(old), _about(new)
    found = [
        f"{label} ({before[key]} vs {after[key]})"
        for key, label in (("seed", "seed"), ("samples", "samples"), ("rollouts", "rollouts"))
        if before[key] != after[key]
    ]
    if before["data"] != after["data"]:
        files = [", ".join(about["data"]) or "none" for about in (before, after)]
        found.append(f"data file ({files[0]} vs {files[1]})")
    if before["job_sha256"] != after["job_sha256"]:
        found.append("job file (its sha256)")
    if not found:
        return []
    return [f"the runs differ in {'; '.join(found)}: compare like with like"]


def _changed(old: Run, new: Run, common: set[str]) -> list[dict[str, Any]]:
    """The samples whose score (the weighted total, else the first reward) changed most."""
    if old.summary.total is not None and new.summary.total is not None:
        label, value = "weighted total", _value("total", None, None)
    else:
        names = [n for n in old.summary.rewards if n in new.summary.rewards]
        if not names:
            return []
        label, value = names[0], _value("reward", names[0], None)
    olds, news = _per_sample(old, value, common), _per_sample(new, value, common)
    # the prompts are the same in both: that is what pairs them
    prompts = {_sample(line): prompt_line(line.messages) for line in new.lines}
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
        if _quiet(news[s] - olds[s])
    ]
    changes.sort(key=lambda c: (-abs(c["change"]), *_in_file_order(c["sample"])))
    return changes[:CHANGED_SHOWN]


def _in_file_order(sample: str) -> tuple[str, int]:
    """``file:line`` as a key that puts line 2 before line 10."""
    name, _, line = sample.rpartition(":")
    return (name, int(line)) if line.isdigit() else (sample, 0)


# ---- the table and the page -------------------------------------------------------------


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


def _p(value: Any) -> str:
    if value is None:
        return "-"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def _mean_std(side: dict[str, Any]) -> str:
    if side["mean"] is None:
        return "-"
    return f"{_num(side['mean'])} ± {_num(side['std'])}"


def _change(row: dict[str, Any]) -> str:
    return row["status"] if row["change"] is None and row["status"] else _signed(row["change"])


def _interval(row: dict[str, Any]) -> str:
    interval = row["ci95"]
    return f"[{_signed(interval[0])}, {_signed(interval[1])}]" if interval else "-"


def _seed(seed: Any) -> str:
    return "no seed" if seed is None else f"seed {seed}"


def _headline(side: str, about: dict[str, Any]) -> str:
    commit = about["git_commit"][:12] if about["git_commit"] else "no git commit"
    dirty = " (uncommitted changes)" if about["git_dirty"] else ""
    return (
        f"{side.upper()} {about['path']}: {about['started_at'] or 'start unknown'}, "
        f"{commit}{dirty}, {_seed(about['seed'])}, {about['samples']} samples x "
        f"{about['rollouts']} rollouts"
    )


def _in_common(result: dict[str, Any]) -> str:
    text = f"{result['samples_in_common']} samples in common"
    if result["prompt_differs"]:
        text += (
            f" ({result['prompt_differs']} more of the same data line with a different "
            "prompt: not paired)"
        )
    return text


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
        console.print(_headline(side, result[side]))
    table = Table(title="Compared", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    # the score's name wraps when the table is too wide: the numbers never do
    table.add_column("score", justify="left", overflow="fold", min_width=12)
    columns = ["old mean ± std", "new mean ± std", "change", "p", "", "95% interval", "n"]
    columns += ["failed", "zero-var"]
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    for row in result["metrics"]:
        old, new = row["old"], row["new"]
        table.add_row(
            row["label"],
            _mean_std(old),
            _mean_std(new),
            _change(row),
            _p(row["p"]),
            "significant" if row["significant"] else "",
            _interval(row),
            str(row["samples"]),
            f"{_share(old['failure_rate'])} → {_share(new['failure_rate'])}",
            f"{_share(old['zero_variance_share'])} → {_share(new['zero_variance_share'])}",
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
    console.print(
        f"{_in_common(result)}; n: samples paired on the row; failed, zero-var (share of "
        f"zero-variance groups): old → new. {result['method']}"
    )


def render(result: dict[str, Any]) -> bytes:
    """``compare.html``; ReportUnavailable without the eval extra."""
    from runtime.eval.report import templates

    environment = templates()
    environment.filters["signed"] = _signed
    environment.filters["p"] = _p
    environment.filters["seed"] = _seed
    page = environment.get_template("compare.html").render(
        result=result, in_common=_in_common(result)
    )
    return page.encode()


def _write(target: Path, page: bytes) -> Path:
    """``compare.html`` in ``target``, made if needed; on failure no directory it made is
    left behind."""
    made = [p for p in (target, *target.parents) if not p.exists()]
    try:
        target.mkdir(parents=True, exist_ok=True)
        with OutDir.open(target) as directory:
            directory.write("compare.html", (page,))
    except OSError:
        for path in made:  # deepest first; only while empty
            with contextlib.suppress(OSError):
                os.rmdir(path)
        raise
    return target / "compare.html"


def run(old: str, new: str, out: str | None) -> int:
    """The command: 0 when compared, 2 on a CompareError or a page that cannot be written
    (printed; the table is printed first)."""
    from runtime.eval.report import ReportUnavailable

    try:
        result = compare(load(Path(old)), load(Path(new)))
    except CompareError as exc:
        print(f"error: {terminal(str(exc))}", file=sys.stderr)
        return 2
    if result["same_directory"]:
        print(
            f"note: {terminal(old)} and {terminal(new)} are the same directory: nothing "
            "can have changed",
            file=sys.stderr,
        )
    for warning in result["warnings"]:
        print(f"warning: {terminal(warning)}", file=sys.stderr)
    print_table(result)
    target, named = (Path(out), f"--out {out}") if out else (Path(new), new)
    try:
        page = _write(target, render(result))
    except ReportUnavailable as exc:
        print(f"warning: {str(exc).replace('report.html', 'compare.html')}", file=sys.stderr)
        return 0
    except OSError as exc:
        why = exc.strerror or exc
        print(f"error: {terminal(named)}: cannot write compare.html there: {why}", file=sys.stderr)
        return 2
    print(f"wrote {terminal(str(page))}", file=sys.stderr)
    return 0
