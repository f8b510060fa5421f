"""A user's type checker sees processors_base as installed from the wheel (its py.typed
marker), and the reward and observability decorators hand back the class or function they
decorate, typed as it was: mypy run on a user's file reveals those types, not Any."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import ROOT

USER_FILE = """\
from processors_base import (
    AbstractRewardProcessor,
    AbstractRolloutProcessor,
    RewardInput,
    RolloutInput,
    RewardOutput,
    aggregate_func,
    reward_func,
    sub_reward_func,
)
from processors_base.observability import observe_llm, observe_processor, observe_tool


@reward_func("math")
class MathReward(AbstractRewardProcessor):
    @sub_reward_func("format", sub_weight=0.2)
    def format_ok(self, input_data: RewardInput) -> float:
        return 1.0

    @sub_reward_func
    async def answer_ok(self, input_data: RewardInput) -> float:
        return 1.0

    @aggregate_func
    def combine(self, sub_rewards: dict[str, object]) -> float:
        return 0.0


@reward_func
class Bare(AbstractRewardProcessor):
    pass


@reward_func(name="named")
class Named(AbstractRewardProcessor):
    pass


@reward_func("not_a_processor")  # an error, as it is at run time (TypeError)
class NotAProcessor:
    pass


reveal_type(MathReward)
reveal_type(Bare)
reveal_type(Named)
reveal_type(MathReward.format_ok)
reveal_type(MathReward.answer_ok)
reveal_type(MathReward.combine)


class Observed(AbstractRewardProcessor):
    @observe_processor
    def process(self, input_data: RewardInput) -> RewardOutput:
        raise NotImplementedError

    @observe_tool(name="lookup")
    async def lookup(self, key: str) -> bytes:
        return b""


@observe_llm
def ask(model: str, messages: list[str]) -> str:
    return ""


@observe_llm(provider="openai")
async def ask_async(model: str, prompt: str) -> int:
    return 0


@observe_tool
def add(a: int, b: int = 1) -> int:
    return a + b


reveal_type(Observed().process)
reveal_type(Observed().lookup)
reveal_type(ask)
reveal_type(ask_async)
reveal_type(add)


class AsyncReward(AbstractRewardProcessor):  # process may be async: no [override] error
    async def process(self, input_data: RewardInput) -> RewardOutput:
        raise NotImplementedError


class WrongRollout(AbstractRolloutProcessor):  # an error: a rollout returns RolloutOutput
    def process(self, input_data: RolloutInput) -> int:
        return 0
"""


def _wheel(tmp_path: Path) -> Path:
    """The project's wheel, built from a copy of its sources (nothing written in the tree)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for package in ("processors_base", "runtime"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path / "dist"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


def test_a_users_type_checker_sees_the_decorated_types(tmp_path):
    site = tmp_path / "site"  # the wheel as installed, with nothing else of the project's
    with zipfile.ZipFile(_wheel(tmp_path)) as archive:
        archive.extractall(site)
    assert (site / "processors_base" / "py.typed").is_file()

    (tmp_path / "user_fns.py").write_text(USER_FILE)
    (tmp_path / "mypy.ini").write_text("[mypy]\n")  # the user's settings, not this project's
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)  # where mypy asks the interpreter for installed packages
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file=mypy.ini",
            f"--python-executable={sys.executable}",
            "--cache-dir=.mypy_cache",
            "user_fns.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = done.stdout.splitlines()
    revealed = [m[1] for m in map(re.compile(r'Revealed type is "(.*)"$').search, lines) if m]
    errors = [line for line in lines if ": error: " in line]

    # as mypy prints them (names shortened by some versions: builtins.dict or dict)
    classes, methods, observed = revealed[:3], revealed[3:6], revealed[6:]
    for shown, name in zip(classes, ("MathReward", "Bare", "Named"), strict=True):
        assert shown.startswith("def (") and shown.endswith(f") -> user_fns.{name}"), shown
    assert len(methods) == 3 and all(
        m.startswith("def (self: user_fns.MathReward, ") for m in methods
    ), methods
    assert methods[0].endswith("input_data: processors_base.models.RewardInput) -> float")
    assert methods[1].endswith("RewardInput) -> typing.Coroutine[Any, Any, float]")
    assert re.search(r"sub_rewards: (builtins\.)?dict\[.*\]\) -> float$", methods[2])
    models = "processors_base.models"
    assert [re.sub(r"\bbuiltins\.", "", shown) for shown in observed] == [
        f"def (input_data: {models}.RewardInput) -> {models}.RewardOutput",
        "def (key: str) -> typing.Coroutine[Any, Any, bytes]",
        "def (model: str, messages: list[str]) -> str",
        "def (model: str, prompt: str) -> typing.Coroutine[Any, Any, int]",
        "def (a: int, b: int =) -> int",
    ], observed
    # the two errors are the misuses (without py.typed: an import error, and Any everywhere)
    assert len(errors) == 2, done.stdout
    assert 'cannot be "type[NotAProcessor]"' in errors[0] and "[type-var]" in errors[0]
    assert 'Return type "int" of "process"' in errors[1] and "[override]" in errors[1]
