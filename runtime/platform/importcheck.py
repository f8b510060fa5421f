"""``main()`` with SPECS_JSON as its argument: import targets as ``serve`` would.

Run in a clean subprocess before anything is uploaded, so that a typo or a missing
dependency fails in a second and the packaging process's own imports cannot mask it.
Prints one JSON object per target: its function type and, for rewards, the sub-reward
weights of the class's registry (the ``@sub_reward_func`` weights; the aggregate is not a
sub-reward), or the one-line error.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def check(spec: str, workspace: str, expected: str | None) -> dict[str, Any]:
    from runtime.execution.loading import TargetError, load_target

    try:
        target = load_target(spec, workspace, expected)
    except TargetError as exc:
        return {"error": str(exc)}
    weights = None
    if target.func_type.value == "reward":
        from processors_base.processors import AbstractProcessor
        from processors_base.rewards import registry_of

        if issubclass(target.cls, AbstractProcessor):
            subs = registry_of(target.cls).sub_rewards
            weights = {sub.name: sub.weight for sub in subs} or None
    return {"func_type": target.func_type.value, "class": target.name, "weights": weights}


def main() -> None:
    targets = json.loads(sys.argv[1])
    print(json.dumps([check(*target) for target in targets]))


if __name__ == "__main__":
    main()
