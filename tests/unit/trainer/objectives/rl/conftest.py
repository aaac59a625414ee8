"""What the online RL objective's unit tests share: the built-in tiny model with LoRA (its B drawn away from zero, so
that the policy is not its base), its tokenizer, a split of prompt rows written as staging writes them, and a GRPO
objective started on it without DeepSpeed (world 1, or a rank of tests/gloo.py's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from config.sections.model_train import TrainConfig
from config.sections.results import GenerateConfig
from storage.location import Location
from storage.shards import PromptWriter
from storage.split_reader import Shard, Split

# A reward every completion gets a different value of (its characters, tenths): groups always have a spread.
LENGTHS = "def chars(completions, **kwargs):\n    return [len(c[0]['content']) / 10 for c in completions]\n"
QUESTIONS = [f"What is {a} plus {b}?" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4)]]


def load_policy(model_dir: str) -> Any:
    """The tiny model with LoRA as the trainer makes it trainable, B drawn away from zero, float32, seeded."""
    from transformers import AutoModelForCausalLM

    from trainer.model.adapters import make_trainable

    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = make_trainable(model, TrainConfig.model_validate({"lora": {"dropout": 0.0}}))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return model


def write_prompts(model_dir: str, folder: Path) -> Split:
    """A split of prompt rows (staging/prompts.py's form) of QUESTIONS, each with its answer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    writer = PromptWriter(Location(str(folder)), "train", 100, "blake3", lambda _: None)
    for index, question in enumerate(QUESTIONS):
        messages = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = np.array(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int32)
        a, b = (int(x) for x in question.removeprefix("What is ").removesuffix("?").split(" plus "))
        record = {"location": f"q.jsonl:{index + 1}", "prompt": messages, "columns": {"answer": str(a + b)}}
        writer.add_prompts(ids, np.array([len(ids)]), np.array([False]), [json.dumps(record)])
    writer.close()
    return Split([Shard(folder / "train" / "shard-00000.arrow")], len(QUESTIONS))


def started(model_dir: str, rl: dict[str, Any], method: str = "lora", seed: int = 3) -> Any:
    """A GRPO objective with train.rl `rl` (a file's reward of the completions' lengths beside accuracy unless given),
    started for a model without DeepSpeed."""
    from transformers import AutoTokenizer

    from storage.rewards import stage_rewards
    from trainer.objectives.rl.objective import Grpo, Runtime
    from trainer.objectives.rl.reward_funcs import load_rewards

    storage = Path(model_dir).parent / "rl-storage"
    storage.mkdir(exist_ok=True)
    (storage / "lengths.py").write_text(LENGTHS)
    settings = {"rewards": ["accuracy", f"{storage}/lengths.py:chars"], "max_completion_length": 6, **rl}
    train = TrainConfig.model_validate({"objective": "grpo", "method": method, "seed": seed, "rl": settings})
    grpo = Grpo.of(train)
    refs = stage_rewards(train.rl.parsed_rewards, Location(str(storage)))
    rewards = load_rewards(train.rl, refs, Location(str(storage)))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    grpo.runtime = Runtime(tokenizer, rewards, tokenizer.pad_token_id, False, None, seed, GenerateConfig())
    return grpo


@pytest.fixture(scope="module")
def prompts(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Split:
    return write_prompts(tiny_model, tmp_path_factory.mktemp("prompts"))
