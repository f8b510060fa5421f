"""What a run leaves: the table on the terminal, and with ``--out``: ``trajectories.jsonl``,
``summary.json`` and ``report.html`` (one self-contained page: charts as embedded PNGs).

The page needs matplotlib and jinja2 (``pip install 'agentic-rl-runtime[eval]'``); without
them the table and the two other files are still written.
"""

from __future__ import annotations

import base64
import io
import math
import sys
import warnings
from pathlib import Path
from typing import Any

import orjson

from runtime.eval.files import OutDir, terminal
from runtime.eval.plan import Plan
from runtime.eval.runner import Results, Trajectory
from runtime.eval.stats import failed_sub_rewards, prompt_line, total_of, unscored

__all__ = [
    "ReportUnavailable",
    "failure_rows",
    "print_table",
    "templates",
    "write_files",
    "write_html",
]

SHOWN = 10  # lowest and highest scored trajectories on the page
_CONTENT_LIMIT = 4000  # characters of one message on the page


class ReportUnavailable(Exception):
    pass


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


_TABLE: dict[str, Any] = {
    "title_justify": "left",
    "collapse_padding": True,
    "pad_edge": False,
}


def _print_whole(console: Any, table: Any) -> None:
    """Never a cropped number: a table wider than the terminal is printed at its own width
    (the terminal then wraps its lines)."""
    from rich import box

    table.box = box.SIMPLE_HEAD
    needed = console.measure(table, options=console.options.update(width=1000)).maximum
    width = console.width
    console.width = max(width, needed)
    try:
        console.print(table)
    finally:
        console.width = width


def _one_line(text: str | None, limit: int = 160) -> str:
    lines = (text or "").strip().splitlines() or [""]
    line = lines[0] + (" [...]" if len(lines) > 1 else "")
    return line if len(line) <= limit else line[:limit] + " [...]"


def failure_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Where failures happened, most first: each function with failed calls and each
    sub-reward that failed, with its calls, failures, rate and top error messages."""
    rows = []
    for name, row in summary["functions"].items():
        if row["failures"]:
            rows.append(
                {
                    "where": name,
                    "kind": row["type"],
                    "calls": row["calls"],
                    "failures": row["failures"],
                    "failure_rate": row["failure_rate"],
                    "errors": row.get("error_messages", []),
                    "logged": False,
                    "first_failure": None,
                    "others": _left_out(row["failures"], row.get("error_messages", [])),
                }
            )
    for name, reward in summary["rewards"].items():
        for sub, row in reward["sub_rewards"].items():
            if row["failures"]:
                rows.append(
                    {
                        "where": f"{name} └ {sub}",
                        "kind": "sub-reward",
                        "calls": row["calls"],
                        "failures": row["failures"],
                        "failure_rate": row["failure_rate"],
                        "errors": row["errors_logged"],
                        "logged": True,
                        "first_failure": row["first_failure"],
                        "others": _left_out(row["failures"], row["errors_logged"]),
                    }
                )
    return sorted(rows, key=lambda r: -r["failures"])


def _left_out(failures: int, errors: list[dict[str, Any]]) -> int:
    """The failures no message shown accounts for: of other messages (past the top
    ones), or, for a sub-reward, not logged one by one by its server."""
    return max(0, failures - sum(e["count"] for e in errors))


def left_out_text(row: dict[str, Any]) -> str:
    """How a failure row's messages fall short of its count, in words; "" when they do not."""
    if not row["others"]:
        return ""
    if row["logged"]:
        return (
            f"{row['others']} more not logged one by one (a sub-reward's failure is logged "
            "with its traceback once a minute, the rest counted: see logs/)"
        )
    return f"{row['others']} more with other messages"


def _error_text(error: dict[str, Any], logged: bool) -> str:
    code = "" if logged else f"{error['code']}: "
    times = f"logged {error['count']}x" if logged else f"{error['count']}x"
    example = f", e.g. {error['example']}" if error.get("example") else ""
    return f"{code}{_one_line(error['message'])} ({times}{example})"


def _print_failures(console: Any, summary: dict[str, Any]) -> None:
    from rich.table import Table

    rows = failure_rows(summary)
    if not rows:
        return
    table = Table(title="Failures", **_TABLE)
    for column in ("where", "calls", "failed", "top errors (count, e.g. sample)"):
        table.add_column(
            column, justify="right" if column in ("calls", "failed") else "left", no_wrap=True
        )
    for row in rows:
        errors = [_error_text(e, row["logged"]) for e in row["errors"]]
        if more := left_out_text(row):
            errors.append(f"({more})")
        if row["first_failure"]:
            errors.append(f"(first failed on {row['first_failure']})")
        table.add_row(
            row["where"],
            str(row["calls"]),
            f"{row['failures']} ({row['failure_rate']:.0%})",
            "\n".join(errors) or "-",
        )
    _print_whole(console, table)


def print_table(summary: dict[str, Any], stream: Any = None) -> None:
    """The summary as tables on stdout (rich; 140 columns when not a terminal). Markup is
    off: names and error messages are the user's text, ``[/INST]`` included; their control
    characters are shown escaped."""
    from rich.console import Console
    from rich.table import Table

    stream = stream or sys.stdout
    summary = terminal(summary)  # names and errors: no control sequence reaches the terminal
    console = Console(
        file=stream, width=None if stream.isatty() else 140, highlight=False, markup=False
    )
    functions = Table(title="Functions", **_TABLE)
    for column in ("function", "type", "calls", "failed", "errors", "p50", "p95", "max", "timeout"):
        functions.add_column(
            column,
            justify="left" if column in ("function", "type", "errors") else "right",
            no_wrap=column != "errors",
        )
    for name, row in summary["functions"].items():
        errors = ", ".join(f"{code} {n}" for code, n in row["errors"].items()) or "-"
        failed = f"{row['failures']} ({row['failure_rate']:.0%})" if row["calls"] else "0"
        functions.add_row(
            name,
            row["type"],
            str(row["calls"]),
            failed,
            errors,
            _seconds(row["latency_s"]["p50"]),
            _seconds(row["latency_s"]["p95"]),
            _seconds(row["latency_s"]["max"]),
            f"{row['timeout_s']:g}s",
        )
    _print_whole(console, functions)

    if summary["rewards"]:
        rewards = Table(title="Rewards", **_TABLE)
        for column in (
            "reward",
            "weight",
            "scored",
            "mean",
            "std",
            "min",
            "max",
            "=0",
            "=1",
            "distinct",
            "zero-var groups",
        ):
            rewards.add_column(
                column, justify="left" if column == "reward" else "right", no_wrap=True
            )

        def add(label: str, weight: Any, stats: dict[str, Any], groups: str) -> None:
            rewards.add_row(
                label,
                _num(weight),
                str(stats["count"]),
                _num(stats["mean"]),
                _num(stats["std"]),
                _num(stats["min"]),
                _num(stats["max"]),
                _share(stats["share_zero"]),
                _share(stats["share_one"]),
                str(stats["distinct"]),
                groups,
            )

        for name, row in summary["rewards"].items():
            label = name if row["type"] == "reward" else f"{name} (group)"
            add(
                label,
                row["weight"],
                row["scores"],
                f"{row['zero_variance_groups']} of {row['groups']}",
            )
            for sub, stats in row["sub_rewards"].items():
                failed = f" ({stats['failures']} failed)" if stats["failures"] else ""
                groups = f"{stats['zero_variance_groups']} of {stats['groups']}"
                add(f"  └ {sub}{failed}", stats["weight"], stats, groups)
        total = summary.get("total")
        if total is not None:
            add(
                "weighted total",
                None,
                total["scores"],
                f"{total['zero_variance_groups']} of {total['groups']}",
            )
        _print_whole(console, rewards)

    _print_failures(console, summary)

    done = summary["trajectories"]
    parts = [
        f"{done[key]} {what}"
        for key, what in (
            ("failed_rollout", "rollout"),
            ("failed_reward", "reward"),
            ("failed_sub_reward", "sub-reward"),
        )
        if done.get(key)
    ]
    console.print(
        f"{summary['samples']} samples x {summary['rollouts_per_sample']} rollouts = "
        f"{done['total']} trajectories: {done['succeeded']} succeeded, {done['failed']} failed"
        + (f" (on: {', '.join(parts)})" if parts else "")
        + f", {done['not_run']} not run"
        + (f" ({done['unscored']} succeeded but unscored: stopped)" if done["unscored"] else "")
        + f", in {summary['elapsed_s']:.1f} s"
    )
    failures = summary.get("failures") or {}
    if failures.get("total"):
        console.print(
            f"{failures['total']} failure(s): {failures['calls']} failed call(s), "
            f"{failures['sub_rewards']} failed sub-reward(s)",
            style="bold red",
        )
    for name, row in summary["rewards"].items():
        if row.get("sub_rewards_without_weight"):
            console.print(
                f"note: {name} reports sub-reward(s) with no weight: "
                + ", ".join(row["sub_rewards_without_weight"])
            )
    if summary["flags"]:
        console.print(f"{len(summary['flags'])} red flag(s):", style="bold red")
        for flag in summary["flags"]:
            console.print(f"  ✗ {flag['message']}", style="red")
    else:
        console.print("no red flags", style="green")
    if summary["stopped_early"]:
        console.print(summary["stopped_early"], style="bold red")


def _trajectory_line(plan: Plan, trajectory: Trajectory) -> dict[str, Any]:
    subs = {
        name: {k: v for k, v in metrics.items() if "." not in k}
        for name, metrics in trajectory.metrics.items()
    }
    line = {
        "file": trajectory.sample.file,
        "line": trajectory.sample.line,
        "rollout": trajectory.index,
        "status": trajectory.status,
        "unscored": unscored(plan, trajectory),  # scorers the run stopped before
        "error_code": trajectory.error_code,
        "error": trajectory.error,
        "messages": trajectory.messages,
        "ground_truth": trajectory.sample.ground_truth,
        "scores": trajectory.scores,
        "reward_metrics": trajectory.metrics,
        "sub_rewards": subs,
        "total": total_of(plan, trajectory),  # null: not every reward scored it
        "latency_s": trajectory.latency,
        "errors": trajectory.errors,
        "invalid_text": trajectory.invalid_text,  # replaced with U+FFFD: flagged
    }
    if not (plan.rewards or plan.group_rewards):
        del line["total"]  # no reward, no total: absent, as in summary.json
    return plan.scrub.value(line)


def write_files(plan: Plan, results: Results, summary: dict[str, Any], out: OutDir) -> None:
    """``trajectories.jsonl`` and ``summary.json``, of values already scrubbed."""
    out.write(
        "trajectories.jsonl",
        (
            orjson.dumps(_trajectory_line(plan, trajectory)) + b"\n"
            for trajectory in results.trajectories
            if trajectory.status != "pending"
        ),
    )
    options = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
    out.write("summary.json", (orjson.dumps(summary, option=options) + b"\n",))


# ---- the page -----------------------------------------------------------------------


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def _label(name: str) -> str:
    """A name as a chart shows it: as written (``$`` would start matplotlib's math, and an
    unknown symbol in it lose the page), control characters escaped."""
    return terminal(name).replace("$", r"\$")


def _charts(summary: dict[str, Any], results: Results, plan: Plan) -> dict[str, Any]:
    # a glyph missing from the font (a CJK name) is a warning per glyph: not for the terminal
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _draw(summary, results, plan)


def _draw(summary: dict[str, Any], results: Results, plan: Plan) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    charts: dict[str, Any] = {"rewards": [], "latency": None}
    scorers = [f.name for f in plan.rewards + plan.group_rewards]
    if "total" in summary:
        scorers.append("weighted total")
    for name in scorers:
        if name == "weighted total":
            values = [v for t in results.trajectories if (v := total_of(plan, t)) is not None]
        else:
            values = [t.scores[name] for t in results.trajectories if name in t.scores]
        if not values:
            continue
        figure, axes = plt.subplots(figsize=(4.6, 2.6))
        distinct = sorted(set(values))
        if len(distinct) <= 12:  # few values (0/1 rewards): a bar per value, counted
            counts = [values.count(v) for v in distinct]
            labels = [_num(v) for v in distinct]
            bars = axes.bar(labels, counts, color="#3b6ea8", width=0.6)
            axes.bar_label(bars, fontsize=8)
            axes.margins(y=0.15)
        else:
            bins = min(20, max(5, int(math.sqrt(len(values))) * 2))
            axes.hist(values, bins=bins, color="#3b6ea8", edgecolor="white")
        axes.set_title(_label(name), fontsize=10)
        axes.set_xlabel("score", fontsize=9)
        axes.set_ylabel("trajectories", fontsize=9)
        axes.tick_params(labelsize=8)
        axes.grid(axis="y", alpha=0.3)
        charts["rewards"].append({"name": name, "png": _png(figure)})
        plt.close(figure)

    names = [n for n, row in summary["functions"].items() if row["calls"]]
    if names:
        figure, axes = plt.subplots(figsize=(9.2, 0.55 * len(names) + 1.2))
        data = [[c.latency for c in results.calls if c.function == n] for n in names]
        labels = [_label(n) for n in names]
        axes.boxplot(data, vert=False, tick_labels=labels, showfliers=True)
        marked = False
        for position, name in enumerate(names, 1):
            timeout = summary["functions"][name]["timeout_s"]
            if timeout <= max(max(d) for d in data) * 1.5:  # else it would squash the boxes
                axes.plot([timeout], [position], marker="|", color="#c0392b", markersize=18)
                marked = True
        label = "latency (s)" + ("; red mark: the function's timeout" if marked else "")
        axes.set_xlabel(label, fontsize=9)
        axes.tick_params(labelsize=8)
        axes.grid(axis="x", alpha=0.3)
        charts["latency"] = _png(figure)
        plt.close(figure)
    return charts


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(
            str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content
        )
    text = "" if content is None else str(content)
    return text if len(text) <= _CONTENT_LIMIT else text[:_CONTENT_LIMIT] + " [...]"


def _transcript(plan: Plan, trajectory: Trajectory, rollouts: list[int]) -> dict[str, Any]:
    """A trajectory as the page shows it (one of ``rollouts``, identical), its values
    scrubbed (before a message is cut short: a secret cut in two would not be found); its
    badges in the job's order of rewards, whatever order they were scored in."""
    scrub = plan.scrub.value
    messages = []
    for message in scrub(trajectory.messages or []):
        if not isinstance(message, dict):
            continue
        calls = [
            f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments')})"
            for c in message.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        messages.append(
            {
                "role": str(message.get("role", "?")),
                "content": _content(message),
                "tool_calls": calls,
            }
        )
    badges = []
    for function in plan.rewards + plan.group_rewards:
        error = trajectory.errors.get(function.name)
        badges.append(
            {
                "name": function.name,
                "score": trajectory.scores.get(function.name),
                "error": error.get("code") if error else None,
            }
        )
    word = "rollout" if len(rollouts) == 1 else "rollouts"
    return {
        "sample": trajectory.sample.id,
        "where": f"{word} {', '.join(map(str, rollouts))}",
        "count": len(rollouts),
        "total": total_of(plan, trajectory),
        "badges": badges,
        "failed_sub_rewards": failed_sub_rewards(trajectory),
        "ground_truth": scrub(trajectory.sample.ground_truth),
        "messages": messages,
    }


def _identical(trajectories: list[Trajectory]) -> list[tuple[Trajectory, list[int]]]:
    """Each distinct trajectory of a sample once, with the rollouts that were the same
    (messages, scores, metrics and errors alike)."""
    found: dict[tuple[int, bytes], tuple[Trajectory, list[int]]] = {}
    for t in trajectories:
        what = [t.messages, t.scores, t.metrics, t.errors]
        try:
            text = orjson.dumps(what, option=orjson.OPT_SORT_KEYS, default=str)
        except TypeError:  # a key that is not a string: never the same as another
            text = repr(id(t)).encode()
        found.setdefault((id(t.sample), text), (t, []))[1].append(t.index)
    return list(found.values())


def _ranked(
    plan: Plan, results: Results
) -> tuple[list[tuple[Trajectory, list[int]]], list[tuple[Trajectory, list[int]]]]:
    """The lowest and the highest scored distinct trajectories, none shown twice."""

    def key(t: Trajectory) -> float | None:
        total = total_of(plan, t)
        if total is not None or not t.scores:
            return total
        return sum(t.scores.values())

    scored = sorted(
        (item for item in _identical(results.trajectories) if key(item[0]) is not None),
        key=lambda item: (key(item[0]), item[0].sample.line, item[0].index),
    )
    lowest = scored[: min(SHOWN, math.ceil(len(scored) / 2))]
    highest = scored[len(lowest) :][::-1][:SHOWN]
    return lowest, highest


def _by_prompt(plan: Plan, items: list[tuple[Trajectory, list[int]]]) -> list[dict[str, Any]]:
    """The transcripts under their prompt, the prompts in the order of their first."""
    groups: dict[int, dict[str, Any]] = {}
    for trajectory, rollouts in items:
        sample = trajectory.sample
        group = groups.setdefault(
            id(sample),
            {
                "sample": sample.id,
                "prompt": prompt_line(sample.record.get("messages"), plan.scrub.text),
                "transcripts": [],
            },
        )
        group["transcripts"].append(_transcript(plan, trajectory, rollouts))
    return list(groups.values())


def templates() -> Any:
    """The jinja2 environment of eval's pages (autoescaped); ReportUnavailable without
    jinja2 or matplotlib."""
    try:
        import jinja2
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ReportUnavailable(
            f"report.html not written: it needs {exc.name}; install the eval extra: "
            "pip install 'agentic-rl-runtime[eval]'"
        ) from None
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("runtime.eval", "templates"),
        autoescape=jinja2.select_autoescape(("html",)),
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["num"] = _num
    environment.filters["share"] = _share
    environment.filters["seconds"] = _seconds
    environment.filters["one_line"] = _one_line
    environment.filters["left_out"] = left_out_text
    return environment


def write_html(plan: Plan, results: Results, summary: dict[str, Any], out: OutDir) -> Path:
    """``report.html``, rendered (escaped) from values scrubbed before: the page itself is
    never scrubbed, so that no secret can delete its markup."""
    environment = templates()
    lowest, highest = _ranked(plan, results)
    page = environment.get_template("report.html").render(
        summary=summary,
        failures=failure_rows(summary),
        charts=_charts(summary, results, plan),
        lowest=_by_prompt(plan, lowest),
        highest=_by_prompt(plan, highest),
        job_name=plan.scrub.text(plan.job.config.name),
    )
    out.write("report.html", (page.encode(),))
    return out.path / "report.html"
