"""`python -m trainer.evaluate` under real torchrun ranks (gloo): exact all-reduced metrics whatever the
world size, checkpoints evaluated like their exports, greedy samples, and refusals with one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from config.methods import FULL
from core.errors import UserError
from tests.distributed.harness import Run, Staged, evaluate
from tests.lm_tasks import ANSWER_TASK, CHOICE_TASK, QUESTIONS

METRICS = ("loss", "perplexity", "token_accuracy")
COUNTS = ("target_tokens", "correct_tokens", "examples")


def samples(run: Run) -> list[dict]:
    return [json.loads(line) for line in (run.run_dir / "samples.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def lora(reference: Run) -> Run:
    """The session's reference run (tests/distributed/conftest.py): ZeRO-2 + LoRA on 2 ranks, 12 steps, checkpoints
    8 and 12 kept; its spec asks for 3 greedy samples and eval batches of 4."""
    return reference


@pytest.fixture(scope="module")
def by_world(lora: Run) -> dict[int, tuple[dict, list[dict]]]:
    """(eval.json, samples) of final/ evaluated on 1 and 3 ranks, and of checkpoint step 12 on 2 ranks: each world
    size once, and the checkpoint (the same weights as final/) against the export on another world size."""
    out = {}
    for world, model in ((1, lora.run_dir / "final"), (3, lora.run_dir / "final"), (2, lora.checkpoint(12))):
        out[world] = evaluate(lora, model, world), samples(lora)
    return out


def test_eval_split_size_divides_by_neither_2_nor_3(staged: Staged) -> None:
    manifest = json.loads((Path(staged.dataset.url) / "manifest.json").read_text())
    records = manifest["splits"]["eval"]["records"]
    assert records % 2 and records % 3, f"the exactness test needs an eval split not divisible by 2 or 3, got {records}"


@pytest.mark.multirun
def test_metrics_are_identical_on_1_2_and_3_ranks(by_world, staged: Staged) -> None:
    """Exact: the 2-rank result is of the checkpoint, so it also holds the checkpoint to the export."""
    single = by_world[1][0]
    split = json.loads((Path(staged.dataset.url) / "manifest.json").read_text())["splits"]["eval"]
    assert single["examples"] == split["records"] and single["target_tokens"] == split["target_tokens"]
    for world in (2, 3):
        result = by_world[world][0]
        assert result["world_size"] == world
        assert {k: result[k] for k in COUNTS} == {k: single[k] for k in COUNTS}  # no example lost or duplicated
        assert_close([result[k] for k in METRICS], [single[k] for k in METRICS], rtol=1e-7, atol=0)
    assert single["loss"] == pytest.approx(single["loss_sum"] / single["target_tokens"], rel=1e-12)
    assert single["token_accuracy"] == single["correct_tokens"] / single["target_tokens"]


@pytest.mark.multirun
def test_greedy_samples_are_written_and_do_not_depend_on_the_world_size(by_world) -> None:
    one, three = by_world[1][1], by_world[3][1]
    assert [s["index"] for s in one] == [0, 1, 2]
    assert all(s["prompt"] and s["reference"] and 0 < len(s["completion_ids"]) <= 12 for s in one)
    assert [s["completion_ids"] for s in three] == [s["completion_ids"] for s in one]
    assert all(s["prompt"].endswith("assistant\n") for s in one)  # up to where the assistant's answer begins
    assert all(s["reference"].count("<|im_end|>") == 1 for s in one)  # the first answer only


@pytest.mark.multirun
def test_generated_answers_score_the_same_on_1_2_and_3_ranks(by_world) -> None:
    """eval.generate: each rank answers its batches, the score sums are all-reduced; the figures and the answers shown
    equal one process's (the 2-rank result is of the checkpoint, the same weights)."""
    single = by_world[1][0]["generate"]
    assert single["records"] == 9 and 0 < single["new_tokens"] <= 9 * 8 and single["tool_call_records"] == 0
    assert 0 <= single["rouge_l_f1"] <= 1 and single["exact_match"] <= single["normalized_exact_match"]
    assert [a["index"] for a in single["answers"]] == [0, 1, 2, 3, 4]
    assert all(a["prompt"].endswith("assistant\n") and a["reference"] for a in single["answers"])
    exact = ("records", "exact_match", "normalized_exact_match", "new_tokens", "answers")
    for world in (2, 3):
        result = by_world[world][0]["generate"]
        assert {k: result[k] for k in exact} == {k: single[k] for k in exact}
        assert result["rouge_l_f1"] == pytest.approx(single["rouge_l_f1"], rel=1e-12)  # float sums in another order


@pytest.mark.multirun
def test_benchmark_tasks_score_the_same_on_1_2_and_3_ranks(by_world) -> None:
    """eval.tasks: lm-evaluation-harness shares each task's 7 documents across the ranks (unevenly: padded) and
    rank 0 aggregates every document's result, so the figures equal one process's (the 2-rank result is of the
    checkpoint, the same weights)."""
    single = by_world[1][0]
    assert set(single["tasks"]) == {CHOICE_TASK, ANSWER_TASK}
    per_task = single["tasks_detail"]["per_task"]
    assert per_task[CHOICE_TASK]["samples"] == per_task[ANSWER_TASK]["samples"] == len(QUESTIONS)
    for world in (2, 3):
        assert by_world[world][0]["tasks"] == single["tasks"], world
        theirs = by_world[world][0]["tasks_detail"]["per_task"]
        assert {t: theirs[t]["samples"] for t in theirs} == {t: per_task[t]["samples"] for t in per_task}


@pytest.mark.multirun
def test_checkpoint_eval_equals_final_eval_zero2(by_world) -> None:
    result, final = by_world[2][0], by_world[1][0]
    assert result["model_kind"] == "checkpoint" and final["model_kind"] == "export"
    assert {k: result[k] for k in COUNTS} == {k: final[k] for k in COUNTS}
    assert_close([result[k] for k in METRICS], [final[k] for k in METRICS], rtol=1e-7, atol=0)


@pytest.mark.multirun
def test_checkpoint_eval_equals_final_eval_zero3(zero3: Run) -> None:
    from_checkpoint = evaluate(zero3, zero3.checkpoint(12), 2)
    from_final = evaluate(zero3, zero3.run_dir / "final", 2)
    assert from_checkpoint["model_kind"] == "checkpoint" and from_final["model_kind"] == "export"
    assert_close([from_checkpoint[k] for k in METRICS], [from_final[k] for k in METRICS], rtol=1e-7, atol=0)
    in_memory = next(r for r in zero3.metrics() if r.get("event") == "final_eval")
    assert_close(from_final["loss"], in_memory["loss"], rtol=1e-5, atol=0)


def test_an_incomplete_or_foreign_model_is_refused(lora: Run, tmp_path) -> None:
    from storage.location import Location
    from trainer.evaluation.load import load_for_eval

    partial = tmp_path / "step-00000012"
    shutil.copytree(lora.checkpoint(12), partial, symlinks=True)
    (partial / "COMPLETE").unlink()
    with pytest.raises(UserError, match=r"the checkpoint is not complete \(no COMPLETE matching its manifest.json\)"):
        load_for_eval(Location(str(partial)), lora.spec, torch.device("cpu"))
    with pytest.raises(UserError, match=r"only complete checkpoints .* and exports .* can be evaluated"):
        load_for_eval(Location(str(tmp_path)), lora.spec, torch.device("cpu"))
    full_spec = lora.spec.model_copy(
        update={
            "config": lora.spec.config.model_copy(
                update={"train": lora.spec.config.train.model_copy(update={"method": FULL})}
            )
        }
    )
    with pytest.raises(UserError, match="a lora checkpoint, but the spec trains full"):
        load_for_eval(Location(str(lora.checkpoint(12))), full_spec, torch.device("cpu"))


@pytest.mark.multirun
def test_the_base_model_is_evaluated_once_then_read_from_its_cache(
    lora: Run, staged: Staged, tmp_path, caplog, monkeypatch
) -> None:
    """eval.compare_base, evaluated in this process (one rank, the ranks' code): the first run's evaluation loads the
    base model and caches its figures under run.storage; a second run's, of the same base and data, reads them and
    loads no base model (counted); the base figures equal the base model's own evaluation as an export, and 2 ranks'
    (all-reduced) base figures equal the one process's."""
    import logging

    from storage.location import Location
    from storage.spec import publish_spec
    from trainer.evaluation import base_model
    from trainer.evaluation.stage import evaluate as evaluate_here
    from trainer.parallel.distributed import Dist

    def spec_of(name: str, compare_base: bool, storage: Path = tmp_path):
        cfg = lora.spec.config
        cfg = cfg.model_copy(
            update={
                "run": cfg.run.model_copy(update={"storage": str(storage)}),
                "eval": cfg.eval.model_copy(update={"compare_base": compare_base}),
            }
        )
        return lora.spec.model_copy(
            update={"config": cfg, "run_id": name, "run": Location(str(storage / "runs" / name))}
        )

    loads = []
    real_load = base_model.load_base_for_eval
    dist = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="h", device=torch.device("cpu"))
    final = Location(str(lora.run_dir / "final"))
    monkeypatch.setattr(
        base_model, "load_base_for_eval", lambda spec, d: loads.append(spec.run_id) or real_load(spec, d)
    )
    with caplog.at_level(logging.INFO, logger="trainer.evaluation.base_model"):
        first, second = (evaluate_here(spec_of(name, True), final, dist) for name in ("one", "two"))
    assert loads == ["one"] and [len(list((tmp_path / "eval-cache" / "base").iterdir()))] == [1]
    assert "cache miss" in caplog.text and "cache hit" in caplog.text
    assert first["base"] == second["base"] and first["delta"] == second["delta"]
    export = tmp_path / "base-export"  # the base model evaluated as a full-weights export, the ordinary path
    shutil.copytree(staged.model_path, export)
    (export / "COMPLETE").touch()
    direct = evaluate_here(spec_of("direct", False), Location(str(export)), dist)
    for key in (*METRICS, *COUNTS):
        assert first["base"][key] == direct[key], key
    shown = {key: value for key, value in direct["generate"].items() if key not in ("seconds", "answers")}
    assert {key: first["base"]["generate"][key] for key in shown} == shown
    assert [a["base_output"] for a in first["generate"]["answers"]] == [
        a["output"] for a in direct["generate"]["answers"]
    ]
    assert first["delta"]["loss"] == first["loss"] - direct["loss"]
    # On 2 ranks (torchrun, a storage of its own: a miss), the base figures equal the one process's.
    ranks2 = publish_spec(spec_of("two-ranks", True, tmp_path / "two-ranks"))
    # base_model.json: what a node holds its copy of the base model against.
    shutil.copy(lora.run_dir / "base_model.json", tmp_path / "two-ranks" / "runs" / "two-ranks")
    on_two = evaluate(Run(ranks2.spec, ranks2.url), final.url, 2)["base"]
    assert {k: on_two[k] for k in COUNTS} == {k: first["base"][k] for k in COUNTS}
    assert_close([on_two[k] for k in METRICS], [first["base"][k] for k in METRICS], rtol=1e-7, atol=0)
    exact = ("records", "exact_match", "normalized_exact_match", "new_tokens")
    assert {k: on_two["generate"][k] for k in exact} == {k: first["base"]["generate"][k] for k in exact}
    # eval.tasks beside the base: the base's task figures are the direct evaluation's, cached, and on 2 ranks the same.
    assert first["base"]["tasks"] == direct["tasks"] == on_two["tasks"] == second["base"]["tasks"]
    assert (
        first["delta"]["tasks"][CHOICE_TASK]["acc"]
        == first["tasks"][CHOICE_TASK]["acc"] - direct["tasks"][CHOICE_TASK]["acc"]
    )
