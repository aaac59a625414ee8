#!/usr/bin/env bash
# System services and programs the test suite runs for real, from Debian's packages: SLURM (slurmctld +
# slurmd) and munge for the SLURM tests, Chromium for the test that opens the Prefect UI's run form, OpenSSH's
# server (and iproute2's ip/tc) for the netns suite's machines in network namespaces. Run by
# `make test`; installs only what is missing. Needs root and apt-get, otherwise it says so and those tests skip.
set -euo pipefail
missing=()
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    missing+=(slurm-wlm munge)
fi
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
command -v tc >/dev/null 2>&1 || missing+=(iproute2)
if [[ ${#missing[@]} == 0 ]]; then
    exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: ${missing[*]} not installed (needs root + apt-get); the SLURM / browser / netns tests will be skipped"
    exit 0
fi
echo "setup: installing ${missing[*]} for the SLURM / browser / netns tests"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
