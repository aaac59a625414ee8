"""The memory plan (config/memory_plan.py) against measurements, against DeepSpeed's own estimators, in preflight
and on the command line. The measurements are recorded ones: the first GPU session's (one H200, the JSON documents in
tests/benchmarks/results/h200-2026-11-26/) and the CPU ranks' of docs/large-models.md ("Measured"). Every one of them
was known while the plan was written; the plan's terms are counted, not fitted to them (the module's docstring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from config.deepspeed import read_deepspeed_json, resolve_from_train
from config.loader import load_config
from config.memory_plan import GB, PLAN_ERROR, MemoryPlan, Phase, Term, longest_length, plan
from tests.benchmarks.bench_gpu import ACCUMULATION, LORA, MICRO_BATCH, shape_of
from tests.conftest import ROOT

H200 = ROOT / "tests" / "benchmarks" / "results" / "h200-2026-11-26"
ZERO3 = str(ROOT / "config" / "deepspeed" / "zero3.json")


def planned(overrides: list[str], model: dict, *, on_gpu: bool) -> MemoryPlan:
    cfg = load_config(None, overrides)
    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    memory = plan(cfg, ds, model, on_gpu=on_gpu)
    assert memory is not None
    return memory


def h200_measurements() -> list[tuple[str, list[str], float]]:
    """(case, its settings, Tandem's measured peak GB) of every Tandem row of the H200 session."""
    found = []
    for path in sorted(H200.glob("bench_*.json")):
        document = json.loads(path.read_text())
        for result in document["results"]:
            for trainer, row in result["trainers"].items():
                if not trainer.startswith("tandem"):
                    continue
                chunk = trainer.split("=")[1].rstrip(")")
                settings = [
                    "launch.nnodes=1",
                    "launch.nproc_per_node=1",
                    f"data.max_length={result['seq']}",
                    f"train.micro_batch_size={MICRO_BATCH[result['seq']]}",
                    f"train.gradient_accumulation_steps={ACCUMULATION}",
                    f"train.method={result['method']}",
                    f"train.loss_chunk_tokens={chunk}",
                    *LORA,
                ]
                found.append((f"{result['case']} {trainer}", settings, row["peak_memory_gb"]))
    return found


def test_the_peak_is_what_is_always_held_plus_the_largest_phase() -> None:
    terms = [
        Term("weights", 10, Phase.ALWAYS, ""),
        Term("activations", 5, Phase.BACKWARD, ""),
        Term("gradients", 3, Phase.BACKWARD, ""),
        Term("float32 gradients", 7, Phase.STEP, ""),
    ]
    assert MemoryPlan.peak(terms) == 10 + 8  # backward's 5 + 3, never at once with the step's 7
    assert MemoryPlan.peak(terms, besides=9) == 10 + 9
    assert MemoryPlan.peak([Term("the process", 2, Phase.ALWAYS, ""), Term("the load", 4, Phase.LOAD, "")]) == 6


def test_the_plan_is_within_its_error_of_the_gpu_peaks_measured() -> None:
    """Peak device memory (torch's allocated bytes) of LoRA and full fine-tuning of the 1.5B shape at 2,048 tokens,
    the loss chunked and not, on one H200."""
    cases = h200_measurements()
    assert len(cases) == 3
    for case, settings, measured in cases:
        predicted = planned(settings, shape_of("1.5b"), on_gpu=True).device_bytes / GB
        assert abs(predicted / measured - 1) <= PLAN_ERROR, (case, predicted, measured)


@pytest.mark.parametrize(("ranks", "measured_gb"), [(1, 11.62), (2, 6.95), (4, 4.64)])
def test_the_plan_is_within_its_error_of_cpu_ranks_measured(ranks: int, measured_gb: float) -> None:
    """The largest RssAnon of a rank, full fine-tuning of Qwen2.5-0.5B's shape under ZeRO-3 on CPU ranks, 64 tokens
    (`tests/benchmarks/bench_model_scale.py --ranks 1,2,4`, docs/large-models.md), measured before background saves
    existed (so without one)."""
    memory = planned(
        [
            "launch.nnodes=1",
            f"launch.nproc_per_node={ranks}",
            "data.max_length=64",
            "train.micro_batch_size=1",
            "train.method=full",
            "train.async_save=false",
            f"deepspeed.config={ZERO3}",
        ],
        shape_of("0.5b"),
        on_gpu=False,
    )
    assert abs(memory.host_bytes / GB / measured_gb - 1) <= PLAN_ERROR


@pytest.mark.parametrize("ranks", [1, 2, 8, 32])
def test_model_states_agree_with_deepspeeds_estimators(ranks: int) -> None:
    """Full fine-tuning in bf16 with one token a micro-batch (activations and logits negligible): the plan's model
    states against DeepSpeed's estimate_zero2/zero3_model_states_mem_needs (no offload, no buffer factor)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from config.footprint import model_params

    model = {**shape_of("1.5b"), "vocab_size": 64}  # a small vocabulary: the loss's logits negligible too
    params = model_params(model)
    common = ["launch.nnodes=1", f"launch.nproc_per_node={ranks}", "data.max_length=1", "train.micro_batch_size=1"]
    common += ["train.method=full", "train.async_save=false"]
    zero2 = planned(common, model, on_gpu=True).device_bytes
    _, theirs2 = estimate_zero2_model_states_mem_needs(params, ranks, 1, cpu_offload=False, additional_buffer_factor=1)
    assert zero2 == pytest.approx(theirs2, rel=0.02)
    zero3 = planned([*common, f"deepspeed.config={ZERO3}"], model, on_gpu=True).device_bytes
    largest = model["hidden_size"] * model["intermediate_size"]  # a projection: the embedding is smaller here
    _, theirs3, _ = estimate_zero3_model_states_mem_needs(
        params, largest, ranks, 1, cpu_offload=False, cpu_offload_params=False, additional_buffer_factor=1
    )
    assert zero3 == pytest.approx(theirs3, rel=0.15)


def qwen_dir(tmp_path: Path, size: str) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(shape_of(size)))
    return tmp_path


FULL_1_5B = ["launch.nnodes=2", "launch.nproc_per_node=8", "train.method=full", "data.max_length=2048"]


def test_the_docs_table_is_what_the_plan_says() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    from memory_table import moe_table, published_table, table

    page = (ROOT / "docs" / "memory-plan.md").read_text()
    for printed in (table(), moe_table(), published_table()):
        assert printed in page, "docs/memory-plan.md: run `.venv/bin/python tools/memory_table.py` and paste its tables"


def test_the_plan_on_the_command_line(tmp_path: Path) -> None:
    """`python -m flows.finetune --plan` prints the plan and runs nothing (no run directory appears)."""
    model = qwen_dir(tmp_path / "model", "0.5b") if (tmp_path / "model").mkdir() is None else None
    storage = tmp_path / "storage"
    out = subprocess.run(
        [sys.executable, "-m", "flows.finetune", "--plan", "--set", f"model.name_or_path={model}",
         "--set", f"run.storage={storage}", "--set", "train.method=full"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "memory plan, GPU ranks (bf16)" in out.stdout and "float32 master copy and Adam's moments" in out.stdout
    assert "run.storage: a checkpoint" in out.stdout
    assert "each node's disk: nothing staged (run.storage is a local or shared filesystem" in out.stdout
    assert not (storage / "runs").exists()


def test_the_plan_says_what_each_node_stages_on_its_own_disk(tmp_path: Path) -> None:
    """With run.storage on S3: the checkpoint shards of a node's 8 ranks (of 16), and on node 0 the export too, the
    same bytes as preflight's space check counts (config/footprint.py `staged_on_node`, one definition)."""
    from config.footprint import estimate, read_model_json, staged_on_node
    from pipeline.memory import plan_text
    from storage.full import human_bytes

    model = qwen_dir(tmp_path, "1.5b")
    cfg = load_config(None, [*FULL_1_5B, "run.storage=s3://bucket/tandem", f"model.name_or_path={model}"])
    text = plan_text(cfg, on_gpu=True)
    footprint = estimate(cfg, cast(dict, read_model_json(str(model))), cfg.train.max_steps or 1, 16, bf16=True)
    assert footprint is not None
    node0, other = (staged_on_node(footprint, 8, 16, node0=first) for first in (True, False))
    assert other == footprint.checkpoint // 2 and node0 == other + footprint.export
    assert f"({human_bytes(node0)} on node 0 with the export, {human_bytes(other)} on the others)" in text, text


def test_sequence_parallelism_divides_a_ranks_activations_and_loss() -> None:
    """train.sequence_parallel_size=2: each rank holds half of every row's activations and takes half of its loss;
    its weights and optimizer states are those of two data-parallel ranks (ZeRO partitions over every rank)."""
    common = ["launch.nnodes=1", "launch.nproc_per_node=2", "data.max_length=16384", "train.micro_batch_size=1"]
    alone, split = (
        {t.what: t.bytes for t in planned([*common, *extra], shape_of("0.5b"), on_gpu=True).device}
        for extra in ([], ["train.sequence_parallel_size=2"])
    )
    assert split["activations"] == alone["activations"] // 2
    assert {k: v for k, v in split.items() if "activations" not in k and "loss" not in k} == {
        k: v for k, v in alone.items() if "activations" not in k and "loss" not in k
    }
    unchunked = ["train.loss_chunk_tokens=0"]  # the loss over a part's whole logits: half of the row's
    alone, split = (
        {t.what: t.bytes for t in planned([*common, *unchunked, *extra], shape_of("0.5b"), on_gpu=True).device}
        for extra in ([], ["train.sequence_parallel_size=2"])
    )
    assert split["the loss's logits"] == alone["the loss's logits"] // 2 > 0


def test_a_tiled_mlp_keeps_none_of_its_intermediates_but_one_tiles() -> None:
    """train.tiled_mlp: the activations lose each layer's four intermediate-size tensors per token and gain one tile's
    (hidden_size tokens) while backward recomputes it; nothing else changes."""
    common = ["data.max_length=16384", "train.micro_batch_size=1"]
    model = shape_of("0.5b")
    plain, tiled = (
        {t.what: t.bytes for t in planned([*common, *extra], model, on_gpu=True).device}
        for extra in ([], ["train.tiled_mlp=true"])
    )
    w = 2  # bfloat16 on a GPU
    layers, hidden, inter = (int(model[k]) for k in ("num_hidden_layers", "hidden_size", "intermediate_size"))
    assert plain["activations"] - tiled["activations"] == layers * 16384 * w * 4 * inter - hidden * w * 4 * inter
    assert {k: v for k, v in plain.items() if k != "activations"} == {
        k: v for k, v in tiled.items() if k != "activations"
    }


def test_the_longest_length_is_the_last_multiple_that_fits() -> None:
    """The search's answer fits the budget and the next multiple of 1,024 does not (checked against the plan
    itself); at sequence-parallel size 2 the longest row is longer; a budget below the weights fits nothing."""
    common = ["launch.nnodes=1", "launch.nproc_per_node=2", "train.micro_batch_size=1", "data.packing=false"]
    model, budget = shape_of("0.5b"), 20 * GB
    found = {}
    for size in (1, 2):
        cfg = load_config(None, [*common, f"train.sequence_parallel_size={size}"])
        ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
        longest = longest_length(cfg, ds, model, int(budget))
        assert longest is not None and longest % 1024 == 0 and 0 < longest < 1_048_576
        peaks = [
            planned([*common, f"train.sequence_parallel_size={size}", f"data.max_length={n}"], model, on_gpu=True)
            for n in (longest, longest + 1024)
        ]
        assert peaks[0].device_bytes <= budget < peaks[1].device_bytes
        found[size] = longest
        assert longest_length(cfg, ds, model, int(0.1 * GB)) == 0
        assert longest_length(cfg, ds, {"hidden_size": 8}, int(budget)) is None
    assert 1.5 * found[1] < found[2] <= 2 * found[1] + 1024


def test_the_long_sequences_table_is_what_the_plan_says() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    from memory_table import longest_table

    page = (ROOT / "docs" / "long-sequences.md").read_text()
    assert longest_table() in page, "docs/long-sequences.md: run `.venv/bin/python tools/memory_table.py --longest`"


def test_the_qwen3_30b_a3b_preset_fits_its_nodes_by_the_plan() -> None:
    """The preset on Qwen3-30B-A3B's published config.json: LoRA on every expert under ZeRO-3, 2 nodes x 8 GPUs."""
    import yaml

    from config.schema import FinetuneConfig
    from tests.published import QWEN3_30B_A3B

    tree = yaml.safe_load((ROOT / "config" / "presets" / "qwen3-30b-a3b-lora.yaml").read_text())
    tree["deepspeed"]["config"] = str(ROOT / tree["deepspeed"]["config"])  # the loader resolves it so
    cfg = FinetuneConfig.model_validate(tree)  # (its data.source and model directory are the cluster's)
    assert (cfg.train.method.name, cfg.world_size, cfg.train.lora.target_parameters) == ("lora", 16, None)
    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    assert ds["zero_optimization"]["stage"] == 3
    memory = plan(cfg, ds, QWEN3_30B_A3B, on_gpu=True)
    assert memory is not None and memory.device_bytes * (1 + PLAN_ERROR) < 80 * GB
    assert memory.device_bytes / GB == pytest.approx(8.06, abs=0.01)


def test_a_vision_language_plan_counts_the_tower_and_a_micro_batchs_image_patches() -> None:
    """Qwen2.5-VL-7B-Instruct as published (the vision tower's 631M and the merger's 45M among its 8.29B weights);
    its tower's activations kept for backward only when it trains; Q-LoRA keeps the vision side in the compute dtype;
    the preset fits its 80 GB GPUs by the plan, and a longer data.max_length is refused by it."""
    import yaml

    from config.footprint import model_params, projection_shapes
    from config.memory_plan import NF4_BYTES
    from config.schema import FinetuneConfig
    from config.vision import language_view, vision_params
    from tests.published_vision import QWEN25_VL_7B_INSTRUCT

    model = language_view(QWEN25_VL_7B_INSTRUCT)
    base = ["data.max_length=2048", "train.micro_batch_size=1"]
    frozen = planned(base, model, on_gpu=True)
    weights = next(t for t in frozen.device if t.what.startswith("weights"))
    assert weights.bytes / GB == pytest.approx(16.58, abs=0.01)
    tower = next(t for t in frozen.device if "vision tower" in t.what)
    assert "frozen" in tower.what and tower.phase is Phase.BACKWARD
    trained = planned([*base, "model.freeze_vision_tower=false"], model, on_gpu=True)
    kept = next(t for t in trained.device if "vision tower" in t.what)
    assert kept.bytes == 32 * tower.bytes  # every one of its 32 blocks keeps what one holds while it runs
    qlora = planned([*base, "train.method=qlora"], model, on_gpu=True)
    quantized = next(t for t in qlora.device if t.what.startswith("base weights"))
    projections = sum(i * o for i, o in projection_shapes(model).values()) * int(model["num_hidden_layers"])
    rest = model_params(model) - projections - vision_params(model)
    expected = int(projections * NF4_BYTES) + rest * 4 + vision_params(model) * 2  # the vision side in bf16
    assert "the vision side" in quantized.what and quantized.bytes == expected
    tree = yaml.safe_load((ROOT / "config" / "presets" / "qwen2.5-vl-7b-lora.yaml").read_text())
    tree["deepspeed"]["config"] = str(ROOT / tree["deepspeed"]["config"])
    cfg = FinetuneConfig.model_validate(tree)
    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    memory = plan(cfg, ds, model, on_gpu=True)
    assert memory is not None and memory.device_bytes * (1 + PLAN_ERROR) < 80 * GB
    longest = longest_length(cfg, ds, model, int(80 * GB / (1 + PLAN_ERROR)))
    assert longest is not None and cfg.data.max_length <= longest < 1_048_576
