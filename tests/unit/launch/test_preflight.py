"""The preflight's GPU check against an nvidia-smi that prints what the real one prints for the query it sends (this
machine has no GPU: the stand-in is a script on PATH; tests/gpu runs the check against the real one on a GPU
machine)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from core.errors import UserError
from launch.job import NodePlan
from launch.preflight import Gpu, check_gpus, gpus, visible_gpus


def fake_nvidia_smi(folder: Path, rows: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An nvidia-smi on PATH answering only the preflight's query, with `rows` (csv, noheader, nounits)."""
    script = folder / "nvidia-smi"
    body = "\n".join(rows)
    script.write_text(
        '#!/bin/sh\n[ "$1" = "--query-gpu=name,memory.free,memory.total" ] '
        '&& [ "$2" = "--format=csv,noheader,nounits" ] || exit 9\n'
        f"cat <<'ROWS'\n{body}\nROWS\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


def plan(nproc: int) -> NodePlan:
    return NodePlan(node_rank=1, nnodes=2, nproc_per_node=nproc, master_addr="10.0.0.1", master_port=29500)


def test_the_gpus_their_model_and_the_least_free_memory_are_reported(tmp_path, monkeypatch) -> None:
    fake_nvidia_smi(
        tmp_path, ["NVIDIA H100 80GB HBM3, 81000, 81559", "NVIDIA H100 80GB HBM3, 20480, 81559"], monkeypatch
    )
    assert gpus() == [Gpu("NVIDIA H100 80GB HBM3", 81000, 81559), Gpu("NVIDIA H100 80GB HBM3", 20480, 81559)]
    assert visible_gpus() == 2
    assert check_gpus(plan(2)) == "2 x NVIDIA H100 80GB HBM3, the least free 20.0 of 79.6 GiB free"


def test_fewer_gpus_than_ranks_names_the_setting(tmp_path, monkeypatch) -> None:
    fake_nvidia_smi(tmp_path, ["NVIDIA H200, 143000, 143771"], monkeypatch)
    with pytest.raises(UserError, match=r"node 1: 1 GPUs visible, 2 ranks requested; set launch.nproc_per_node"):
        check_gpus(plan(2))


def test_mixed_models_are_refused(tmp_path, monkeypatch) -> None:
    fake_nvidia_smi(
        tmp_path, ["NVIDIA H100 80GB HBM3, 81000, 81559", "NVIDIA A100-SXM4-80GB, 81000, 81920"], monkeypatch
    )
    with pytest.raises(UserError, match="mixed GPU models"):
        check_gpus(plan(2))


def test_a_machine_without_nvidia_smi_runs_cpu_ranks(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert gpus() is None
    assert check_gpus(plan(2)) == "no GPU (CPU ranks, gloo)"


def test_a_broken_driver_is_one_line_naming_nvidia_smi(tmp_path, monkeypatch) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text(
        '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(
        UserError, match=r"nvidia-smi failed on .* \(exit 9: NVIDIA-SMI has failed .*\); fix the GPU driver"
    ):
        check_gpus(plan(1))


def test_benchmark_task_names_are_checked_on_the_node_before_training(tmp_path) -> None:
    """eval.tasks on this node: known names (your own, in eval.tasks.include_path, indexed alone) pass; an
    include_path this node lacks stops it in one line naming the node (an unknown name's line, which needs the
    harness's whole index: tests/unit/trainer/evaluation/test_lm_tasks.py); no tasks, nothing to check."""
    from launch.preflight import check_tasks
    from tests.lm_tasks import ANSWER_TASK, CHOICE_TASK, write_tasks
    from tests.specs import spec_for

    tasks = write_tasks(tmp_path / "tasks")
    known = spec_for(tmp_path, [f"eval.tasks.names=[{CHOICE_TASK}, {ANSWER_TASK}]", f"eval.tasks.include_path={tasks}"])
    assert check_tasks(known, plan(1)) == f"{CHOICE_TASK}, {ANSWER_TASK} known to lm-evaluation-harness 0.4.13"
    assert check_tasks(spec_for(tmp_path, []), plan(1)) == "none (eval.tasks)"
    missing = spec_for(
        tmp_path, [f"eval.tasks.names=[{CHOICE_TASK}]", f"eval.tasks.include_path={tmp_path / 'nowhere'}"]
    )
    with pytest.raises(UserError, match=r"^node 1: eval.tasks.include_path=.*nowhere: no such directory on "):
        check_tasks(missing, plan(1))


def test_the_model_check_covers_a_vision_models_processor_files(tmp_path, qwen25_vl) -> None:
    """Every node's copy of a vision-language model is held to base_model.json, its image processor's files among
    the weights and the tokenizer's: a node whose preprocessor_config.json differs fails before training."""
    import shutil

    from launch.preflight import check_base_model
    from storage.base_model import record_base_model
    from tests.specs import spec_for

    model = tmp_path / "model"
    shutil.copytree(qwen25_vl, model)
    spec = spec_for(tmp_path, [], model=str(model))
    digest = record_base_model(spec.run, str(model), "blake3", tmp_path / "cache")
    spec = spec.model_copy(update={"model_manifest_digest": digest})
    line = check_base_model(spec, plan(1))
    assert "(the processor's chat_template.json, preprocessor_config.json among them)" in line
    config = model / "preprocessor_config.json"
    config.write_text(config.read_text().replace('"max_pixels": 12845056', '"max_pixels": 1000'))
    with pytest.raises(UserError, match=r"node 1: base model: .*preprocessor_config\.json"):
        check_base_model(spec, plan(1))
