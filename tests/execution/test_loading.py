"""Target resolution: the three target forms and a clear line for every wrong target."""

from __future__ import annotations

import pytest
from conftest import SAMPLES, TESTS

from processors_base import FunctionType
from runtime.execution.loading import TargetError, load_target


@pytest.mark.parametrize(
    "spec",
    [
        "functions.reward.reward:DemoRewardProcessor",
        "functions.reward.reward.DemoRewardProcessor",
        "functions/reward/reward.py:DemoRewardProcessor",
    ],
)
def test_three_forms_resolve_to_the_same_class(spec):
    target = load_target(spec, SAMPLES)
    assert target.cls.__name__ == "DemoRewardProcessor"
    assert target.func_type is FunctionType.REWARD
    assert target.input_model.__name__ == "RewardInput"


def test_function_type_comes_from_the_base():
    assert load_target("workspace.fns:LeakyRollout", TESTS).func_type is FunctionType.ROLLOUT
    assert (
        load_target("workspace.fns:EchoGroupReward", TESTS).func_type is FunctionType.GROUP_REWARD
    )
    assert load_target("workspace.fns:EchoReward", TESTS, expected="reward").name == "EchoReward"


def test_a_file_outside_the_workspace(tmp_path):
    (tmp_path / "standalone.py").write_text(
        "from processors_base import AbstractRewardProcessor\n"
        "class R(AbstractRewardProcessor):\n    def process(self, i):\n        return None\n"
    )
    assert load_target(f"{tmp_path}/standalone.py:R", TESTS).name == "R"


@pytest.mark.parametrize(
    ("spec", "expected", "message"),
    [
        ("", None, "no target given"),
        ("NoDots", None, "is not of the form"),
        ("workspace.nothere:X", None, "importing 'workspace.nothere' failed: ModuleNotFoundError"),
        ("workspace.fns:Missing", None, "has no attribute 'Missing'"),
        ("workspace.fns:NotAProcessor", None, "is not a processor class"),
        ("workspace.fns:Abstract", None, "is abstract (does not implement process)"),
        ("workspace.fns:EchoReward", "rollout", "given as 'rollout', but EchoReward is a 'reward'"),
        ("workspace/none.py:X", None, "does not exist"),
    ],
)
def test_wrong_targets_say_which_and_why(spec, expected, message):
    with pytest.raises(TargetError) as caught:
        load_target(spec, TESTS, expected)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_syntax_error_names_file_and_line(tmp_path):
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(TargetError, match=r"SyntaxError at .*broken.py:1"):
        load_target("broken:X", tmp_path)
