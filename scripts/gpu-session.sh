#!/usr/bin/env bash
# Everything GPU-side in one call on a lent GPU machine (docs/testing.md, "A session with a GPU"):
#
#   bash scripts/gpu-session.sh OUT_DIR
#
# Needs, prepared on a machine with network: .whl/ (scripts/gpu-wheels.sh) and, for the
# side-by-side figures, .hami/libvgpu.so (scripts/hami-core.sh). Runs, each stage under a time
# limit so that a hang costs one stage and not the lease:
#   1. make gpu-test: NVML against the real driver (read-only) and the limiter under PyTorch;
#   2. HAMi-core through the same programs (bench/limiter_gpu.py --engine hami), one measure per
#      stage, when .hami/libvgpu.so is there.
# GPU_TEST_SELECT, a pytest -k expression, runs part of the suite again (a second call on what
# failed in the first). OUT_DIR gets results.tar.gz (every JSON figure, the logs) and session.log. The GPU's settings
# are only read: no MIG mode change, no reset, no daemon left behind.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu-session.sh OUT_DIR}
mkdir -p "$out"
results=$(mktemp -d)/results
mkdir -p "$results"
log=$out/session.log
exec > >(tee "$log") 2>&1

stage() {  # stage NAME SECONDS CMD...: runs CMD under a limit, ends its workers if it is killed
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "=== $name (limit ${limit}s)"
    timeout --signal=TERM --kill-after=10 "$limit" "$@"
    local rc=$?
    pkill -f "tests/gpu/programs/" 2>/dev/null && sleep 1
    echo "=== $name: exit $rc after $((SECONDS - t0))s"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current,compute_mode --format=csv
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 GPUOPS_GPU_RESULTS=$results

# A build of the limiter before a change (native/build/before, made on the CPU machine from the
# previous commit) runs in the same rounds of the overhead loops, as "NAME, before".
if [ -f native/build/before/libgpuops-limiter.so ]; then
    export GPUOPS_LIMITER_BEFORE=$PWD/native/build/before/libgpuops-limiter.so
fi
stage "gpu-test" "${GPU_TEST_LIMIT:-480}" make -s gpu-test \
    PYTEST_ARGS="-p no:cacheprovider --durations=0${GPU_TEST_SELECT:+ -k '$GPU_TEST_SELECT'}"
if [ -f .hami/libvgpu.so ]; then
    for m in memory-default:50 memory-expandable:50 shares:80 overhead:160; do
        stage "hami ${m%%:*}" "${m##*:}" python3 bench/limiter_gpu.py --engine hami --only "${m%%:*}"
    done
fi
nvidia-smi --query-gpu=name,memory.used,mig.mode.current --format=csv
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
tar -C "$(dirname "$results")" -czf "$out/results.tar.gz" results
echo "results: $(ls "$results" | tr '\n' ' ')"
