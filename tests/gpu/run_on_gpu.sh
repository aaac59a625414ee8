#!/usr/bin/env bash
# A GPU session in one command (tests/benchmarks/GPU.md): install the carried wheels, then, until DEADLINE_S
# seconds from the start, the steps of PLAN, each result kept in $OUT_DIR as soon as it exists.
#   PLAN=first: the benchmark's first cases (LoRA and full 1.5B at 2,048 tokens, both trainers) and the gpu suite.
#   PLAN=fast-paths: packed rows at micro-batch 4, each case's first Tandem run profiled, torch.compile on and off.
#   PLAN=kernels: Tandem with Liger's kernels (train.kernels=liger; its wheel carried) against the built-in path.
#   PLAN=issue54: the ranking of trainers (three interleaved: HF plain, HF at its best, Tandem), LoRA then full 1.5B,
#     Qwen2.5-7B LoRA against NeMo's published figure, the gpu suite, then background saves.
# Usage: OUT_DIR=out DEADLINE_S=540 WHEELS=.whl PLAN=fast-paths bash tests/gpu/run_on_gpu.sh
# DRY_RUN_CPU=1 rehearses a plan on a CPU (toy shapes, nothing installed, PYTHON=.venv/bin/python): every step runs
# end to end, so that no GPU minute goes to a typo. Its steps get STEP_SCALE times their GPU budgets (default 4: a toy
# run's process starts cost a 2-core machine more than the GPU's real runs), and DEADLINE_S should grow with them.
set -u
OUT_DIR=${OUT_DIR:-gpu-out}
PLAN=${PLAN:-fast-paths}
WHEELS=${WHEELS:-.tandem/gpu-wheels}
DRY_RUN_CPU=${DRY_RUN_CPU:-}
PYTHON=${PYTHON:-python3}
STEP_SCALE=${STEP_SCALE:-$([[ -n $DRY_RUN_CPU ]] && echo 4 || echo 1)}
DEADLINE=$((SECONDS + ${DEADLINE_S:-540}))
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
left() { echo $((DEADLINE - SECONDS)); }
step() {  # step NAME SECONDS COMMAND...: run COMMAND for at most SECONDS (or what is left), its output in the log
    local name=$1 budget=$(($2 * STEP_SCALE))
    shift 2
    local limit=$(( budget < $(left) ? budget : $(left) ))
    if (( limit < 20 )); then echo "== $name: skipped, $(left) s left" | tee -a "$OUT_DIR/log.txt"; return; fi
    echo "== $name (at most $limit s)" | tee -a "$OUT_DIR/log.txt"
    local start=$SECONDS
    timeout "$limit" "$@" >>"$OUT_DIR/log.txt" 2>&1
    echo "== $name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT_DIR/log.txt"
}
if [[ -n $DRY_RUN_CPU ]]; then
    DRY=(--dry-run-cpu)
    echo "== dry run on the CPU: toy shapes, nothing installed; the figures mean nothing" | tee -a "$OUT_DIR/log.txt"
else
    DRY=()
    # The carried wheels, then the project itself beside the machine's torch (never a PYTHONPATH): a failure stops
    # here.
    WHEELS=$WHEELS LOG=$OUT_DIR/log.txt bash tests/gpu/install.sh || exit 2
fi
{
    nvidia-smi
    $PYTHON tests/benchmarks/gpu_env.py
    $PYTHON -c "import torch, transformers, peft, deepspeed, bitsandbytes as b; print(torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, deepspeed.__version__, b.__version__)"
    $PYTHON -c "import liger_kernel; print('liger-kernel', liger_kernel.__file__)"
} >"$OUT_DIR/env.txt" 2>&1
B=tests/benchmarks/bench_gpu.py
if [[ $PLAN == issue54 ]]; then
    # Packed rows of 2,048 tokens, 4 a micro-batch, the same rows for the three trainers; 8 optimizer steps a run (3
    # warm-up, 5 timed); each JSON rewritten after every run, so a step cut off keeps the repeats it finished.
    RANK=(--repeats 3 --steps 8 --records 240 --torch-adam --packing --micro-batch 4 --hf-best --loss-chunk-tokens ''
        --variant train.kernels=auto --work /tmp/tandem-bench-work "${DRY[@]}")
    step "(a) lora-1.5b-2048: HF plain, HF at its best, Tandem, interleaved" 200 $PYTHON $B --cases lora-1.5b-2048 \
        "${RANK[@]}" --out "$OUT_DIR/a_lora_ranking.json"
    step "(b) full-1.5b-2048: HF plain, HF at its best, Tandem, interleaved" 190 $PYTHON $B --cases full-1.5b-2048 \
        "${RANK[@]}" --out "$OUT_DIR/b_full_ranking.json"
    step "(c) lora-7b-4096: Tandem against NeMo AutoModel's 14,110 tokens/s (1x H100)" 100 $PYTHON $B \
        --cases lora-7b-4096 --repeats 3 --steps 6 --records 120 --torch-adam --packing --micro-batch 1 --no-hf \
        --loss-chunk-tokens '' --variant train.kernels=auto --anchor "NeMo AutoModel Qwen2.5-7B LoRA (1x H100)=14110" \
        --work /tmp/tandem-bench-work "${DRY[@]}" --out "$OUT_DIR/c_lora_7b.json"
    step "(d) gpu suite" 90 $PYTHON -m pytest -m gpu tests/gpu -p no:cacheprovider -n 4 -q -rA
    SAVES=qwen2.5-0.5b:1:local
    [[ -n $DRY_RUN_CPU ]] && SAVES=tiny:1:local
    step "(e) background against synchronous saves ($SAVES)" 120 $PYTHON tests/benchmarks/bench_async_save.py \
        --cases $SAVES
    echo "== (f) Q-LoRA 1.5B's peak against the plan, (g) the Qwen3-MoE shape: no step yet" | tee -a "$OUT_DIR/log.txt"
elif [[ $PLAN == kernels ]]; then
    # Each fast path on and off, interleaved: neither (padded rows through sdpa, the built-in loss), variable-length
    # attention alone (train.attention=auto: flash-attn's where installed, else PyTorch's), both with Liger.
    step "lora-1.5b-2048 packed: Tandem plain, with variable-length attention, with Liger too" 330 python3 $B \
        --cases lora-1.5b-2048 --repeats 3 --steps 10 --torch-adam --packing --micro-batch 4 --no-hf \
        --loss-chunk-tokens '' --variant "train.kernels=none train.attention=sdpa" --variant train.kernels=none \
        --variant train.kernels=liger --work /tmp/tandem-bench-work --out "$OUT_DIR/packed_lora_kernels.json"
    step "gpu suite: the kernels and attention" 120 python3 -m pytest -m gpu tests/gpu/test_kernels.py \
        tests/gpu/test_attention.py -p no:cacheprovider -q -rA
elif [[ $PLAN == first ]]; then
    # DeepSpeed's fused Adam (the default JSON's optimizer, which the gpu suite runs) compiles at first use: meanwhile.
    (python3 -c "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()" \
        >"$OUT_DIR/fused_adam.txt" 2>&1 &)
    step "lora-1.5b-2048, both trainers" 230 python3 $B --cases lora-1.5b-2048 --repeats 2 --steps 14 --torch-adam \
        --out "$OUT_DIR/bench_lora.json"
    step "gpu suite" 150 python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -n 4 -q -rA
    step "full-1.5b-2048, both trainers" 200 python3 $B --cases full-1.5b-2048 --repeats 1 --steps 14 --torch-adam \
        --out "$OUT_DIR/bench_full.json"
    step "lora-1.5b-2048, the loss over full logits" 120 python3 $B --cases lora-1.5b-2048 --repeats 1 --steps 14 \
        --torch-adam --no-hf --loss-chunk-tokens 0 --out "$OUT_DIR/bench_lora_full_logits.json"
else
    # Packed rows of 2,048 tokens, 4 a micro-batch: about 8,000 real tokens per forward pass, where the first session's
    # 2 padded rows held 1,900 and a step's kernels took a fraction of its time. The models are built once (--work).
    FAST=(--repeats 1 --steps 14 --torch-adam --packing --micro-batch 4 --profile-steps 3 --variant train.compile=true
        --work /tmp/tandem-bench-work)
    step "lora-1.5b-2048 packed: HF, Tandem (profiled), Tandem compiled" 230 python3 $B --cases lora-1.5b-2048 \
        "${FAST[@]}" --out "$OUT_DIR/packed_lora.json"
    step "full-1.5b-2048 packed: HF, Tandem (profiled), Tandem compiled" 260 python3 $B --cases full-1.5b-2048 \
        "${FAST[@]}" --out "$OUT_DIR/packed_full.json"
    step "lora-1.5b-2048 as the first session ran it (2 padded rows), Tandem profiled" 100 python3 $B \
        --cases lora-1.5b-2048 --repeats 1 --steps 8 --torch-adam --no-hf --profile-steps 2 \
        --work /tmp/tandem-bench-work --out "$OUT_DIR/padded_lora.json"
fi
[[ $PLAN == issue54 ]] && for f in "$OUT_DIR"/[abc]_*.json; do
    [[ -f $f ]] && $PYTHON tests/benchmarks/gpu_trainers.py "$f" | tee -a "$OUT_DIR/log.txt"
done
grep -h "^== \|tokens/s\|passed\|failed\|Error" "$OUT_DIR/log.txt" | tail -40
