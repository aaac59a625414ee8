"""Greedy completions of eval prompts (`eval.generate_samples`), for a human look at what was learned.

The prompt of an eval example is everything before its first target token (the conversation up to
the assistant's first answer; the first half of a plain-text example); the reference is that answer. Sample i is
generated on rank i % world and rank 0 writes them all, in order, to {run}/samples.jsonl.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from storage import layout
from storage.fs import write_bytes_atomic
from storage.location import join
from storage.shards import IGNORE_INDEX, Row
from storage.spec import Spec
from storage.split_reader import ImageSource
from trainer.images import ImageInputs
from trainer.model.generation import Pixels
from trainer.parallel.distributed import Dist, gather_objects


def split_prompt(example: Row) -> tuple[list[int], list[int]]:
    """(prompt ids, reference ids): the ids before the first target label, and that first answer's ids. Plain
    text (data.format text) is a target from its first token: its first half is the prompt."""
    ids, labels = example.input_ids, example.labels
    first = next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(ids))
    if first == 0:
        first = max(1, len(ids) // 2)
    end = next((i for i in range(first, len(labels)) if labels[i] == IGNORE_INDEX), len(labels))
    return list(ids[:first]), list(labels[first:end])


@torch.no_grad()
def greedy(
    model: Any, prompt: list[int], max_new_tokens: int, pad_id: int, device: torch.device, pixels: Pixels | None = None
) -> list[int]:
    """The greedy continuation of one prompt (new tokens only), with its images (`pixels`) when it has any."""
    input_ids = torch.tensor([prompt], dtype=torch.long, device=device)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        **(pixels.inputs(input_ids) if pixels is not None else {}),
    )
    return out[0, len(prompt) :].tolist()


def example_pixels(example: Row, vision: tuple[ImageInputs, ImageSource | None] | None) -> Pixels | None:
    """An example's images for generation (None when it has none)."""
    if vision is None or not example.images or vision[1] is None:
        return None
    values, grids = vision[0].pixels(example.images, vision[1])
    return Pixels(values, grids, vision[0].image_token)


def write_samples(
    model: Any,
    examples: list[Row],
    spec: Spec,
    dist: Dist,
    pad_id: int,
    vision: tuple[ImageInputs, ImageSource | None] | None = None,
) -> str | None:
    """Generate eval.generate_samples completions across ranks (with each prompt's images: `vision`, a
    vision-language model's image inputs and where the split's images are); rank 0 writes them. Returns the URL."""
    from transformers import AutoTokenizer

    count = min(spec.config.eval.generate_samples, len(examples))
    if count == 0:
        return None
    tokenizer = AutoTokenizer.from_pretrained(spec.model_path, trust_remote_code=spec.config.model.trust_remote_code)
    mine = []
    for index in range(dist.rank, count, dist.world_size):
        prompt, reference = split_prompt(examples[index])
        pixels = example_pixels(examples[index], vision)
        completion = greedy(model, prompt, spec.config.eval.max_new_tokens, pad_id, dist.device, pixels)
        mine.append(
            {
                "index": index,
                "prompt": tokenizer.decode(prompt),
                "completion": tokenizer.decode(completion),
                "reference": tokenizer.decode(reference),
                "completion_ids": completion,
            }
        )
    rows = sorted((row for part in gather_objects(mine, dist) for row in part), key=lambda r: r["index"])
    url = join(spec.run, layout.SAMPLES)
    if dist.is_main:
        lines = [json.dumps({"schema": layout.SAMPLES_SCHEMA, **row}, ensure_ascii=False) for row in rows]
        write_bytes_atomic(url, ("\n".join(lines) + "\n").encode("utf-8"))
    return str(url)
