#!/usr/bin/env bash
# The GPU session in one command (tests/benchmarks/GPU.md): install the carried wheels, then, until DEADLINE_S
# seconds from the start, the benchmark cases in their ranked order and the gpu suite, each result kept in $OUT_DIR
# as soon as it exists. Usage: OUT_DIR=out DEADLINE_S=540 WHEELS=.whl bash tests/gpu/run_on_gpu.sh
set -u
OUT_DIR=${OUT_DIR:-gpu-out}
WHEELS=${WHEELS:-.tandem/gpu-wheels}
DEADLINE=$((SECONDS + ${DEADLINE_S:-540}))
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
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
python3 -m pip install -q --no-index --no-deps --no-compile "$WHEELS"/*.whl >>"$OUT_DIR/log.txt" 2>&1 \
    || { echo "pip install failed" | tee -a "$OUT_DIR/log.txt"; exit 1; }
{
    nvidia-smi
    python3 tests/benchmarks/gpu_env.py
    python3 -c "import torch, transformers, peft, deepspeed, bitsandbytes as b; print(torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, deepspeed.__version__, b.__version__)"
} >"$OUT_DIR/env.txt" 2>&1
# DeepSpeed's fused Adam (the default JSON's optimizer, which the gpu suite runs) compiles at first use: meanwhile.
(python3 -c "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()" \
    >"$OUT_DIR/fused_adam.txt" 2>&1 &)
B=tests/benchmarks/bench_gpu.py
step "lora-1.5b-2048, both trainers" 230 python3 $B --cases lora-1.5b-2048 --repeats 2 --steps 14 --torch-adam \
    --out "$OUT_DIR/bench_lora.json"
step "gpu suite" 150 python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -n 4 -q -rA
step "full-1.5b-2048, both trainers" 200 python3 $B --cases full-1.5b-2048 --repeats 1 --steps 14 --torch-adam \
    --out "$OUT_DIR/bench_full.json"
step "lora-1.5b-2048, the loss over full logits" 120 python3 $B --cases lora-1.5b-2048 --repeats 1 --steps 14 \
    --torch-adam --no-hf --loss-chunk-tokens 0 --out "$OUT_DIR/bench_lora_full_logits.json"
grep -h "^== \|tokens/s\|passed\|failed\|Error" "$OUT_DIR/log.txt" | tail -40
