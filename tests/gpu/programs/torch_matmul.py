"""A matmul loop for the compute-share test (run by tests/gpu/torchlab.py).

    python torch_matmul.py SIZE BATCH

Warms up, prints 'ready', then reads 'go T0 T1 T_END' (time.monotonic() seconds, the same clock
in every process) from stdin. Runs SIZE x SIZE matmuls until T_END, waiting for the GPU after
each BATCH, and prints 'RESULT {json}' with the matmuls completed between T0 and T1
(interpolated between those waits). Torch and the standard library only.
"""

import itertools
import json
import os
import sys
import time

import torch


def limiter_loaded() -> bool:
    """gpuops' limiter, or HAMi-core's libvgpu for the side-by-side run, is mapped."""
    with open("/proc/self/maps") as maps:
        text = maps.read()
    return "libgpuops-limiter" in text or "libvgpu.so" in text


def count_at(marks: list, t: float) -> float:
    """Matmuls completed at time t, from (time, completed) marks taken after each wait."""
    for (ta, na), (tb, nb) in itertools.pairwise(marks):
        if ta <= t <= tb:
            return na + (nb - na) * (t - ta) / (tb - ta) if tb > ta else nb
    raise ValueError(f"time {t:.3f} outside the run ({marks[0][0]:.3f} .. {marks[-1][0]:.3f})")


def main() -> int:
    size, batch = int(sys.argv[1]), int(sys.argv[2])
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    torch.manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    c = torch.empty(size, size, device=device, dtype=dtype)
    for _ in range(3 * batch):  # cuBLAS set-up and kernel selection
        torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    print("ready", flush=True)

    words = sys.stdin.readline().split()
    if len(words) != 4 or words[0] != "go":
        print(f"expected 'go T0 T1 T_END', got {words!r}", file=sys.stderr)
        return 2
    t0, t1, t_end = (float(w) for w in words[1:])
    done = 0
    marks = [(time.monotonic(), 0)]
    while marks[-1][0] < t_end:
        for _ in range(batch):
            torch.mm(a, b, out=c)
        torch.cuda.synchronize()
        done += batch
        marks.append((time.monotonic(), done))
    if marks[0][0] > t0:
        print(f"started {marks[0][0] - t0:.3f} s after T0", file=sys.stderr)
        return 3
    completed = count_at(marks, t1) - count_at(marks, t0)
    rate = completed / (t1 - t0)
    out = {
        "pid": os.getpid(),
        "limiter_loaded": limiter_loaded(),
        "size": size,
        "dtype": str(dtype).replace("torch.", ""),
        "batch": batch,
        "window_s": t1 - t0,
        "matmuls": completed,
        "matmuls_per_s": rate,
        "tflops": rate * 2 * size**3 / 1e12,
        "total_matmuls": done,
        "finite": bool(torch.isfinite(c).all().item()),
    }
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
