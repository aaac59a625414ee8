"""Baseline for bench_train.py: the Hugging Face Trainer driving the same model, LoRA config, DeepSpeed
config, data and world size as a Tandem spec. Run on every rank under torchrun:

    torchrun --nnodes 2 --nproc-per-node 1 ... tests/benchmarks/hf_trainer_baseline.py --spec SPEC --out FILE

It uses the HF Trainer as users of Qwen's finetune.py do (padding to the longest example of each
micro-batch, no length grouping, the model's own loss over full logits). The staged rows are collated by Tandem's own
`collate`, so a packed dataset (data.packing: several examples a row) trains the same thing on both sides: each
example to itself (position ids restarting at every example, no attention mask, from which transformers builds the
block-diagonal mask) and no example's first token predicted from the one before. On CPU the Trainer needs
accelerate's state configured first, or every rank believes it is alone (a known limitation of the HF Trainer with
DeepSpeed on CPU): PartialState(cpu=True, backend="gloo") + DEEPSPEED. On a GPU it runs as users run it, in bf16
as Tandem's trainer does. Rank 0 writes {"tokens": non-pad tokens seen, "seconds": summed step times, "steps": n,
"step_seconds": each step's time, "padding_fraction": of the positions collated, "liger": whether Liger's kernels
ran, "flattened": whether the rows were flattened} (and on a GPU "peak_memory_gb", the most its tensors held) to
--out, skipping the first `--warmup` steps.

`--best` runs the HF Trainer at its best, as LLaMA-Factory's and axolotl's users run it: `use_liger_kernel=True`
(Liger's kernels patched in by the Trainer itself; CUDA only: on a CPU it is left out and the result says
`"liger": false`) and padding-free packing with transformers' own `DataCollatorWithFlattening`: each micro-batch's
examples (a packed row split back into its examples) concatenated into one row without padding, positions
restarting at each example, each example's first label masked.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType
from transformers import DataCollatorWithFlattening, Trainer, TrainerCallback, TrainingArguments

from config.deepspeed import read_deepspeed_json
from storage.local_dataset import open_split
from storage.location import location_argument
from storage.node_cache import node_cache
from storage.shards import Row
from storage.spec import load_spec
from trainer.data import collate
from trainer.model.adapters import make_trainable
from trainer.model.load import ensure_pad_token_id, load_base


class StepClock(TrainerCallback):
    """Times every optimizer step; tokens and positions are counted by the collator."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.started = warmup, 0.0
        self.step_seconds: list[float] = []  # after the warm-up
        self.at_warmup = dict.fromkeys(COUNTER, 0)

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step > self.warmup:
            self.step_seconds.append(time.perf_counter() - self.started)
        elif state.global_step == self.warmup:
            self.at_warmup = dict(COUNTER)


COUNTER = {"tokens": 0, "positions": 0}  # non-pad tokens and all positions (padding included) collated


def main() -> None:
    """Train with the HF Trainer and write the throughput measurement."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True, type=location_argument)
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--best", action="store_true", help="Liger's kernels (CUDA) and padding-free flattening")
    args = parser.parse_args()
    spec, _ = load_spec(args.spec)
    train = spec.config.train
    cuda = torch.cuda.is_available()
    if not cuda:
        state = PartialState(cpu=True, backend="gloo")
        state.distributed_type = DistributedType.DEEPSPEED
    model = make_trainable(load_base(spec.model_path, method=train.method, bf16=cuda), train)
    ds = read_deepspeed_json(spec.config.deepspeed.config)  # "auto" values: HF fills them from its arguments
    examples = open_split(spec.dataset_dir, "train", node_cache(spec.config.launch))
    # A list of rows is a map-style dataset for the Trainer: the `datasets` package is not needed (a GPU machine
    # may lack it).
    dataset = [row._asdict() for row in examples]
    pad_id = ensure_pad_token_id(model, spec.model_path)

    collator = flattening_collator() if args.best else padding_collator(pad_id)
    clock = StepClock(args.warmup)
    # The Trainer makes its output folder even when it saves nothing: a temporary one, removed after the run.
    output_dir = tempfile.mkdtemp(prefix=f"hf-baseline-{spec.run_id}-")
    arguments = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=train.micro_batch_size,
        gradient_accumulation_steps=train.gradient_accumulation_steps,
        max_steps=spec.total_steps,
        learning_rate=train.learning_rate,
        lr_scheduler_type=train.lr_scheduler,
        warmup_steps=math.ceil(train.warmup_ratio * spec.total_steps),
        weight_decay=train.weight_decay,
        max_grad_norm=train.max_grad_norm,
        seed=train.seed,
        adam_beta1=train.adam_beta1,
        adam_beta2=train.adam_beta2,
        adam_epsilon=train.adam_epsilon,
        deepspeed=ds,
        report_to=[],
        save_strategy="no",
        logging_steps=1000,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        bf16=cuda,
        torch_compile=train.compile,  # the Trainer's own torch.compile, where the spec asks Tandem's
        accelerator_config={"use_configured_state": not cuda},
        use_liger_kernel=args.best and cuda,
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=dataset, data_collator=collator, callbacks=[clock])
    try:
        trainer.train()
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    write_result(trainer, clock, args.out, {"liger": args.best and cuda, "flattened": args.best})


def padding_collator(pad_id: int) -> Callable[[list[dict]], dict]:
    """Pad to the longest row, as ours does, and count the real tokens; packed rows get ours' restarting position ids
    (no mask) and their examples' first labels masked, so both trainers learn the same targets."""

    def collator(features: list[dict]) -> dict[str, torch.Tensor]:
        batch = collate([Row(**f) for f in features], pad_id)
        COUNTER["tokens"] += int(batch.attention_mask.sum())
        COUNTER["positions"] += batch.attention_mask.numel()
        return {**batch.model_inputs(torch.device("cpu")), "labels": batch.labels}

    return collator


def flattening_collator() -> Callable[[list[dict]], dict]:
    """transformers' DataCollatorWithFlattening over the micro-batch's examples (packed rows split at their segments):
    one row, no padding, positions restarting per example, each example's first label -100 (as ours masks it)."""
    flatten = DataCollatorWithFlattening(return_position_ids=True, separator_id=-100)

    def collator(features: list[dict]) -> dict[str, torch.Tensor]:
        examples = []
        for feature in features:
            start = 0
            for length in feature["segments"]:
                end = start + length
                examples.append(
                    {"input_ids": list(feature["input_ids"][start:end]), "labels": list(feature["labels"][start:end])}
                )
                start = end
        batch = flatten(examples)
        COUNTER["tokens"] += batch["input_ids"].numel()
        COUNTER["positions"] += batch["input_ids"].numel()
        return batch

    return collator


def write_result(trainer: Trainer, clock: StepClock, out: str, settings: dict) -> None:
    """Rank 0 writes the measurement: every rank's tokens and positions after the warm-up, summed."""
    cuda = torch.cuda.is_available()
    counts = torch.tensor(
        [COUNTER[key] - clock.at_warmup[key] for key in ("tokens", "positions")],
        dtype=torch.float64,
        device="cuda" if cuda else "cpu",
    )
    torch.distributed.all_reduce(counts)
    tokens, positions = counts.tolist()
    if trainer.is_world_process_zero():
        result = {
            "tokens": tokens,
            "seconds": sum(clock.step_seconds),
            "steps": len(clock.step_seconds),
            "step_seconds": clock.step_seconds,
            "padding_fraction": 1 - tokens / max(positions, 1.0),
            **settings,
        }
        if cuda:
            result["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        with open(out, "w") as handle:
            json.dump(result, handle)


if __name__ == "__main__":
    main()
