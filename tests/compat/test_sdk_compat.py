"""Functions written for the DashScope SDK serve unchanged, with and without the SDK.

Environment 1 (no ``dashscope`` installed) runs with this interpreter. Environment 2
needs a Python with ``dashscope`` installed: this one if it has it, else the one named
by ``DASHSCOPE_PYTHON`` (``.ci/run`` makes one with ``pip install -e ".[test,sdk]"``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, TESTS, free_port
from helpers import HERE_HAS_SDK, SDK_PYTHON, with_sdk, without_sdk
from llm_stub import LLMStub

from runtime.compat.sdk import SDK

WORKSPACE = TESTS / "sdk_workspace"


REWARD = {
    "func_type": "reward",
    "ground_truth": "42",
    "agent_output": {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}]
    },
}
GROUP = {
    "func_type": "group_reward",
    "agent_outputs": [{"messages": [{"role": "user", "content": "q"}]}, {"messages": [{}, {}]}],
}
SDK_MODULES = {
    "dashscope.finetune.reinforcement": [
        "AbstractRolloutProcessor",
        "AbstractRewardProcessor",
        "AbstractGroupRewardProcessor",
        "RolloutInput",
        "RolloutOutput",
        "RewardInput",
        "RewardOutput",
        "Reward",
        "GroupRewardInput",
        "GroupRewardOutput",
        "GroupReward",
        "AgentOutput",
        "TaskStatus",
        "reward_func",
        "sub_reward_func",
        "aggregate_func",
        "logger",
    ],
    "dashscope.finetune.reinforcement.component.processor": [
        "AbstractRolloutProcessor",
        "AbstractRewardProcessor",
        "AbstractGroupRewardProcessor",
    ],
    "dashscope.finetune.reinforcement.component.processor.abstract_processor": [
        "AbstractProcessor"
    ],
    "dashscope.finetune.reinforcement.component.processor.abstract_rollout_processor": [
        "AbstractRolloutProcessor"
    ],
    "dashscope.finetune.reinforcement.component.processor.abstract_reward_processor": [
        "AbstractRewardProcessor"
    ],
    "dashscope.finetune.reinforcement.component.processor.abstract_group_reward_processor": [
        "AbstractGroupRewardProcessor"
    ],
    "dashscope.finetune.reinforcement.component.data.base_data_model": [
        "BaseDataModel",
        "TaskStatus",
        "ModelProtocol",
        "ModelResource",
        "RequestMetadata",
        "AgentOutput",
        "Task",
        "Resource",
    ],
    "dashscope.finetune.reinforcement.component.data.reward_input": ["RewardInput"],
    "dashscope.finetune.reinforcement.component.data.reward_output": ["Reward", "RewardOutput"],
    "dashscope.finetune.reinforcement.component.data.rollout_input": ["RolloutInput"],
    "dashscope.finetune.reinforcement.component.data.rollout_output": ["RolloutOutput"],
    "dashscope.finetune.reinforcement.component.data.group_reward_input": ["GroupRewardInput"],
    "dashscope.finetune.reinforcement.component.data.group_reward_output": [
        "GroupReward",
        "GroupRewardOutput",
    ],
    "dashscope.finetune.reinforcement.component.func_decorator": [
        "reward_func",
        "sub_reward_func",
        "aggregate_func",
    ],
    "dashscope.finetune.reinforcement.component.observability": [
        "observe_processor",
        "trace_client",
        "trace_tool",
        "observe_llm",
        "observe_tool",
    ],
    "dashscope.finetune.reinforcement.common.log": ["logger"],
}


def python_says(code: str, python: str = sys.executable, cwd: Path = ROOT) -> str:
    done = subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def check_all_functions(start_server, python: str) -> None:
    plain = start_server(
        "functions.plain_reward:ExactMatchReward", workspace=WORKSPACE, python=python
    )
    answer = plain.post(REWARD)
    assert answer.status_code == 200
    assert answer.json() == {
        "reward": {"reward_score": 1.0, "reward_metrics": {"len": 2.0}},
        "status": "success",
        "error": None,
        "error_code": None,
    }
    assert set(plain.client.get("/health").json()) == {"status", "func_type", "processor", "parser"}
    assert plain.post({**REWARD, "ground_truth": "7"}).json()["reward"]["reward_score"] == 0.0

    composite = start_server(
        "functions.composite_reward:CompositeReward", workspace=WORKSPACE, python=python
    )
    reward = composite.post(REWARD).json()["reward"]
    assert reward["reward_score"] == pytest.approx(1.0)
    assert reward["reward_metrics"] == {"has_answer": 1.0, "correct": 1.0}
    wrong = composite.post({**REWARD, "ground_truth": "0"}).json()["reward"]
    assert wrong["reward_score"] == pytest.approx(0.4)

    group = start_server(
        "functions/group_reward.py:RankGroupReward", workspace=WORKSPACE, python=python
    )
    rewards = group.post(GROUP).json()["reward"]["rewards"]
    assert [r["reward_score"] for r in rewards] == [0.0, 1.0]

    with LLMStub(free_port()) as llm:
        rollout = start_server(
            "functions.rollout:OneShotRollout", workspace=WORKSPACE, python=python
        )
        output = rollout.post(
            {
                "func_type": "rollout",
                "messages": [{"role": "user", "content": "no tools, please"}],
                "model_resource": {
                    "model_name": "m",
                    "base_url": llm.base_url,
                    "api_key": "sk-sdk-test",
                },
            }
        ).json()
    assert (
        output["status"] == "success" and output["error"] is None and output["error_code"] is None
    )
    assert output["agent_output"]["rollout_metrics"] == {"turns": 1.0}
    assert len(output["agent_output"]["messages"]) == 2
    assert llm.authorizations == ["Bearer sk-sdk-test"]


# --- environment 1: dashscope not installed ------------------------------------------


@without_sdk
def test_every_sdk_path_resolves_to_ours_only_under_the_runtime():
    code = textwrap.dedent(f"""
        import importlib, importlib.util, json
        import processors_base
        from runtime.compat import sdk as sdk_compat

        def state():
            return "importable" if importlib.util.find_spec("dashscope") else "absent"

        before = state()
        assert sdk_compat.install()
        modules = {SDK_MODULES!r}
        missing = [f"{{m}}.{{n}}" for m, names in modules.items() for n in names
                   if not hasattr(importlib.import_module(m), n)]
        r = importlib.import_module("dashscope.finetune.reinforcement")
        same = r.AbstractRewardProcessor is processors_base.AbstractRewardProcessor
        sdk_compat.uninstall()
        print(json.dumps([before, missing, same, state()]))
    """)
    before, missing, same, after = json.loads(python_says(code))
    assert before == "absent"  # nothing was written into site-packages
    assert missing == []
    assert same is True
    assert after == "absent"


def test_a_real_dashscope_is_never_hidden(tmp_path):
    fake = tmp_path / "dashscope"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL = True\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from runtime.compat import sdk as sdk_compat\n"
        "installed = sdk_compat.install()\n"
        "import dashscope\n"
        "print(installed, dashscope.REAL)\n"
    )
    # installed: the subtree this dashscope lacks is provided beside it (next test)
    assert python_says(code) == "True True"


@pytest.mark.parametrize("has_finetune", [False, True])
def test_an_older_dashscope_without_the_subtree_gets_it_beside_it(tmp_path, has_finetune):
    # An older SDK pinned for its LLM calls: the workspace must still import and serve.
    fake = tmp_path / "dashscope"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL = True\n")
    (fake / "audio.py").write_text("SPEECH = 1\n")
    if has_finetune:
        (fake / "finetune").mkdir()
        (fake / "finetune" / "__init__.py").write_text("OLD_FINETUNE = True\n")
    code = textwrap.dedent(f"""
        import importlib, json, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from runtime.compat import sdk as sdk_compat
        out = {{"installed": sdk_compat.install()}}
        import dashscope, dashscope.audio
        from dashscope.finetune.reinforcement import AbstractRewardProcessor
        from dashscope.finetune.reinforcement.component.func_decorator import reward_func
        out["real"] = [dashscope.REAL, dashscope.audio.SPEECH]
        out["ours"] = [AbstractRewardProcessor.__module__, reward_func.__module__]
        try:
            importlib.import_module("dashscope.nothing")
        except ModuleNotFoundError as exc:
            out["missing"] = str(exc)
        print(json.dumps(out))
    """)
    out = json.loads(python_says(code))
    assert out["installed"] is True and out["real"] == [True, 1]
    assert out["ours"] == ["processors_base.processors", "processors_base.rewards"]
    assert out["missing"] == "No module named 'dashscope.nothing'"  # the real package's own

    request = tmp_path / "request.json"
    request.write_text(json.dumps(REWARD))
    target = "functions.composite_reward:CompositeReward"
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "invoke", target, "--input", str(request)],
        cwd=WORKSPACE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "success"


@without_sdk
def test_sdk_style_workspace_serves_without_the_sdk(start_server):
    check_all_functions(start_server, sys.executable)


@without_sdk
def test_sdk_start_script_environment_starts_the_server(start_server):
    server = start_server(
        "",
        workspace=WORKSPACE,
        ready=False,
        env={
            "FUNC_TYPE": "reward",
            "PROCESSOR_CLASS": "functions.plain_reward.ExactMatchReward",
            "THREAD_POOL_WORKERS": "4",
            "THREAD_POOL_QUEUE": "10",
            "ENABLE_LOGGING": "false",
            "LOG_LEVEL": "INFO",
        },
    )
    server.wait_ready()
    assert server.post(REWARD).json()["reward"]["reward_score"] == 1.0
    output = server.wait_output("queue=10 threads=4")  # the log's thread may trail
    assert "log_level=warning" in output  # config still shown
    assert "ready: ExactMatchReward" not in output  # ENABLE_LOGGING=false hides info lines


@without_sdk
def test_invoke_an_sdk_style_function():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime",
            "invoke",
            "functions.composite_reward.CompositeReward",
            "-i",
            "-",
        ],
        cwd=WORKSPACE,
        input=json.dumps(REWARD).encode(),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reward"]["reward_score"] == pytest.approx(1.0)


# --- environment 2: dashscope installed ----------------------------------------------


@with_sdk
def test_classes_derive_from_the_installed_sdk():
    code = textwrap.dedent("""
        from runtime.execution.loading import load_target
        import dashscope.finetune.reinforcement as r
        t = load_target("functions.composite_reward:CompositeReward", ".")
        real = r.__file__.endswith("dashscope/finetune/reinforcement/__init__.py")
        print(t.func_type.value, t.input_model.__module__,
              issubclass(t.cls, r.AbstractRewardProcessor), real)
    """)
    assert python_says(code, SDK_PYTHON, WORKSPACE) == (
        "reward dashscope.finetune.reinforcement.component.data.reward_input True True"
    )


@with_sdk
def test_sdk_style_workspace_serves_with_the_sdk(start_server):
    check_all_functions(start_server, SDK_PYTHON)


@pytest.mark.parametrize("python", ["here", "sdk"])
def test_sub_reward_errors_fail_is_never_silently_ignored(tmp_path, python):
    # With the SDK installed, its own @reward_func runs the sub-rewards, which fail mode
    # cannot reach: the runtime says so and exits 2 rather than serving without it.
    if python == "sdk" and SDK_PYTHON is None:
        pytest.skip("needs a Python with dashscope (DASHSCOPE_PYTHON)")
    executable = SDK_PYTHON if python == "sdk" else sys.executable
    with_the_sdk = python == "sdk" or HERE_HAS_SDK
    request = tmp_path / "request.json"
    request.write_text(json.dumps(REWARD))
    target = "functions.examples.reward_decorator:SafetyProcessor"
    done = subprocess.run(
        [
            executable,
            "-m",
            "runtime",
            "invoke",
            target,
            "--input",
            str(request),
            "--sub-reward-errors",
            "fail",
        ],
        cwd=WORKSPACE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if with_the_sdk:
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1
        assert "decorated by the installed SDK's own @reward_func" in done.stderr
    else:  # our @reward_func behind the SDK's path: fail mode applies
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["status"] == "success"


# --- the SDK's whole public surface, and only that part of dashscope --------------------


@without_sdk
def test_every_public_name_of_the_sdk_resolves_under_the_alias():
    code = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, "tests")
        import sdk_surface
        table = sdk_surface.coverage(json.loads(sdk_surface.SNAPSHOT.read_text()))
        print(json.dumps({m: missing for m, (_, _, missing) in table.items() if missing}))
    """)
    assert json.loads(python_says(code)) == {}


@with_sdk
def test_the_surface_snapshot_is_the_installed_sdks():
    code = (
        "import json, sys; sys.path.insert(0, 'tests'); import sdk_surface; "
        "print(json.dumps(sdk_surface.sdk_surface()))"
    )
    recorded = json.loads((TESTS / "sdk_surface.json").read_text())
    assert json.loads(python_says(code, SDK_PYTHON).splitlines()[-1]) == recorded


@without_sdk
def test_probes_for_the_rest_of_dashscope_find_it_absent():
    code = textwrap.dedent("""
        import importlib.util, json
        from runtime.compat import sdk as sdk_compat

        def attempt(action):
            try:
                action()
                return "ok"
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"

        def import_(name):
            return lambda: __import__(name)

        out = {}
        sdk_compat.install()
        out["spec_before"] = importlib.util.find_spec("dashscope") is not None
        out["import_before"] = attempt(import_("dashscope"))
        from dashscope.finetune.reinforcement.common.utils import client_fc  # imports fine
        import dashscope.finetune.reinforcement as r
        import dashscope
        out["subtree"] = r.AbstractRewardProcessor.__module__
        out["generation"] = attempt(lambda: dashscope.Generation)
        out["audio"] = attempt(import_("dashscope.audio"))
        out["private"] = attempt(import_("dashscope.finetune.reinforcement.nothing_here"))
        out["client_fc"] = attempt(client_fc)
        sdk_compat.uninstall()
        out["spec_after"] = importlib.util.find_spec("dashscope") is not None
        print(json.dumps(out))
    """)
    out = json.loads(python_says(code))
    assert out["spec_before"] is False and out["spec_after"] is False
    assert out["import_before"] == "ModuleNotFoundError: No module named 'dashscope'"
    assert out["subtree"] == "processors_base.processors"
    absent = "the DashScope SDK is not installed. This process runs agentic-rl-runtime"
    assert out["generation"].startswith("AttributeError: dashscope.Generation is not available")
    assert absent in out["generation"]
    assert out["audio"].startswith("ModuleNotFoundError: No module named 'dashscope.audio'")
    assert absent in out["audio"] and absent in out["private"]
    assert out["client_fc"].startswith("NotProvidedError: ")
    assert "python -m runtime ship" in out["client_fc"]


def test_task_status_prints_as_the_sdks():
    from processors_base import ModelProtocol, RewardOutput, TaskStatus

    assert str(TaskStatus.SUCCESS) == "TaskStatus.SUCCESS"
    assert f"{TaskStatus.FAILED}" == "TaskStatus.FAILED"
    assert str(ModelProtocol.OPENAI) == "ModelProtocol.OPENAI"
    assert TaskStatus.SUCCESS == "success"  # still the value when compared and sent
    assert RewardOutput(reward={"reward_score": 1}).model_dump(mode="json")["status"] == "success"


@without_sdk
def test_the_sdks_documented_components_behave_as_documented():
    code = textwrap.dedent("""
        import asyncio, copy, json
        from runtime.compat import sdk as sdk_compat
        sdk_compat.install()
        from dashscope.finetune.reinforcement import (
            AbstractRewardProcessor, InputError, RewardInput, RewardOutput, Reward,
            get_filepath_classname, reward_func, sub_reward_func)
        from dashscope.finetune.reinforcement.component import FuncManager
        from dashscope.finetune.reinforcement.component.func_decorator import (
            RewardProcessorMeta, SubRewardFunction)
        from dashscope.finetune.reinforcement.component.parser import RewardRequestParser
        from dashscope.finetune.reinforcement.component.demo import (
            DemoGroupRewardProcessor, DemoRolloutProcessor)
        from dashscope.finetune.reinforcement.component.observability import (
            is_tracing_enabled, rollout_context, current_trace_id_hex)

        out = {}
        parsed = RewardRequestParser().parse({"agent_output": {"messages": []}, "extra": 1})
        out["parsed"] = [type(parsed).__name__, parsed.extra]

        @reward_func("judge")
        class Judge(AbstractRewardProcessor):
            @sub_reward_func("len", sub_weight=0.5)
            def length(self, input_data):
                score = len(input_data.agent_output.messages)
                return RewardOutput(reward=Reward(reward_score=score))

        judge = Judge()
        out["meta"] = [judge.reward_meta.processor_id, sorted(judge.reward_meta.sub_functions)]
        sub = SubRewardFunction("s", print, 0.2)
        sub.score = 3.0
        out["copied_score"] = copy.deepcopy(sub).score
        meta = RewardProcessorMeta("m")
        out["copy_cached"] = meta.copy() is meta.copy()

        manager = FuncManager("reward", judge)
        out["parser"] = type(manager.parser).__name__
        body = {"agent_output": {"messages": [{}, {}]}}
        out["processed"] = asyncio.run(manager.processes(manager.parses(body))).reward.reward_score
        out["executed"] = manager.execute(body).reward.reward_score

        group = DemoGroupRewardProcessor().process(
            __import__("processors_base").GroupRewardInput(
                agent_outputs=[{"messages": [{"content": "x 4"}]}, {"messages": [{}]}, {}],
                ground_truth=4))
        out["group"] = [r.reward_score for r in group.reward.rewards]
        rollout = DemoRolloutProcessor().process(__import__("processors_base").RolloutInput(
            messages=[{"role": "user", "content": "hi"}],
            model_resource={"model_name": "m", "base_url": "u", "api_key": "k"}))
        out["echo"] = rollout.agent_output.messages[-1]["content"]

        with rollout_context(rollout_id="ro-1"):
            out["tracing"] = [is_tracing_enabled(), current_trace_id_hex()]
        out["classpath"] = [get_filepath_classname("a/b.py:C"), get_filepath_classname("a.b.C")]
        try:
            get_filepath_classname("a/b.py:")
        except InputError as exc:
            out["bad_classpath"] = exc.error_code
        print(json.dumps(out))
    """)
    out = json.loads(python_says(code))
    assert out["parsed"] == ["RewardInput", 1]
    assert out["meta"] == ["judge", ["len"]]
    assert out["copied_score"] == 0.0 and out["copy_cached"] is True
    assert out["parser"] == "RewardRequestParser"
    assert out["processed"] == out["executed"] == 1.0  # 0.5 x 2 messages
    assert out["group"] == [1.0, 0.5, 0.0]
    assert out["echo"] == "[DemoRolloutProcessor Echo] hi"
    assert out["tracing"] == [False, None]
    assert out["classpath"] == [["a/b.py", "C"], ["a/b.py", "C"]]
    assert out["bad_classpath"] == 1100  # InputError's code, as in the SDK


# --- the SDK's example functions: our runtime and the SDK's own server, same answers -----

ROLLOUT = {
    "func_type": "rollout",
    "messages": [{"role": "user", "content": "What is 6 * 7?"}],
    "rollout_extra": {"source": "gsm8k"},
    "request_metadata": {"job_id": "j", "sample_id": "s", "rollout_id": "r", "attempt_id": "a"},
    "model_resource": {"model_name": "m", "base_url": "set per test", "api_key": "sk-example"},
}
EXAMPLES = [
    ("functions.examples.reward", "DemoRewardProcessor", "reward"),
    ("functions.examples.reward_decorator", "SafetyProcessor", "reward"),
    ("functions.examples.group_reward", "DemoGroupRewardProcessor", "group_reward"),
    ("functions.examples.rollout", "DemoRolloutProcessor", "rollout"),
    ("functions.examples.rollout_only", "RolloutOnly", "rollout"),
]


def example_requests(func_type: str, llm_url: str) -> list[dict]:
    if func_type == "reward":
        toxic = {"role": "assistant", "content": "I hate this; I cannot help"}
        return [
            REWARD,
            {**REWARD, "ground_truth": "7"},
            {**REWARD, "ground_truth": None, "agent_output": {"messages": [toxic]}},
            {"agent_output": {"messages": [], "rollout_metrics": {"latency": 0.5}}},
        ]
    if func_type == "group_reward":
        return [GROUP, {**GROUP, "ground_truth": "q"}]
    resource = {**ROLLOUT["model_resource"], "base_url": llm_url}
    return [{**ROLLOUT, "model_resource": resource}]


class SdkServer:
    """The SDK's own server (its FastAPI app on uvicorn) serving one processor."""

    def __init__(self, processor_class: str, func_type: str) -> None:
        self.port = free_port()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        env = {
            **os.environ,
            "FUNC_TYPE": func_type,
            "PROCESSOR_CLASS": processor_class,
            "PYTHONPATH": str(WORKSPACE),
            "LOG_LEVEL": "WARNING",
        }
        command = [SDK_PYTHON, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*command, f"{SDK}.component.server.server:app"],
            cwd=WORKSPACE,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise AssertionError(f"SDK server exited:\n{self.log.read().decode()}")
            with contextlib.suppress(httpx.TransportError):
                if self.client.get("/health", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise AssertionError("the SDK's server did not get ready")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.client.close()
        self.log.close()


def answers_of(post, func_type: str, llm_url: str) -> list:
    return [
        [(r := post(body)).status_code, r.json()] for body in example_requests(func_type, llm_url)
    ]


def as_sdk_sends(ours: list, sdk: list) -> list:
    """Our answer less the one documented difference: ``error_code``, which some of the
    SDK's outputs lack (README, "differences"); everything else must be equal."""
    status, body = ours
    if "error_code" not in sdk[1] and body.get("error_code") is None:
        body = {k: v for k, v in body.items() if k != "error_code"}
    return [status, body]


@with_sdk
@pytest.mark.parametrize(("module", "name", "func_type"), EXAMPLES, ids=[e[1] for e in EXAMPLES])
def test_the_sdks_example_functions_answer_as_under_its_own_server(
    start_server, module, name, func_type
):
    pythons = [SDK_PYTHON] if HERE_HAS_SDK else [sys.executable, SDK_PYTHON]
    with LLMStub(free_port()) as llm:
        sdk = SdkServer(f"{module}.{name}", func_type)
        try:
            sdk.wait_ready()
            expected = answers_of(
                lambda b: sdk.client.post("/api/v1", json=b), func_type, llm.base_url
            )
            health = sdk.client.get("/health").json()
        finally:
            sdk.close()
        for python in pythons:  # without the SDK (this interpreter), and with it
            ours = start_server(f"{module}:{name}", workspace=WORKSPACE, python=python)
            got = answers_of(ours.post, func_type, llm.base_url)
            assert [as_sdk_sends(a, b) for a, b in zip(got, expected, strict=True)] == expected
            mine = ours.client.get("/health").json()
            assert {k: mine[k] for k in ("status", "processor", "parser")} == {
                k: health[k] for k in ("status", "processor", "parser")
            }
    assert all(status == 200 for status, _ in expected)


@without_sdk
def test_the_sdks_tracing_helpers_record_on_the_runtimes_tracing():
    code = textwrap.dedent("""
        import json
        from opentelemetry import baggage, trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from runtime.compat import sdk as sdk_compat
        sdk_compat.install()
        from dashscope.finetune.reinforcement import RewardInput
        from dashscope.finetune.reinforcement.component.demo import DemoRewardProcessor
        from dashscope.finetune.reinforcement.component.observability import (
            AGENTIC_RL_ROLLOUT_ID_BAGGAGE_KEY, current_trace_id_hex,
            dashscope_response_to_output_messages, get_tracer, is_tracing_enabled,
            openai_chat_messages_to_input_messages, rollout_context,
            run_with_genai_llm_span, trace_processor_process)

        out = {"before": is_tracing_enabled()}
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        out["after"] = is_tracing_enabled()
        with rollout_context(rollout_id="ro-1"):
            out["baggage"] = baggage.get_baggage(AGENTIC_RL_ROLLOUT_ID_BAGGAGE_KEY)
            with get_tracer().start_as_current_span("outer"):
                out["trace_id"] = len(current_trace_id_hex() or "")
                answer = run_with_genai_llm_span(
                    lambda q: {"model": "m-1", "output": {"text": q}}, "hi",
                    provider="dashscope", request_model="m")
                scored = trace_processor_process(
                    "reward", DemoRewardProcessor(),
                    RewardInput(agent_output={"messages": [{"content": "42"}]}, ground_truth=42))
        out["answer"] = answer["output"]["text"]
        out["score"] = scored.reward.reward_score
        out["spans"] = sorted(s.name for s in exporter.get_finished_spans())
        tool_reply = {"role": "tool", "tool_call_id": "c", "content": "4"}
        question = {"role": "user", "content": "q"}
        inputs = openai_chat_messages_to_input_messages([question, tool_reply])
        out["inputs"] = [[m.role, type(m.parts[0]).__name__] for m in inputs]
        outputs = dashscope_response_to_output_messages({"output": {"text": "a"}})
        out["outputs"] = [[m.role, m.parts[0].content, m.finish_reason] for m in outputs]
        print(json.dumps(out))
    """)
    out = json.loads(python_says(code))
    assert (out["before"], out["after"]) == (False, True)
    assert out["baggage"] == "ro-1" and out["trace_id"] == 32
    assert out["answer"] == "hi" and out["score"] == 1.0
    assert out["spans"] == ["chat m", "outer", "reward DemoRewardProcessor"]
    assert out["inputs"] == [["user", "Text"], ["tool", "ToolCallResponse"]]
    assert out["outputs"] == [["assistant", "a", "stop"]]
