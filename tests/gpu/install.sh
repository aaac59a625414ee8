#!/usr/bin/env bash
# Installs what a GPU session needs into the machine's Python (tests/benchmarks/GPU.md, step 3): the wheels carried in
# WHEELS, then the project itself with its `tandem` command. Run from the checkout's root; output is appended to LOG.
# A failure is one line saying what to carry or fix, exit status 2.
# Usage: WHEELS=.tandem/gpu-wheels LOG=gpu-out/log.txt bash tests/gpu/install.sh
set -u
WHEELS=${WHEELS:-.tandem/gpu-wheels}
LOG=${LOG:-/dev/stderr}
ROOT=$(pwd -P)
OUTPUT=$([[ $LOG == /dev/stderr ]] && echo "pip's output above" || echo "its log: $LOG")
say() {  # say LINE: on the terminal, and in LOG where LOG is a file
    echo "$1"
    [[ $LOG == /dev/stderr ]] || echo "$1" >>"$LOG"
}
stop() {  # stop LINE: the session cannot go on; LINE says what to carry or fix
    say "error: $1"
    exit 2
}
# The carried wheels, but setuptools': that one is the project's build backend, installed below only where the machine's
# own is missing or too old (a plain glob would replace the machine's setuptools, which its torch requires, on 3.12).
CARRIED=()
for wheel in "$WHEELS"/*.whl; do [[ -f $wheel && $(basename "$wheel") != setuptools-* ]] && CARRIED+=("$wheel"); done
if (( ${#CARRIED[@]} )); then
    python3 -m pip install -q --no-index --no-deps --no-compile "${CARRIED[@]}" >>"$LOG" 2>&1 \
        || stop "installing the wheels of $WHEELS failed ($OUTPUT)"
fi
# The project itself, beside the machine's torch (--no-deps), with its `tandem` command: never a PYTHONPATH. Editable,
# because the code's root is the checkout (core/checkout.py): the sample data under data/, the built-in models and the
# scratch space under .tandem/, and the digest of the sources that preflight compares across nodes are read there,
# where a copy in site-packages would have none of them. Offline, the build needs setuptools 70.1 or newer (PEP 660
# editable wheels, with bdist_wheel built in): the machine's, or the one carried in $WHEELS.
python3 -m pip install -q --no-index --find-links "$WHEELS" "setuptools>=70.1" >>"$LOG" 2>&1 \
    || stop "this Python has no setuptools >= 70.1: carry its wheel in $WHEELS (tests/benchmarks/GPU.md, step 2)"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 \
    || stop "installing the project (pip install --no-deps -e .) failed ($OUTPUT)"
# From elsewhere than the checkout (where the working directory would hide a missing install): the import is this one.
(cd / && python3 -c "import core.checkout as c, sys; sys.exit(str(c.PROJECT_ROOT) != sys.argv[1])" "$ROOT") \
    || stop "the project that Python imports is not this checkout ($ROOT): pip uninstall tandem, then run this again"
command -v tandem >/dev/null \
    || stop "the \`tandem\` command is not on PATH: add the directory that pip's warning names ($OUTPUT)"
say "installed the project from $ROOT for $(python3 --version), with $(command -v tandem)"
