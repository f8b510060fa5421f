"""NeMo Gym's ``POST /aggregate_metrics``: the metrics of a run, from the verify answers the
caller sends back, in Gym's ``AggregateMetrics`` shape.

Gym's collector (``ng_collect_rollouts``) posts ``{"verify_responses": [...]}`` at the end of
a run and logs what comes back; its own resources servers answer with the baseline stats of
its reward profiler (``nemo_gym/reward_profile.py``, ``compute_aggregate_metrics``). These
are the same numbers, written from that contract in plain Python (the runtime carries no
pandas, scipy or wandb):

- each verify answer's numeric fields (booleans as 0/1, names starting ``_`` left out, the
  ``response.usage`` counts added) are a row; a masked answer (``mask_sample``) is left out
  of every quality statistic and counted in the ``coverage/*`` metrics;
- ``group_level_metrics``: per task (``_ng_task_index``), ``mean/``, ``max/``, ``min/``,
  ``median/`` and ``std/`` (sample, ddof 1; 0 for a task of one rollout) of each field,
  with the task's rollouts listed;
- ``agent_metrics``: the same over all rollouts, plus, when there are several repeats
  (``_ng_rollout_index``), each repeat's means summarized across repeats, and
  ``num_repeats``; ``key_metrics``: its ``mean/*`` entries;
- ``repeat_level_metrics``: per repeat, each field's mean, median, std, sem, min, max,
  quartiles and 95% t-interval;
- ``perf_summary``: the rollouts' ``ng_perf`` records summarized, absent without any.

A scored answer without integer ``_ng_task_index`` and ``_ng_rollout_index``, or two answers
for one rollout, are refused (``GymMetricsError``): Gym's own code fails on them too.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

__all__ = ["GymMetricsError", "aggregate_metrics"]

TASK_INDEX = "_ng_task_index"
ROLLOUT_INDEX = "_ng_rollout_index"
MASK_SAMPLE = "mask_sample"
AGENT = {"name": "agent"}  # Gym profiles one run as one agent of this name

# Gym's metric grammar (nemo_gym/metrics_config.py): STAT/name, STAT_across_repeats/name
_ACROSS = "_across_repeats/"
_GROUP_STATS = ("mean", "max", "min", "median", "std")
# a repeat's entries that are no point estimate: never summarized across repeats
_NOT_PRIMARY_NAMES = frozenset(
    f"{TASK_INDEX} {ROLLOUT_INDEX} _ng_attempt_index sample_count missing_count num_repeats "
    "token_usage_version".split()
)
_NOT_PRIMARY_PREFIXES = tuple(
    f"{stat}/"
    for stat in [
        "max",
        "min",
        "median",
        "std",
        "sem",
        "se",
        "p25",
        "p75",
        "ci_low_95",
        "ci_high_95",
        "histogram",
    ]
)
_NOT_PRIMARY_SUFFIXES = (
    "/max",
    "/min",
    "/median",
    "/p5",
    "/p25",
    "/p75",
    "/p95",
    "/ci_low_95",
    "/ci_high_95",
    "/ci_lower",
    "/ci_upper",
    "_ci_lower",
    "_ci_upper",
    "_ci95_lower",
    "_ci95_upper",
    "/_ng_attempt_index",
    "/std_dev_across_runs",
    "/std_err_across_runs",
    "/avg_sample_std_dev",
)
_PERF_TOKEN_FIELDS = [
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
]


class GymMetricsError(ValueError):
    """The verify answers cannot be profiled (as Gym's own code refuses them)."""


Row = dict[str, Any]


def aggregate_metrics(verify_responses: list[Row]) -> dict[str, Any]:
    """Gym's ``AggregateMetrics`` of these verify answers (its default hooks: no
    benchmark-specific metrics)."""
    empty: dict[str, Any] = {
        "group_level_metrics": [],
        "agent_metrics": {},
        "key_metrics": {},
        "perf_summary": None,
        "repeat_level_metrics": [],
    }
    if not verify_responses:
        return empty
    scored = [vr for vr in verify_responses if not vr.get(MASK_SAMPLE)]
    coverage = _coverage(verify_responses, scored)
    perf = _perf_summary(
        [vr["ng_perf"] for vr in verify_responses if isinstance(vr.get("ng_perf"), dict)],
        len(verify_responses),
    )
    if not scored:  # every rollout masked: no quality metric, only what happened
        return {**empty, "agent_metrics": dict(coverage), "key_metrics": dict(coverage)} | {
            "perf_summary": perf
        }
    rows = _rows(verify_responses, scored)
    columns = list(dict.fromkeys(name for _, _, numbers, _ in rows for name in numbers))

    by_task: dict[int, list[tuple[int, dict[str, float], Row]]] = defaultdict(list)
    for task, repeat, numbers, info in rows:
        by_task[task].append((repeat, numbers, info))
    groups = []
    for task in sorted(by_task):
        members = by_task[task]
        group: dict[str, Any] = _describe([numbers for _, numbers, _ in members], columns)
        group[TASK_INDEX] = task
        group["sample"] = {"agent_ref": dict(AGENT)}
        group["num_rollouts"] = group["expected_num_rollouts"] = len(members)
        group["missing_num_rollouts"] = 0
        group["reward_profile_completion_pct"] = 100.0
        group["rollout_infos"] = [info for _, _, info in sorted(members, key=lambda m: m[0])]
        groups.append(group)

    agent = _describe([numbers for _, _, numbers, _ in rows], columns)
    repeats = _repeat_level(rows, columns)
    agent.update(_across_repeats(repeats))
    agent.update(coverage)
    agent["num_repeats"] = len({vr.get(ROLLOUT_INDEX, 0) for vr in verify_responses})
    key_metrics = {k: v for k, v in agent.items() if k.startswith("mean/")}
    key_metrics.update(coverage)
    return {
        "group_level_metrics": groups,
        "agent_metrics": agent,
        "key_metrics": key_metrics,
        "perf_summary": perf,
        "repeat_level_metrics": repeats,
    }


# --- rows --------------------------------------------------------------------------------


def _rows(everything: list[Row], scored: list[Row]) -> list[tuple[int, int, dict[str, float], Row]]:
    """(task, repeat, numeric fields, rollout info) of each scored answer, by (task, repeat)."""
    keys: dict[tuple[Any, Any], int] = defaultdict(int)
    for vr in everything:  # a masked answer without indices is rollout (0, 0) to Gym
        keys[(vr.get(TASK_INDEX, 0), vr.get(ROLLOUT_INDEX, 0))] += 1
    rows = []
    for at, vr in enumerate(scored):
        task, repeat = vr.get(TASK_INDEX), vr.get(ROLLOUT_INDEX)
        if not (isinstance(task, int) and isinstance(repeat, int)) or bool in (
            type(task),
            type(repeat),
        ):
            raise GymMetricsError(
                f"verify_responses[{at}] needs integer {TASK_INDEX} and {ROLLOUT_INDEX} "
                "(rollout collection sets them)"
            )
        if keys[(task, repeat)] > 1:
            raise GymMetricsError(f"two verify responses for rollout {task}:{repeat}")
        response = vr.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        usage = usage if isinstance(usage, dict) else {}
        info: Row = {"rollout_id": f"{task}:{repeat}", TASK_INDEX: task, ROLLOUT_INDEX: repeat}
        if "reward" in vr:
            info["reward"] = vr["reward"]
        info.update(_numbers(usage.items()))
        info.update(
            _numbers((k, v) for k, v in vr.items() if k not in ("reward", "response", MASK_SAMPLE))
        )
        # the usage counts override a field of the same name here (and not in the info)
        fields = {**{k: v for k, v in vr.items() if k != MASK_SAMPLE}, **usage}
        rows.append((task, repeat, _numbers(fields.items()), info))
    rows.sort(key=lambda row: (row[0], row[1]))
    return rows


def _numbers(items: Iterable[tuple[str, Any]]) -> dict[str, float]:
    """The numeric fields (a boolean as 0 or 1), names starting "_" left out."""
    out: dict[str, float] = {}
    for name, value in items:
        if isinstance(name, str) and name.startswith("_"):
            continue
        if isinstance(value, bool):
            out[name] = int(value)
        elif isinstance(value, (int, float)) and math.isfinite(value):
            out[name] = value
    return out


def _coverage(everything: list[Row], scored: list[Row]) -> dict[str, int]:
    """How many rollouts and tasks the quality metrics come from; empty if none was masked."""
    if len(scored) == len(everything):
        return {}
    tasks = {vr.get(TASK_INDEX, 0) for vr in everything}
    measured = {vr.get(TASK_INDEX, 0) for vr in scored}
    return {
        "coverage/measured_rollouts": len(scored),
        "coverage/masked_rollouts": len(everything) - len(scored),
        "coverage/measured_tasks": len(measured),
        "coverage/fully_masked_tasks": len(tasks - measured),
    }


# --- statistics --------------------------------------------------------------------------


def _describe(rows: list[dict[str, float]], columns: list[str]) -> dict[str, Any]:
    """mean/max/min/median/std of each column over ``rows`` (a missing value skipped); std
    needs two values, except in a group of one row, where it is 0."""
    out: dict[str, Any] = {}
    for stat in _GROUP_STATS:
        for column in columns:
            values = [row[column] for row in rows if column in row]
            if not values:
                continue
            if stat == "std":
                if len(values) >= 2:
                    out[f"std/{column}"] = statistics.stdev(values)
                elif len(rows) == 1:
                    out[f"std/{column}"] = 0.0
                continue
            out[f"{stat}/{column}"] = _stat(stat, values)
    return out


def _stat(stat: str, values: list[float]) -> float:
    if stat == "mean":
        return math.fsum(values) / len(values)
    if stat == "max":
        return max(values)
    if stat == "min":
        return min(values)
    if stat == "median":
        return statistics.median(values)
    if stat == "total":
        return sum(values)
    if stat == "std":  # the population's, as Gym's perf summary takes it
        return statistics.pstdev(values)
    if stat.startswith("p"):
        return _quantile(values, int(stat[1:]) / 100)
    raise ValueError(stat)


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's and pandas' default)."""
    ordered = sorted(values)
    at = (len(ordered) - 1) * q
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (at - low) * (ordered[high] - ordered[low])


def _summary(values: list[float]) -> tuple[float, float, float]:
    """(mean, sample std (0 for one value), its standard error)."""
    mean = math.fsum(values) / len(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, std, std / math.sqrt(len(values))


def _interval(mean: float, error: float, n: int) -> tuple[float, float] | None:
    """The 95% Student-t interval around ``mean``; None for a single value."""
    if n <= 1:
        return None
    if error == 0:
        return mean, mean
    half = t_quantile_975(n - 1) * error
    return mean - half, mean + half


def _repeat_level(
    rows: list[tuple[int, int, dict[str, float], Row]], columns: list[str]
) -> list[dict[str, Any]]:
    """Per repeat (when there are several): each column's summary over its tasks."""
    repeats: dict[int, list[tuple[int, dict[str, float]]]] = defaultdict(list)
    for task, repeat, numbers, _ in rows:
        repeats[repeat].append((task, numbers))
    if len(repeats) < 2:
        return []
    total = len({task for task, _, _, _ in rows})
    out = []
    for repeat in sorted(repeats):
        members = repeats[repeat]
        present = len({task for task, _ in members})
        entry: dict[str, Any] = {
            ROLLOUT_INDEX: repeat,
            "sample_count": present,
            "missing_count": total - present,
        }
        for column in sorted(columns):
            values = [numbers[column] for _, numbers in members if column in numbers]
            if not values:
                continue
            mean, std, sem = _summary(values)
            entry |= {
                f"mean/{column}": mean,
                f"median/{column}": statistics.median(values),
                f"std/{column}": std,
                f"sem/{column}": sem,
                f"min/{column}": min(values),
                f"max/{column}": max(values),
                f"p25/{column}": _quantile(values, 0.25),
                f"p75/{column}": _quantile(values, 0.75),
            }
            interval = _interval(mean, sem, len(values))
            if interval:
                entry[f"ci_low_95/{column}"], entry[f"ci_high_95/{column}"] = interval
        out.append(entry)
    return out


def _is_primary(name: str) -> bool:
    """A point estimate (not a spread, a bound or a count): summarized across repeats."""
    return (
        name not in _NOT_PRIMARY_NAMES
        and not name.startswith(_NOT_PRIMARY_PREFIXES)
        and not name.endswith(_NOT_PRIMARY_SUFFIXES)
        and _ACROSS not in name
    )


def _across_repeats(repeats: list[dict[str, Any]]) -> dict[str, float]:
    """Each repeat's point estimates as one observation each, summarized across repeats."""
    names = dict.fromkeys(name for entry in repeats for name in entry if _is_primary(name))
    out: dict[str, float] = {}
    for name in names:
        values = [entry[name] for entry in repeats if name in entry]
        mean, std, error = _summary(values)
        out |= {
            f"mean{_ACROSS}{name}": mean,
            f"median{_ACROSS}{name}": statistics.median(values),
            f"std{_ACROSS}{name}": std,
            f"min{_ACROSS}{name}": min(values),
            f"max{_ACROSS}{name}": max(values),
            f"se{_ACROSS}{name}": error,
        }
        interval = _interval(mean, error, len(values))
        if interval:
            out[f"ci_low_95{_ACROSS}{name}"], out[f"ci_high_95{_ACROSS}{name}"] = interval
    return out


def _perf_summary(records: list[Row], total: int) -> dict[str, Any] | None:
    """The rollouts' ``ng_perf`` records summarized; None when none carried one."""
    if total <= 0 or not records:
        return None

    def values(key: str) -> list[float]:
        return [r[key] for r in records if isinstance(r.get(key), (int, float))]

    covered = [r.get("token_observability_coverage") for r in records]
    summary: dict[str, Any] = {
        "overall_observability_coverage": len(records) / total,
        "token_observability_coverage": sum(
            1 for c in covered if isinstance(c, (int, float)) and c > 0
        )
        / total,
    }
    for name in _PERF_TOKEN_FIELDS:
        if found := values(name):
            for stat in ("mean", "median", "total"):
                summary[f"{stat}_{name}"] = _stat(stat, found)
    if turns := values("num_turns"):
        for stat in ("mean", "median", "std", "min", "p90", "max"):
            summary[f"{stat}_num_turns"] = _stat(stat, turns)
    per_turn = [
        r["completion_tokens"] / r["num_turns"]
        for r in records
        if isinstance(r.get("completion_tokens"), (int, float))
        and isinstance(r.get("num_turns"), (int, float))
        and r["num_turns"] > 0
    ]
    if per_turn:
        summary["mean_tokens_per_turn"] = _stat("mean", per_turn)
        summary["median_tokens_per_turn"] = _stat("median", per_turn)
    if latency := values("total_latency_ms"):
        for stat in ("p50", "p90", "p99", "mean"):
            summary[f"total_latency_{stat}_ms"] = _stat(stat, latency)
    return summary


# --- Student's t, for the 95% intervals ----------------------------------------------------


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom: the t where the
    two tails beyond +-t hold 5%, found by bisection on the regularized incomplete beta
    function (two-tailed P(|T| > t) = I_{df/(df+t^2)}(df/2, 1/2))."""
    if df == 1:
        return math.tan(math.pi * 0.475)  # the Cauchy distribution: exact
    low, high = 0.0, 16.0  # df >= 2: t(0.975) <= 4.31
    for _ in range(200):
        mid = (low + high) / 2
        if _beta_regularized(df / 2, 0.5, df / (df + mid * mid)) > 0.05:
            low = mid
        else:
            high = mid
        if high - low <= 1e-15 * high:
            break
    return (low + high) / 2


def _beta_regularized(a: float, b: float, x: float) -> float:
    """I_x(a, b), by its continued fraction (evaluated on the side where it converges)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(log_front + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), by the modified Lentz method."""
    tiny = 1e-300

    def guard(value: float) -> float:
        return value if abs(value) > tiny else tiny

    c, d = 1.0, 1.0 / guard(1.0 - (a + b) * x / (a + 1))
    result = d
    for m in range(1, 1000):
        # the even step, then the odd one, of the fraction's terms
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 / guard(1.0 + even * d)
        c = guard(1.0 + even / c)
        result *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 / guard(1.0 + odd * d)
        c = guard(1.0 + odd / c)
        step = d * c
        result *= step
        if abs(step - 1.0) < 1e-16:
            break
    return result
