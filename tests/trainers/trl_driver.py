"""TRL's own ``GRPOTrainer``, two steps on the CPU, scored by ``trl_reward_func`` (issue 22).

Run by test_trl_own_code.py in a Python that has TRL and torch (``TRL_PYTHON``); not
collected by pytest. The model and its tokenizer are built here, tiny and untrained (no
download): a byte-level BPE trained on a few words with ``tokenizers`` and a one-layer GPT-2.
It trains twice: against the server at the first argument's URL, then against the
second's, where nothing listens. The last line printed is JSON: TRL's version, and per run
the metrics TRL logged at each step, the seconds each step took and each sample's prompt,
completion and the value the reward function gave TRL for it.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from typing import Any

import trl
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, TrainerCallback

from processors_base.trainer_hooks import trl_reward_func

# One prompt of each kind PromptKindReward knows (tests/workspace/trainer_fns.py): every
# step's batch holds them all, each twice (GRPO's group of 2).
PROMPTS = ["count", "words", "raise", "hang", "failed"]


def tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    words = [*PROMPTS, "the reward is high", "a short answer", "forty two"]
    bpe.train_from_iterator(
        words * 10,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<pad>", "<eos>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>")


class StepTimes(TrainerCallback):
    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.started = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.seconds.append(round(time.monotonic() - self.started, 3))


def recorded(reward: Any, samples: list[dict[str, Any]]) -> Any:
    """``reward`` as TRL calls it, each sample's prompt, completion and value kept."""

    def call(prompts: list[str], completions: list[str], **columns: Any) -> list[Any]:
        values = reward(prompts, completions, **columns)
        samples.extend(
            {"prompt": p, "completion": c, "value": v}
            for p, c, v in zip(prompts, completions, values, strict=True)
        )
        return values

    call.__name__ = reward.__name__  # TRL logs under it
    return call


def train(url: str, output_dir: str) -> dict[str, Any]:
    tok = tokenizer()
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=64,
        n_embd=16,
        n_layer=1,
        n_head=2,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    dataset = Dataset.from_dict({"prompt": PROMPTS, "answer": ["42"] * len(PROMPTS)})
    args = trl.GRPOConfig(
        output_dir=output_dir,
        max_steps=2,
        per_device_train_batch_size=2 * len(PROMPTS),
        num_generations=2,
        max_completion_length=8,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    times = StepTimes()
    samples: list[dict[str, Any]] = []
    trainer = trl.GRPOTrainer(
        model=GPT2LMHeadModel(config),
        # a cool-down longer than the run: one "circuit open" line, however slow the steps
        reward_funcs=[recorded(trl_reward_func(url, cool_down=600.0), samples)],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[times],
    )
    trainer.train()
    steps = [entry for entry in trainer.state.log_history if "rewards/remote_reward/mean" in entry]
    return {"steps": steps, "seconds": times.seconds, "samples": samples}


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)  # the client's lines, for the test
    url, down = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as output_dir:
        served = train(url, output_dir)
        unreachable = train(down, output_dir)
    print(json.dumps({"version": trl.__version__, "served": served, "down": unreachable}))


if __name__ == "__main__":
    main()
