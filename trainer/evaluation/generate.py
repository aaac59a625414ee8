"""Answers generated for the eval split's prompts and scored against its references (`eval.generate`), exactly.

The prompt of an eval example is the conversation up to its last assistant turn, as the chat template rendered it at
staging; the reference is that turn. At most eval.generate.max_records examples are answered, from rows spread
evenly over the split. They are ordered by prompt length (less padding) and cut into batches of
eval.generate.batch_size; batch j is generated on rank j % world_size, left-padded, with the KV cache, stopping at the
model's stop tokens (the generation service, trainer/model/generation.py; sampled answers each with a seed of their
own). A batch is the same whatever the number of ranks, so each answer is too; every rank sums its
answers' scores (trainer/evaluation/scoring.py) and the sums are all-reduced and divided once: the figures equal one
process's.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from config.sections.results import GenerateConfig
from config.vision import IMAGE_PLACEHOLDER
from core.errors import UserError
from storage.shards import IGNORE_INDEX, Row, examples_of
from storage.split_reader import ImageSource
from trainer.evaluation.scoring import SUMS, Sums, figures, load_scorer
from trainer.images import ImageInputs
from trainer.model.generation import Generator, Pixels, Sampling, row_seed
from trainer.parallel.distributed import Dist, dist_sum, gather_objects

log = logging.getLogger(__name__)
# Answers shown to a person (the Prefect artifact, the model card), each text cut to this many characters.
SHOWN_ANSWERS = 5
SHOWN_CHARS = 600

# (example index, prompt ids, reference ids, the prompt's images: a vision-language model's, by staged name)
Prompt = tuple[int, list[int], list[int], tuple[str, ...]]
# A prompt's images as the answers show them (the decoded run of image tokens of each).
IMAGE_RUN = re.compile(r"<\|vision_start\|>(?:<\|image_pad\|>)+<\|vision_end\|>")


def last_turn(example: Row) -> tuple[list[int], list[int]] | None:
    """(prompt ids, reference ids): the ids before the example's last run of target labels, and that run (its last
    assistant turn); plain text (a target from its first token) is cut in half. None when it has no target."""
    ids, labels = example.input_ids, example.labels
    end = next((i + 1 for i in range(len(labels) - 1, -1, -1) if labels[i] != IGNORE_INDEX), 0)
    if end == 0:
        return None
    start = end
    while start > 0 and labels[start - 1] != IGNORE_INDEX:
        start -= 1
    if start == 0:
        start = max(1, end // 2)
    return list(ids[:start]), list(labels[start:end])


def prompts_of(split: Any, rows: list[int], max_records: int, image_token: int = -1) -> list[Prompt]:
    """At most `max_records` prompts, from these rows of the split (each row's examples, in order; `image_token`: a
    vision-language model's image token, which tells a packed row's images apart)."""
    out: list[Prompt] = []
    for row in rows:
        for example in examples_of([split[row]], image_token):
            cut = last_turn(example)
            if cut is not None and len(out) < max_records:
                out.append((len(out), *cut, tuple(example.images)))
    return out


def batches_of(prompts: list[Prompt], batch_size: int) -> list[list[Prompt]]:
    """The prompts ordered by length (then index) and cut into batches: the same batches on any number of ranks."""
    ordered = sorted(prompts, key=lambda p: (len(p[1]), p[0]))
    return [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]


def generate_and_score(
    model: Any,
    prompts: list[Prompt],
    cfg: GenerateConfig,
    dist: Dist,
    ids: tuple[int, Any],
    seed: int = 0,
    vision: tuple[ImageInputs, ImageSource | None] | None = None,
) -> dict[str, Any]:
    """eval.json's `generate`: the all-reduced scores of the answers to these prompts (`ids`: (pad id, tokenizer)),
    from the generation service (trainer/model/generation.py) on the model given; with eval.generate.temperature > 0
    answer i is sampled with its own seed, from `seed` and i. `vision`: a vision-language model's image inputs and
    where the split's images are: each prompt is answered with its images, shown by their names."""
    pad_id, tokenizer = ids
    scorer = load_scorer(cfg.scorer)
    generator = Generator.of(model, tokenizer, pad_id)
    sampling = Sampling(cfg.max_new_tokens, cfg.temperature)
    sums, shown, new_tokens = Sums(), [], 0
    started = time.perf_counter()
    for j, batch in enumerate(batches_of(prompts, cfg.batch_size)):
        if j % dist.world_size != dist.rank:
            continue
        pixels = batch_pixels(batch, vision)
        answers = generator.generate([p[1] for p in batch], sampling, [row_seed(seed, p[0]) for p in batch], pixels)
        for (index, prompt, reference, images), answer in zip(batch, answers, strict=True):
            question = IMAGE_RUN.sub(IMAGE_PLACEHOLDER, tokenizer.decode(prompt))
            texts = (question, *tokenizer.batch_decode([reference, answer], skip_special_tokens=True))
            sums.add(texts[0], texts[1].strip(), texts[2].strip(), scorer)
            new_tokens += len(answer)
            if index < SHOWN_ANSWERS:
                answer_doc = {"index": index, **dict(zip(("prompt", "reference", "output"), texts, strict=True))}
                shown.append(answer_doc | image_labels(images, vision))
    seconds = time.perf_counter() - started
    return reduce(sums, shown, (new_tokens, seconds), cfg, dist)


def batch_pixels(batch: list[Prompt], vision: tuple[ImageInputs, ImageSource | None] | None) -> Pixels | None:
    """The images of a batch of prompts, for the generation service (None when it holds none)."""
    names = [name for prompt in batch for name in prompt[3]]
    if vision is None or not names:
        return None
    inputs, source = vision
    if source is None:
        raise UserError("the eval prompts name images but the dataset lists none; re-stage it")
    values, grids = inputs.pixels(names, source)
    return Pixels(values, grids, inputs.image_token)


def image_labels(images: tuple[str, ...], vision: tuple[ImageInputs, ImageSource | None] | None) -> dict[str, Any]:
    """A shown answer's `images`: the names of its prompt's images (nothing for a prompt without)."""
    if not images:
        return {}
    source = vision[1] if vision is not None else None
    return {"images": [source.label(name) if source is not None else name for name in images]}


def reduce(
    sums: Sums, shown: list[dict[str, Any]], cost: tuple[int, float], cfg: GenerateConfig, dist: Dist
) -> dict[str, Any]:
    """Every rank's sums added (the user scores' names first made the same on every rank), divided once."""
    parts = gather_objects((sorted(sums.user), shown, cost[1]), dist)
    names = sorted({name for part in parts for name in part[0]})
    local = [*(sums.values[key] for key in SUMS), float(cost[0])]
    for name in names:
        local.extend(sums.user.get(name, (0.0, 0)))
    total = dist_sum(local, dist)
    user = {name: (total[len(SUMS) + 1 + 2 * i], int(total[len(SUMS) + 2 + 2 * i])) for i, name in enumerate(names)}
    seconds = max(part[2] for part in parts)
    result = figures(dict(zip(SUMS, total, strict=False)), user)
    log.info(
        "generated %d answers (%d new tokens) on %d ranks in %.1f s",
        result["records"],
        int(total[len(SUMS)]),
        dist.world_size,
        seconds,
    )
    answers = sorted((a for part in parts for a in part[1]), key=lambda a: a["index"])
    return {
        **result,
        "new_tokens": int(total[len(SUMS)]),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "seconds": round(seconds, 3),
        "answers": [shorten(answer) for answer in answers],
    }


def shorten(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer to show: the prompt's end (where the question is) and the reference's and output's starts."""
    return {
        "index": answer["index"],
        **({"images": answer["images"]} if "images" in answer else {}),
        "prompt": answer["prompt"][-SHOWN_CHARS:],
        "reference": answer["reference"][:SHOWN_CHARS],
        "output": answer["output"][:SHOWN_CHARS],
    }
