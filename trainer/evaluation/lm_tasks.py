"""Benchmark tasks (`eval.tasks`): lm-evaluation-harness tasks run on the model under evaluation, on every rank.

The harness's Hugging Face backend (`HFLM`) wraps the model already in memory (the export or checkpoint being
evaluated, and the base model with eval.compare_base), so nothing is loaded twice. Its evaluator already knows how to
share a task across processes: each rank builds the requests of documents rank, rank + world, ... (padded to the same
count), runs them, and rank 0 gathers every document's per-sample metrics before aggregating, so the figures equal
one process's over the whole task. `RankedLM` gives it our process group (torchrun's, gloo or NCCL) in place of the
`accelerate` launcher it expects. Every rank takes rank 0's figures, so eval.json and the base model's cache agree.

The harness loads each task's documents through `datasets`: local files (your own tasks, eval.tasks.include_path),
the node's Hugging Face cache, or the hub where the node reaches it; a task that cannot load them stops the evaluation
in one line naming the task.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from config.lm_tasks import harness_version
from config.sections.results import TasksConfig
from core.errors import UserError
from storage.metrics import TASKS, TASKS_DETAIL
from trainer.parallel.distributed import Dist, gather_objects

log = logging.getLogger(__name__)
# The harness writes each metric as "<metric>,<filter>"; "none" is the filter of a task without a filter pipeline.
NO_FILTER = "none"
STDERR = "_stderr"


def ranked_lm(model: Any, tokenizer: Any, dist: Dist, batch_size: int) -> Any:
    """The harness's HFLM over `model` as one of `dist`'s ranks: its evaluator shares each task's documents."""
    import torch
    import torch.distributed as tdist
    from lm_eval.models.huggingface import HFLM

    class RankedLM(HFLM):  # HFLM is Any to the type checker: the harness ships no types
        """HFLM with torchrun's process group in place of `accelerate`'s (the harness's evaluator asks an LM for its
        rank and world size, and to gather, gather objects and wait)."""

        def __init__(self) -> None:
            super().__init__(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
            self._rank, self._world_size = dist.rank, dist.world_size

        def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
            if self.world_size == 1:
                return tensor
            flat = tensor.reshape(-1)  # the evaluator gathers 0-d counts; accelerate returns them concatenated
            out = [torch.empty_like(flat) for _ in range(self.world_size)]
            tdist.all_gather(out, flat)
            return torch.cat(out)

        def barrier(self) -> None:
            if self.world_size > 1:
                tdist.barrier()

        # Without progress bars: a rank's log is lines, where a bar redrawn 100 times is noise; the stage logs the
        # tasks' time and figures instead.
        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = True) -> list[Any]:
            return super().loglikelihood(requests, disable_tqdm=True)

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = True) -> list[Any]:
            return super().loglikelihood_rolling(requests, disable_tqdm=True)

        def generate_until(self, requests: list[Any], disable_tqdm: bool = True) -> list[Any]:
            return super().generate_until(requests, disable_tqdm=True)

    return RankedLM()


def figures(result: dict[str, Any], seconds: float, cfg: TasksConfig) -> dict[str, Any]:
    """eval.json's `tasks` (each task's and group's metrics: "acc,none" is `acc`, "exact_match,strict-match" is
    `exact_match-strict-match`) and `tasks_detail` (standard errors, directions, samples, few-shot, version, time)."""
    tasks: dict[str, dict[str, float]] = {}
    per_task: dict[str, dict[str, Any]] = {}
    for task, row in result["results"].items():
        metrics, stderr = {}, {}
        for key, value in row.items():
            if "," not in key or not isinstance(value, int | float) or isinstance(value, bool):
                continue  # names, aliases, and a group's "N/A"
            metric, _, filter_name = key.partition(",")
            suffix = "" if filter_name == NO_FILTER else f"-{filter_name}"
            if metric.endswith(STDERR):
                stderr[metric.removesuffix(STDERR) + suffix] = float(value)
            else:
                metrics[metric + suffix] = float(value)
        tasks[task] = metrics
        samples = result.get("n-samples", {}).get(task, {})
        per_task[task] = {
            "samples": samples.get("effective"),
            "num_fewshot": result.get("n-shot", {}).get(task),
            "stderr": stderr,
            "higher_is_better": result.get("higher_is_better", {}).get(task, {}),
        }
    detail = {
        "harness_version": harness_version(),
        "seconds": round(seconds, 3),
        "limit": cfg.limit,
        "apply_chat_template": cfg.apply_chat_template,
        "per_task": per_task,
    }
    return {TASKS: tasks, TASKS_DETAIL: detail}


def run_tasks(model: Any, tokenizer: Any, cfg: TasksConfig, manager: Any, dist: Dist, seed: int) -> dict[str, Any]:
    """eval.json's `tasks` and `tasks_detail` for `model`: the same on every rank (rank 0's, which aggregated)."""
    from lm_eval import simple_evaluate

    lm = ranked_lm(model, tokenizer, dist, cfg.batch_size)
    start = time.perf_counter()
    try:
        result = simple_evaluate(
            model=lm,
            tasks=list(cfg.names),
            num_fewshot=cfg.num_fewshot,
            limit=cfg.limit,
            task_manager=manager,
            apply_chat_template=cfg.apply_chat_template,
            bootstrap_iters=cfg.bootstrap_iters,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
            log_samples=False,
        )
    except Exception as exc:
        raise unloadable(exc, cfg, manager) from exc
    seconds = time.perf_counter() - start
    found = figures(result, seconds, cfg) if dist.is_main else None
    found = gather_objects(found, dist)[0]
    log.info(
        "benchmark tasks %s: %d documents on %d ranks in %.1f s",
        ", ".join(cfg.names),
        sum(task["samples"] or 0 for task in found[TASKS_DETAIL]["per_task"].values()),
        dist.world_size,
        seconds,
    )
    return found


def unloadable(exc: Exception, cfg: TasksConfig, manager: Any) -> Exception:
    """A one-line refusal naming the task when it is one whose documents cannot be loaded (its data neither local
    nor in this node's Hugging Face cache, a YAML naming a missing file); the original error otherwise."""
    from lm_eval.tasks import get_task_dict

    for name in cfg.names:
        try:
            get_task_dict([name], manager)
        except Exception as cause:  # noqa: BLE001 - the harness and `datasets` raise anything, ValueError to ConnectionError
            first = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
            return UserError(
                f"eval.tasks: task {name} cannot load its data ({type(cause).__name__}: {first}); put its dataset in "
                "the Hugging Face cache of every node (HF_HOME, or HF_DATASETS_OFFLINE=0 where the hub is reachable) "
                "or name local files in your own task (eval.tasks.include_path)"
            )
    return exc
