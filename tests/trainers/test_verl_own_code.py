"""verl 0.9.1's own reward managers scoring through the runtime's hooks against a real
served function (issue 22):

- ``BatchRewardManager`` (``reward_manager=batch``) with ``verl_compute_score_batch``;
- the legacy ``NaiveRewardManager`` (``verl.workers.reward_manager``, the trainer's default
  up to 0.6) with ``verl_compute_score_sync``, one sample at a time;
- the reward loop's ``NaiveRewardManager`` (``verl.experimental.reward_loop``, the trainer's
  from 0.7) with the async ``verl_compute_score``, its ``run_single`` per sample.

verl's code comes from its wheel (``TRAINER_WHEELS``, see ``trainer_wheels.py``), imported
from the wheel itself: the managers' registries, bases and managers, without running the
packages' ``__init__`` (which pull in ray, tensordict and transformers). Torch is used when
installed; without it, a numpy stand-in of the few torch calls the managers make, and a
stand-in of verl's ``DataProto`` (which needs tensordict) holding what they read. Where
ray, omegaconf or transformers are missing, an empty module stands for each: verl's modules
here import them only for names used at call time or in annotations. Without the wheel
these tests skip, saying so.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import importlib.util
import inspect
import logging
import sys
import types
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Server, free_port
from helpers import started, wait_for
from trainer_wheels import needs_wheel
from trainer_wheels import wheel as trainer_wheel

from processors_base.trainer_hooks import verl_compute_score_batch

VERL_VERSION = "0.9.1"  # the release these tests prove
pytestmark = needs_wheel("verl", VERL_VERSION)
# the packages imported without their __init__: no ray, no transformers
PACKAGES = (
    "verl",
    "verl.utils",
    "verl.trainer",
    "verl.trainer.ppo",
    "verl.workers",
    "verl.workers.reward_manager",
    "verl.experimental",
    "verl.experimental.reward_loop",
    "verl.experimental.reward_loop.reward_manager",
)
# imported by those modules for names used only at call time, or in annotations
STAND_INS: dict[str, dict[str, Any]] = {
    "ray": {},
    "omegaconf": {"DictConfig": dict},
    "transformers": {"AutoTokenizer": object},
}


# --- verl from its wheel -----------------------------------------------------------------


def _numpy_torch() -> types.ModuleType:
    """What BatchRewardManager asks of torch, on numpy: zeros_like, tensor, float32, and
    tensors' ``sum(dim=)``, ``item()``, ``shape``, ``device`` and indexing."""

    class Tensor(np.ndarray):
        def sum(self, dim: int | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
            return np.ndarray.sum(self, axis=dim, **kwargs)

    def zeros_like(like: Any, dtype: Any = None) -> Tensor:
        return np.zeros_like(like, dtype=dtype).view(Tensor)

    def tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
        return np.asarray(data, dtype=dtype).view(Tensor)

    torch = types.ModuleType("torch")
    torch.__dict__.update(
        Tensor=Tensor, float32=np.float32, long=np.int64, zeros_like=zeros_like, tensor=tensor
    )
    return torch


@dataclass
class DataProtoItem:
    batch: dict[str, Any]
    non_tensor_batch: dict[str, Any]
    meta_info: dict[str, Any]


@dataclass
class DataProto:
    """verl.protocol.DataProto's fields, and its ``len``, ``[int]`` (so iteration), ``[slice]``
    and ``from_dict`` as the managers use them; ``batch`` a dict where verl has a
    TensorDict (which needs tensordict)."""

    batch: dict[str, Any]
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(
        cls, tensors: dict[str, Any], non_tensors: dict[str, Any], meta_info: Any = None
    ) -> DataProto:
        return cls(dict(tensors), dict(non_tensors), dict(meta_info or {}))

    def __len__(self) -> int:
        return len(self.batch["responses"])

    def __getitem__(self, item: int | slice) -> Any:  # IndexError past the end, as verl's
        batch = {key: value[item] for key, value in self.batch.items()}
        non_tensor = {key: value[item] for key, value in self.non_tensor_batch.items()}
        if isinstance(item, slice):  # those samples, as a DataProto (the reward loop's)
            return DataProto(batch, non_tensor, self.meta_info)
        return DataProtoItem(batch, non_tensor, self.meta_info)


@dataclass
class Verl:
    version: str
    torch: Any
    DataProto: Any
    BatchRewardManager: Any
    NaiveRewardManager: Any  # the legacy one
    get_reward_manager_cls: Any
    LoopNaiveRewardManager: Any  # the reward loop's
    get_loop_reward_manager_cls: Any
    get_custom_reward_fn: Any  # how verl's trainer loads custom_reward_function


@pytest.fixture(scope="module")
def verl() -> Iterator[Verl]:
    """verl's reward-manager modules, imported from the wheel; sys.modules as it was after."""
    wheel = trainer_wheel("verl", VERL_VERSION)
    with zipfile.ZipFile(wheel) as archive:
        version = archive.read("verl/version/version").decode().strip()
    before = set(sys.modules)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "path", [str(wheel), *sys.path])  # a pure-Python wheel imports as is
        try:
            import torch

            real_torch = True
        except ImportError:
            torch, real_torch = _numpy_torch(), False
            patch.setitem(sys.modules, "torch", torch)
        for name, names in STAND_INS.items():
            if importlib.util.find_spec(name) is None:
                stand_in = types.ModuleType(name)
                stand_in.__dict__.update(names)
                patch.setitem(sys.modules, name, stand_in)
        packages = {}
        for name in PACKAGES:
            package = types.ModuleType(name)
            package.__path__ = [f"{wheel}/{name.replace('.', '/')}"]
            packages[name] = package
            patch.setitem(sys.modules, name, package)
        data_proto: Any = DataProto
        if real_torch and all(importlib.util.find_spec(m) for m in ("tensordict", "ray")):
            with contextlib.suppress(ImportError):  # verl's own, where it imports
                data_proto = importlib.import_module("verl.protocol").DataProto
        if data_proto is DataProto:
            protocol = types.ModuleType("verl.protocol")
            protocol.__dict__["DataProto"] = DataProto
            patch.setitem(sys.modules, "verl.protocol", protocol)
        packages["verl"].__dict__["DataProto"] = data_proto  # `from verl import DataProto`
        # what verl/workers/reward_manager/__init__.py does first, before its heavier imports
        registry = importlib.import_module("verl.workers.reward_manager.registry")
        manager = packages["verl.workers.reward_manager"]
        manager.__dict__.update(
            register=registry.register, get_reward_manager_cls=registry.get_reward_manager_cls
        )
        # and the reward loop's registry (its __init__ imports every manager, some need ray)
        loop_registry = importlib.import_module(
            "verl.experimental.reward_loop.reward_manager.registry"
        )
        packages["verl.experimental.reward_loop.reward_manager"].__dict__.update(
            register=loop_registry.register,
            get_reward_manager_cls=loop_registry.get_reward_manager_cls,
        )
        try:
            module = importlib.import_module
            yield Verl(
                version,
                torch,
                data_proto,
                module("verl.workers.reward_manager.batch").BatchRewardManager,
                module("verl.workers.reward_manager.naive").NaiveRewardManager,
                registry.get_reward_manager_cls,
                module("verl.experimental.reward_loop.reward_manager.naive").NaiveRewardManager,
                loop_registry.get_reward_manager_cls,
                module("verl.trainer.ppo.reward").get_custom_reward_fn,
            )
        finally:
            for name in set(sys.modules) - before:
                if name == "verl" or name.startswith("verl."):
                    del sys.modules[name]
            sys.path_importer_cache.pop(str(wheel), None)


class CharTokenizer:
    """One id per character, 0 pads: ``decode`` is all the batch manager asks of it."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return "".join(chr(int(i)) for i in ids if int(i) or not skip_special_tokens)


@dataclass
class Sample:
    solution: str
    ground_truth: str
    data_source: str = "openai/gsm8k"
    hold: bool = False
    sleep: float = 0.0  # seconds the function takes


def verl_batch(verl: Verl, samples: list[Sample]) -> Any:
    """A batch as verl's rollout hands it over: prompts padded on the left, responses on the
    right, the attention mask over both, the dataset's fields as object arrays."""
    tokenizer, torch = CharTokenizer(), verl.torch
    prompts = [tokenizer.encode(f"What is {i}/4?") for i in range(len(samples))]
    responses = [tokenizer.encode(s.solution) for s in samples]
    width, length = max(map(len, prompts)), max(map(len, responses))
    prompt_ids = [[0] * (width - len(p)) + p for p in prompts]
    response_ids = [r + [0] * (length - len(r)) for r in responses]
    mask = [
        [0] * (width - len(p)) + [1] * (len(p) + len(r)) + [0] * (length - len(r))
        for p, r in zip(prompts, responses, strict=True)
    ]
    tensors = {
        "prompts": torch.tensor(prompt_ids, dtype=torch.long),
        "responses": torch.tensor(response_ids, dtype=torch.long),
        "input_ids": torch.tensor(
            [p + r for p, r in zip(prompt_ids, response_ids, strict=True)], dtype=torch.long
        ),
        "attention_mask": torch.tensor(mask, dtype=torch.long),
    }
    non_tensors = {
        "data_source": np.array([s.data_source for s in samples], dtype=object),
        "reward_model": np.array(
            [{"style": "rule", "ground_truth": s.ground_truth} for s in samples], dtype=object
        ),
        "extra_info": np.array(
            [
                {"index": i, "split": "train", "hold": s.hold, "sleep": s.sleep}
                for i, s in enumerate(samples)
            ],
            dtype=object,
        ),
    }
    return verl.DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={})


# --- the tests ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from started("workspace.verl_fns:VerlBatchReward")


def test_verl_0_9_1_batch_manager_puts_the_servers_scores_in_its_reward_tensor(
    verl: Verl, server: Server, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    assert verl.version == VERL_VERSION
    assert verl.get_reward_manager_cls("batch") is verl.BatchRewardManager  # the name verl reads
    samples = [
        Sample("0.25", "0.25", hold=True),
        Sample("RAISE", "1"),
        Sample("0.5", "0.75", data_source="math", hold=True),  # wrong: 0.0, not failed
        Sample("0.75", "0.75", hold=True),
        Sample("1", "1", hold=True),
    ]
    url = server.url + "/"  # as given, not another test's: a shared client of its own
    # a batch of one failed sample first: its client has then read the server and seen no
    # metric name; the next failed result is finished as soon as it is read
    first = verl_compute_score_batch(["openai/gsm8k"], ["RAISE"], ["1"], url=url)
    assert (first[0]["score"], first[0]["reward_failed"]) == (0.0, 1.0)
    # the reward_kwargs verl passes to compute_score
    manager = verl.BatchRewardManager(
        tokenizer=CharTokenizer(),
        num_examine=0,
        compute_score=custom_reward_fn(verl, tmp_path, "verl_compute_score_batch", url),
        reward_fn_key="data_source",
    )
    data = verl_batch(verl, samples)
    caplog.set_level(logging.WARNING, logger="processors_base.client")
    caplog.clear()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(manager, data, return_dict=True)  # verl's trainer asks a dict
        # the failed sample's result is read first, before any metric name was seen: the
        # others wait for the RELEASE
        wait_for(lambda: "PROCESSOR_ERROR" in caplog.text, "the failed sample's result")
        server.post({"agent_output": {"messages": [{"role": "user", "content": "RELEASE"}]}})
        out = running.result(timeout=60)

    # the server's own answer to each sample alone (a failed one: 0.0)
    served = []
    for i, s in enumerate(samples):
        answer = server.post(
            {
                "ground_truth": s.ground_truth,
                "agent_output": {
                    "messages": [{"role": "assistant", "content": s.solution}],
                    "rollout_extra": {"extra_info": {"index": i}},
                },
            }
        )
        served.append(answer.json()["reward"]["reward_score"] if answer.status_code == 200 else 0.0)
    assert served == [0.25, 0.0, 0.0, 0.75, 1.0]
    # verl puts each score on the sample's last response token
    rows = np.asarray(out["reward_tensor"]).tolist()
    width = len(rows[0])
    for row, s, score in zip(rows, samples, served, strict=True):
        end = len(s.solution)
        assert row == [0.0] * (end - 1) + [score] + [0.0] * (width - end), s
    assert np.asarray(data.batch["acc"]).tolist() == served
    info = out["reward_extra_info"]
    assert info["score"] == served
    assert info["reward_failed"] == [0.0, 1.0, 0.0, 0.0, 0.0]
    # every key a list of the batch's length: the failed sample has the others' keys
    assert set(info) == {"score", "reward_failed", "index", "gsm8k", "has_rollout_scores"}
    assert all(len(values) == len(samples) for values in info.values()), info
    assert info["index"] == [0.0, 0.0, 2.0, 3.0, 4.0]  # extra_infos in the samples' order
    assert info["gsm8k"] == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert info["has_rollout_scores"] == [1.0, 0.0, 1.0, 1.0, 1.0]


def test_verl_0_9_1_batch_manager_survives_a_server_that_is_down(verl: Verl) -> None:
    samples = [Sample("0.25", "0.25"), Sample("0.5", "0.5"), Sample("1", "1")]
    manager = verl.BatchRewardManager(
        CharTokenizer(),
        0,
        verl_compute_score_batch,
        url=f"http://127.0.0.1:{free_port()}",
        timeout=5,
    )
    out = manager(verl_batch(verl, samples), return_dict=True)
    assert not np.asarray(out["reward_tensor"]).any()
    assert out["reward_extra_info"] == {"score": [0.0] * 3, "reward_failed": [1.0] * 3}


# --- the naive managers: one sample at a time, the first one failing ---------------------

# The failing sample comes first: the hook has seen no answer, no metric name, before it.
FIRST_FAILS = [
    Sample("RAISE", "1"),
    Sample("0.25", "0.25"),
    Sample("FAILED", "1"),  # a failed result
    Sample("0.5", "0.75", data_source="math"),  # wrong: 0.0, not failed
    Sample("1", "1", sleep=30),  # past the hook's timeout
    Sample("1", "1"),
]
SERVED = [0.0, 0.25, 0.0, 0.0, 0.0, 1.0]
FAILED = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
HOOK_TIMEOUT = 1.0  # seconds: +custom_reward_function.reward_kwargs.timeout=1
DECLARED = {"score", "reward_failed", "index", "gsm8k", "has_rollout_scores"}


@pytest.fixture(scope="module")
def declared() -> Iterator[Server]:
    """A function that declares its metric names (known before any sample succeeds)."""
    yield from started("workspace.verl_fns:VerlDeclaredReward")


def custom_reward_fn(verl: Verl, tmp_path: Path, hook: str, url: str, **kwargs: Any) -> Any:
    """What verl's trainer makes of ``custom_reward_function`` as docs/trainers.md sets it:
    a file naming the hook ``compute_score``, ``reward_kwargs.url`` (and ``kwargs``)."""
    path = tmp_path / "remote_reward.py"
    path.write_text(f"from processors_base.trainer_hooks import {hook}\n\ncompute_score = {hook}\n")
    config = types.SimpleNamespace(
        reward={
            "custom_reward_function": {
                "path": str(path),
                "name": "compute_score",
                "reward_kwargs": {"url": url, **kwargs},
            }
        }
    )
    return verl.get_custom_reward_fn(config)


def test_verl_0_9_1_legacy_naive_manager_has_every_key_when_the_first_sample_fails(
    verl: Verl, declared: Server, tmp_path: Path
) -> None:
    assert verl.get_reward_manager_cls("naive") is verl.NaiveRewardManager
    # a URL no other test's hook has used: its client has seen nothing yet
    compute_score = custom_reward_fn(
        verl, tmp_path, "verl_compute_score_sync", declared.url, timeout=HOOK_TIMEOUT
    )
    manager = verl.NaiveRewardManager(CharTokenizer(), 0, compute_score)
    out = manager(verl_batch(verl, FIRST_FAILS), return_dict=True)
    info = out["reward_extra_info"]
    # verl's trainer makes a column of each key: one value a sample, or its assertion fails
    assert set(info) == DECLARED
    assert all(len(values) == len(FIRST_FAILS) for values in info.values()), info
    assert info["score"] == SERVED
    assert info["reward_failed"] == FAILED
    assert info["index"] == [0.0, 1.0, 0.0, 3.0, 0.0, 5.0]  # a failed sample's: 0.0
    rows = np.asarray(out["reward_tensor"]).tolist()
    width = len(rows[0])
    for row, s, score in zip(rows, FIRST_FAILS, SERVED, strict=True):
        end = len(s.solution)
        assert row == [0.0] * (end - 1) + [score] + [0.0] * (width - end), s


def test_verl_0_9_1_reward_loop_gives_every_sample_the_first_samples_keys(
    verl: Verl, declared: Server, tmp_path: Path
) -> None:
    assert verl.get_loop_reward_manager_cls("naive") is verl.LoopNaiveRewardManager
    url = declared.url + "/"  # a client of its own, as above
    compute_score = custom_reward_fn(
        verl, tmp_path, "verl_compute_score", url, timeout=HOOK_TIMEOUT
    )
    assert inspect.iscoroutinefunction(compute_score)  # awaited by the manager, not threaded
    data = verl_batch(verl, FIRST_FAILS)

    async def run() -> list[dict[str, Any]]:
        manager = verl.LoopNaiveRewardManager({}, CharTokenizer(), compute_score)
        # as the reward loop's worker does: each sample alone, all at once
        samples = [manager.run_single(data[i : i + 1]) for i in range(len(data))]
        return list(await asyncio.gather(*samples))

    results = asyncio.run(run())
    assert [r["reward_score"] for r in results] == SERVED
    infos = [r["reward_extra_info"] for r in results]
    # the loop's manager stacks every sample's extra info by the first sample's keys: the
    # failed first sample has every key, so none would be dropped for the batch
    assert all(set(info) == DECLARED for info in infos), infos
    assert [info["reward_failed"] for info in infos] == FAILED
    assert [info["index"] for info in infos] == [0.0, 1.0, 0.0, 3.0, 0.0, 5.0]


def test_verl_0_9_1_reward_loop_survives_a_server_that_is_down(verl: Verl, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    compute_score = custom_reward_fn(verl, tmp_path, "verl_compute_score", url)
    data = verl_batch(verl, FIRST_FAILS[1:4])

    async def run() -> list[dict[str, Any]]:
        manager = verl.LoopNaiveRewardManager({}, CharTokenizer(), compute_score)
        return list(
            await asyncio.gather(*(manager.run_single(data[i : i + 1]) for i in range(len(data))))
        )

    results = asyncio.run(run())
    assert [r["reward_score"] for r in results] == [0.0] * 3
    # no name could be learned from a server that never answered: the same two keys each
    assert [r["reward_extra_info"] for r in results] == [{"score": 0.0, "reward_failed": 1.0}] * 3
