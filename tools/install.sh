#!/usr/bin/env bash
# Create .venv inside the checkout and install Tandem with pinned dependencies. Idempotent: a stamp
# keyed on pyproject.toml + constraints.txt skips everything when nothing changed.
#
#   bash tools/install.sh            (what `make setup` runs)
#
# DeepSpeed is built from its sdist once, with its CPU communication op and Adam prebuilt
# (DS_BUILD_SHM_COMM/DS_BUILD_FUSED_ADAM), so no run ever JIT-compiles an op: a compile killed half
# way leaves a lock file that hangs every later run. The wheel is cached outside the checkout
# (TANDEM_WHEEL_CACHE, default ~/.cache/tandem/wheels) so fresh clones on the same machine reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=.venv
STAMP="$VENV/.tandem-installed"
WANT=$(cat pyproject.toml constraints.txt tools/install.sh | sha256sum | cut -c1-16)
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    echo "setup: .venv is up to date"
    exit 0
fi

"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"Python 3.11 required, got {sys.version}"'
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip setuptools wheel
# torch first: DeepSpeed's build imports it. TORCH_INDEX_URL lets a machine without a local CPU
# wheel take one from PyTorch's CPU index instead of PyPI's CUDA build.
"${PIP[@]}" install -q -c constraints.txt ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0

DS_VERSION=$(grep -i '^deepspeed==' constraints.txt | cut -d= -f3)
CACHE=${TANDEM_WHEEL_CACHE:-$HOME/.cache/tandem/wheels}
mkdir -p "$CACHE"
if ! "$VENV/bin/python" -c "import deepspeed, sys; sys.exit(deepspeed.__version__ != '$DS_VERSION')" 2>/dev/null; then
    WHEEL=$(ls "$CACHE"/deepspeed-"$DS_VERSION"-*.whl 2>/dev/null | head -n1 || true)
    if [[ -z "$WHEEL" ]]; then
        echo "setup: building DeepSpeed $DS_VERSION with prebuilt CPU ops (once per machine, ~4 min)"
        DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 DS_BUILD_FUSED_ADAM=1 \
            "${PIP[@]}" wheel -q --no-cache-dir --no-deps --no-build-isolation -c constraints.txt \
            -w "$CACHE" "deepspeed==$DS_VERSION"
        WHEEL=$(ls "$CACHE"/deepspeed-"$DS_VERSION"-*.whl | head -n1)
    fi
    "${PIP[@]}" install -q -c constraints.txt "$WHEEL"
fi

"${PIP[@]}" install -q -c constraints.txt -e ".[dev]"
echo "$WANT" > "$STAMP"
echo "setup: done ($VENV)"
