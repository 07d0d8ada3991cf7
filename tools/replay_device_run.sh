#!/usr/bin/env bash
# `pagedstate replay --executor triton` on the device machine (docs/replay.md): the store's ops run
# on real tensors of the model's full geometry on the GPU and every restore is checked bit for
# bit. Results go to $OUT (env.txt, tests.log, replay_*.log, replay_*.json).
#
# The device image has its own python3 (torch, Triton, NumPy, attrs, pytest, hypothesis) and
# no network: the package goes on PYTHONPATH through links to this checkout (as in
# tools/gpu_device_run.sh). The traces ship in the checkout under data/traces/ and travel
# with the working tree; TRACES=DIR reads them from elsewhere.
# usage (through the device tool): bash tools/replay_device_run.sh
set -uo pipefail
out=${OUT:-/tmp/replay-out}
traces=${TRACES:-data/traces}
model=${MODEL:-Qwen/Qwen3-Next-80B-A3B-Instruct}
mkdir -p "$out" /tmp/pp/pagedstate
for d in spec models impl gpu engines; do ln -sfn "$PWD/$d" "/tmp/pp/pagedstate/$d"; done
export PYTHONPATH=/tmp/pp PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c 'import sys, torch, triton; print(sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
    echo "commit: ${COMMIT:-unknown}"
} 2>&1 | tee "$out/env.txt"
rc=0
SECONDS=0
python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_replay_exec.py tests/test_replay.py \
    2>&1 | tee "$out/tests.log" || rc=1
echo "tests: ${SECONDS}s" | tee -a "$out/tests.log"
run() {  # name, then replay arguments
    local name=$1
    shift
    SECONDS=0
    python3 -m pagedstate.models.cli replay "$@" --model "$model" --executor triton --quiet \
        --json "$out/replay_$name.json" 2>&1 | tee "$out/replay_$name.log"
    local r=${PIPESTATUS[0]}
    echo "replay $name: exit $r, ${SECONDS}s" | tee -a "$out/replay_$name.log"
    [ "$r" -eq 0 ] || rc=1
}
run verify2000 "$traces/conversation_trace.jsonl" --pool-gib 16 --placement end,anchor,grid:4 \
    --limit 2000 --verify --offload --abort-rate 0.02
run conversation "$traces/conversation_trace.jsonl" --pool-gib 16,64 --placement anchor
run synthetic "$traces/synthetic_trace.jsonl" --pool-gib 16 --placement anchor,grid:4
exit $rc
