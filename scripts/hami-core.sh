#!/usr/bin/env bash
# HAMi-core (libvgpu.so), the open peer of gpuops' limiter, built here for the side-by-side run
# on a lent GPU (docs/testing.md, "A session with a GPU"; bench/limiter_gpu.py --engine hami).
#
#   bash scripts/hami-core.sh [SOURCE]     # -> .hami/libvgpu.so (in .gitignore)
#
# SOURCE is a HAMi-core checkout; without it the pinned commit is cloned from GitHub. The GPU
# machine has no network and this one need not have CUDA: the CUDA and NVML headers come from
# NVIDIA's PyPI wheels (12.9: HAMi-core's hook tables are written against CUDA 12's cuda.h), and
# libcuda.so.1 / libnvidia-ml.so.1 are link stubs with those sonames and no code, as the CUDA
# toolkit's own stubs are; the real driver libraries are what the loader finds on the GPU machine.
# --no-as-needed keeps libcuda.so.1 and libnvidia-ml.so.1 NEEDED, as its CMake file links them.
# Built as HAMi's build.sh (and so its Dockerfile) does: multiprocess limits, dlsym hook, meminfo and
# NVML hooks, CMAKE_BUILD_TYPE=Debug. Not Release: its Release flags add -fvisibility=hidden, which
# hides every cu* hook but dlsym, and such a build intercepts nothing (seen on an H100, PyTorch 2.11).
set -euo pipefail
cd "$(dirname "$0")/.."
PIN=8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811
CUDA_WHEELS=(nvidia-cuda-runtime-cu12==12.9.79 nvidia-nvml-dev-cu12==12.9.79)
out=$PWD/.hami
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

src=${1:-}
if [ -z "$src" ]; then
    git clone -q https://github.com/Project-HAMi/HAMi-core "$work/src"
    src=$work/src
fi
git -C "$src" rev-parse HEAD >/dev/null 2>&1 || { echo "error: $src is not a git checkout of HAMi-core" >&2; exit 1; }
rm -rf "$work/tree" && git clone -q "$src" "$work/tree" && git -C "$work/tree" checkout -q "$PIN"

# Headers: the wheels' include/ folders merged into one CUDA_HOME.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/wheels" "${CUDA_WHEELS[@]}"
mkdir -p "$work/cuda/include" "$work/cuda/lib64"
for wheel in "$work"/wheels/*.whl; do
    python3 - "$wheel" "$work/cuda/include" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if "/include/" in name and not name.endswith("/"):
            target = dest + "/" + name.split("/include/", 1)[1]
            import os
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as dst:
                dst.write(src.read())
PY
done
for lib in cuda nvidia-ml cudart; do
    echo 'void gpuops_link_stub(void) {}' | gcc -shared -fPIC -x c - -Wl,-soname,"lib$lib.so.1" \
        -o "$work/cuda/lib64/lib$lib.so"
done

mkdir -p "$work/tree/build"
(
    cd "$work/tree/build"
    CUDA_HOME=$work/cuda cmake .. -DCMAKE_BUILD_TYPE=Debug -DDLSYM_HOOK_ENABLE=1 \
        -DMULTIPROCESS_LIMIT_ENABLE=1 -DHOOK_MEMINFO_ENABLE=1 -DHOOK_NVML_ENABLE=1 \
        -DCMAKE_SHARED_LINKER_FLAGS="-L$work/cuda/lib64 -Wl,--no-as-needed" -DCMAKE_EXE_LINKER_FLAGS="-L$work/cuda/lib64" >/dev/null
    # Only the library: HAMi's test programs need nvcc.
    CUDA_HOME=$work/cuda make -s -j"$(nproc)" vgpu >/dev/null
)
mkdir -p "$out"
cp "$work/tree/build/libvgpu.so" "$out/libvgpu.so"
echo "$PIN" >"$out/COMMIT"
echo "$out/libvgpu.so: HAMi-core $PIN ($(du -h "$out/libvgpu.so" | cut -f1)); needs: $(readelf -d "$out/libvgpu.so" | grep -o 'lib[a-z-]*\.so\.[0-9]*' | tr '\n' ' ')"
