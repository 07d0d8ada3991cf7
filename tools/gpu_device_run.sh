#!/usr/bin/env bash
# Run the GPU tests and `make bench-gpu` on the device machine (docs/gpu-benchmarks.md).
#
# The device image has its own python3 (torch, Triton, NumPy, attrs, pytest, hypothesis), no
# install of this project and no network, so the package is put on PYTHONPATH as
# pagedstate.{spec,models,impl,gpu,engines} through links to this checkout. Everything goes to $OUT
# (the device tool brings it back): env.txt, gpu_tests.log (tests/test_gpu_cuda.py and
# tests/test_gpu_descriptor.py unless GPU_TESTS names others), bench.log, bench.json,
# gpu-benchmarks.md.
#
# usage (through the device tool): bash tools/gpu_device_run.sh [BENCH ARGS...]
set -uo pipefail
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out" /tmp/pp/pagedstate
for d in spec models impl gpu engines; do ln -sfn "$PWD/$d" "/tmp/pp/pagedstate/$d"; done
export PYTHONPATH=/tmp/pp PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    python3 -c 'import sys, torch, triton, numpy; print(sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__)'
    echo "commit: ${COMMIT:-unknown}"
} 2>&1 | tee "$out/env.txt"
SECONDS=0
python3 -m pytest -q -p no:cacheprovider -o addopts="" -m "not slow" ${GPU_TESTS:-tests/test_gpu_cuda.py tests/test_gpu_descriptor.py} 2>&1 | tee "$out/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}
echo "gpu tests: exit $tests_rc, ${SECONDS}s" | tee -a "$out/gpu_tests.log"
SECONDS=0
python3 -m pagedstate.gpu.bench --json "$out/bench.json" --out "$out/gpu-benchmarks.md" "$@" \
    2>&1 | tee "$out/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "bench: exit $bench_rc, ${SECONDS}s" | tee -a "$out/bench.log"
exit $(( tests_rc || bench_rc ))
