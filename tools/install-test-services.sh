#!/usr/bin/env bash
# System services the test suite starts for real: SLURM (slurmctld + slurmd) and munge, from Debian's
# packages. Run by `make test`; needs root and apt-get, otherwise it says so and the SLURM tests skip.
set -euo pipefail
if command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then
    exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: slurm-wlm/munge not installed (needs root + apt-get); the SLURM tests will be skipped"
    exit 0
fi
echo "setup: installing slurm-wlm and munge for the SLURM tests"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
