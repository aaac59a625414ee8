#!/usr/bin/env bash
# A GPU session in one command (tests/benchmarks/GPU.md): install the carried wheels, then, until DEADLINE_S
# seconds from the start, the steps of PLAN, each result kept in $OUT_DIR as soon as it exists.
#   PLAN=first: the benchmark's first cases (LoRA and full 1.5B at 2,048 tokens, both trainers) and the gpu suite.
#   PLAN=fast-paths: packed rows at micro-batch 4, each case's first Tandem run profiled, torch.compile on and off.
#   PLAN=kernels: Tandem with Liger's kernels (train.kernels=liger; its wheel carried) against the built-in path.
# Usage: OUT_DIR=out DEADLINE_S=540 WHEELS=.whl PLAN=fast-paths bash tests/gpu/run_on_gpu.sh
set -u
OUT_DIR=${OUT_DIR:-gpu-out}
PLAN=${PLAN:-fast-paths}
WHEELS=${WHEELS:-.tandem/gpu-wheels}
DEADLINE=$((SECONDS + ${DEADLINE_S:-540}))
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
left() { echo $((DEADLINE - SECONDS)); }
step() {  # step NAME SECONDS COMMAND...: run COMMAND for at most SECONDS (or what is left), its output in the log
    local name=$1 budget=$2
    shift 2
    local limit=$(( budget < $(left) ? budget : $(left) ))
    if (( limit < 20 )); then echo "== $name: skipped, $(left) s left" | tee -a "$OUT_DIR/log.txt"; return; fi
    echo "== $name (at most $limit s)" | tee -a "$OUT_DIR/log.txt"
    local start=$SECONDS
    timeout "$limit" "$@" >>"$OUT_DIR/log.txt" 2>&1
    echo "== $name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT_DIR/log.txt"
}
# The carried wheels, then the project itself beside the machine's torch (never a PYTHONPATH): a failure stops here.
WHEELS=$WHEELS LOG=$OUT_DIR/log.txt bash tests/gpu/install.sh || exit 2
{
    nvidia-smi
    python3 tests/benchmarks/gpu_env.py
    python3 -c "import torch, transformers, peft, deepspeed, bitsandbytes as b; print(torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, deepspeed.__version__, b.__version__)"
} >"$OUT_DIR/env.txt" 2>&1
B=tests/benchmarks/bench_gpu.py
if [[ $PLAN == kernels ]]; then
    # The unnamed Tandem variant is train.kernels=auto (Liger where installed, its log says): the two named ones are
    # what is compared.
    step "lora-1.5b-2048 packed: Tandem built-in against Tandem with Liger" 330 python3 $B --cases lora-1.5b-2048 \
        --repeats 3 --steps 14 --torch-adam --packing --micro-batch 4 --no-hf --variant train.kernels=none \
        --variant train.kernels=liger --work /tmp/tandem-bench-work --out "$OUT_DIR/packed_lora_kernels.json"
    step "gpu suite: the kernels" 120 python3 -m pytest -m gpu tests/gpu/test_kernels.py -p no:cacheprovider -q -rA
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
grep -h "^== \|tokens/s\|passed\|failed\|Error" "$OUT_DIR/log.txt" | tail -40
