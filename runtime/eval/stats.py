"""The numbers of a run and its red flags, as ``summary.json`` holds them (stable keys)."""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Callable
from typing import Any

from runtime.eval.metadata import describe
from runtime.eval.plan import Plan, Sample
from runtime.eval.runner import LLM_NAME, Results, Trajectory
from runtime.eval.secrets import without_userinfo

__all__ = [
    "FAILURE_RATE_FLAG",
    "LATENCY_SHARE_FLAG",
    "failed_on",
    "percentile",
    "prompt_line",
    "score_stats",
    "summarise",
    "top_errors",
]

FAILURE_RATE_FLAG = 0.05  # a function failing more often than this is flagged
LATENCY_SHARE_FLAG = 0.8  # p95 latency at this share of the timeout or more is flagged
ZERO_VARIANCE_FLAG = 0.5  # flagged when at least this share of groups carry no signal


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def score_stats(values: list[float]) -> dict[str, Any]:
    count = len(values)
    if not count:
        return {
            "count": 0,
            "mean": None,
            "std": None,
            "min": None,
            "max": None,
            "share_zero": None,
            "share_one": None,
            "distinct": 0,
        }
    return {
        "count": count,
        "mean": statistics.fmean(values),
        "std": statistics.pstdev(values) if count > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "share_zero": sum(v == 0.0 for v in values) / count,
        "share_one": sum(v == 1.0 for v in values) / count,
        "distinct": len(set(values)),
    }


def _groups(trajectories: list[Trajectory], value: Any) -> tuple[int, int]:
    """(groups with two values or more, those among them whose values are all equal)."""
    groups, flat = _flat_groups(trajectories, value)
    return groups, len(flat)


def _flat_groups(
    trajectories: list[Trajectory], value: Any, scrub: Callable[[str], str] = str
) -> tuple[int, list[dict[str, Any]]]:
    """(groups with two values or more, those among them whose values are all equal: each
    as its sample id, the value and the first line of its prompt, scrubbed)."""
    by_sample: dict[int, tuple[Sample, list[float]]] = {}  # by id(): a Sample holds a dict
    for trajectory in trajectories:
        found = value(trajectory)
        if found is not None:
            by_sample.setdefault(id(trajectory.sample), (trajectory.sample, []))[1].append(found)
    groups = [(s, values) for s, values in by_sample.values() if len(values) > 1]
    flat = [
        {"sample": s.id, "score": values[0], "prompt": prompt_line(s.record.get("messages"), scrub)}
        for s, values in groups
        if max(values) == min(values)
    ]
    return len(groups), flat


PROMPT_CHARS = 200  # of a prompt's first line, where one is shown


def prompt_line(messages: Any, scrub: Callable[[str], str] = str) -> str:
    """The first line of a conversation's prompt: its last user message before the first
    answer (the question; a system prompt is the same for every line). ``scrub`` runs
    before the line is cut short: a secret cut in two would no longer be recognised."""
    found = ""
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict) or message.get("role") == "assistant":
            break
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            found = str(content or "")
    line = scrub(next((x.strip() for x in found.splitlines() if x.strip()), ""))
    return line if len(line) <= PROMPT_CHARS else line[:PROMPT_CHARS] + " [...]"


TOP_ERRORS = 5  # error messages shown per function and sub-reward
_MESSAGE_CHARS = 300  # of one error message, as errors are counted and shown


def top_errors(
    failures: list[tuple[str, str, str | None]], scrub: Callable[[str], str] = str
) -> list[dict[str, Any]]:
    """(code, message, sample id) of each failure -> the most frequent (code, message),
    each with its count and the first sample it happened on; a message scrubbed, then cut."""
    counts: Counter[tuple[str, str]] = Counter()
    examples: dict[tuple[str, str], str | None] = {}
    for code, message, sample in failures:
        key = (code, scrub(message)[:_MESSAGE_CHARS])
        counts[key] += 1
        examples.setdefault(key, sample)
    return [
        {"code": code, "message": message, "count": count, "example": examples[code, message]}
        for (code, message), count in counts.most_common(TOP_ERRORS)
    ]


# A failed sub-reward's line in its server's log (processors_base.rewards: once a minute
# per sub-reward, the rest counted), with the request's ids appended (runtime.logs).
_LOGGED = re.compile(
    r"sub-reward (?P<name>'[^'\n]*'|\"[^\"\n]*\") of \S+ failed \([^)\n]*\): "
    r"(?P<message>.*?)(?P<ids>(?: \w+_id=\S*)*)$",
    re.MULTILINE,
)
_LINE_ID = re.compile(r" sample_id=\S*-(\d+)(?: |$)")


def logged_failures(log: str, samples: list[Sample]) -> dict[str, list[tuple[str, str | None]]]:
    """Sub-reward name -> (message, sample id) of each failure its server's log names."""
    by_line: dict[int, str] = {}
    for sample in samples:
        by_line.setdefault(sample.line, sample.id)
    found: dict[str, list[tuple[str, str | None]]] = {}
    for match in _LOGGED.finditer(log):
        line = _LINE_ID.search(match["ids"])
        where = by_line.get(int(line[1])) if line else None
        found.setdefault(match["name"][1:-1], []).append((match["message"], where))
    return found


def failed_sub_rewards(trajectory: Trajectory) -> list[str]:
    """``reward/sub`` for each sub-reward that failed on the trajectory."""
    return [
        f"{name}/{key[: -len('.failed')]}"
        for name, metrics in trajectory.metrics.items()
        for key, value in metrics.items()
        if key.endswith(".failed") and value == 1.0
    ]


def total_of(plan: Plan, trajectory: Trajectory) -> float | None:
    """The weighted total with the job's weights, when every reward scored the trajectory."""
    scorers = plan.rewards + plan.group_rewards
    if not scorers or any(f.name not in trajectory.scores for f in scorers):
        return None
    return sum(f.weight * trajectory.scores[f.name] for f in scorers)


def unscored(plan: Plan, trajectory: Trajectory) -> list[str]:
    """The scorers that never scored a trajectory whose rollout succeeded, nor failed on
    it: the run stopped before they were called."""
    if trajectory.status != "success":
        return []
    return [
        f.name
        for f in plan.rewards + plan.group_rewards
        if f.name not in trajectory.scores and f.name not in trajectory.errors
    ]


def failed_on(trajectory: Trajectory) -> list[str]:
    """What failed on a trajectory: its rollout, a reward (by name), a sub-reward
    (``reward/sub``)."""
    rollout = ["rollout"] if trajectory.status == "failed" else []
    return rollout + list(trajectory.errors) + failed_sub_rewards(trajectory)


def reported(metrics: list[dict[str, Any]]) -> list[str]:
    """The sub-reward names a reward reported (``x``, ``x.failed``, ``x.error`` ... -> x)."""
    return list(dict.fromkeys(str(k).split(".", 1)[0] for m in metrics for k in m))


def _sub_value(name: str, sub: str) -> Any:
    def value(t: Trajectory) -> float | None:
        found = t.metrics.get(name, {}).get(sub)
        return float(found) if isinstance(found, (int, float)) else None

    return value


def _sub_rewards(
    plan: Plan, results: Results, name: str, weights: dict[str, float], log: str
) -> dict[str, Any]:
    scored = [t for t in results.trajectories if name in t.metrics]
    metrics = [t.metrics[name] for t in scored]
    logged = logged_failures(log, plan.samples)
    out = {}
    for sub in dict.fromkeys([*weights, *reported(metrics)]):
        value = _sub_value(name, sub)
        values = [v for t in scored if (v := value(t)) is not None]
        failed = [t for t in scored if t.metrics[name].get(f"{sub}.failed") == 1.0]
        groups, flat = _groups(results.trajectories, value)
        out[sub] = {
            **score_stats(values),
            "weight": weights.get(sub),
            "failures": len(failed),
            "calls": len(metrics),
            "failure_rate": len(failed) / len(metrics) if metrics else 0.0,
            "first_failure": failed[0].sample.id if failed else None,
            # what the protocol does not carry (only ``<sub>.failed``): the messages its
            # server logged, a failure a minute per sub-reward
            "errors_logged": top_errors(
                [("logged", m, s) for m, s in logged.get(sub, [])], plan.scrub.text
            ),
            "groups": groups,
            "zero_variance_groups": flat,
        }
    return out


def summarise(
    plan: Plan,
    results: Results,
    weights: dict[str, dict[str, float]],
    logs: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``weights``: each reward's sub-reward weights (from the job file or the class);
    ``logs``: each function's server log, where its sub-rewards' failures are named."""
    logs = logs or {}
    flags: list[dict[str, str]] = []
    trajectories = results.trajectories
    status = Counter(t.status for t in trajectories)

    functions: dict[str, Any] = {}
    served = [(f.name, f.kind, f.timeout) for f in plan.functions]
    if plan.rollout is None:
        assert plan.llm is not None
        served.insert(0, (LLM_NAME, "llm", plan.llm.timeout))
    for name, kind, timeout in served:
        calls = [c for c in results.calls if c.function == name]
        failures = [c for c in calls if not c.ok]
        latencies = [c.latency for c in calls]
        rate = len(failures) / len(calls) if calls else 0.0
        p95 = percentile(latencies, 0.95)
        functions[name] = {
            "type": kind,
            "timeout_s": timeout,
            "calls": len(calls),
            "failures": len(failures),
            "failure_rate": rate,
            "errors": dict(Counter(str(c.error_code) for c in failures).most_common()),
            "error_messages": top_errors(
                [(str(c.error_code), c.error or "", c.sample) for c in failures], plan.scrub.text
            ),
            "latency_s": {
                "p50": percentile(latencies, 0.5),
                "p95": p95,
                "max": max(latencies) if latencies else None,
            },
        }
        if rate > FAILURE_RATE_FLAG:
            top = next(iter(functions[name]["errors"]))
            flags.append(
                {
                    "kind": "failure_rate",
                    "function": name,
                    "message": f"{name} failed {len(failures)} of {len(calls)} calls ({rate:.0%}, "
                    f"over {FAILURE_RATE_FLAG:.0%}), most often {top}",
                }
            )
        if p95 is not None and p95 >= LATENCY_SHARE_FLAG * timeout:
            where = "over" if p95 > timeout else f"{p95 / timeout:.0%} of"
            flags.append(
                {
                    "kind": "latency",
                    "function": name,
                    "message": f"{name}: p95 latency {p95:.2f} s is {where} its timeout "
                    f"({timeout:g} s): on a loaded platform its calls will time out",
                }
            )

    rewards: dict[str, Any] = {}
    for function in plan.rewards + plan.group_rewards:
        name = function.name
        values = [t.scores[name] for t in trajectories if name in t.scores]
        stats = score_stats(values)
        groups, flat = _flat_groups(
            trajectories, lambda t, n=name: t.scores.get(n), plan.scrub.text
        )
        weighted = dict(weights.get(name) or {})
        subs = _sub_rewards(plan, results, name, weighted, logs.get(name, ""))
        rewards[name] = {
            "type": function.kind,
            "weight": function.weight,
            "scores": stats,
            "groups": groups,
            "zero_variance_groups": len(flat),
            "zero_variance_samples": flat,
            "sub_rewards": subs,
        }
        if stats["count"] > 1 and stats["distinct"] == 1:
            flags.append(
                {
                    "kind": "constant",
                    "function": name,
                    "message": f"{name} scored {stats['min']:g} on all {stats['count']} "
                    "trajectories: it cannot tell a good trajectory from a bad one",
                }
            )
        constant = stats["count"] > 1 and stats["distinct"] == 1
        if groups and len(flat) == groups and not constant:
            flags.append(
                {
                    "kind": "no_group_variance",
                    "function": name,
                    "message": f"{name} scored the same on all the rollouts of each of its "
                    f"{groups} groups: it never ranks the rollouts of one prompt",
                }
            )
        metrics = [t.metrics[name] for t in trajectories if name in t.metrics]
        found = reported(metrics)
        # only where some are weighed: a reward with no weights reports its metrics for show
        rewards[name]["sub_rewards_without_weight"] = [
            s for s in found if weighted and s not in weighted
        ]
        shown = ", ".join(sorted(found)) or "nothing"
        for sub in weighted:
            if metrics and sub not in found:  # scored, yet never a word of this sub-reward
                flags.append(
                    {
                        "kind": "weight_never_reported",
                        "function": name,
                        "message": f"{name}: weight set for sub-reward {sub}, which the "
                        f"function never reports (it reports: {shown})",
                    }
                )
        for sub, numbers in subs.items():
            failing = bool(numbers["calls"]) and numbers["failures"] == numbers["calls"]
            if failing:
                flags.append(
                    {
                        "kind": "sub_reward_failing",
                        "function": name,
                        "message": f"{name}: sub-reward {sub} failed on every call "
                        f"({numbers['failures']}), so it scored 0 each time",
                    }
                )
            elif numbers["failure_rate"] > FAILURE_RATE_FLAG:  # each one a silent 0
                flags.append(
                    {
                        "kind": "sub_reward_failure_rate",
                        "function": name,
                        "message": f"{name}: sub-reward {sub} failed {numbers['failures']} of "
                        f"{numbers['calls']} calls ({numbers['failure_rate']:.0%}, over "
                        f"{FAILURE_RATE_FLAG:.0%}), scoring 0 each time: training would learn "
                        "from those zeros",
                    }
                )
            if failing or constant:  # its numbers are in the table: one flag is enough
                continue
            if numbers["count"] > 1 and numbers["distinct"] == 1:
                flags.append(
                    {
                        "kind": "sub_reward_constant",
                        "function": name,
                        "message": f"{name}: sub-reward {sub} scored {numbers['min']:g} on all "
                        f"{numbers['count']} trajectories: it cannot tell a good trajectory "
                        "from a bad one",
                    }
                )
            elif (
                function.kind == "reward"  # a group reward's metrics are often the group's
                and numbers["groups"]
                and numbers["zero_variance_groups"] == numbers["groups"]
            ):
                flags.append(
                    {
                        "kind": "sub_reward_no_group_variance",
                        "function": name,
                        "message": f"{name}: sub-reward {sub} scored the same on all the "
                        f"rollouts of each of its {numbers['groups']} groups: it never ranks "
                        "the rollouts of one prompt",
                    }
                )

    if plan.ground_truth_key and all(s.ground_truth is None for s in plan.samples):
        flags.append(
            {
                "kind": "ground_truth_key",
                "function": "data",
                "message": f"--ground-truth-key {plan.ground_truth_key} matches none of the "
                f"{len(plan.samples)} lines: every call got ground_truth null",
            }
        )

    replaced = sum(t.invalid_text for t in trajectories)
    if replaced:
        flags.append(
            {
                "kind": "invalid_text",
                "function": LLM_NAME,
                "message": f"{replaced} of {len(trajectories)} trajectories: the LLM's answer "
                "held text that is not valid Unicode (a lone surrogate: half an emoji); it "
                "was replaced with U+FFFD before it was scored and written",
            }
        )

    total: dict[str, Any] | None = None
    if plan.rewards or plan.group_rewards:
        totals = [v for t in trajectories if (v := total_of(plan, t)) is not None]
        groups, flat_samples = _flat_groups(
            trajectories, lambda t: total_of(plan, t), plan.scrub.text
        )
        flat_count = len(flat_samples)
        total = {
            "weights": {f.name: f.weight for f in plan.rewards + plan.group_rewards},
            "scores": score_stats(totals),
            "groups": groups,
            "zero_variance_groups": flat_count,
            "zero_variance_samples": flat_samples,
        }
        if groups and flat_count / groups >= ZERO_VARIANCE_FLAG:
            shown = ", ".join(f["sample"] for f in flat_samples[:5])
            more = f" and {flat_count - 5} more" if flat_count > 5 else ""
            flags.append(
                {
                    "kind": "zero_variance",
                    "function": "total",
                    "message": f"{flat_count} of {groups} groups scored the same on all their "
                    "rollouts "
                    "(weighted total): they carry no learning signal in GRPO-style training "
                    f"({shown}{more})",
                }
            )

    assert plan.llm is not None
    failed = {
        "calls": sum(f["failures"] for f in functions.values()),
        "sub_rewards": sum(
            sub["failures"] for r in rewards.values() for sub in r["sub_rewards"].values()
        ),
    }
    summary = {
        "run": describe(plan, results),
        "config": str(plan.job.path),
        "data": [str(p) for p in plan.data],
        "samples": len(plan.samples),
        "rollouts_per_sample": plan.rollouts,
        "llm": {
            "base_url": without_userinfo(plan.llm.base_url),
            "model": plan.llm.model,
            "timeout_s": plan.llm.timeout,
        },
        "completed": results.stopped is None,
        "stopped_early": results.stopped,
        "elapsed_s": results.elapsed,
        "trajectories": {
            "total": len(trajectories),
            # succeeded: its rollout, every reward and every sub-reward on it
            "succeeded": sum(t.status == "success" and not failed_on(t) for t in trajectories),
            "failed": sum(t.status == "failed" or bool(failed_on(t)) for t in trajectories),
            "not_run": status["pending"],
            "unscored": sum(bool(unscored(plan, t)) for t in trajectories),
            "failed_rollout": status["failed"],
            "failed_reward": sum(bool(t.errors) for t in trajectories),
            "failed_sub_reward": sum(bool(failed_sub_rewards(t)) for t in trajectories),
        },
        # failed calls of every function, and failed sub-rewards (within calls that did not)
        "failures": {**failed, "total": failed["calls"] + failed["sub_rewards"]},
        "functions": functions,
        "rewards": rewards,
        "flags": flags,
    }
    if total is not None:  # a job without rewards has no total: the key is absent
        summary["total"] = total
    return plan.scrub.value(summary)
