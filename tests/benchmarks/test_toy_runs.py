"""Every benchmark script under tests/benchmarks/, end to end at toy size, through its command line (`main(argv)`), so a
change that breaks a benchmark fails here instead of in its next full-size run. Marker `bench`: `make test-bench`
(`pytest -m bench tests/benchmarks`), after changing a benchmark or what one drives; not in CI, whose 90-minute limit
could not keep their ~29 minutes of a worker (the default run checks that every script imports and parses its
options, `test_every_benchmark_script_imports_and_parses_its_options`). Each run is as small as the
script allows (1 repeat, the fewest steps past the warm-up, tiny models and data); the tests assert that it completed
and produced its figures, never a time: the figures of toy runs on a shared machine mean nothing. bench_gpu.py runs
its CPU path (`--dry-run-cpu`), the one a machine without a GPU can run. `make bench` runs the full-size benchmarks."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
bench = pytest.mark.bench


def positive(figures: dict[str, Any], *keys: str) -> None:
    """Each of `keys` is a finite figure above zero."""
    for key in keys:
        value = figures[key]
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, (key, figures)


@bench
def test_bench_train_tandem_vs_hf_trainer() -> None:
    """Tandem's trainer and the HF Trainer (hf_trainer_baseline.py) on the same spec, then the checkpoint saves."""
    from tests.benchmarks import bench_train

    result = bench_train.main(["--repeats", "1", "--steps", str(bench_train.WARMUP_STEPS + 2), "--records", "120"])
    positive(result, "tandem_tokens_per_s", "hf_tokens_per_s", "ratio", "fastest_steps_ratio", "checkpoint_s_per_gb")
    assert 0 <= result["tandem_padding"] < 1 and 0 <= result["hf_padding"] < 1, result


@bench
def test_bench_train_packing() -> None:
    """(d): packed vs length-grouped rows, with the padding of each."""
    from tests.benchmarks import bench_train

    result = bench_train.main(
        ["--parts", "packing", "--repeats", "1", "--steps", str(bench_train.WARMUP_STEPS + 2), "--records", "120"]
    )
    positive(result, "packed_tokens_per_s", "grouped_tokens_per_s", "ratio", "grouped_padding")
    assert 0 <= result["packed_padding"] < 1


@bench
def test_bench_gpu_dry_run_on_the_cpu(tmp_path: Path) -> None:
    """The GPU benchmark's CPU path: both toy cases (LoRA, full), Tandem and the HF Trainer, the table's JSON."""
    from tests.benchmarks import bench_gpu

    out = tmp_path / "bench_gpu.json"
    assert bench_gpu.main(["--dry-run-cpu", "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["dry_run_cpu"] and [r["case"] for r in document["results"]] == ["lora-toy-128", "full-toy-128"]
    for result in document["results"]:
        assert set(result["trainers"]) == {"tandem (loss_chunk_tokens=1024)", "HF Trainer"}, result["trainers"]
        for row in result["trainers"].values():
            positive(row, "tokens_per_s")
        positive(result, "flops_per_token")


def test_bench_gpu_writes_its_results_where_it_is_told_or_in_the_temporary_folder(tmp_path: Path) -> None:
    """Never in the checkout's root (where a bare run left an untracked bench_gpu.json): --out, else --work, else the
    temporary folder. Parsing only: no run, in the default run."""
    import tempfile

    from tests.benchmarks import bench_gpu

    assert bench_gpu.parse([]).out == Path(tempfile.gettempdir()) / "bench_gpu.json"
    assert bench_gpu.parse(["--work", str(tmp_path)]).out == tmp_path / "bench_gpu.json"
    assert bench_gpu.parse(["--out", str(tmp_path / "x.json")]).out == tmp_path / "x.json"
    assert not bench_gpu.parse(["--dry-run-cpu"]).out.resolve().is_relative_to(HERE.parents[1])


@bench
def test_bench_launch(prefect_server: Any) -> None:
    """The pipeline's train stage vs a bare torchrun, and the time from a rank's death to the stage's failure."""
    from tests.benchmarks import bench_launch

    positive(bench_launch.main(["--repeats", "1"]), "bare_torchrun_s", "pipeline_stage_s", "failure_detection_s")


@bench
def test_bench_loss_memory() -> None:
    """The loss alone at Qwen2.5's vocabulary, full logits and chunks (512 tokens: beyond the one-pass threshold)."""
    from tests.benchmarks import bench_loss_memory

    rows = bench_loss_memory.main(["--seq", "512", "--chunks", "0,256"])
    assert [(r["loss_chunk_tokens"], r["chunked"]) for r in rows] == [(0, False), (256, True)], rows
    assert rows[0]["loss"] == pytest.approx(rows[1]["loss"], rel=1e-4)  # the same loss either way
    for row in rows:
        positive(row, "peak_added_gb")


@bench
def test_bench_async_save() -> None:
    """The blocked-time table at toy size: the tiny model at 2 ranks on S3 (the path with the most parts: the upload,
    every rank), trained without saves, with synchronous and with background saves."""
    from tests.benchmarks import bench_async_save

    results = bench_async_save.main(["--cases", "tiny:2:s3"])
    assert set(results) == {"tiny:2:s3"}, results
    for figures in results.values():
        assert len(figures["sync_blocked_s"]) == len(figures["async_blocked_s"]) == 3
        assert len(figures["async_save_seconds"]) == 4 and figures["async_gb"] > 0  # 3 measured saves + the last
        positive(figures["peak_anon_gb"], "none", "sync", "async")


@bench
@pytest.mark.parametrize("method", ["lora", "full"])
def test_bench_preference_reference(method: str) -> None:
    """DPO's step with its reference pass (LoRA) or its reference table (full fine-tuning, and the table's time)
    against ORPO's without, at toy size."""
    from tests.benchmarks import bench_preference_reference

    toy = ["--pairs", "2", "--seq", "64", "--layers", "1", "--hidden", "64", "--method", method]
    rows = bench_preference_reference.main(toy)
    assert [r["objective"] for r in rows] == ["orpo", "dpo"], rows
    for row in rows:
        positive(row, "step_s")
    if method == "full":
        positive(rows[1], "reference_table_s_per_pair")


@bench
def test_bench_model_scale() -> None:
    """The memory table at toy size: the tiny model laid out as published, 1 and 2 ranks, the code before at 1."""
    from tests.benchmarks import bench_model_scale

    results = bench_model_scale.main(["--shape", "tiny", "--ranks", "1,2", "--old-ranks", "1"])
    assert set(results) == {(1, False), (1, True), (2, False)}, results
    for world in (1, 2):
        positive(results[(world, False)], "before loading the model", "model loaded", "engine built", "training peak")
        positive(results[(world, False)], "export peak", "whole-run peak")
    positive(results[(1, True)], "whole-run peak", "file-backed peak")


@bench
def test_bench_memory_plan() -> None:
    """The plan against measured RssAnon at toy size: the tiny model laid out as published, both configurations."""
    from tests.benchmarks import bench_memory_plan

    results = bench_memory_plan.main(["--shape", "tiny", "--ranks", "2"])
    assert set(results) == {(label, 2) for label in bench_memory_plan.CONFIGURATIONS}
    for figures in results.values():
        positive(figures, "planned_gb", "measured_gb", "ratio")


@bench
def test_bench_prepare(tmp_path: Path) -> None:
    """Staging vs the workflow it replaces, re-staging, tokenization, the first pass: (a), (b), (c), (e), (f)."""
    from tests.benchmarks import bench_prepare

    text = bench_prepare.main(["--gb", "0.002", "--repeats", "1", "--tokenize-mb", "1", "--tmp", str(tmp_path)])
    for part in ("(a)", "(b)", "(c)", "(e)", "(f)"):
        assert re.search(rf"^{re.escape(part)} ", text, re.MULTILINE), (part, text)
    assert re.search(r"speed-up \d+\.\d\dx", text) and "records/s" in text, text


@bench
def test_bench_data_scale(prefect_server: Any, tmp_path: Path) -> None:
    """Datasets of millions of records at toy size (one size, 200 records: every path of the script's own tree, S3
    included; how memory grows with the size is the full run's question), through its command line. The reader of
    before (an old tree checked out and run beside it) is left out here: it doubled the toy run's ~7 minutes."""
    from tests.benchmarks import bench_data_scale

    args = ["--records", "200", "--steps", "3", "--baseline", "none", "--work", str(tmp_path)]
    figures = bench_data_scale.main(args)
    assert set(figures) == {"200 new"}, figures
    for column in figures.values():
        positive(column, "pipeline_s", "staging_peak_gb", "pipeline_rank_anon_gb", "launch_first_s", "eval_stage_s")
        positive(column, "data_ms", "reader_anon_gb", "s3_cold_launch_s")
    for column in (figures["200 new"],):
        positive(column, "rank_anon_gb", "rank_file_gb", "launch_s", "train_data_ms", "s3_warm_launch_s")
        positive(column, "stage_jsonl_s", "stage_jsonl_peak_gb", "stage_parquet_s", "stage_parquet_peak_gb")


@bench
def test_bench_probe() -> None:
    """Training launches without and with the network probe."""
    from tests.benchmarks import bench_probe

    positive(bench_probe.main(["--repeats", "1"]), "without_probe_s", "with_probe_s", "ratio", "probe_s")


@bench
def test_bench_reshard() -> None:
    """A checkpoint converted to DeepSpeed's universal form, against reading it once (a 2-layer, 128-wide model)."""
    from tests.benchmarks import bench_reshard

    result = bench_reshard.main(["--repeats", "1", "--hidden", "128", "--layers", "2"])
    positive(result, "checkpoint_gb", "universal_gb", "read_s", "convert_s", "convert_s_per_gb")


@bench
def test_bench_reference_table_memory() -> None:
    """The reference table gathered, written and mapped the way the trainer does it, against the way it did before,
    on 2 real gloo ranks at 20,000 pairs: every rank of both ways read the same values."""
    from tests.benchmarks import bench_reference_table_memory

    rows = bench_reference_table_memory.main(["--rows", "20000", "--repeats", "1"])
    assert sorted((row["way"], row["rank"]) for row in rows) == [("new", 0), ("new", 1), ("old", 0), ("old", 1)]
    assert len({row["checksum"] for row in rows}) == 1
    assert all(row["peak_rss_added_mib"] > 0 for row in rows)


@bench
def test_bench_sequence_parallel() -> None:
    """A tiny model's row of 256 tokens on 1 rank and split across 2 (DeepSpeed's Ulysses): both ran, and the split
    row's loss is the whole row's."""
    from tests.benchmarks import bench_sequence_parallel

    rows = bench_sequence_parallel.main(["--toy"])
    assert [(row["length"], row["ranks"]) for row in rows] == [(256, 1), (256, 2)], rows
    assert rows[1]["loss"] == pytest.approx(rows[0]["loss"], rel=1e-4)
    for row in rows:
        positive(row, "peak_gb", "tokens_per_s", "peak_ratio")
        assert 0 <= row["step_gb"] <= row["peak_gb"], row


@bench
def test_bench_generate() -> None:
    """eval.generate's batched generation against one prompt at a time on a toy Qwen2: both answered every prompt,
    and scoring ran."""
    from tests.benchmarks import bench_generate

    argv = ["--shape", "toy", "--vocab", "512", "--records", "4", "--max-new-tokens", "4", "--batch-sizes", "1,4"]
    rows = bench_generate.main([*argv, "--repeats", "1"])
    assert [row["batch_size"] for row in rows] == [1, 4] and rows[0]["new_tokens"] == rows[1]["new_tokens"] > 0
    for row in rows:
        positive(row, "seconds", "peak_gb", "ratio_to_batch_1")
    assert rows[0]["scoring_seconds"] >= 0


@bench
def test_bench_lm_tasks() -> None:
    """eval.tasks' multiple-choice task on a toy Qwen2 at two request batch sizes: both scored every document, to the
    same accuracy."""
    from tests.benchmarks import bench_lm_tasks

    rows = bench_lm_tasks.main(["--shape", "toy", "--documents", "6", "--batch-sizes", "1,4", "--repeats", "1"])
    assert [row["batch_size"] for row in rows] == [1, 4] and rows[0]["acc"] == rows[1]["acc"]
    for row in rows:
        positive(row, "seconds", "peak_gb", "requests_per_s", "ratio_to_batch_1")


@bench
def test_bench_vision() -> None:
    """Images per second through the loader and through the step, at 1 and 2 ranks: small pictures, 3 steps."""
    from tests.benchmarks import bench_vision

    result = bench_vision.main(["--records", "16", "--image-size", "112", "--steps", "3", "--repeats", "1"])
    for world in (1, 2):
        positive(result, f"loader_images_per_s_{world}", f"step_images_per_s_{world}", f"ratio_{world}")
        assert result[f"data_time_s_{world}"] >= 0


@bench
def test_bench_rl() -> None:
    """Online RL: the generation service against transformers' generate on a toy Qwen2 (both generated every
    completion's tokens), and one GRPO step's phases on 1 and 2 gloo ranks (each phase timed)."""
    from tests.benchmarks import bench_rl

    argv = ["--shape", "toy", "--vocab", "512", "--prompts", "2", "--group", "4", "--batch", "4"]
    figures = bench_rl.main([*argv, "--max-new-tokens", "4", "--repeats", "1", "--steps", "1", "--warmup", "0"])
    positive(figures["rollouts"], "tandem_tokens_per_s", "transformers_tokens_per_s", "ratio")
    assert [row["world"] for row in figures["steps"]] == [1, 2]
    for row in figures["steps"]:
        assert row["step"][0] > 0 and all(row[phase][0] >= 0 for phase in bench_rl.PHASES), row


@pytest.mark.parametrize("script", sorted(path.stem for path in HERE.glob("bench_*.py")))
def test_every_benchmark_script_imports_and_parses_its_options(script: str, capsys: pytest.CaptureFixture) -> None:
    """In the default run, where the toy runs are not: an import or an option a change broke fails the build. `--help`
    builds the whole parser and exits 0 before any work."""
    import importlib

    module = importlib.import_module(f"tests.benchmarks.{script}")
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0 and "usage:" in capsys.readouterr().out


def test_every_benchmark_script_has_a_toy_run() -> None:
    """In the default run: a new bench_*.py without a toy run here fails the build, not only its first CI run."""
    names = {name for name in globals() if name.startswith("test_bench_")}
    missing = [
        path.name
        for path in sorted(HERE.glob("bench_*.py"))
        if not any(name == f"test_{path.stem}" or name.startswith(f"test_{path.stem}_") for name in names)
    ]
    assert not missing, f"benchmark scripts without a toy run in {Path(__file__).name}: {missing}"
