"""Baseline for bench_train.py: the Hugging Face Trainer driving the same model, LoRA config, DeepSpeed
config, data and world size as a Tandem spec. Run on every rank under torchrun:

    torchrun --nnodes 2 --nproc-per-node 1 ... tests/benchmarks/hf_trainer_baseline.py --spec SPEC --out FILE

It uses the HF Trainer as users of Qwen's finetune.py do (padding to the longest example of each
micro-batch, no length grouping, the model's own loss over full logits). On CPU the Trainer needs accelerate's state
configured first, or every rank believes it is alone (a known limitation of the HF Trainer with DeepSpeed on CPU):
PartialState(cpu=True, backend="gloo") + DEEPSPEED. On a GPU it runs as users run it, in bf16 as Tandem's trainer does.
Rank 0 writes {"tokens": non-pad tokens seen, "seconds": summed step times, "steps": n} (and on a GPU
"peak_memory_gb", the most its tensors held) to --out, skipping the first `--warmup` steps.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType
from transformers import Trainer, TrainerCallback, TrainingArguments

from config.deepspeed import read_deepspeed_json
from storage.spec import load_spec
from storage.shards import row
from trainer.data import collate, load_split
from trainer.model import load_base, make_trainable


class StepClock(TrainerCallback):
    """Times every optimizer step; tokens are counted by the collator."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.seconds, self.started, self.steps = warmup, 0.0, 0.0, 0
        self.tokens_at_warmup = 0

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201 - HF callback signature
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        if state.global_step > self.warmup:
            self.seconds += time.perf_counter() - self.started
            self.steps += 1
        elif state.global_step == self.warmup:
            self.tokens_at_warmup = COUNTER["tokens"]


COUNTER = {"tokens": 0}


def main() -> None:
    """Train with the HF Trainer and write the throughput measurement."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    spec, _ = load_spec(args.spec)
    train = spec.config.train
    cuda = torch.cuda.is_available()
    if not cuda:
        state = PartialState(cpu=True, backend="gloo")
        state.distributed_type = DistributedType.DEEPSPEED
    model = make_trainable(load_base(spec.model_path, method=train.method, bf16=cuda), train)
    ds = read_deepspeed_json(spec.config.deepspeed.config)  # "auto" values: HF fills them from its arguments
    examples = load_split(spec.dataset.url, "train")
    # A list of rows is a map-style dataset for the Trainer: the `datasets` package is not needed (a GPU machine
    # may lack it).
    dataset = [{"input_ids": ids, "labels": labels} for ids, labels in examples]
    pad_id = int(model.config.pad_token_id)

    def collator(features: list[dict]) -> dict[str, torch.Tensor]:
        """Pad to the longest example, as ours does, and count the real tokens."""
        batch = collate([row(f["input_ids"], f["labels"]) for f in features], pad_id)
        COUNTER["tokens"] += int(batch.attention_mask.sum())
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "labels": batch.labels}

    clock = StepClock(args.warmup)
    arguments = TrainingArguments(
        output_dir=f"/tmp/hf-baseline-{spec.run_id}", per_device_train_batch_size=train.micro_batch_size,
        gradient_accumulation_steps=train.gradient_accumulation_steps, max_steps=spec.total_steps,
        learning_rate=train.learning_rate, lr_scheduler_type=train.lr_scheduler,
        warmup_steps=math.ceil(train.warmup_ratio * spec.total_steps), weight_decay=train.weight_decay,
        max_grad_norm=train.max_grad_norm, seed=train.seed, adam_beta1=train.adam_beta1,
        adam_beta2=train.adam_beta2, adam_epsilon=train.adam_epsilon, deepspeed=ds, report_to=[], save_strategy="no",
        logging_steps=1000, dataloader_num_workers=0, remove_unused_columns=False, bf16=cuda,
        accelerator_config={"use_configured_state": not cuda},
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=dataset, data_collator=collator, callbacks=[clock])
    trainer.train()
    tokens = torch.tensor([COUNTER["tokens"] - clock.tokens_at_warmup], dtype=torch.float64,
                          device="cuda" if cuda else "cpu")
    torch.distributed.all_reduce(tokens)
    if trainer.is_world_process_zero():
        result = {"tokens": tokens.item(), "seconds": clock.seconds, "steps": clock.steps}
        if cuda:
            result["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        with open(args.out, "w") as handle:
            json.dump(result, handle)


if __name__ == "__main__":
    main()
