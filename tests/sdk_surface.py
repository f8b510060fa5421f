"""The DashScope SDK's public import surface, and how much of it resolves under our alias.

    # with the SDK installed: record its public modules and names (tests/sdk_surface.json)
    $DASHSCOPE_PYTHON tests/sdk_surface.py --snapshot
    # without it: resolve every recorded name under runtime.compat.sdk's alias, per module
    python tests/sdk_surface.py

A module's public names are its ``__all__``; where it has none, the names it defines
itself (classes and functions whose ``__module__`` is the module) plus its plain constants.
Modules with a private segment (``_core``) are left out. ``tests/compat/test_sdk_compat.py``
asserts full coverage and, where the SDK can be run, that the snapshot is current.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).with_name("sdk_surface.json")
ROOT_MODULE = "dashscope.finetune.reinforcement"
# the SDK's server module reads these at import time
_SERVER_ENV = {
    "FUNC_TYPE": "reward",
    "PROCESSOR_CLASS": f"{ROOT_MODULE}.component.demo.reward_processor_demo.DemoRewardProcessor",
}
_CONSTANT_TYPES = (str, int, float, bool, tuple, list, dict, frozenset)


def public_names(module: object) -> list[str]:
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return sorted(set(declared))
    name = module.__name__  # type: ignore[attr-defined]
    return sorted(
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_") and not inspect.ismodule(value) and _defined_here(value, name)
    )


def _defined_here(value: object, module_name: str) -> bool:
    """Classes and functions defined in the module; other objects (constants, a logger)
    unless they are typing constructs; imported classes and functions are not its names."""
    if inspect.isclass(value) or inspect.isroutine(value):
        return getattr(value, "__module__", None) == module_name
    return isinstance(value, _CONSTANT_TYPES) or type(value).__module__ not in (
        "__future__",
        "typing",
        "typing_extensions",
    )


def sdk_surface() -> dict[str, list[str]]:
    """Every public module of the installed SDK's package and its public names."""
    os.environ.update({k: v for k, v in _SERVER_ENV.items() if k not in os.environ})
    root = importlib.import_module(ROOT_MODULE)
    surface = {ROOT_MODULE: public_names(root)}
    for info in pkgutil.walk_packages(root.__path__, ROOT_MODULE + "."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        surface[info.name] = public_names(importlib.import_module(info.name))
    return dict(sorted(surface.items()))


def coverage(surface: dict[str, list[str]]) -> dict[str, tuple[int, int, list[str]]]:
    """Per module: (names resolvable here, names exported by the SDK, missing names)."""
    from runtime.compat import sdk as sdk_compat

    sdk_compat.install()
    table = {}
    for module_name, names in surface.items():
        try:
            module = importlib.import_module(module_name)
        except Exception:  # an unresolvable module resolves no names
            table[module_name] = (0, len(names), list(names))
            continue
        missing = [n for n in names if not hasattr(module, n)]
        table[module_name] = (len(names) - len(missing), len(names), missing)
    return table


def main() -> None:
    if "--snapshot" in sys.argv:
        SNAPSHOT.write_text(json.dumps(sdk_surface(), indent=1) + "\n")
        print(f"wrote {SNAPSHOT}")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    table = coverage(json.loads(SNAPSHOT.read_text()))
    width = max(len(m) for m in table) - len(ROOT_MODULE)
    print(f"| module (under {ROOT_MODULE}) | resolvable / exported |")
    print("|---|---|")
    for module_name, (found, total, _) in table.items():
        short = module_name[len(ROOT_MODULE) :] or "(root)"
        print(f"| `{short:<{width}}` | {found} / {total} |")
    found = sum(f for f, _, _ in table.values())
    total = sum(t for _, t, _ in table.values())
    print(f"| **all {len(table)} modules** | **{found} / {total}** |")


if __name__ == "__main__":
    main()
