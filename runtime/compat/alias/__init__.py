"""What the DashScope SDK's ``finetune.reinforcement`` package provides, from this project.

``MODULES`` names every public module of the SDK's package (relative to it) and the
public names it exports; ``exports(module)`` gives each name's object here. Behind each
name is this project's implementation: the processor bases, wire models, decorators and
tracing of ``processors_base``; the parsers, demos, FuncManager, errors, enums, settings
and utilities of this package. The SDK's deployment client (upload, register, tune) and
its server's handlers are stand-ins that import fine and raise ``NotProvidedError`` with
what to use instead when called (``unavailable``); its component and dataset models are
the job file's (``tuning``). ``EXTRA_MODULES``: the SDK's Tuning API
(``dashscope.finetune.agentic_rl``), served by ``runtime.compat.agentic_rl`` on this
project's platform client.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

__all__ = ["EXTRA_MODULES", "MODULES", "SDK", "exports"]

SDK = "dashscope.finetune.reinforcement"
# SDK modules beside that package, each served whole by one module of ours
EXTRA_MODULES = {"dashscope.finetune.agentic_rl": "runtime.compat.agentic_rl"}

MODULES: dict[str, str] = {
    "": (
        "AbstractGroupRewardProcessor AbstractRewardProcessor AbstractRolloutProcessor "
        "AgentOutput AgenticRLError AgenticRLFunctionComponent AgenticRLTuning "
        "BAILIAN_FILE_API BAILIAN_FILE_TIMEOUT BaseConnectionError BasePermissionError "
        "ConfigurationError DASHSCOPE_API_KEY DASHSCOPE_HTTP_BASE_URL "
        "DATASETS_FILE_SIZE_WARNING DataSourceType Dataset Datasets DatasetsType "
        "DeploymentError FC_API_KEY FC_DELETE_API FC_FILES_START FC_LAYER_CREATE_API "
        "FC_LAYER_NAME FC_LAYER_QUERY_API FC_LAYER_USED FC_LOAD_API FC_OSS_FILE_SIZE_WARNING "
        "FC_PYPI_LIB FC_PYPI_REPO FC_QUERY_API FC_QUERY_LOG_API FC_REGISTER_GROUP_REWARD_API "
        "FC_REGISTER_REWARD_API FC_REGISTER_ROLLOUT_API FC_REQUIREMENTS_FILE "
        "FC_SERVER_CLASSPATH FC_UPLOAD_OSS_API FC_WORKERS_COUNT FC_ZIP_EXCLUDE_PATTERNS "
        "FileSpec FoundationModel FunctionComponentModel FunctionComponentRuntime "
        "FunctionLayerError FunctionLoadError FunctionType GroupReward "
        "GroupRewardFunctionComponent GroupRewardInput GroupRewardOutput HTTP_REQUEST_TIMEOUT "
        "IOErrorWithCode InputError InstanceQueryError InstanceWarmupError "
        "LOGGER_FILTER_FIELDS LOG_LEVEL Models MountStorage OSSConnectionError OSSUploadError "
        "Observability OutputError RegistrationError RequestFC ResponseFC Reward "
        "RewardFunctionComponent RewardInput RewardOutput RewardProcessorMeta "
        "RolloutFunctionComponent RolloutInput RolloutOutput RuntimeErrorWithCode Status "
        "StatusType TaskStatus Training TrainingDataset TrainingType TuningModel "
        "ValidationDataset ValidationError ValueErrorWithCode aggregate_func app check_file "
        "client_fc create_deployment_files deep_mask deep_remove_none extract_reward_weights "
        "generate_random_id get_filepath_classname get_func_type_id get_weights_from_file "
        "logger reward_func serialize_for_output set_api_key sub_reward_func to_bailian_data "
        "upload_zip_to_oss_and_by_signed_url zip_dir"
    ),
    ".common": "",
    ".common.constants": (
        "BAILIAN_FILE_API BAILIAN_FILE_TIMEOUT DASHSCOPE_API_KEY DASHSCOPE_HTTP_BASE_URL "
        "DATASETS_FILE_SIZE_WARNING ENABLE_TRAJECTORY FC_API_KEY FC_BASE_ENDPOINT "
        "FC_DELETE_API FC_FILES_START FC_LAYER_CREATE_API FC_LAYER_NAME FC_LAYER_QUERY_API "
        "FC_LAYER_USED FC_LOAD_API FC_OSS_FILE_SIZE_WARNING FC_PYPI_LIB FC_PYPI_REPO "
        "FC_QUERY_API FC_QUERY_LOG_API FC_REGISTER_GROUP_REWARD_API FC_REGISTER_REWARD_API "
        "FC_REGISTER_ROLLOUT_API FC_REQUIREMENTS_FILE FC_SERVER_CLASSPATH FC_UPLOAD_OSS_API "
        "FC_WORKERS_COUNT FC_ZIP_EXCLUDE_PATTERNS HTTP_REQUEST_TIMEOUT LOGGER_FILTER_FIELDS "
        "LOGGER_NAME LOG_LEVEL TUNING_MODE_NAME get_bool_env get_int_env logger"
    ),
    ".common.errors": (
        "AgenticRLError BaseConnectionError BasePermissionError ConfigurationError "
        "DatasetsError DeploymentError FunctionLayerError FunctionLoadError IOErrorWithCode "
        "InputError InstanceQueryError InstanceWarmupError OSSConnectionError OSSUploadError "
        "OutputError RegistrationError RuntimeErrorWithCode ValidationError "
        "ValueErrorWithCode"
    ),
    ".common.log": "LOGGER_NAME LOG_LEVEL logger setup_logger",
    ".common.model": (
        "AgenticRLFunctionComponent AgenticRLTuning Dataset Datasets FC_API_KEY FC_DELETE_API "
        "FC_LAYER_CREATE_API FC_LAYER_NAME FC_LAYER_QUERY_API FC_LAYER_USED FC_LOAD_API "
        "FC_QUERY_API FC_QUERY_LOG_API FC_REGISTER_GROUP_REWARD_API FC_REGISTER_REWARD_API "
        "FC_REGISTER_ROLLOUT_API FC_REQUIREMENTS_FILE FC_UPLOAD_OSS_API FoundationModel "
        "FunctionComponentModel FunctionComponentRuntime GroupRewardFunctionComponent "
        "LOG_LEVEL Models MountStorage Observability RewardFunctionComponent "
        "RolloutFunctionComponent Training TrainingDataset TuningModel ValidationDataset "
        "logger"
    ),
    ".common.model_types": (
        "DataSourceType DatasetsType FileSpec FunctionType RLType RequestFC RequestTuning "
        "ResponseFC ResponseTuning Status StatusType TrainingType"
    ),
    ".common.utils": (
        "BAILIAN_FILE_API BAILIAN_FILE_TIMEOUT DASHSCOPE_API_KEY DATASETS_FILE_SIZE_WARNING "
        "FC_FILES_START FC_LAYER_USED FC_OSS_FILE_SIZE_WARNING FC_PYPI_LIB FC_PYPI_REPO "
        "FC_SERVER_CLASSPATH FC_WORKERS_COUNT FC_ZIP_EXCLUDE_PATTERNS HTTP_REQUEST_TIMEOUT "
        "LOGGER_FILTER_FIELDS LOG_LEVEL async_http_request check_file client_fc "
        "create_deployment_files deep_mask deep_remove_none extract_reward_weights "
        "generate_agentic_script generate_random_id get_business_summary get_fc_request_id "
        "get_filepath_classname get_func_type_id get_weights_from_file logger secret_part_str "
        "serialize_for_output set_api_key to_bailian_data upload_zip_to_oss_and_by_signed_url "
        "zip_dir zip_files"
    ),
    ".component": (
        "AbstractRewardProcessor AbstractRolloutProcessor AgentOutput BaseDataModel "
        "BaseRequestParser DemoRewardProcessor DemoRolloutProcessor FuncManager ModelProtocol "
        "Resource Reward RewardInput RewardOutput RewardRequestParser RolloutInput "
        "RolloutOutput RolloutRequestParser Task TaskStatus aggregate_func observe_processor "
        "reward_func sub_reward_func"
    ),
    ".component.data": (
        "AgentOutput BaseDataModel GroupReward GroupRewardInput GroupRewardOutput "
        "ModelProtocol ModelResource RequestMetadata Resource Reward RewardInput RewardOutput "
        "RolloutInput RolloutOutput Task TaskStatus"
    ),
    ".component.data.base_data_model": (
        "AgentOutput BaseDataModel ModelProtocol ModelResource RequestMetadata Resource Task "
        "TaskStatus"
    ),
    ".component.data.group_reward_input": "GroupRewardInput",
    ".component.data.group_reward_output": "GroupReward GroupRewardOutput",
    ".component.data.reward_input": "RewardInput",
    ".component.data.reward_output": "Reward RewardOutput",
    ".component.data.rollout_input": "RolloutInput",
    ".component.data.rollout_output": "RolloutOutput",
    ".component.demo": "DemoGroupRewardProcessor DemoRewardProcessor DemoRolloutProcessor",
    ".component.demo.group_reward_processor_demo": "DemoGroupRewardProcessor logger",
    ".component.demo.reward_processor_demo": "DemoRewardProcessor logger",
    ".component.demo.rollout_processor_demo": "DemoRolloutProcessor logger",
    ".component.func_decorator": (
        "AggregateFunction RewardProcessorMeta SubRewardFunction aggregate_func logger "
        "reward_func sub_reward_func"
    ),
    ".component.func_manager": "FuncManager logger",
    ".component.observability": (
        "AGENTIC_RL_ATTEMPT_ID_BAGGAGE_KEY AGENTIC_RL_ROLLOUT_ID_BAGGAGE_KEY "
        "AGENTIC_RL_SAMPLE_ID_BAGGAGE_KEY apply_processor_span_attributes_after "
        "apply_processor_span_attributes_before async_trace_processor_process "
        "current_trace_id_hex dashscope_response_to_output_messages "
        "ensure_agentic_rl_baggage_span_processor genai_llm_span get_tracer "
        "instrument_dashscope_generation_call instrument_openai_chat_completions "
        "is_tracing_enabled log_trace_id observe_llm observe_processor observe_tool "
        "openai_chat_messages_to_input_messages openai_completion_to_output_messages "
        "resolve_processor_func_type_for_span rollout_context run_with_genai_llm_span "
        "span_payload_preview trace_client trace_processor_process trace_processor_span "
        "trace_tool"
    ),
    ".component.observability.genai": (
        "dashscope_response_to_output_messages genai_llm_span "
        "instrument_dashscope_generation_call instrument_openai_chat_completions observe_llm "
        "observe_tool openai_chat_messages_to_input_messages "
        "openai_completion_to_output_messages run_with_genai_llm_span trace_client trace_tool"
    ),
    ".component.observability.genai.llm_dashscope": (
        "GENAI_AVAILABLE instrument_dashscope_generation_call logger"
    ),
    ".component.observability.genai.llm_openai": (
        "GENAI_AVAILABLE instrument_openai_chat_completions logger"
    ),
    ".component.observability.genai.llm_span": "genai_llm_span observe_llm run_with_genai_llm_span",
    ".component.observability.genai.messages": (
        "dashscope_response_to_output_messages logger openai_chat_messages_to_input_messages "
        "openai_completion_to_output_messages tool_calls_to_parts unwrap_openai_completion"
    ),
    ".component.observability.genai.tools": "observe_tool trace_tool",
    ".component.observability.processor_span": "observe_processor trace_processor_span",
    ".component.observability.tracing": (
        "AGENTIC_RL_ATTEMPT_ID_BAGGAGE_KEY AGENTIC_RL_ROLLOUT_ID_BAGGAGE_KEY "
        "AGENTIC_RL_SAMPLE_ID_BAGGAGE_KEY ForceFlushMode "
        "apply_processor_span_attributes_after apply_processor_span_attributes_before "
        "async_trace_processor_process current_span_ids_hex current_trace_id_hex "
        "ensure_agentic_rl_baggage_span_processor get_tracer get_upstream_trace_linkage "
        "is_tracing_enabled log_trace_id logger maybe_force_flush maybe_force_flush_async "
        "reset_upstream_trace_linkage resolve_processor_func_type_for_span rollout_context "
        "set_upstream_trace_linkage span_payload_preview trace_processor_process"
    ),
    ".component.parser": (
        "BaseRequestParser GroupRewardRequestParser RewardRequestParser RolloutRequestParser"
    ),
    ".component.parser.base_parser": "BaseRequestParser",
    ".component.parser.group_reward_parser": "GroupRewardRequestParser logger",
    ".component.parser.reward_parser": "RewardRequestParser logger",
    ".component.parser.rollout_parser": "RolloutRequestParser logger",
    ".component.processor": (
        "AbstractGroupRewardProcessor AbstractProcessor AbstractRewardProcessor "
        "AbstractRolloutProcessor"
    ),
    ".component.processor.abstract_group_reward_processor": "AbstractGroupRewardProcessor",
    ".component.processor.abstract_processor": "AbstractProcessor",
    ".component.processor.abstract_reward_processor": "AbstractRewardProcessor",
    ".component.processor.abstract_rollout_processor": "AbstractRolloutProcessor",
    ".component.server": "",
    ".component.server.server": (
        "app executor func_manager func_type handle_endpoint health_check_endpoint logger "
        "shutdown_event startup_event validation_exception_handler"
    ),
}

# the SDK's workflow state objects; its component and dataset models are ours (tuning)
_CLIENT_MODELS = (
    "AgenticRLTuning Datasets FoundationModel Models Observability Training TuningModel"
)
_CLIENT_FUNCTIONS = (
    "app async_http_request check_file client_fc create_deployment_files "
    "generate_agentic_script get_business_summary get_fc_request_id set_api_key "
    "to_bailian_data upload_zip_to_oss_and_by_signed_url zip_dir zip_files"
)
_SERVER_HANDLERS = (
    "handle_endpoint health_check_endpoint shutdown_event startup_event "
    "validation_exception_handler"
)


@functools.cache
def _pool() -> dict[str, Any]:
    """Every name any SDK module exports, bound to this project's object for it."""
    import processors_base
    from processors_base import models, reward_meta
    from runtime.compat.alias import common, demos, manager, parsers, tracing, unavailable

    pool: dict[str, Any] = {
        name: getattr(processors_base, name) for name in processors_base.__all__
    }
    pool.update({name: getattr(models, name) for name in models.__all__})
    pool.update({name: getattr(reward_meta, name) for name in reward_meta.__all__})
    for module in (demos, manager, parsers, tracing):
        pool.update({name: getattr(module, name) for name in module.__all__})
    pool.update(common.ERRORS)
    pool.update(common.MODEL_TYPES)
    pool.update(common.SETTINGS)
    pool.update(common.UTILS)
    pool.update(
        get_bool_env=common.get_bool_env,
        get_int_env=common.get_int_env,
        setup_logger=common.setup_logger,
    )
    from runtime.compat.alias import tuning

    pool.update(tuning.MODELS)
    for name in _CLIENT_MODELS.split():
        pool[name] = unavailable.unavailable_class(f"{SDK}.common.model", name)
    for name in _CLIENT_FUNCTIONS.split():
        pool[name] = unavailable.unavailable_function(f"{SDK}.common.utils", name)
    for name in _SERVER_HANDLERS.split():
        pool[name] = unavailable.unavailable_function(
            f"{SDK}.component.server.server", name, unavailable.SERVER
        )
    func_type = os.environ.get("FUNC_TYPE", "").strip().lower()
    pool["func_type"] = (
        models.FunctionType(func_type)
        if func_type in ("rollout", "reward", "group_reward")
        else None
    )
    return pool


@functools.cache
def _server_names() -> dict[str, Any]:
    """The SDK server module's own objects, which this runtime's server replaces."""
    from runtime.compat.alias import unavailable

    module = f"{SDK}.component.server.server"
    return {
        name: unavailable.unavailable_object(module, name)
        for name in ("app", "executor", "func_manager")
    }


def exports(module: str) -> dict[str, Any]:
    """The names of the SDK module ``module`` (its full dotted name) and their objects."""
    if module in EXTRA_MODULES:
        served = importlib.import_module(EXTRA_MODULES[module])
        return {name: getattr(served, name) for name in served.__all__}
    pool = _pool()
    if module.endswith(".component.server.server"):
        pool = {**pool, **_server_names()}
    return {name: pool[name] for name in MODULES[module[len(SDK) :]].split()}
