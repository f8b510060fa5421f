"""The job file models, the submit body built from them, and the packages of functions."""

from __future__ import annotations

import os
import zipfile
from importlib import metadata
from io import BytesIO
from pathlib import Path

import pytest
from conftest import SAMPLES, SPEC_EXAMPLES

from runtime.platform import packaging
from runtime.platform.config import ConfigError, load_job_file
from runtime.platform.functions import Component, ComponentError, resolve
from runtime.platform.jobs import components_of, submit_body


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_sdk_example_files_load_with_documented_types():
    job = load_job_file(SPEC_EXAMPLES / "job.yaml")
    job.check()
    hyper = job.config.training.hyper_parameters
    assert hyper is not None
    # YAML 1.1 reads 2e-6 as a string; the platform documents a number
    assert hyper.learning_rate == 2e-6 and isinstance(hyper.learning_rate, float)
    assert hyper.batch_size == 64
    assert job.config.functions[1].reward_metric_weight == {
        "reward_metric_weightA": 0.3,
        "reward_metric_weightB": 0.7,
    }
    opd = load_job_file(SPEC_EXAMPLES / "opd-job.yaml")
    opd.check()
    assert opd.config.teacher_model == "qwen3.5-397b-a17b"
    assert opd.config.training.type == "pg_opd"


def test_errors_name_the_key_path_and_the_line(tmp_path):
    path = write(
        tmp_path / "job.yaml",
        "name: x\n"
        "functions:\n"
        "- type: rollout\n"
        "  fcmodel: {classpath: a.B}\n"
        "- type: reward\n"
        "  fcmodel:\n"
        "    classpath: a.C\n"
        "  runtime:\n"
        "    cpux: 2\n",
    )
    with pytest.raises(ConfigError) as caught:
        load_job_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:9: functions[1].runtime.cpux: unknown key (allowed: ")
    assert "memory_size" in message

    write(path, "name: x\nmodel: qwen3.5-9b\n")
    with pytest.raises(ConfigError, match=r"job.yaml:2: model: .*valid dictionary"):
        load_job_file(path)
    write(path, "name: x\njob_name: y\n")  # the SDK's --job-name bug: not a config key
    with pytest.raises(ConfigError, match=r"job.yaml:2: job_name: unknown key"):
        load_job_file(path)
    write(path, "training:\n  hyper_parameters:\n    batch_size: many\n")
    with pytest.raises(ConfigError, match=r":3: training.hyper_parameters.batch_size: .*integer"):
        load_job_file(path)
    write(path, "functions: [\n")
    with pytest.raises(ConfigError, match=r"job.yaml:2: not valid YAML"):
        load_job_file(path)


FUNCTIONS = {
    "rollout": "- type: rollout\n  name: r\n  fcmodel: {classpath: functions.rollout.rollout.X}\n",
    "reward": "- type: reward\n  name: w\n  fcmodel: {classpath: functions.reward.reward.Y}\n",
}


@pytest.mark.parametrize("rollout", [False, True])
@pytest.mark.parametrize("reward", [False, True])
def test_opd_makes_rollout_and_reward_optional_and_rl_needs_both(tmp_path, rollout, reward):
    blocks = (FUNCTIONS["rollout"] if rollout else "") + (FUNCTIONS["reward"] if reward else "")
    functions = f"functions:\n{blocks}" if blocks else ""
    opd = write(tmp_path / "opd.yaml", f"teacher_model: big\n{functions}")
    load_job_file(opd).check()  # the four combinations of the spec's table
    rl = write(tmp_path / "rl.yaml", functions)
    if rollout and reward:
        load_job_file(rl).check()
    else:
        with pytest.raises(ConfigError, match="at least one rollout and one reward"):
            load_job_file(rl).check()


def test_rules_across_keys(tmp_path):
    path = write(tmp_path / "job.yaml", "training:\n  type: pg_opd\n")
    with pytest.raises(ConfigError, match=r":2: training.type: pg_opd .* needs a teacher model"):
        load_job_file(path).check()
    two = FUNCTIONS["rollout"] + FUNCTIONS["rollout"].replace("name: r", "name: r2")
    write(path, f"functions:\n{two}{FUNCTIONS['reward']}")
    with pytest.raises(ConfigError, match=r":5: functions\[1\]: 2 rollouts"):
        load_job_file(path).check()
    same_name = FUNCTIONS["reward"].replace("name: w", "name: r")
    write(path, f"functions:\n{FUNCTIONS['rollout']}{same_name}")
    with pytest.raises(ConfigError, match=r"functions\[1\].name: function name 'r' is also used"):
        load_job_file(path).check()


def test_submit_body_keeps_each_components_settings_with_it(tmp_path):
    path = write(
        tmp_path / "job.yaml",
        "name: calc\n"
        "functions:\n"
        "- {type: rollout, name: ro, timeout: 600, entity_id: ro-1}\n"
        "- {type: reward, name: first, weight: 0.5, entity_id: rw-1}\n"
        "- type: reward\n"
        "  name: second\n"
        "  entity_id: rw-2\n"
        "  reward_metric_weight: {a: 0.25}\n"
        "  runtime: {cpu: 2, layer_code: layer-9, env: {ENABLE_TRAJECTORY: true, EMPTY: ''}}\n"
        "- {type: group_reward, name: group, entity_id: grw-1}\n"
        "datasets:\n"
        "- {file_id: file-1}\n"
        "- {type: validation, data_source_type: download_url, download_url: 'https://x/v'}\n"
        "- {type: testing, file_id: file-3}\n"
        "training:\n"
        "  hyper_parameters: {learning_rate: 1e-5, batch_size: 8, custom: keep}\n",
    )
    job = load_job_file(path)
    job.check()
    components = components_of(job)
    components[1].weights = {"from_registry": 1.0}
    components[2].weights = {"from_registry": 1.0}
    body = submit_body(job, components, {}, job_name="exactly-this")
    assert body["job_name"] == "exactly-this"
    assert body["rollout"] == {"rollout_id": "ro-1", "name": "ro", "timeout": 600}
    assert body["rewards"] == [
        # the first reward has no runtime: it gets none (the SDK shifts the second's onto it)
        {
            "reward_id": "rw-1",
            "name": "first",
            "weight": 0.5,
            "reward_metric_weight": {"from_registry": 1.0},
        },
        {
            "reward_id": "rw-2",
            "name": "second",
            "reward_metric_weight": {"a": 0.25},  # the YAML's weights win
            "layer_code": "layer-9",
            "cpu": 2.0,
            "env": {"ENABLE_TRAJECTORY": "true", "EMPTY": ""},
        },
        {"reward_id": "grw-1", "name": "group", "type": "group_reward"},
    ]
    assert body["training_datasets"] == [
        {"type": "training", "data_source_type": "file_id", "file_id": "file-1"}
    ]
    assert body["validation_datasets"] == [
        {"type": "validation", "data_source_type": "download_url", "download_url": "https://x/v"}
    ]
    assert body["hyper_parameters"] == {"learning_rate": 1e-5, "batch_size": 8, "custom": "keep"}
    assert body["training_type"] == "reinforcement"
    assert "teacher_model" not in body and "model" not in body


def test_classpath_forms_resolve_to_file_module_and_class():
    for classpath in (
        "functions.reward.safety.SafetyProcessor",  # SDK dotted
        "functions/reward/safety.py:SafetyProcessor",  # SDK colon, a file path
        "functions\\reward\\safety:SafetyProcessor",  # back-slashes
        "functions.reward.safety:SafetyProcessor",  # ours: a module path
    ):
        component = resolve("reward", classpath, SAMPLES)
        assert (component.file, component.module, component.class_name) == (
            "functions/reward/safety.py",
            "functions.reward.safety",
            "SafetyProcessor",
        ), classpath
    found = resolve("reward", "", SAMPLES, filepath="functions/reward/safety", classname="S")
    assert found.file == "functions/reward/safety.py"
    with pytest.raises(ComponentError, match="does not exist in the workspace"):
        resolve("reward", "functions.reward.nope.X", SAMPLES)
    with pytest.raises(ComponentError, match="two segments"):
        resolve("reward", "X", SAMPLES)


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "functions").mkdir(parents=True)
    (ws / "functions" / "__init__.py").write_text("")
    (ws / "functions" / "fn.py").write_text("X = 1\n")
    (ws / "requirements.txt").write_text("numpy>=1.26\n")
    (ws / "run.sh").write_text("echo hi\n")
    (ws / "run.sh").chmod(0o755)
    for junk in (
        ".git/config",
        ".venv/bin/python",
        "myenv/pyvenv.cfg",  # a virtual environment by another name
        "functions/__pycache__/fn.cpython-311.pyc",
        "data/train.jsonl",
        "tests/test_fn.py",
        "notes.md",
        ".pytest_cache/x",
        "start.sh",
    ):
        (ws / junk).parent.mkdir(parents=True, exist_ok=True)
        (ws / junk).write_text("junk")
    return ws


def _package(ws: Path, server: str = "runtime") -> packaging.Package:
    requirements = packaging.layer_requirements(ws, "./requirements.txt", server)
    return packaging.build_package(ws, "reward", "functions.fn", "Fn", requirements, server=server)


def test_the_package_is_reproducible_filtered_and_starts_this_runtime(tmp_path):
    ws = _workspace(tmp_path)
    before = sorted(p.relative_to(ws).as_posix() for p in ws.rglob("*"))
    first = _package(ws)
    os.utime(ws / "functions" / "fn.py", (1, 1))  # a new mtime, the same content
    second = _package(ws)
    assert first.data == second.data  # same workspace, same bytes
    assert sorted(p.relative_to(ws).as_posix() for p in ws.rglob("*")) == before  # untouched
    archive = zipfile.ZipFile(BytesIO(first.data))
    names = archive.namelist()
    assert names == sorted(names)
    assert {"functions/__init__.py", "functions/fn.py", "requirements.txt", "run.sh"} <= set(names)
    assert "runtime/cli.py" in names and "processors_base/models.py" in names
    for excluded in (".git/", ".venv/", "myenv/", "__pycache__", "data/", "tests/", "notes.md"):
        assert not any(excluded in n for n in names), excluded
    assert not any(n.endswith("/") for n in names)  # file entries only
    modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in archive.infolist()}
    assert modes["start.sh"] == 0o755 and modes["run.sh"] == 0o755
    assert modes["functions/fn.py"] == 0o644
    assert {i.date_time for i in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    script = archive.read("start.sh").decode()
    assert script != "junk"  # the workspace's own start.sh is replaced
    assert "export PROCESSOR_CLASS=functions.fn:Fn" in script
    assert "export FUNC_TYPE=reward" in script
    assert "exec python3 -m runtime serve" in script
    requirements = archive.read(packaging.REQUIREMENTS_NAME).decode()
    assert "numpy>=1.26" in requirements
    assert f"pydantic=={metadata.version('pydantic')}" in requirements
    assert f"uvicorn[standard]=={metadata.version('uvicorn')}" in requirements


def test_the_sdk_server_choice_and_the_size_limit(tmp_path, monkeypatch):
    ws = _workspace(tmp_path)
    sdk = zipfile.ZipFile(BytesIO(_package(ws, "sdk").data))
    script = sdk.read("start.sh").decode()
    assert "export PROCESSOR_CLASS=functions.fn.Fn" in script
    assert f"exec python3 -m {packaging.SDK_SERVER}" in script
    assert "runtime/cli.py" not in sdk.namelist()
    assert "dashscope" in sdk.read(packaging.REQUIREMENTS_NAME).decode()

    (ws / "functions" / "weights.bin").write_bytes(os.urandom(2 * 1024 * 1024))  # incompressible
    monkeypatch.setenv("FC_OSS_FILE_SIZE_WARNING", str(1024 * 1024))
    with pytest.raises(packaging.PackagingError, match=r"over the platform's limit of 1.0 MB"):
        _package(ws)


def test_a_workspace_with_its_own_runtime_package_is_refused(tmp_path):
    ws = _workspace(tmp_path)
    (ws / "runtime").mkdir()
    (ws / "runtime" / "__init__.py").write_text("")
    with pytest.raises(packaging.PackagingError, match="would shadow the runtime's sources"):
        _package(ws)


def test_components_without_runtime_settings_send_only_their_layer():
    component = Component("reward", "x", SAMPLES, layer_code="layer-1")
    assert component.runtime_body() == {"layer_code": "layer-1"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("training:\n  hyper_parameters:\n    learning_rate: .nan\n", ":3: training.hyper_"),
        ("functions:\n- type: reward\n  weight: -.inf\n", ":3: functions[0].weight"),
        ("functions:\n- type: reward\n  weight: 'nan'\n", ":3: functions[0].weight"),
        ("observability:\n  x: [1, 2, 1.0e+999]\n", ":2: observability.x[2]"),
    ],
)
def test_nan_and_infinity_are_config_errors_with_the_line(tmp_path, text, expected):
    with pytest.raises(ConfigError, match="not a finite number") as caught:
        load_job_file(write(tmp_path / "job.yaml", text))
    assert expected in str(caught.value)


def test_nested_aliases_and_huge_files_are_refused_quickly(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n"
    for level in "bcdefghij":
        previous = chr(ord(level) - 1)
        bomb += f"{level}: &{level} [*{previous}, *{previous}, *{previous}, *{previous}, "
        bomb += f"*{previous}, *{previous}, *{previous}, *{previous}, *{previous}]\n"
    bomb = "observability:\n" + "".join(f"  {line}\n" for line in bomb.splitlines())
    assert len(bomb.encode()) < 1000
    # refused at the count's bound: a billion values never walked
    with pytest.raises(ConfigError, match="expands to more than 100000 values"):
        load_job_file(write(tmp_path / "bomb.yaml", bomb))

    big = write(tmp_path / "big.yaml", "name: x\n" + "# padding\n" * 200_000)
    with pytest.raises(ConfigError, match=r"big.yaml: 2.0 MB; a job file is at most 1.0 MB"):
        load_job_file(big)


def test_a_key_given_twice_names_both_lines(tmp_path):
    text = "name: a\nfunctions:\n- type: reward\n  name: r\n  weight: 1\n  name: s\n"
    with pytest.raises(ConfigError) as caught:
        load_job_file(write(tmp_path / "job.yaml", text))
    assert str(caught.value).endswith(
        "job.yaml:6: functions[0].name is given twice (first on line 4)"
    )


_RUNTIME = "functions:\n- type: reward\n  runtime:\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "training:\n  hyper_parameters:\n    n_rollouts: -2\n",
            ":3: training.hyper_parameters.n_rollouts: Input should be greater than 0",
        ),
        ("training:\n  hyper_parameters:\n    batch_size: 0\n", ":3: training.hyper_parameters."),
        ("training:\n  hyper_parameters:\n    learning_rate: -2e-6\n", "learning_rate: Input"),
        ("training:\n  hyper_parameters:\n    kl_loss_coef: -0.1\n", "kl_loss_coef: Input"),
        ("training:\n  hyper_parameters:\n    save_total_limit: 0\n", "save_total_limit: "),
        ("functions:\n- type: reward\n  timeout: 0\n", ":3: functions[0].timeout: Input"),
        (_RUNTIME + "    concurrency: 0\n", ":4: functions[0].runtime.concurrency: Input"),
        (_RUNTIME + "    cpu: -1\n", ":4: functions[0].runtime.cpu: Input"),
        (_RUNTIME + "    memory_size: 0\n", ":4: functions[0].runtime.memory_size"),
        (_RUNTIME + "    memory_scale_threshold: 1.5\n", "memory_scale_threshold: Input"),
        (_RUNTIME + "    concurrency_scale_threshold: 0\n", "concurrency_scale_threshold"),
        (_RUNTIME + "    min_capacity: -1\n", ":4: functions[0].runtime.min_capacity"),
        (
            _RUNTIME + "    min_capacity: 5\n    max_capacity: 2\n",
            ":3: functions[0].runtime: min_capacity (5) is above max_capacity (2)",
        ),
    ],
)
def test_numbers_are_checked_against_their_meaning(tmp_path, text, expected):
    with pytest.raises(ConfigError) as caught:
        load_job_file(write(tmp_path / "job.yaml", text))
    assert expected in str(caught.value)


def test_a_deeply_nested_job_file_is_refused_with_its_line(tmp_path):
    deep = write(tmp_path / "deep.yaml", "name: x\nobservability: " + "[" * 1000 + "]" * 1000)
    assert len(deep.read_bytes()) < 2100
    with pytest.raises(ConfigError) as caught:
        load_job_file(deep)
    assert str(caught.value) == f"{deep}:2: nested more than 50 levels deep"
    # what a job file needs is far from the limit: 40 levels load
    load_job_file(write(tmp_path / "ok.yaml", "observability:\n  x: " + "[" * 40 + "]" * 40))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: x\nobservability: " + "[" * 1000 + "]" * 1000 + "\n", "nested more than"),
        (
            "name: x\ntraining:\n  hyper_parameters:\n    n_rollouts: -2\n",
            "job.yaml:4: training.hyper_parameters.n_rollouts: Input should be greater than 0",
        ),
    ],
)
def test_job_run_refuses_a_bad_job_file_as_a_usage_error(tmp_path, text, expected):
    """Exit 2, one line, before anything is sent (the base URL answers nothing)."""
    import subprocess
    import sys

    write(tmp_path / "job.yaml", text)
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "job", "run", "-c", "job.yaml"],
        cwd=tmp_path,
        env={
            **os.environ,
            "DASHSCOPE_API_KEY": "sk-test",
            "DASHSCOPE_HTTP_BASE_URL": "http://127.0.0.1:9",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: ")
    assert expected in done.stderr
