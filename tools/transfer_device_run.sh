#!/usr/bin/env bash
# The prefill/decode transfer (docs/transfer.md) on the two-GPU device machine
# (kind nvidia-h200-x2): the gloo tests (two local processes), then the nccl benchmark at the
# full Qwen3-Next-80B-A3B geometry, the protocol against a plain NCCL send/recv of the same
# bytes in the same run.
#
# The device image has its own python3 (torch, NumPy, attrs, pytest, hypothesis), no install
# of this project and no network, so the package is put on PYTHONPATH as
# pagedstate.{spec,models,impl,gpu,engines} through links to this checkout (as in
# tools/gpu_device_run.sh); the ranks the benchmark spawns inherit it. NVLink multicast stays
# off (the machine's KINDS.md: NCCL_NVLS_ENABLE=0 and friends), also in the children.
# Everything goes to $OUT: env.txt, transfer_tests.log, bench_transfer.log,
# bench_transfer.json, transfer.md (docs/transfer.md with the nccl section filled in).
#
# usage (through the device tool, kind nvidia-h200-x2):
#     bash tools/transfer_device_run.sh [BENCH ARGS...]
# BENCH ARGS replace the defaults below (e.g. --images 256 --window 8 --block-tokens 512).
set -uo pipefail
out=${OUT:-/tmp/transfer-out}
mkdir -p "$out" /tmp/pp/pagedstate
for d in spec models impl gpu engines; do ln -sfn "$PWD/$d" "/tmp/pp/pagedstate/$d"; done
export PYTHONPATH=/tmp/pp PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
    date -u
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
    nvidia-smi topo -m || true
    python3 -c 'import sys, torch, torch.distributed as d; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None, "gpus", torch.cuda.device_count(), "gloo", d.is_gloo_available(), "nccl", d.is_nccl_available())'
    echo "commit: ${COMMIT:-unknown}"
} 2>&1 | tee "$out/env.txt"
SECONDS=0
python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_transfer.py 2>&1 \
    | tee "$out/transfer_tests.log"
tests_rc=${PIPESTATUS[0]}
echo "transfer tests: exit $tests_rc, ${SECONDS}s" | tee -a "$out/transfer_tests.log"
cp docs/transfer.md "$out/transfer.md"
if [ $# -gt 0 ]; then
    args=("$@")
else
    # issue 21: 16-, 128- and 512-token pages, windows 8 and 32, the index path against the
    # copy engine, rounds one at a time against pipelined (regions: docs/transfer.md has it)
    args=(--images 256 --window 8,32 --block-tokens 16,128,512 --payload staged
          --pipeline 1,2 --copy-engine index,triton)
fi
SECONDS=0
python3 -m pagedstate.models.bench.transfer --backend nccl "${args[@]}" \
    --json "$out/bench_transfer.json" --out "$out/transfer.md" 2>&1 | tee "$out/bench_transfer.log"
bench_rc=${PIPESTATUS[0]}
echo "bench: exit $bench_rc, ${SECONDS}s" | tee -a "$out/bench_transfer.log"
exit $(( tests_rc || bench_rc ))
