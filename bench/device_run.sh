#!/usr/bin/env bash
# One benchmark call on the lent GPU machine, the same way every time:
#   bash bench/device_run.sh [bench.kernelbench options ...]
# e.g. bash bench/device_run.sh --only level2/47_ level2/51_ --timeout 150 --budget 400
# KB=.kb/OTHER bash bench/device_run.sh ... runs another carried folder of tasks (default the dev set).
# The device tool copies the working tree with `carry: [".whl", ".kb"]` (bench/device_prep.sh makes
# them); nothing there can reach the network.  This installs the wheels the image lacks (once per
# machine), turns isolation on with the carried bubblewrap, runs the dev set's tasks with the
# options given, and copies the records, tables and the policy data harvested from the runs' drafts
# (only the files this call wrote: the tool returns a limited number) to $OUT, also when the run
# is cut short, so the caller copies $OUT's files into the repo before the next call.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ ! -d /tmp/site/langgraph ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
mkdir -p /tmp/bin && cp .whl/bwrap /tmp/bin/ && chmod +x /tmp/bin/bwrap
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MTMC_BWRAP=/tmp/bin/bwrap
OUT=${OUT:-/tmp/out}
STARTED=$(mktemp)   # only what this call wrote goes back (the tool returns a limited number of files)
copy_out() {
    mkdir -p "$OUT/policy"
    find bench/results -maxdepth 1 \( -name 'kernelbench-*-h*.*' -o -name kernelbench-baselines.jsonl \) \
        -newer "$STARTED" -exec cp {} "$OUT/" \;
    find bench/data/policy -name '*harvest*' -newer "$STARTED" -exec cp {} "$OUT/policy/" \;
    df -h / | tail -1
}
trap copy_out EXIT
trap "exit 143" TERM INT   # so a timeout still copies what finished
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
python3 -m bench.kernelbench "${KB:-.kb/kernelbench-dev}" --max-steps 2 --compile-modes default "$@" 2>&1 \
    | grep -v '^\s*$' | grep -v '\.\.\.$' | tail -40
