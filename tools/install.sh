#!/usr/bin/env bash
# Create .venv inside the checkout and install Tandem with pinned dependencies. Idempotent: a stamp keyed on
# pyproject.toml + constraints.txt + this script + the Python skips each part when nothing changed.
#
#   bash tools/install.sh                  the runtime: the dependencies and DeepSpeed (`make setup`, `make demo`)
#   bash tools/install.sh --dev            the runtime, then the dev extras: tests, lint, docs (`make setup-dev`, which
#                                          `make test`, `make lint` and `make docs` run first); a stamp of its own
#   bash tools/install.sh --which-python   print the Python the install would use, and install nothing
#
# Python: $PYTHON where it is set; else python3.11 where it exists, else the newest of python3.13 and python3.12 found
# on the PATH, else python3. 3.11, 3.12 and 3.13 are supported; another is refused in one line (exit 2). An existing
# .venv keeps its own Python (remove .venv to change it).
#
# DeepSpeed is built from its sdist once, with its CPU communication op and Adam prebuilt
# (DS_BUILD_SHM_COMM/DS_BUILD_FUSED_ADAM: a CPU run loads both, the first in init_distributed, the second as the
# configs' AdamW), so no run ever JIT-compiles an op: a compile killed half way leaves a lock file that hangs every
# later run. The build compiles with ninja (both cores) and without debug information (-g0 after the ops' own -g: the
# same machine code, a third less compile time, 2 MB of ops instead of 31). The wheel is cached outside the checkout
# (TANDEM_WHEEL_CACHE, default ~/.cache/tandem/wheels), per Python and torch build, so fresh clones on the same machine
# reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."

SUPPORTED="3.11, 3.12 or 3.13"
VENV=.venv

die() {
    echo "setup: $*" >&2
    exit 2
}

# The Python named by $PYTHON, else the first of python3.11, python3.13, python3.12, python3 on the PATH.
choose_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        command -v "$PYTHON" >/dev/null 2>&1 || die "PYTHON=$PYTHON is not a command; set it to a Python $SUPPORTED"
        echo "$PYTHON"
        return
    fi
    local name
    for name in python3.11 python3.13 python3.12 python3; do
        if command -v "$name" >/dev/null 2>&1; then
            echo "$name"
            return
        fi
    done
    die "no Python found (looked for python3.11, python3.13, python3.12, python3): install Python $SUPPORTED," \
        "or set PYTHON=/path/to/python3.X"
}

# X.Y.Z of a Python, refused in one line unless it is 3.11, 3.12 or 3.13.
python_version() {
    local version
    version=$("$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null) \
        || die "$1 does not run as a Python; set PYTHON to a Python $SUPPORTED"
    case "$version" in
        3.11.* | 3.12.* | 3.13.*) echo "$version" ;;
        *) die "Python $version ($1) is not supported: Tandem needs Python $SUPPORTED (set PYTHON=python3.11, say)" ;;
    esac
}

DEV=0
case "${1:-}" in
    "") ;;
    --dev) DEV=1 ;;
    --which-python)
        if [[ -x "$VENV/bin/python" ]]; then
            python="$VENV/bin/python"
        else
            python=$(choose_python)
        fi
        version=$(python_version "$python")
        echo "$python $version"
        exit 0
        ;;
    *) die "unknown option $1 (use --dev or --which-python)" ;;
esac

if [[ -x "$VENV/bin/python" ]]; then
    VERSION=$(python_version "$VENV/bin/python")
    if [[ -n "${PYTHON:-}" ]] && command -v "$PYTHON" >/dev/null 2>&1 \
        && [[ "$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)" != "$VERSION" ]]; then
        echo "setup: $VENV has Python $VERSION, so PYTHON=$PYTHON is not used (remove $VENV to change it)"
    fi
    PYTHON="$VENV/bin/python"
else
    PYTHON=$(choose_python)
    VERSION=$(python_version "$PYTHON")
fi
WANT=$( (cat pyproject.toml constraints.txt tools/install.sh && echo "$VERSION") | sha256sum | cut -c1-16)
STAMP="$VENV/.tandem-installed"
DEV_STAMP="$VENV/.tandem-dev-installed"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && { [[ $DEV == 0 ]] || [[ -f "$DEV_STAMP" && "$(cat "$DEV_STAMP")" == "$WANT" ]]; }; then
    echo "setup: .venv is up to date"
    exit 0
fi

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
INSTALL=(install -q -c constraints.txt)
# setuptools warns on every editable build that a folder named as a package may shadow it: that is the point here.
export PYTHONWARNINGS="ignore:Editable installation"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" ]]; then
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "setup: creating $VENV with Python $VERSION ($PYTHON)"
        "$PYTHON" -m venv "$VENV" || die "$PYTHON could not create $VENV (on Debian and Ubuntu: apt-get install" \
            "python${VERSION%.*}-venv)"
    else
        echo "setup: updating $VENV (Python $VERSION)"
    fi
    # ninja runs DeepSpeed's compiles in parallel (it is one of DeepSpeed's own dependencies).
    "${PIP[@]}" "${INSTALL[@]}" --upgrade pip setuptools wheel ninja
    # torch first: DeepSpeed's build imports it. TORCH_INDEX_URL lets a machine without a local CPU wheel take one from
    # PyTorch's CPU index instead of PyPI's CUDA build.
    "${PIP[@]}" "${INSTALL[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0

    DS_VERSION=$(grep -i '^deepspeed==' constraints.txt | cut -d= -f3)
    have_ds=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('deepspeed'))" 2>/dev/null || true)
    ds=()
    if [[ "$have_ds" != "$DS_VERSION" ]]; then
        # A wheel built against another Python or another build of torch (CPU, CUDA) is not this one's.
        torch_build=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('torch'))")
        CACHE=${TANDEM_WHEEL_CACHE:-$HOME/.cache/tandem/wheels}/torch-$torch_build
        TAG=cp$(echo "$VERSION" | cut -d. -f1-2 | tr -d .)
        mkdir -p "$CACHE"
        WHEEL=$(ls "$CACHE"/deepspeed-"$DS_VERSION"-"$TAG"-*.whl 2>/dev/null | head -n1 || true)
        if [[ -z "$WHEEL" ]]; then
            echo "setup: building DeepSpeed $DS_VERSION with prebuilt CPU ops (once per machine, about 2 minutes)"
            built=$SECONDS
            cxx=$(mktemp)
            trap 'rm -f "$cxx"' EXIT
            printf '#!/bin/sh\nexec %s "$@" -g0\n' "${CXX:-c++}" >"$cxx"
            chmod +x "$cxx"
            PATH="$PWD/$VENV/bin:$PATH" CXX="$cxx" DS_ENABLE_NINJA=1 \
                DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 DS_BUILD_FUSED_ADAM=1 \
                "${PIP[@]}" wheel -q --no-cache-dir --no-deps --no-build-isolation -c constraints.txt \
                -w "$CACHE" "deepspeed==$DS_VERSION"
            WHEEL=$(ls "$CACHE"/deepspeed-"$DS_VERSION"-"$TAG"-*.whl | head -n1)
            echo "setup: built $WHEEL in $((SECONDS - built)) s"
        fi
        ds=("$WHEEL")
    fi
    "${PIP[@]}" "${INSTALL[@]}" --no-build-isolation "${ds[@]}" -e .
    echo "$WANT" >"$STAMP"
    rm -f "$DEV_STAMP"
fi
if [[ $DEV == 1 ]]; then
    echo "setup: installing the dev extras (tests, lint, docs)"
    "${PIP[@]}" "${INSTALL[@]}" --no-build-isolation -e ".[dev]"
    echo "$WANT" >"$DEV_STAMP"
fi
echo "setup: done in $((SECONDS / 60)) min $((SECONDS % 60)) s ($VENV, Python $VERSION)"
