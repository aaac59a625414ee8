"""The trainer on a real GPU: bf16 with NCCL at world size 1, Q-LoRA through bitsandbytes' CUDA kernels under ZeRO-2
and ZeRO-3, and the preflight reading the real nvidia-smi. Nothing is mocked. Several GPUs (NCCL's collectives
across ranks) are not covered: the machine these ran on has one."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from core.errors import RetryableError
from tests.distributed.harness import Run, Staged, train

pytestmark = pytest.mark.gpu

ONE_GPU = ["launch.nnodes=1", "launch.nproc_per_node=1"]
# bf16 matrix products may split their reductions differently between two launches of one shape (cuBLAS picks by
# workspace and stream state): a resumed run is compared within this relative tolerance, and the largest difference
# seen is printed (tests/benchmarks/GPU.md records it).
BF16_RTOL = 2e-3


def node_log(run: Run) -> str:
    return (run.run_dir / "nodes" / "0" / "log.txt").read_text()


def max_relative_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def test_preflight_reads_the_real_gpus() -> None:
    """The preflight's GPU count, model and free memory are nvidia-smi's and torch's."""
    from launch.preflight import gpus

    found = gpus()
    assert found is not None and len(found) == torch.cuda.device_count()
    assert found[0].name == torch.cuda.get_device_name(0)
    free, total = torch.cuda.mem_get_info(0)
    assert abs(found[0].total_mib - total / 2**20) < 0.02 * total / 2**20
    assert 0 < found[0].free_mib <= found[0].total_mib
    assert abs(found[0].free_mib - free / 2**20) < 0.05 * total / 2**20
    assert shutil.which("nvidia-smi")


def test_bf16_with_nccl_trains_and_resumes_like_an_uninterrupted_run(staged: Staged) -> None:
    """LoRA under ZeRO-2 in bf16 on the GPU with NCCL: the loss falls; a run killed at step 9 resumes from step 8 and
    reproduces the uninterrupted run's losses (bitwise where the kernels allow, within BF16_RTOL otherwise)."""
    reference = train(staged, "gpu-ref", ONE_GPU)
    assert any(r.get("peak_memory_gb", 0) > 0 for r in reference.metrics())  # the ranks ran on the GPU
    losses = reference.losses()
    assert losses[-1] < losses[0]
    with pytest.raises(RetryableError, match="rank 0 exited with code 137"):
        train(staged, "gpu-resume", ONE_GPU, env={"TANDEM_TEST_EXIT_AT_STEP": "0:9"})
    resumed = train(staged, "gpu-resume", ONE_GPU)
    assert "resumed from step 8" in node_log(resumed)
    difference = max_relative_difference(resumed.losses(), losses)
    exact = "bitwise equal" if difference == 0 else "not bitwise equal"
    print(f"bf16 resume: largest relative loss difference {difference:.3g} ({exact})")
    assert difference <= BF16_RTOL


@pytest.mark.parametrize("zero", [2, 3])
def test_qlora_trains_saves_resumes_and_exports_a_merged_model(staged: Staged, zero: int) -> None:
    """Q-LoRA (bitsandbytes nf4, double quantization, bf16 compute) under ZeRO-2 and under ZeRO-3 (the 4-bit weights
    stored as bf16 so ZeRO-3 partitions them): trains, is killed at step 9, resumes from step 8, and exports a merged
    model that loads and gives finite logits."""
    from transformers import AutoModelForCausalLM

    overrides = [*ONE_GPU, "train.method=qlora", "train.export_merged=true"]
    if zero == 3:
        overrides.append(f"deepspeed.config={Path(__file__).parents[2] / 'config' / 'deepspeed' / 'zero3.json'}")
    name = f"gpu-qlora-zero{zero}"
    with pytest.raises(RetryableError, match="rank 0 exited with code 137"):
        train(staged, name, overrides, env={"TANDEM_TEST_EXIT_AT_STEP": "0:9"})
    run = train(staged, name, overrides)
    assert "resumed from step 8" in node_log(run)
    losses = run.losses()
    assert all(torch.isfinite(torch.tensor(losses)))
    merged = AutoModelForCausalLM.from_pretrained(run.run_dir / "final" / "merged", dtype=torch.bfloat16).cuda()
    assert not any("lora" in name for name, _ in merged.named_parameters())
    ids = torch.arange(1, 33, device="cuda").unsqueeze(0)
    assert torch.isfinite(merged(ids).logits).all()


def test_nvidia_smi_is_the_one_the_preflight_reads() -> None:
    """The machine's nvidia-smi answers the query the preflight sends (the format it parses)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.free,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip().count(",") == 2 * len(out.strip().splitlines())
