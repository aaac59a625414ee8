"""Training on one GPU: Tandem's trainer vs the Hugging Face Trainer on Qwen2.5-shaped models (tokens/s, MFU, memory).

    python tests/benchmarks/bench_gpu.py                                  # every case, in the order below
    python tests/benchmarks/bench_gpu.py --cases lora-1.5b-2048,full-1.5b-2048 --repeats 3
    python tests/benchmarks/bench_gpu.py --cases lora-1.5b-2048 --loss-chunk-tokens 1024,0 --no-hf
    python tests/benchmarks/bench_gpu.py --cases full-1.5b-2048 --packing --micro-batch 4 \
        --variant "train.profile_steps=3" --variant "train.compile=true"  # packed rows; profiled; compiled
    python tests/benchmarks/bench_gpu.py --cases lora-1.5b-2048 --packing --micro-batch 4 --hf-best \
        --loss-chunk-tokens '' --variant train.kernels=auto       # HF plain, HF at its best, Tandem: interleaved
    python tests/benchmarks/bench_gpu.py --cases lora-7b-4096 --packing --no-hf --anchor "NeMo=14110"
    python tests/benchmarks/bench_gpu.py --dry-run-cpu                    # checks this script only (toy shape, CPU)

The models have random weights (they run at the speed of trained ones) in the shapes of Qwen2.5-0.5B, -1.5B and -7B from
their published configurations, with the built-in tiny model's tokenizer (a vocabulary of 151,936 rows all the
same, the rows past the tokenizer being padding, as in Qwen). The data are generated chat conversations whose answer
lengths are log-normal (median a sixth of the sequence length in words, truncated at it), staged as the pipeline
stages them. The trainers (tests/benchmarks/gpu_trainers.py: the HF Trainer plain, with `--hf-best` the HF Trainer at
its best, Tandem's variants) run the same model, rows, DeepSpeed JSON (config/deepspeed/zero2.json) and precision
(bf16) on one GPU under torchrun, interleaved (A B C A B C ...), `--repeats` times; the medians are reported with their
spread (min..max), and Tandem's ratios to the HF Trainer plain and at its best (tokens/s, peak memory); `--anchor`
sets Tandem against a published figure. The cases run in this order
(the order to keep when GPU time is short): LoRA 1.5B at 2,048 tokens, full fine-tuning 1.5B at 2,048, then the rest.

Measured: real (non-padding) tokens per second of step time after the warm-up steps; peak GPU memory (the most the
trainer's tensors held: Tandem's metrics.jsonl `peak_memory_gb`, torch.cuda.max_memory_allocated for the HF
Trainer); MFU = tokens/s x FLOPs per token / the GPU's peak dense bf16 FLOP/s, FLOPs counted as torchtitan counts
them (printed with the table). `--loss-chunk-tokens` lists Tandem variants (train.loss_chunk_tokens; 0 = the loss
over full logits), each measured in the same alternation; `--variant` adds a Tandem variant of any overrides (e.g.
`train.compile=true`; with `train.profile_steps=N` the profiled steps are left out of its tokens/s, and its table is
kept beside the JSON). `--packing` stages the rows packed (for both trainers), `--micro-batch` sets the micro-batch
of both. The table is printed and written as JSON (`--out`), after every run.
On a machine without CUDA it prints one line and exits (status 1); `--dry-run-cpu` runs a toy shape on the CPU
instead, to check the script end to end before spending GPU time, and its figures mean nothing.
tests/benchmarks/GPU.md says how to run it from a checkout on a machine without the project's pinned environment.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from config.flops import flops_per_token  # after the checkout is on sys.path
from config.methods import METHODS
from tests.benchmarks.gpu_trainers import ratios, run_once, summary, trainers

# Published configuration values (config.json of Qwen/Qwen2.5-0.5B, -1.5B and -7B; a size's own values win).
QWEN25 = {
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    },
    "7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "max_position_embeddings": 131072,
    },
}
QWEN25_COMMON = {
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}
# Only for --dry-run-cpu: small enough for a CPU.
TOY = {
    "vocab_size": 2048,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}
# Examples per micro-batch by sequence length; gradient accumulation 2. The generated rows are shorter than the
# sequence length (at 2,048, 952 tokens on average): a micro-batch of 2 holds about 1,900 real tokens.
MICRO_BATCH = {128: 2, 512: 8, 2048: 2, 4096: 1, 8192: 1}
ACCUMULATION = 2
LORA = ["train.lora.r=16", "train.lora.alpha=32", "train.lora.dropout=0"]  # every linear layer: Tandem's default
# Dense bf16 peak FLOP/s by device name (NVIDIA's data sheets); --peak-tflops for any other.
PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.0}
FLOPS_FORMULA = (
    "FLOPs per token (torchtitan's count, config/flops.py): full fine-tuning 6*N + 12*L*H*D*T; LoRA 4*N + 6*N_lora + "
    "12*L*H*D*T (the frozen base has no weight-gradient FLOPs); N = parameters a token goes through (a mixture of "
    "experts' routed experts only) without the input embedding and biases, the LM head counted (tied or not), "
    "N_lora = the adapters', L layers, H heads, D head dim, T = data.max_length. Recomputation (the chunked loss's) "
    "is not counted."
)


@dataclass(frozen=True)
class Case:
    """One benchmark configuration."""

    method: str  # "lora" or "full"
    size: str  # a QWEN25 key, or "toy"
    seq: int

    @property
    def name(self) -> str:
        return f"{self.method}-{self.size}-{self.seq}"


RANKED = [
    Case("lora", "1.5b", 2048),
    Case("full", "1.5b", 2048),
    Case("lora", "0.5b", 2048),
    Case("full", "0.5b", 2048),
    Case("lora", "1.5b", 512),
    Case("full", "1.5b", 512),
    Case("lora", "0.5b", 512),
    Case("full", "0.5b", 512),
    Case("lora", "1.5b", 8192),
    Case("lora", "0.5b", 8192),
    Case("lora", "7b", 4096),  # against NeMo AutoModel's published figure (--anchor), Tandem alone (--no-hf)
]


def shape_of(size: str) -> dict:
    """Qwen2Config values of a case's model."""
    return TOY if size == "toy" else {**QWEN25_COMMON, **QWEN25[size]}


def peak_flops(override: float | None) -> tuple[float | None, str]:
    """(the GPU's dense bf16 peak FLOP/s or None, its name)."""
    import torch

    if not torch.cuda.is_available():
        return override * 1e12 if override else None, "cpu"
    name = torch.cuda.get_device_name()
    if override:
        return override * 1e12, name
    for key, tflops in PEAK_TFLOPS.items():  # the more specific names come first
        if key in name:
            return tflops * 1e12, name
    return None, name


def micro_batch(case: Case, options: argparse.Namespace) -> int:
    """Rows per micro-batch of a case: --micro-batch, else MICRO_BATCH by sequence length."""
    return options.micro_batch or MICRO_BATCH[case.seq]


def prepare(work: Path, case: Case, options: argparse.Namespace) -> tuple[str, object, list[str]]:
    """(model path, staged dataset, base overrides) of a case: the model saved in bf16, the data staged."""
    from config.deepspeed import read_deepspeed_json
    from config.loader import load_config
    from staging.stage import stage_dataset
    from storage import layout
    from tests.benchmarks.bench_train import make_data, make_model
    from trainer.model import tiny

    tokenizer_dir = work / "tiny"
    tiny.materialize(tokenizer_dir, ROOT / "data" / "sample" / "conversations.json")
    data = work / f"chat-{case.seq}.jsonl"
    make_data(data, options.records, median_words=max(case.seq // 6, 10), max_words=case.seq)
    base = [
        f"run.storage={work / 'storage'}",
        f"data.source={data}",
        f"data.max_length={case.seq}",
        "data.eval_ratio=0.02",
        "launch.nnodes=1",
        "launch.nproc_per_node=1",
        f"train.micro_batch_size={micro_batch(case, options)}",
        f"data.packing={str(options.packing).lower()}",
        f"train.gradient_accumulation_steps={ACCUMULATION}",
        f"train.method={case.method}",
        "train.learning_rate=1e-5",
        *LORA,
    ]
    if options.torch_adam:
        # DeepSpeed's fused Adam is a CUDA extension compiled at first use (nvcc and ninja); without them, or to spare
        # the compile, PyTorch's fused AdamW, for both trainers alike.
        ds = read_deepspeed_json(str(ROOT / "config" / "deepspeed" / "zero2.json"))
        ds["optimizer"]["params"]["torch_adam"] = True
        # DeepSpeed hands the other params to torch.optim.AdamW: its fused kernel (one launch for every tensor).
        ds["optimizer"]["params"]["fused"] = not options.dry_run_cpu
        (work / "zero2-torch-adam.json").write_text(json.dumps(ds))
        base.append(f"deepspeed.config={work / 'zero2-torch-adam.json'}")
    model_dir = work / f"model-{case.size}"
    if not model_dir.exists():
        make_model(
            str(tokenizer_dir), model_dir, shape_of(case.size), dtype="float32" if options.dry_run_cpu else "bfloat16"
        )
    cfg = load_config(None, base)
    return str(model_dir), stage_dataset(cfg.data, layout.root(cfg.run), str(model_dir)), base


def measure(case: Case, options: argparse.Namespace, work: Path, report: Callable[[dict], None]) -> dict:
    """Run the trainers interleaved (A B C A B C ...: each repeat runs every trainer once, in the same order); their
    summaries. `report` gets the summaries so far after every run (a cut-off session keeps what it measured)."""
    model, dataset, base = prepare(work, case, options)
    runs: dict[str, list[dict]] = {}
    order = trainers(options)
    for repeat in range(options.repeats):
        for index, trainer in enumerate(order):
            run = f"{options.out.stem}-{case.name}-{index}-{repeat}"  # --out names the runs: --work is kept
            row = run_once(trainer, model, dataset, base, run, options, work)
            runs.setdefault(trainer.name, []).append({"sequence": repeat * len(order) + index, **row})
            report({name: summary(rows) for name, rows in runs.items()})
        print(
            f"{case.name} repeat {repeat + 1}: "
            + ", ".join(f"{name} {rows[-1].get('tokens_per_s', 0):.0f} tokens/s" for name, rows in runs.items()),
            flush=True,
        )
    return {name: summary(rows) for name, rows in runs.items()}


def table(results: list[dict]) -> str:
    """The printed table: one line per case and trainer, its median tokens/s and their spread (min..max), and Tandem's
    ratios to the HF Trainer plain (tokens/s, peak memory) and at its best (tokens/s)."""
    lines = [
        f"{'case':<16} {'trainer':<34} {'tokens/s':>9} {'min..max':>15} {'MFU':>6} {'peak GB':>8} "
        f"{'/HF tok/s':>9} {'/HF mem':>7} {'/best tok/s':>11}"
    ]
    for result in results:
        for name, row in result["trainers"].items():
            if not row["tokens_per_s"]:
                lines.append(f"{result['case']:<16} {name:<34} failed: {row['repeats'][-1]['error']}")
                continue
            mfu = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "n/a"
            memory = f"{row['peak_memory_gb']:.2f}" if row["peak_memory_gb"] is not None else "n/a"
            spread = f"{row['tokens_per_s_min']:.0f}..{row['tokens_per_s_max']:.0f}"
            ratio = result["ratios"].get(name, {})
            lines.append(
                f"{result['case']:<16} {name:<34} {row['tokens_per_s']:>9.0f} {spread:>15} {mfu:>6} {memory:>8} "
                f"{times(ratio.get('tokens_per_s_vs_hf_plain')):>9} {times(ratio.get('peak_memory_vs_hf_plain')):>7} "
                f"{times(ratio.get('tokens_per_s_vs_hf_best')):>11}"
            )
    return "\n".join(lines)


def times(ratio: float | None) -> str:
    """A ratio as printed in the table ('' where there is none)."""
    return f"{ratio:.2f}x" if ratio else ""


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line's options, --cases resolved to Cases (--dry-run-cpu sets the toy ones)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--cases",
        default=",".join(c.name for c in RANKED),
        help="comma-separated METHOD-SIZE-SEQ names, run in the order given (default: all, ranked)",
    )
    parser.add_argument("--repeats", type=int, help="runs of each trainer, interleaved (default 3; 1 on --dry-run-cpu)")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run (the first 3 are warm-up)")
    parser.add_argument("--records", type=int, default=400, help="generated conversations per case")
    parser.add_argument(
        "--loss-chunk-tokens",
        default="1024",
        help="Tandem variants: comma-separated train.loss_chunk_tokens values (0: full logits; '': only --variant's)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="a further Tandem variant: space-separated overrides (repeatable), e.g. 'train.compile=true'",
    )
    parser.add_argument("--profile-steps", type=int, default=0, help="profile this many steps of the first variant")
    parser.add_argument("--micro-batch", type=int, help="rows per micro-batch, both trainers (default by sequence)")
    parser.add_argument("--packing", action="store_true", help="stage the rows packed (data.packing), both trainers")
    parser.add_argument("--hf-compile", action="store_true", help="the HF Trainer with torch_compile")
    parser.add_argument("--work", type=Path, help="a folder kept across invocations (the models are built once)")
    parser.add_argument("--no-hf", dest="hf", action="store_false", help="without the plain HF Trainer")
    parser.add_argument(
        "--hf-best",
        action="store_true",
        help="also the HF Trainer at its best: use_liger_kernel (CUDA only) and DataCollatorWithFlattening",
    )
    parser.add_argument(
        "--anchor",
        type=anchor_argument,
        help="a published figure to set Tandem against, 'NAME=TOKENS_PER_S' (e.g. NeMo AutoModel's Qwen2.5-7B LoRA)",
    )
    parser.add_argument(
        "--torch-adam",
        action="store_true",
        help="PyTorch's fused AdamW in DeepSpeed (torch_adam), where its own fused Adam cannot or need not be compiled",
    )
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, when its name is not known")
    parser.add_argument(
        "--out", type=Path, help="where the JSON goes (default: bench_gpu.json in --work, else in the temporary folder)"
    )
    parser.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="check this script only on the CPU: each case's method at a toy shape of 128 tokens (default: LoRA and "
        "full), 1 repeat unless --repeats",
    )
    options = parser.parse_args(argv)
    # Never the checkout: a bare run leaves nothing there for git to show.
    options.out = options.out or (options.work or Path(tempfile.gettempdir())) / "bench_gpu.json"
    options.loss_chunk_tokens = [int(v) for v in options.loss_chunk_tokens.split(",") if v]
    by_name = {c.name: c for c in [*RANKED, Case("lora", "toy", 128), Case("full", "toy", 128)]}
    unknown = [n for n in options.cases.split(",") if n not in by_name]
    if unknown:
        parser.error(f"--cases: unknown {unknown}; known: {sorted(by_name)}")
    options.cases = [by_name[n] for n in options.cases.split(",")]
    options.repeats = options.repeats or (1 if options.dry_run_cpu else 3)
    if options.dry_run_cpu:  # the same methods, in the same order, at the toy shape
        options.cases = [Case(c.method, "toy", 128) for c in options.cases]
        options.cases = list(dict.fromkeys(options.cases))
        options.steps, options.records, options.micro_batch = 5, 60, options.micro_batch and 2
    return options


def anchor_argument(value: str) -> tuple[str, float]:
    """--anchor's 'NAME=TOKENS_PER_S' as (name, tokens/s)."""
    name, _, figure = value.rpartition("=")
    try:
        return name, float(figure)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--anchor {value!r}: expected NAME=TOKENS_PER_S, e.g. 'NeMo=14110'") from None


def main(argv: list[str] | None = None) -> int:
    """Run the cases; print the table and write the JSON."""
    options = parse(argv)
    import torch

    if not options.dry_run_cpu and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; this benchmark needs one GPU (--dry-run-cpu checks the script on a CPU)")
        return 1
    peak, device = peak_flops(options.peak_tflops)
    results: list[dict] = []
    work = options.work or Path(tempfile.mkdtemp(prefix="tandem-bench-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for case in options.cases:

            def report(figures: dict[str, dict], case: Case = case) -> None:
                write(options, device, peak, [*results, case_result(case, options, figures, peak)])

            figures = measure(case, options, work, report)
            results.append(case_result(case, options, figures, peak))
            write(options, device, peak, results)
    finally:
        if not options.work:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\ndevice: {device}; peak bf16 {peak / 1e12 if peak else 'unknown'} TFLOP/s; medians of {options.repeats}")
    print(FLOPS_FORMULA)
    print(table(results))
    for result in results:
        if "anchor" in result:
            print(f"{result['case']}: {anchor_line(result['anchor'], device)}")
    print(f"written: {options.out}")
    return 0


def case_result(case: Case, options: argparse.Namespace, figures: dict, peak: float | None) -> dict:
    """A case's entry of the JSON document: its settings, FLOPs per token, each trainer's figures with MFU, Tandem's
    ratios to the HF Trainer plain and at its best, and to --anchor's published figure where given."""
    flops = flops_per_token(shape_of(case.size), METHODS[case.method], case.seq)
    for row in figures.values():
        row["mfu"] = row["tokens_per_s"] * flops / peak if peak and row["tokens_per_s"] else None
    result = {
        "case": case.name,
        "method": case.method,
        "model": "toy" if case.size == "toy" else f"Qwen2.5-{case.size} shape",
        "seq": case.seq,
        "micro_batch": micro_batch(case, options),
        "accumulation": ACCUMULATION,
        "packing": options.packing,
        "flops_per_token": flops,
        "trainers": figures,
        "ratios": ratios(figures),
    }
    if options.anchor:
        name, published = options.anchor
        ours = max((row["tokens_per_s"] or 0 for n, row in figures.items() if n.startswith("tandem")), default=0)
        result["anchor"] = {"name": name, "tokens_per_s": published, "tandem_vs_anchor": ours / published or None}
    return result


def anchor_line(anchor: dict, device: str) -> str:
    """The printed comparison with a published figure, naming this run's device (the figure's may differ)."""
    ratio = anchor["tandem_vs_anchor"]
    return (
        f"Tandem's best variant {ratio:.2f}x {anchor['name']} ({anchor['tokens_per_s']:.0f} tokens/s); this device: "
        f"{device}"
        if ratio
        else f"no Tandem figure to set against {anchor['name']}"
    )


def write(options: argparse.Namespace, device: str, peak: float | None, results: list[dict]) -> None:
    """Write the JSON document of the results so far to --out."""
    import torch

    document = {
        "device": device,
        "peak_flops": peak,
        "torch": torch.__version__,
        "repeats": options.repeats,
        "steps": options.steps,
        "dry_run_cpu": options.dry_run_cpu,
        "flops_formula": FLOPS_FORMULA,
        "command": " ".join(sys.argv),
        "results": results,
    }
    options.out.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
