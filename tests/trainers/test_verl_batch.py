"""verl 0.9.1's own ``BatchRewardManager`` (``reward_manager=batch``) scoring through
``verl_compute_score_batch`` against a real served function (issue 22).

verl's code comes from its wheel (``TRAINER_WHEELS``, see ``trainer_wheels.py``), imported
from the wheel itself:
its reward-manager registry, abstract class and batch manager, without running
``verl/__init__.py`` (which pulls in ray, tensordict and transformers). Torch is used when
installed; without it, a numpy stand-in of the few torch calls the manager makes, and a
stand-in of verl's ``DataProto`` (which needs tensordict) holding what the manager reads.
Without the wheel these tests skip, saying so.

In 0.9.1 the manager is the one ``verl.workers.reward_manager`` registers as ``batch``;
verl's trainer reaches that registry through ``reward_model.reward_manager=batch`` up to
0.6 (its batch manager's scoring is the same there), and from 0.7 through its reward loop,
which has no ``batch`` manager.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import importlib.util
import logging
import sys
import types
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from conftest import Server, free_port
from helpers import wait_for
from trainer_wheels import needs_wheel
from trainer_wheels import wheel as trainer_wheel

from processors_base.trainer_hooks import verl_compute_score_batch

VERL_VERSION = "0.9.1"  # the release these tests prove
pytestmark = needs_wheel("verl", VERL_VERSION)
PACKAGES = ("verl", "verl.workers", "verl.workers.reward_manager")


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
    """verl.protocol.DataProto's fields, and its ``len``, ``[int]`` (so iteration) and
    ``from_dict`` as the batch manager uses them; ``batch`` a dict where verl has a
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

    def __getitem__(self, item: int) -> DataProtoItem:  # IndexError past the end, as verl's
        batch = {key: value[item] for key, value in self.batch.items()}
        non_tensor = {key: value[item] for key, value in self.non_tensor_batch.items()}
        return DataProtoItem(batch, non_tensor, self.meta_info)


@dataclass
class Verl:
    version: str
    torch: Any
    DataProto: Any
    BatchRewardManager: Any
    get_reward_manager_cls: Any


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
        packages = {}
        for name in PACKAGES:  # the packages without their __init__: no ray, no transformers
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
        try:
            batch = importlib.import_module("verl.workers.reward_manager.batch")
            yield Verl(
                version,
                torch,
                data_proto,
                batch.BatchRewardManager,
                registry.get_reward_manager_cls,
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
            [{"index": i, "split": "train", "hold": s.hold} for i, s in enumerate(samples)],
            dtype=object,
        ),
    }
    return verl.DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={})


# --- the tests ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    server = Server("workspace.verl_fns:VerlBatchReward")
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()


def test_verl_0_9_1_batch_manager_puts_the_servers_scores_in_its_reward_tensor(
    verl: Verl, server: Server, caplog: pytest.LogCaptureFixture
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
        compute_score=verl_compute_score_batch,
        reward_fn_key="data_source",
        url=url,
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
