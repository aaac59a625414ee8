"""The preference objectives' reference model (trainer/objectives/preference/reference.py) on the built-in tiny model's
shape with LoRA (B away from zero, so the policy is not its base): with the adapters disabled, directly or through an
engine's `.module`, its log-probabilities are those of the same base model without LoRA, without gradients, and the
adapters are on again after; a model without adapters is refused. Under full fine-tuning the reference is the table's
rows (chosen, then rejected) instead; KTO's KL sums are policy minus reference over the mismatched sequences; and the
evaluate stage reads the eval split's table the train stage wrote, or says in one line to train first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from config.sections.model_train import TrainConfig
from core.errors import UserError
from storage.shards import IGNORE_INDEX, PAIR, Row
from tests.specs import spec_for
from trainer.loss.chunked import LossHead
from trainer.model import tiny
from trainer.model.adapters import make_trainable
from trainer.objectives.policy import Policy
from trainer.objectives.preference.batching import collate_preference
from trainer.objectives.preference.reference import (
    adapters_off,
    eval_tables,
    kl_sums,
    logps,
    reference_for,
    reference_logps,
)
from trainer.objectives.preference.reference_table import ReferenceTable, write
from trainer.parallel.distributed import Dist

VOCAB, CPU = tiny.RECIPE["vocab_size"], torch.device("cpu")
ONE = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="test", device=CPU)


class Engine:
    """What a DeepSpeed engine shows the reference: the model as `.module`, called as the model."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __call__(self, **inputs: Any) -> Any:
        return self.module(**inputs)


def base() -> Any:
    return tiny.build_model(VOCAB, pad_id=0, eos_id=1).float().eval()  # seeded: the same weights every time


@pytest.fixture(scope="module")
def model() -> Any:
    lora = make_trainable(base(), TrainConfig.model_validate({"lora": {"dropout": 0.0}}))
    torch.manual_seed(2)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return lora.float().eval()


def rows(feedback: list[int]) -> list[Row]:
    generator, out = torch.Generator().manual_seed(4), []
    for k, label in enumerate(feedback):
        p, c, r = 3 + k, 2 + 2 * k, 0 if label != PAIR else 4 - k
        ids = torch.randint(2, VOCAB, (p + c + r,), generator=generator).tolist()
        out.append(Row(ids, [IGNORE_INDEX] * p + ids[p:], [p, c, r]))
    return out


def test_the_reference_is_the_base_model_without_gradients_and_the_adapters_come_back(model: Any) -> None:
    batch = collate_preference(rows([PAIR, PAIR]), [PAIR, PAIR], 0, indices=[0, 1])
    head = LossHead.of(model, 8, one_pass_max_bytes=0)  # in chunks; the base's from full logits
    policy, counts = logps(Policy(model, CPU), batch.sequences, head)
    expected, _ = logps(Policy(base(), CPU), batch.sequences, LossHead.of(base(), 0))
    for wrapped in (model, Engine(model)):
        reference = reference_for(Policy(wrapped, CPU), batch, None, head)
        _, reference_counts = reference_logps(Policy(wrapped, CPU), batch.sequences, head)
        assert not reference.requires_grad and torch.equal(reference_counts, counts)
        assert torch.allclose(reference, expected, rtol=1e-5) and not torch.allclose(reference, policy, rtol=1e-3)
        assert torch.equal(logps(Policy(model, CPU), batch.sequences, head)[0], policy)  # the adapters are on again
    assert policy.requires_grad and counts.tolist() == [2, 4, 4, 3]


def test_a_model_without_adapters_is_refused() -> None:
    with pytest.raises(RuntimeError, match="a LoRA model is needed"), adapters_off(Policy(torch.nn.Linear(2, 2), CPU)):
        pass


def test_full_fine_tuning_reads_the_tables_rows_chosen_then_rejected() -> None:
    table = ReferenceTable(np.array([[-1.0, -2.0], [-3.0, -4.0], [-5.0, -6.0]]))
    batch = collate_preference(rows([PAIR, PAIR]), [PAIR, PAIR], 0, indices=[2, 0])
    reference = reference_for(Policy(None, CPU), batch, table, LossHead(None, 0))  # type: ignore[arg-type]  # no model is asked
    assert reference.tolist() == [-5.0, -1.0, -6.0, -2.0]


def test_ktos_kl_sums_are_policy_minus_reference_over_the_mismatched_sequences(model: Any) -> None:
    items = rows([1, 0, 1])
    batch = collate_preference(items, [1, 0, 1], 0, partners=[*items[1:], items[0]])
    assert batch.mismatched is not None
    total, units = kl_sums(Policy(model, CPU), batch, LossHead.of(model, 8, one_pass_max_bytes=0))
    full = LossHead(None, 0)
    with torch.no_grad():
        policy, reference = Policy(model, CPU), Policy(base(), CPU)
        expected = logps(policy, batch.mismatched, full)[0] - logps(reference, batch.mismatched, full)[0]
    assert units == 3 and total == pytest.approx(float(expected.sum()), rel=1e-4, abs=1e-5) and total != 0.0


def test_the_eval_table_is_read_or_its_absence_said_in_one_line(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, [f"launch.node_cache_dir={tmp_path / 'cache'}"])
    split = rows([PAIR, PAIR])
    with pytest.raises(UserError) as info:
        eval_tables(spec, split, "dpo")
    message = str(info.value)
    assert message.startswith(f"{tmp_path}/runs/r/reference/eval.npy: missing;") and "\n" not in message
    assert "full fine-tuning's dpo reference" in message and message.endswith("train the run first")
    values = np.array([[-1.5, -2.5], [-3.5, -4.5]])

    def fill(out: Any) -> None:
        out[:] = values

    write(spec.run, "eval", 2, ONE, tmp_path / "cache", fill)
    tables = eval_tables(spec, split, "dpo")
    assert list(tables) == ["eval"] and np.array_equal(tables["eval"].values, values)
