#!/usr/bin/env python3
"""torch-adamw.py N [REPS] -- PyTorch's AdamW on one flat tensor of N fp32
parameters, the peer of `ztier bench device`'s fp32 AdamW row at the same N
(run-gpu.sh runs both, in the same call).

On a GPU the step is torch.optim.AdamW(fused=True), timed with CUDA events;
where that does not exist (an older PyTorch) or there is no GPU, the foreach
step, timed on the host clock. The values are fresh random numbers, not
zeros. Prints one JSON object: the median of REPS steps after one untimed
(which creates m and v), and the bytes a step reads and writes (28 a
parameter: the parameter, m and v read and written, the gradient read).
"""
import json
import sys
import time

import torch


def timed_step(opt, on_gpu):
    if not on_gpu:
        t0 = time.perf_counter()
        opt.step()
        return time.perf_counter() - t0
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    opt.step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def main(argv):
    if len(argv) not in (2, 3) or not argv[1].isdigit() or int(argv[1]) < 1:
        sys.exit("usage: torch-adamw.py N [REPS]; N (parameters) is a whole number >= 1")
    n = int(argv[1])
    reps = int(argv[2]) if len(argv) == 3 and argv[2].isdigit() else 7
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    gen = torch.Generator().manual_seed(7)
    p = torch.nn.Parameter(((torch.rand(n, generator=gen) - 0.5) * 4).to(device))
    p.grad = ((torch.rand(n, generator=gen) - 0.5) * 0.04).to(device)
    kind = "fused"
    try:
        if not on_gpu:
            raise TypeError("fused needs a GPU")
        opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, fused=True)
    except (TypeError, RuntimeError):
        kind = "foreach"
        opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, foreach=True)
    before = p.detach().clone()
    timed_step(opt, on_gpu)
    # What is timed must do the work: the first step moved every parameter.
    if torch.equal(before, p.detach()):
        sys.exit("torch-adamw.py: the step left the parameters as they were")
    del before
    times = sorted(timed_step(opt, on_gpu) for _ in range(reps))
    step_s = times[len(times) // 2]
    out = {
        "peer": "torch.optim.AdamW",
        "kind": kind,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "params": n,
        "dtype": "fp32",
        "reps": reps,
        "step_s": step_s,
        "step_s_min": times[0],
        "step_s_max": times[-1],
        "gbps": 28.0 * n / step_s / 1e9,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv)
