"""``python -m runtime.compat SCRIPT [ARG...]``: run a script written for the DashScope SDK
(a Tuning script: ``from dashscope.finetune.agentic_rl import AgenticRL``) where the SDK is
not installed, as ``python SCRIPT [ARG...]`` would, with the SDK's paths served by this
project (``runtime.compat.sdk``). Where a real SDK is installed, the script runs on it.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if argv else 2)
    script = Path(argv[0])
    if not script.is_file():
        print(f"error: {script}: no such script", file=sys.stderr)
        sys.exit(2)
    from runtime.compat import sdk

    if sdk.install():
        # imported before the script's directory is on sys.path: a yaml.py or httpx/ of
        # the script's own cannot shadow what the client imports
        import runtime.compat.agentic_rl  # noqa: F401
    sys.argv = [str(script), *argv[1:]]
    sys.path[0] = str(script.resolve().parent)  # as `python SCRIPT` puts it first
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
