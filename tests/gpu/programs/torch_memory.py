"""PyTorch at a memory cap (run under the limiter by tests/gpu/torchlab.py).

    python torch_memory.py CAP_BYTES CHUNK_BYTES

What the program sees and does: torch.cuda.mem_get_info() before anything is allocated; one
allocation past the cap; allocations of CHUNK_BYTES until an out-of-memory error; then, after
giving everything back, half the cap allocated and used again (the program survived).
Prints 'RESULT {json}' as its last line; torch and the standard library only.
"""

import json
import os
import sys

import torch


def limiter_loaded() -> bool:
    """gpuops' limiter, or HAMi-core's libvgpu for the side-by-side run, is mapped."""
    with open("/proc/self/maps") as maps:
        text = maps.read()
    return "libgpuops-limiter" in text or "libvgpu.so" in text


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def touch(blocks: list) -> None:
    for block in blocks:
        block.fill_(1)
    torch.cuda.synchronize()


def main() -> int:
    cap, chunk = int(sys.argv[1]), int(sys.argv[2])
    oom_error = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)  # torch >= 1.13 has it
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    out = {
        "pid": os.getpid(),
        "torch": torch.__version__,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "limiter_loaded": limiter_loaded(),
    }
    free, total = torch.cuda.mem_get_info(device)
    out["free_before"], out["total"] = free, total
    out["device_total_memory"] = torch.cuda.get_device_properties(device).total_memory

    # One allocation past the cap.
    out["single_oom"], out["single_error"] = False, ""
    try:
        big = torch.empty(cap + chunk, dtype=torch.uint8, device=device)
        big.fill_(1)
        torch.cuda.synchronize()
        del big
    except oom_error as exc:
        out["single_oom"], out["single_error"] = True, first_line(exc)
    torch.cuda.empty_cache()

    # Chunks up to the cap (and a few past it, should the cap not hold).
    held = []
    out["fill_oom"], out["fill_error"] = False, ""
    while len(held) < cap // chunk + 4:
        try:
            held.append(torch.empty(chunk, dtype=torch.uint8, device=device))
        except oom_error as exc:
            out["fill_oom"], out["fill_error"] = True, first_line(exc)
            break
    touch(held)  # the memory is real
    out["held_bytes"] = len(held) * chunk
    out["reserved_at_oom"] = torch.cuda.memory_reserved(device)
    out["free_at_oom"] = torch.cuda.mem_get_info(device)[0]

    # Give it back and go on working.
    held.clear()
    torch.cuda.empty_cache()
    out["free_after_release"] = torch.cuda.mem_get_info(device)[0]
    # Half the cap filled and checked in place: int32.sum() would make an int64 copy (twice the
    # bytes), which a correct cap refuses.
    out["after_fill_ok"], out["after_matmul_ok"], out["after_error"] = False, False, ""
    try:
        ones = torch.ones(cap // 2 // 4, dtype=torch.int32, device=device)
        out["after_fill_ok"] = bool((ones == 1).all().item())
        del ones
        a = torch.randn(2048, 2048, device=device)
        out["after_matmul_ok"] = bool(torch.isfinite(a @ a).all().item())
        torch.cuda.synchronize()
    except oom_error as exc:
        out["after_error"] = first_line(exc)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
