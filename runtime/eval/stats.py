"""The numbers of a run and its red flags, as ``summary.json`` holds them (stable keys)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

from runtime.eval.plan import Plan
from runtime.eval.runner import LLM_NAME, Results, Trajectory
from runtime.eval.secrets import without_userinfo

__all__ = ["FAILURE_RATE_FLAG", "LATENCY_SHARE_FLAG", "percentile", "score_stats", "summarise"]

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
    by_sample: dict[tuple[str, int], list[float]] = {}
    for trajectory in trajectories:
        found = value(trajectory)
        if found is not None:
            key = (trajectory.sample.file, trajectory.sample.line)
            by_sample.setdefault(key, []).append(found)
    groups = [values for values in by_sample.values() if len(values) > 1]
    return len(groups), sum(max(values) == min(values) for values in groups)


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


def reported(metrics: list[dict[str, Any]]) -> list[str]:
    """The sub-reward names a reward reported (``x``, ``x.failed``, ``x.error`` ... -> x)."""
    return list(dict.fromkeys(str(k).split(".", 1)[0] for m in metrics for k in m))


def _sub_rewards(
    plan: Plan, results: Results, name: str, weights: dict[str, float]
) -> dict[str, Any]:
    metrics = [t.metrics[name] for t in results.trajectories if name in t.metrics]
    out = {}
    for sub in dict.fromkeys([*weights, *reported(metrics)]):
        values = [float(m[sub]) for m in metrics if isinstance(m.get(sub), (int, float))]
        failures = sum(m.get(f"{sub}.failed") == 1.0 for m in metrics)
        out[sub] = {
            **score_stats(values),
            "weight": weights.get(sub),
            "failures": failures,
            "calls": len(metrics),
        }
    return out


def summarise(plan: Plan, results: Results, weights: dict[str, dict[str, float]]) -> dict[str, Any]:
    """``weights``: each reward's sub-reward weights (from the job file or the class)."""
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
        groups, flat = _groups(trajectories, lambda t, n=name: t.scores.get(n))
        weighted = dict(weights.get(name) or {})
        subs = _sub_rewards(plan, results, name, weighted)
        rewards[name] = {
            "type": function.kind,
            "weight": function.weight,
            "scores": stats,
            "groups": groups,
            "zero_variance_groups": flat,
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
            if numbers["calls"] and numbers["failures"] == numbers["calls"]:
                flags.append(
                    {
                        "kind": "sub_reward_failing",
                        "function": name,
                        "message": f"{name}: sub-reward {sub} failed on every call "
                        f"({numbers['failures']}), so it scored 0 each time",
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
        groups, flat = _groups(trajectories, lambda t: total_of(plan, t))
        total = {
            "weights": {f.name: f.weight for f in plan.rewards + plan.group_rewards},
            "scores": score_stats(totals),
            "groups": groups,
            "zero_variance_groups": flat,
        }
        if groups and flat / groups >= ZERO_VARIANCE_FLAG:
            flags.append(
                {
                    "kind": "zero_variance",
                    "function": "total",
                    "message": f"{flat} of {groups} groups scored the same on all their rollouts "
                    "(weighted total): they carry no learning signal in GRPO-style training",
                }
            )

    assert plan.llm is not None
    summary = {
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
            "succeeded": status["success"],
            "failed": status["failed"],
            "not_run": status["pending"],
            "unscored": sum(bool(unscored(plan, t)) for t in trajectories),
        },
        "functions": functions,
        "rewards": rewards,
        "flags": flags,
    }
    if total is not None:  # a job without rewards has no total: the key is absent
        summary["total"] = total
    return plan.scrub.value(summary)
