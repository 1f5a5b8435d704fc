"""PyTorch filling its tenant's memory cap (run under the limiter by tests/gpu/torchlab.py).

    python torch_fill.py probe            make a context and one small tensor, report, exit
    python torch_fill.py fill CHUNK_BYTES

fill: allocates CHUNK_BYTES, then CHUNK_BYTES/16, until each is refused, touches what it holds,
prints 'FILLED {json}', holds it until a line comes on stdin, then prints 'RESULT {json}' and
exits. What the limiter refused is in its log (GPUOPS_LOG_LEVEL=3: 'refused N bytes ... at its
cap'); an out-of-memory error without such a line came from the driver. torch and the standard
library only.
"""

import json
import os
import sys

import torch


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def main() -> int:
    mode = sys.argv[1]
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    out = {"pid": os.getpid(), "torch": torch.__version__}
    free, total = torch.cuda.mem_get_info(device)
    out["free_before"], out["total"] = free, total
    if mode == "probe":
        torch.ones(1, device=device).add_(1)
        torch.cuda.synchronize()
        print("RESULT " + json.dumps(out), flush=True)
        return 0
    oom_error = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    chunk = int(sys.argv[2])
    held, errors = [], []
    for size in (chunk, chunk // 16):
        while len(held) < 100000:
            try:
                held.append(torch.empty(size, dtype=torch.uint8, device=device))
            except oom_error as exc:
                errors.append(first_line(exc))
                break
    for block in held:
        block.fill_(1)
    torch.cuda.synchronize()
    out["held_bytes"] = sum(b.numel() for b in held)
    out["reserved_bytes"] = torch.cuda.memory_reserved(device)
    out["free_at_oom"] = torch.cuda.mem_get_info(device)[0]
    out["errors"] = errors
    print("FILLED " + json.dumps(out), flush=True)
    sys.stdin.readline()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
