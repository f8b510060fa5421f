"""The SDK's ``common`` package: its errors, enums and small models, settings read from
the same environment variables, its logger, and the utilities that make sense without its
deployment client (those that do not are stand-ins, see ``unavailable``)."""

from __future__ import annotations

import ast
import copy
import logging
import os
import sys
import uuid
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from processors_base.models import FunctionType

# --- errors ---------------------------------------------------------------------------


class _Coded:
    """``error_code`` and ``message`` on every error; ``root_cause`` follows ``__cause__``."""

    error_code: int
    message: str

    def _init_code(self, message: str, error_code: int) -> None:
        self.message = message
        self.error_code = error_code

    @property
    def root_cause(self) -> BaseException:
        error: BaseException = self  # type: ignore[assignment]
        seen = {id(error)}
        while error.__cause__ is not None and id(error.__cause__) not in seen:
            error = error.__cause__
            seen.add(id(error))
        return error


class AgenticRLError(_Coded, Exception):
    default_code = 1000

    def __init__(self, message: str = "", error_code: int | None = None, **details: Any) -> None:
        super().__init__(message)
        self._init_code(message, self.default_code if error_code is None else error_code)
        self.details = details

    def __str__(self) -> str:
        return f"[{self.error_code}] {self.message}"


class RuntimeErrorWithCode(_Coded, RuntimeError):
    def __init__(self, message: str = "", error_code: int = 0) -> None:
        super().__init__(message)
        self._init_code(message, error_code)


class ValueErrorWithCode(_Coded, ValueError):
    def __init__(self, message: str = "", error_code: int = 0) -> None:
        super().__init__(message)
        self._init_code(message, error_code)


def _error(name: str, base: type, code: int) -> type:
    return type(name, (base,), {"default_code": code, "__module__": __name__})


IOErrorWithCode = _error("IOErrorWithCode", AgenticRLError, 1800)
InputError = _error("InputError", AgenticRLError, 1100)
OutputError = _error("OutputError", AgenticRLError, 1200)
BaseConnectionError = _error("BaseConnectionError", AgenticRLError, 1300)
OSSConnectionError = _error("OSSConnectionError", BaseConnectionError, 1310)
OSSUploadError = _error("OSSUploadError", BaseConnectionError, 1320)
DeploymentError = _error("DeploymentError", AgenticRLError, 1400)
RegistrationError = _error("RegistrationError", DeploymentError, 1410)
DatasetsError = _error("DatasetsError", DeploymentError, 1460)
FunctionLoadError = _error("FunctionLoadError", DeploymentError, 1420)
FunctionLayerError = _error("FunctionLayerError", DeploymentError, 1450)
InstanceWarmupError = _error("InstanceWarmupError", DeploymentError, 1430)
InstanceQueryError = _error("InstanceQueryError", DeploymentError, 1440)
ValidationError = _error("ValidationError", AgenticRLError, 1500)
ConfigurationError = _error("ConfigurationError", ValidationError, 1510)
BasePermissionError = _error("BasePermissionError", AgenticRLError, 1700)

ERRORS = {
    cls.__name__: cls
    for cls in (
        AgenticRLError,
        BaseConnectionError,
        BasePermissionError,
        ConfigurationError,
        DatasetsError,
        DeploymentError,
        FunctionLayerError,
        FunctionLoadError,
        IOErrorWithCode,
        InputError,
        InstanceQueryError,
        InstanceWarmupError,
        OSSConnectionError,
        OSSUploadError,
        OutputError,
        RegistrationError,
        RuntimeErrorWithCode,
        ValidationError,
        ValueErrorWithCode,
    )
}

# --- enums and small models -------------------------------------------------------------


class _ValueStr(str, Enum):
    def __str__(self) -> str:
        return self.value


class StatusType(_ValueStr):
    PENDING = "PENDING"
    SUSPENDED = "SUSPENDED"
    SUCCEEDED = "SUCCEEDED"
    CANCELED = "CANCELED"
    RUNNING = "RUNNING"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"
    HEALTH = "healthy"


class DataSourceType(_ValueStr):
    FILE_ID = "file_id"
    DOWNLOAD_URL = "download_url"
    OSS_MOUNT = "oss_mount"


class DatasetsType(_ValueStr):
    TRAINING = "training"
    TESTING = "testing"
    VALIDATION = "validation"


class TrainingType(_ValueStr):
    TRAINING_TYPE = "reinforcement"
    PG_OPD = "pg_opd"


class RLType(_ValueStr):
    GRPO = "GRPO"
    GRPOLoRA = "GRPOLoRA"
    PPO = "PPO"
    FinetuneLoRA = "FinetuneLoRA"
    FinetuneSFT = "FinetuneSft"
    DPO = "DPO"
    DPOLoRA = "DPOLoRA"
    Pretrain = "Pretrain"


class FileSpec(BaseModel):
    path: str = ""
    descriptions: str | None = ""


class Status(BaseModel):
    task: StatusType = StatusType.SUCCEEDED
    name: str = ""
    code: int = 200
    message: str = ""

    @property
    def success(self) -> bool:
        return self.task == StatusType.SUCCEEDED


class RequestFC(BaseModel):
    name: str = ""
    unique_key: str = ""
    func: str = ""
    code_url: str = ""


class ResponseFC(BaseModel):
    status: Status = Field(default_factory=Status)
    output: dict[str, Any] | None = None


class RequestTuning(BaseModel):
    model: str = ""
    training_file_ids: list[str] = Field(default_factory=list)
    validation_file_ids: list[str] | None = Field(default_factory=list)
    rolloutId: str = ""
    rewardIds: list[str] = Field(default_factory=list)
    hyper_parameters: dict[str, str] | None = Field(default_factory=dict)
    training_type: str = TrainingType.TRAINING_TYPE.value
    job_name: str | None = ""
    model_name: str | None = ""


class ResponseTuning(BaseModel):
    status: Status = Field(default_factory=Status)
    output: dict[str, Any] | None = None


MODEL_TYPES = {
    "DataSourceType": DataSourceType,
    "DatasetsType": DatasetsType,
    "FileSpec": FileSpec,
    "FunctionType": FunctionType,
    "RLType": RLType,
    "RequestFC": RequestFC,
    "RequestTuning": RequestTuning,
    "ResponseFC": ResponseFC,
    "ResponseTuning": ResponseTuning,
    "Status": Status,
    "StatusType": StatusType,
    "TrainingType": TrainingType,
}

# --- settings, read from the SDK's environment variables --------------------------------


def get_bool_env(env_var: str, default: bool) -> bool:
    return os.getenv(env_var, str(default)).strip().lower() in ("true", "1", "yes")


def get_int_env(env_var: str, default: int) -> int:
    try:
        return int(os.getenv(env_var, str(default)))
    except ValueError:
        return default


def _settings() -> dict[str, Any]:
    base = os.environ.get("DASHSCOPE_HTTP_BASE_URL", "https://dashscope.aliyuncs.com/api/v1")
    api_key = os.environ.get("DASHSCOPE_API_KEY", "")
    functions = f"{base}/fine-tunes"

    def endpoint(name: str, path: str) -> str:
        return os.environ.get(name, f"{functions}{path}")

    return {
        "DASHSCOPE_HTTP_BASE_URL": base,
        "DASHSCOPE_API_KEY": api_key,
        "FC_API_KEY": os.environ.get("FC_API_KEY", api_key),
        "LOGGER_NAME": os.environ.get("LOGGER_NAME", "dashscope.finetune.reinforcement"),
        "LOG_LEVEL": os.environ.get("LOG_LEVEL", "info").upper(),
        "LOGGER_FILTER_FIELDS": {
            "trigger_token",
            "instance_token",
            "api_token",
            "api_key",
            "password",
            "access_key",
            "secret_key",
        },
        "ENABLE_TRAJECTORY": get_bool_env("ENABLE_TRAJECTORY", True),  # the SDK's default
        "HTTP_REQUEST_TIMEOUT": get_int_env("HTTP_REQUEST_TIMEOUT", 600),
        "BAILIAN_FILE_API": os.environ.get("BAILIAN_FILE_API", f"{base}/files"),
        "BAILIAN_FILE_TIMEOUT": get_int_env("BAILIAN_FILE_TIMEOUT", 600),
        "FC_BASE_ENDPOINT": functions,
        "FC_UPLOAD_OSS_API": endpoint("FC_UPLOAD_OSS_API", "/generate/faas/upload/url"),
        "FC_REGISTER_ROLLOUT_API": endpoint("FC_REGISTER_ROLLOUT_API", "/create/rollout"),
        "FC_REGISTER_REWARD_API": endpoint("FC_REGISTER_REWARD_API", "/create/reward"),
        "FC_REGISTER_GROUP_REWARD_API": endpoint(
            "FC_REGISTER_GROUP_REWARD_API", "/create/group-reward"
        ),
        "FC_LOAD_API": endpoint("FC_LOAD_API", "/online/faas"),
        "FC_QUERY_API": endpoint("FC_QUERY_API", "/query/faas"),
        "FC_QUERY_LOG_API": endpoint("FC_QUERY_LOG_API", "/query/faas/log"),
        "FC_DELETE_API": endpoint("FC_DELETE_API", "/delete/faas"),
        "FC_LAYER_CREATE_API": endpoint("FC_LAYER_CREATE_API", "/create/faas/layer"),
        "FC_LAYER_QUERY_API": endpoint("FC_LAYER_QUERY_API", "/query/faas/layer/status"),
        "FC_FILES_START": "start.sh",
        "FC_PYPI_LIB": os.environ.get("FC_PYPI_LIB", ""),
        # The package index the function image installs from. The SDK names a registry
        # host here; this project never writes one into its files: pip's own setting, or
        # empty (pip's default index).
        "FC_PYPI_REPO": os.environ.get("FC_PYPI_REPO", os.environ.get("PIP_INDEX_URL", "")),
        # the module the platform starts: this runtime serves in its place
        "FC_SERVER_CLASSPATH": os.environ.get("FC_SERVER_CLASSPATH", "runtime"),
        "FC_WORKERS_COUNT": get_int_env("FC_WORKERS_COUNT", 2),
        "FC_LAYER_USED": get_bool_env("FC_LAYER_USED", True),
        "FC_LAYER_NAME": "fc_layer",
        "FC_REQUIREMENTS_FILE": "./requirements.txt",
        # a comma-separated string, as the SDK has it
        "FC_ZIP_EXCLUDE_PATTERNS": os.environ.get(
            "FC_ZIP_EXCLUDE_PATTERNS",
            ".git,.gitignore,.DS_Store,.vscode,.Python,.env,.venv,.idea,__pycache__,"
            "*.swp,*.egg,*.egg-info,*.pyc,*.md,*.log,*.tmp,*.bak,"
            "build,develop-eggs,.eggs,test,tests,tmp,temp,data",
        ),
        "FC_OSS_FILE_SIZE_WARNING": get_int_env("FC_OSS_FILE_SIZE_WARNING", 200 * 1024 * 1024),
        "DATASETS_FILE_SIZE_WARNING": get_int_env("DATASETS_FILE_SIZE_WARNING", 1024 * 1024 * 1024),
        "TUNING_MODE_NAME": "reinforcement",
    }


SETTINGS = _settings()

# --- logging ------------------------------------------------------------------------------


class _StderrHandler(logging.StreamHandler):
    """The handler setup_logger adds, told apart from the user's own by its class."""


def setup_logger() -> logging.Logger:
    """The functions' logger at LOG_LEVEL, writing to stderr (once, however often called)."""
    logger = logging.getLogger("processors")
    logger.setLevel(getattr(logging, SETTINGS["LOG_LEVEL"], logging.INFO))
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s")
        )
        logger.addHandler(handler)
    return logger


# --- utilities ----------------------------------------------------------------------------


def generate_random_id(prefix: str = "") -> str:
    value = str(uuid.uuid4())
    return f"{prefix}-{value}" if prefix else value


def secret_part_str(value: str) -> str:
    """The first and last four characters of a long secret, stars for the rest."""
    return f"{value[:4]}****{value[-4:]}" if len(value) > 8 else "****"


def deep_mask(data: Any) -> Any:
    """A deep copy with the values of the SDK's ``LOGGER_FILTER_FIELDS`` keys (api_key,
    password, ...) masked, exactly the keys the SDK masks. (The runtime's own redaction of
    spans and logs is wider and does not go through this.)"""
    if hasattr(data, "model_dump"):
        data = data.model_dump(mode="json")
    if isinstance(data, dict):
        return {
            k: secret_part_str(str(v))
            if isinstance(k, str) and k.lower() in SETTINGS["LOGGER_FILTER_FIELDS"]
            else deep_mask(v)
            for k, v in data.items()
        }
    if isinstance(data, (list, tuple, set)):
        return type(data)(deep_mask(v) for v in data)
    return copy.deepcopy(data)


def _empty(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, (list, dict, tuple)) and not value)


def deep_remove_none(obj: Any) -> Any:
    """A copy without empty values (None, "", [], {}, ()), at every depth."""
    if isinstance(obj, dict):
        cleaned = {k: deep_remove_none(v) for k, v in obj.items()}
        return {k: v for k, v in cleaned.items() if not _empty(v)}
    if isinstance(obj, list):
        return [v for v in (deep_remove_none(i) for i in obj) if not _empty(v)]
    return obj


def get_filepath_classname(full_path: str) -> tuple[str, str]:
    """``("path/to/file.py", "Class")`` from ``path/to/file.py:Class``, or
    ``("pkg/module.py", "Class")`` from ``pkg.module.Class``."""
    full_path = full_path.strip()
    if ":" in full_path:
        path, _, name = full_path.partition(":")
        if not path.strip() or not name.strip():
            raise InputError(f"invalid class path {full_path!r}: expected path/to/file.py:Class")
        return path.strip(), name.strip()
    module, _, name = full_path.rpartition(".")
    if not module or not name:
        raise InputError(f"invalid class path {full_path!r}: expected package.module.Class")
    return module.replace(".", "/") + ".py", name


def get_func_type_id(func_type: FunctionType | str) -> str:
    return f"{FunctionType(func_type).value}_id"


def serialize_for_output(data: Any) -> Any:
    """Plain JSON-able data from models, objects, lists and dicts."""
    if hasattr(data, "model_dump"):
        return data.model_dump()
    if isinstance(data, dict):
        return {k: serialize_for_output(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [serialize_for_output(v) for v in data]
    if hasattr(data, "__dict__") and not isinstance(data, type):
        return {k: serialize_for_output(v) for k, v in vars(data).items() if not k.startswith("_")}
    return data


def extract_reward_weights(source_code: str, classname: str) -> dict[str, float]:
    """``{sub-reward name: weight}`` of the ``@sub_reward_func`` methods of ``classname``
    read from source without importing it. As in the SDK: only a top-level class named
    exactly ``classname`` (so ``""`` finds none), and ``{}`` for source that does not parse."""
    weights: dict[str, float] = {}
    try:
        tree = ast.parse(source_code)
    except SyntaxError:
        return weights
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name != classname:
            continue
        for item in node.body:
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for decorator in item.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                target = call.func if call else decorator
                if getattr(target, "id", getattr(target, "attr", None)) != "sub_reward_func":
                    continue
                name, weight = item.name, 1.0
                args = call.args if call else []
                keywords = {k.arg: k.value for k in call.keywords} if call else {}
                name_node = keywords.get("name", args[0] if args else None)
                weight_node = keywords.get("sub_weight", args[1] if len(args) > 1 else None)
                if isinstance(name_node, ast.Constant) and isinstance(name_node.value, str):
                    name = name_node.value
                if isinstance(weight_node, ast.Constant) and isinstance(
                    weight_node.value, (int, float)
                ):
                    weight = float(weight_node.value)
                weights[name] = weight
    return weights


def get_weights_from_file(filepath: str, classname: str = "") -> dict[str, float]:
    path = Path(filepath) if filepath else None
    if path is None or not path.is_file():
        logging.getLogger("processors").error("file not found: %s", filepath)
        return {}
    return extract_reward_weights(path.read_text(encoding="utf-8"), classname)


UTILS = {
    f.__name__: f
    for f in (
        deep_mask,
        deep_remove_none,
        extract_reward_weights,
        generate_random_id,
        get_filepath_classname,
        get_func_type_id,
        get_weights_from_file,
        secret_part_str,
        serialize_for_output,
    )
}
