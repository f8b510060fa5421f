"""The SDK's FuncManager: one processor with its request parser, run the way the server
runs it (sync code in an executor, tracing around ``process`` while it is on)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Coroutine
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, cast

from processors_base.models import BaseDataModel, FunctionType
from processors_base.processors import AbstractProcessor
from runtime.compat.alias.parsers import BaseRequestParser, parser_for
from runtime.compat.alias.tracing import async_trace_processor_process, trace_processor_process

__all__ = ["FuncManager"]


class FuncManager:
    def __init__(
        self,
        func_type: FunctionType,
        processor: AbstractProcessor,
        *,
        observe: bool = True,
        executor: Executor | None = None,
    ) -> None:
        self._func_type = FunctionType(func_type)
        self._parser = parser_for(self._func_type)()
        self._processor = self._checked(processor)
        self._observe = observe
        self.executor = executor

    @staticmethod
    def _checked(processor: Any) -> AbstractProcessor:
        if processor is None:
            raise ValueError("FuncManager needs a processor instance")
        if not isinstance(processor, AbstractProcessor):
            raise TypeError(f"processor must be an AbstractProcessor, got {type(processor)}")
        return processor

    @property
    def func_type(self) -> FunctionType:
        return self._func_type

    @property
    def parser(self) -> BaseRequestParser:
        return self._parser

    @property
    def processor(self) -> AbstractProcessor:
        return self._processor

    def set_executor(self, executor: Executor | None) -> None:
        self.executor = executor

    def register_processor(self, processor: AbstractProcessor) -> None:
        self._processor = self._checked(processor)

    def parses(self, raw_data: dict[str, Any]) -> BaseDataModel:
        return self._parser.parse(raw_data)

    async def _run_sync(self, fn: Any, *args: Any) -> Any:
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    async def setups(self) -> None:
        setup = self._processor.setup
        if inspect.iscoroutinefunction(setup):
            await setup()
        else:
            await self._run_sync(setup)

    async def processes(self, input_data: BaseDataModel) -> Any:
        process = self._processor.process
        if inspect.iscoroutinefunction(process):
            if self._observe:
                return await async_trace_processor_process(
                    self._func_type, self._processor, input_data
                )
            return await process(input_data)
        if self._observe:
            return await self._run_sync(
                trace_processor_process, self._func_type, self._processor, input_data
            )
        return await self._run_sync(process, input_data)

    def execute(self, raw_data: dict[str, Any]) -> Any:
        """Parse and process in one call, from synchronous code."""
        result = self._processor.process(self.parses(raw_data))
        if inspect.isawaitable(result):
            # asyncio.run takes a coroutine, and raises its own error for any other awaitable
            return asyncio.run(cast("Coroutine[Any, Any, Any]", result))
        return result

    @classmethod
    def create_from_env(cls, func_type: FunctionType, processor_class_path: str) -> FuncManager:
        from runtime.execution.loading import load_target

        target = load_target(processor_class_path, Path.cwd(), func_type)
        return cls(func_type, processor=target.cls())
