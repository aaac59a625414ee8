"""Online RL's costs (train.objective=grpo, docs/online-rl.md): (a) rollout tokens/s of the generation service
(trainer/model/generation.py `Generator.complete`: a seed per completion, Gumbel-max sampling) against transformers'
`generate` alone with its own sampling, on the same prompts, batches and settings; (b) a GRPO step's time split into
generation, scoring, the reference's log-probabilities (beta 0.04: the adapters disabled), the policy's forward,
backward and the optimizer, on a DeepSpeed engine (ZeRO-2, LoRA) at 1 and 2 gloo ranks, on the built-in tiny model and
the demo's prompts.

    python tests/benchmarks/bench_rl.py                                 # both parts: 0.5B shape for (a), tiny for (b)
    python tests/benchmarks/bench_rl.py --parts rollouts --shape 0.5b --prompts 8 --group 8 --max-new-tokens 64
    python tests/benchmarks/bench_rl.py --parts step --worlds 1,2 --steps 4

(a) Random weights at the shape (no model can be downloaded here), prompts of --prompt-len random tokens, each sampled
--group times at temperature 1, in rollout batches of --batch rows; the stop token is one the prompts never hold, so
nearly every completion runs to --max-new-tokens (the tokens generated are counted). (b) Steps after --warmup, each
phase timed on rank 0 (the phases' collectives keep the ranks together). Each figure is the median of --repeats runs
(a) or of the steps (b), with its spread. Nothing here asserts: it prints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = {
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14},
    "toy": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
}
STOP = 1  # a token the random prompts never hold


def median(values: list[float]) -> tuple[float, float]:
    """(median, spread: max - min)."""
    return statistics.median(values), max(values) - min(values)


def rollouts(options: argparse.Namespace) -> dict[str, Any]:
    """(a): the generation service against transformers' generate, tokens/s, median of the repeats."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trainer.model.generation import Generator, Sampling, row_seed

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=options.vocab, num_key_value_heads=2, tie_word_embeddings=True,
                         **SHAPES[options.shape])  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(2, options.vocab, (options.prompt_len,), generator=gen).tolist() for _ in range(options.prompts)
    ]
    rows = [p for p in prompts for _ in range(options.group)]
    batches = [rows[i : i + options.batch] for i in range(0, len(rows), options.batch)]
    service = Generator(model, 0, [STOP])
    sampling = Sampling(options.max_new_tokens, 1.0, 1.0)

    def ours() -> int:
        out = [service.complete(b, sampling, [row_seed(0, j, k) for k in range(len(b))]) for j, b in enumerate(batches)]
        return sum(len(c.ids) for batch in out for c in batch)

    def theirs() -> int:
        tokens = 0
        for batch in batches:
            ids = torch.tensor(batch)
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                     temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=options.max_new_tokens,
                                     eos_token_id=STOP, pad_token_id=0)  # fmt: skip
            tokens += int((out[:, ids.shape[1] :] != 0).sum())
        return tokens

    figures: dict[str, Any] = {}
    rates: dict[str, list[float]] = {"tandem": [], "transformers": []}
    for _ in range(options.repeats):  # the two in turn, so that a busy machine's load falls on both alike
        for name, run in (("tandem", ours), ("transformers", theirs)):
            started = time.perf_counter()
            figures[f"{name}_tokens"] = run()
            rates[name].append(figures[f"{name}_tokens"] / (time.perf_counter() - started))
    for name, values in rates.items():
        figures[f"{name}_tokens_per_s"], figures[f"{name}_spread"] = median(values)
    figures["ratio"] = figures["tandem_tokens_per_s"] / figures["transformers_tokens_per_s"]
    print(
        f"rollouts ({options.shape}, {len(rows)} completions of {options.max_new_tokens} tokens in batches of "
        f"{options.batch}): tandem {figures['tandem_tokens_per_s']:.1f} tokens/s (spread "
        f"{figures['tandem_spread']:.1f}), transformers' generate {figures['transformers_tokens_per_s']:.1f} "
        f"(spread {figures['transformers_spread']:.1f}): x{figures['ratio']:.2f}",
        flush=True,
    )
    return figures


def step_split(options: argparse.Namespace) -> list[dict[str, Any]]:
    """(b): a GRPO step's phases at each world size, each rank a process of its own."""
    with tempfile.TemporaryDirectory(prefix="tandem-bench-rl-") as work:
        model = Path(work) / "tiny"
        subprocess.run(
            [sys.executable, "-m", "trainer.model.tiny", "--out", str(model), "--corpus",
             str(ROOT / "data" / "sample" / "conversations.json")],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        rows = []
        for world in (int(w) for w in options.worlds.split(",")):
            out = Path(work) / f"world-{world}.json"
            from launch.command import free_port

            env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
            args = [str(model), str(out), str(options.steps), str(options.warmup)]
            procs = [
                subprocess.Popen([sys.executable, __file__, "--rank-of", str(world), *args],
                                 env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world),
                                      "LOCAL_WORLD_SIZE": str(world)}, cwd=ROOT)
                for r in range(world)
            ]  # fmt: skip
            if any(p.wait(timeout=1800) for p in procs):
                raise RuntimeError(f"the {world}-rank step benchmark failed")
            import json

            row = json.loads(out.read_text())
            rows.append(row)
            parts = ", ".join(f"{k} {row[k][0]:.3f} s (spread {row[k][1]:.3f})" for k in PHASES)
            print(f"GRPO step on {world} rank(s): total {row['step'][0]:.3f} s; {parts}", flush=True)
        return rows


PHASES = ("generation", "scoring", "reference", "forward", "backward", "optimizer")


def one_rank(model_dir: str, out: str, steps: int, warmup: int) -> None:
    """A rank of (b): the demo's prompts, a ZeRO-2 LoRA engine, `steps` GRPO steps timed phase by phase."""
    import json

    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from config.sections.model_train import TrainConfig
    from tests.unit.trainer.objectives.rl.conftest import started, write_prompts
    from trainer.data import Dealing, GlobalOrder
    from trainer.objectives.policy import Policy
    from trainer.parallel.distributed import init

    dist = init(deepspeed_backend=True)
    folder = Path(out).parent / f"prompts-{dist.rank}"
    rows = write_prompts(model_dir, folder)
    train = TrainConfig.model_validate({"lora": {"dropout": 0.0}})
    from trainer.model.adapters import make_trainable

    model = make_trainable(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), train)
    micro, global_batch = 2, 16
    accum = global_batch // micro // dist.world_size
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
              "zero_optimization": {"stage": 2}, "steps_per_print": 10**6}  # fmt: skip
    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=config,
                                      optimizer=torch.optim.AdamW(params, lr=1e-3))  # fmt: skip
    grpo = started(model_dir, {"num_generations": 4, "rollout_batch_size": 4, "max_completion_length": 16,
                               "temperature": 0.7, "beta": 0.04, "rewards": ["accuracy", "format"]})  # fmt: skip
    policy, order = Policy(engine, dist.device), GlobalOrder(len(rows), 1)
    times: dict[str, list[float]] = {k: [] for k in (*PHASES, "step")}
    for step in range(warmup + steps):
        began = time.perf_counter()
        slots = list(grpo.deal(rows, order, Dealing(step, micro, accum, dist.rank, dist.world_size, 0)))
        scope = grpo.begin_step(policy, slots, dist)
        spent = {"generation": scope.seconds["generation_s"], "scoring": scope.seconds["scoring_s"],
                 "reference": scope.seconds["logps_s"], "forward": 0.0, "backward": 0.0, "optimizer": 0.0}  # fmt: skip
        for slot in slots:
            t0 = time.perf_counter()
            loss = grpo.micro_batch(policy, slot, scope).backward
            t1 = time.perf_counter()
            engine.backward(loss)
            t2 = time.perf_counter()
            engine.step()
            spent["forward"] += t1 - t0
            spent["backward"] += t2 - t1
            spent["optimizer"] += time.perf_counter() - t2
        if step >= warmup:
            for key, value in spent.items():
                times[key].append(value)
            times["step"].append(time.perf_counter() - began)
    if dist.rank == 0:
        Path(out).write_text(json.dumps({"world": dist.world_size, **{k: median(v) for k, v in times.items()}}))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The script's entry point; returns the figures, as printed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="rollouts,step")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worlds", default="1,2")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rank-of", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("rank_args", nargs="*", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.rank_of:
        model_dir, out, steps, warmup = options.rank_args
        one_rank(model_dir, out, int(steps), int(warmup))
        return {}
    figures: dict[str, Any] = {}
    if "rollouts" in options.parts:
        figures["rollouts"] = rollouts(options)
    if "step" in options.parts:
        figures["steps"] = step_split(options)
    return figures


if __name__ == "__main__":
    main()
