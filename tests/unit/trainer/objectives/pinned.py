"""Every objective's numbers on one fixed batch, pinned: SFT's summed loss (from full logits, and from the last hidden
states in one pass and in chunks), the evaluation's sums and metrics (loss, perplexity, token accuracy), and DPO's,
IPO's, KTO's and ORPO's losses with their metrics (rewards, reward accuracy and margin, log-probabilities per token,
KTO's reference point), each the evaluation of a real split of preference rows in micro-batches of unequal widths,
their log-probabilities taken from full logits and from the last hidden states (the same literals).

The model is the built-in tiny model's shape with LoRA (its B seeded away from zero, so that the policy is not its
reference), in float32 on the CPU, seeded; the rows are seeded too, part random tokens and part the model's own greedy
continuation (so that token accuracy counts some right predictions). The literals were computed once by the code
these objectives had before they moved into trainer/objectives/ (code whose DPO, IPO, KTO and ORPO and whose
evaluation were checked against TRL 1.16 and plain transformers), and hold within float32 rounding: RELATIVE 1e-6, or
ABSOLUTE 4e-6 for the small values that are differences of float32 log-probability sums (rewards, their margin, KTO's
reference point), whose rounding is that of the sums, not of the difference (integers exactly). Which rounding a sum
gets depends on the CPU's vector width: rerun on an AMD EPYC with AVX-512, KTO's `kl` (0.021874) moved by 1.9e-6, one
unit in the last place of a float32 sum between 16 and 32 (8.7e-5 of itself), and the rewards by 4.3e-6 of
themselves (3.8e-7); every other value stayed within 2e-7 of itself. A
change that moves any of them changes what a user's run computes: it needs a reason, not new literals.

The tests are the objectives' own (objectives/test_sft.py, preference/test_pairs.py, preference/test_kto.py); this
module builds their model and batches. Only `measure_*` below reach into the trainer: the values and the tolerance stay
as they are whatever the layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from config.sections.model_train import TrainConfig
from storage.location import Location
from storage.shards import IGNORE_INDEX, PAIR, PreferenceWriter, Row
from storage.split_reader import Shard, Split
from trainer.data import collate
from trainer.loss.chunked import LossHead
from trainer.model import tiny
from trainer.model.adapters import make_trainable
from trainer.objectives.base import EvalOptions
from trainer.objectives.policy import Policy
from trainer.objectives.registry import build as build_objective
from trainer.objectives.sft import summed_loss
from trainer.parallel.distributed import Dist

RELATIVE = 1e-6  # float32 rounding of sums over a few hundred tokens
ABSOLUTE = 4e-6  # two units in the last place of a float32 log-probability sum of 16 to 32, which differences keep
VOCAB = tiny.RECIPE["vocab_size"]
CPU = torch.device("cpu")
ONE = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="test", device=CPU)
CHUNK = 16  # target tokens a chunk: the fixed batch's targets make several chunks, the last one short
BETA, SMOOTHING, W_D, W_U = 0.3, 0.1, 1.3, 0.7
EVAL_BATCH = 4  # 6 units: micro-batches of 4 and 2


def build() -> Any:
    """The tiny model with LoRA as the trainer makes it trainable; B drawn away from zero."""
    torch.manual_seed(11)
    model = make_trainable(
        tiny.build_model(VOCAB, pad_id=0, eos_id=1), TrainConfig.model_validate({"lora": {"dropout": 0.0}})
    )
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return model.float().eval()


@torch.no_grad()
def greedy(model: Any, prompt: list[int], count: int) -> list[int]:
    """The model's own `count` next tokens after `prompt`, one argmax at a time."""
    ids = list(prompt)
    for _ in range(count):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def tokens(generator: torch.Generator, count: int) -> list[int]:
    return torch.randint(2, VOCAB, (count,), generator=generator).tolist()


def supervised_rows(model: Any) -> list[Row]:
    """5 rows of unequal lengths: a masked prompt, then an answer of the model's greedy tokens and random ones."""
    generator = torch.Generator().manual_seed(3)
    rows = []
    for prompt_len, greedy_len, random_len in ((7, 6, 20), (12, 4, 9), (5, 8, 3), (9, 3, 14), (6, 5, 6)):
        prompt = tokens(generator, prompt_len)
        answer = greedy(model, prompt, greedy_len) + tokens(generator, random_len)
        rows.append(Row(prompt + answer, [IGNORE_INDEX] * prompt_len + answer, [prompt_len + len(answer)]))
    return rows


def preference_split(tmp_path: Path, *, pairs: bool) -> Split:
    """6 preference rows as staged shards: pairs, or KTO answers labelled true, false, true, ..."""
    generator = torch.Generator().manual_seed(7 if pairs else 5)
    writer = PreferenceWriter(Location(str(tmp_path)), "eval", 100, "blake3", lambda entry: None)
    for k in range(6):
        p, c, r = (int(torch.randint(3, 12, (1,), generator=generator)) for _ in range(3))
        prompt, chosen, rejected = tokens(generator, p), tokens(generator, c), tokens(generator, r) if pairs else []
        answers = chosen + rejected
        writer.add_rows(
            np.array(prompt + answers, dtype=np.int64),
            np.array([IGNORE_INDEX] * p + answers, dtype=np.int64),
            np.array([[p, c, len(rejected)]], dtype=np.int64),
            np.array([PAIR if pairs else (k + 1) % 2], dtype=np.int64),
            np.zeros(1, dtype=bool),
        )
    [entry] = writer.close()
    return Split([Shard(tmp_path / entry["path"])], 6)


def measure_sft_losses(model: Any, rows: list[Row]) -> dict[str, float]:
    """The summed training loss of one micro-batch of `rows`, by each way the trainer takes it."""
    batch = collate(rows, pad_id=0)
    heads = {
        "full logits": LossHead.of(model, 0),
        "one pass": LossHead.of(model, CHUNK),
        "chunked": LossHead.of(model, CHUNK, one_pass_max_bytes=0),
    }
    with torch.no_grad():
        return {name: float(summed_loss(Policy(model, CPU), batch, head)) for name, head in heads.items()}


def measure_sft_eval(model: Any, rows: list[Row], chunk_tokens: int) -> dict[str, Any]:
    """The evaluation's metrics of `rows` in micro-batches of 2."""
    objective = build_objective(TrainConfig.model_validate({"loss_chunk_tokens": chunk_tokens}))
    return dict(objective.evaluate(model, rows, range(len(rows)), ONE, EvalOptions(2, 0)))


def measure_preference(model: Any, split: Split, name: str, chunk_tokens: int) -> dict[str, Any]:
    """The objective's evaluation of every row of `split`, its log-probabilities taken as train.loss_chunk_tokens
    `chunk_tokens` says (0: from full logits; else from the last hidden states)."""
    settings = {"beta": BETA, "label_smoothing": SMOOTHING if name == "dpo" else 0.0}
    settings |= {"desirable_weight": W_D, "undesirable_weight": W_U}
    config = {"objective": name, "preference": settings, "loss_chunk_tokens": chunk_tokens}
    objective = build_objective(TrainConfig.model_validate(config))
    return dict(objective.evaluate(model, split, range(len(split)), ONE, EvalOptions(EVAL_BATCH, 0)))


def assert_pinned(got: dict[str, Any], pinned: dict[str, Any]) -> None:
    """Every pinned value within RELATIVE or ABSOLUTE (integers and strings exactly), and nothing else reported."""
    assert got.keys() == pinned.keys()
    for key, value in pinned.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=RELATIVE, abs=ABSOLUTE), key
        else:
            assert got[key] == value, key
