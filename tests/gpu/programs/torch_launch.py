"""A launch-bound loop for the overhead test (run by tests/gpu/torchlab.py).

    python torch_launch.py ITERATIONS REPEATS [CPUS]

Adds 1 to a one-element tensor ITERATIONS times per repeat (each add is one tiny kernel: the
loop's speed is the speed of launching), waiting for the GPU at the end of each repeat, and
prints 'RESULT {json}' with the time per iteration of each repeat. Torch and the standard
library only. CPUS (such as 14,15) pins the process, and the driver threads CUDA starts in it,
to those CPUs before CUDA starts, and after the warm-up the loop's thread alone on the last one.
"""

import contextlib
import json
import os
import statistics
import sys
import threading
import time

import torch

WARMUP = 2000


def limiter_loaded() -> bool:
    """gpuops' limiter, or HAMi-core's libvgpu for the side-by-side run, is mapped."""
    with open("/proc/self/maps") as maps:
        text = maps.read()
    return "libgpuops-limiter" in text or "libvgpu.so" in text


def isolate_main_thread(cpus: list[int]) -> None:
    """The launching thread alone on the last CPU, every other thread (the driver's, PyTorch's
    pools) on the others: where they shared both, a process ran either ~7 or ~10 us an
    iteration depending on where the threads happened to land, whatever the limiter did."""
    if len(cpus) < 2:
        return
    main_tid = threading.get_native_id()
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), {cpus[-1]} if int(tid) == main_tid else set(cpus[:-1]))


def main() -> int:
    iterations, repeats = int(sys.argv[1]), int(sys.argv[2])
    if len(sys.argv) > 3:
        os.sched_setaffinity(0, {int(c) for c in sys.argv[3].split(",")})
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    x = torch.zeros(1, device=device, dtype=torch.float32)
    for _ in range(WARMUP):
        x.add_(1.0)
    torch.cuda.synchronize()
    if len(sys.argv) > 3:
        isolate_main_thread(sorted(int(c) for c in sys.argv[3].split(",")))
    per_iteration = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iterations):
            x.add_(1.0)
        torch.cuda.synchronize()
        per_iteration.append((time.perf_counter() - start) / iterations)
    expected = WARMUP + iterations * repeats  # exact in float32 below 2**24
    out = {
        "pid": os.getpid(),
        "limiter_loaded": limiter_loaded(),
        "iterations": iterations,
        "repeats": repeats,
        "us": [t * 1e6 for t in per_iteration],
        "median_us": statistics.median(per_iteration) * 1e6,
        "min_us": min(per_iteration) * 1e6,
        "value_ok": float(x.item()) == float(expected),
    }
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
