"""Benchmark: memory of grpo.chunked_logprobs (forward + backward) against the naive log-softmax.

Shape (BENCH.md): V = 151,936 (Qwen3), 2,048 completion tokens, hidden 1,024, fp32 on CPU.
The naive baseline is what a trainer does without care: logits = head(hidden) (N, V), full
log_softmax (N, V), gather the targets, backward.

How peak memory is measured on CPU (torch has no CPU allocator statistics): each method runs in a
fresh process (so neither inherits the other's freed-but-cached heap); after building the inputs
(hidden (N, H), the head (V, H)), the process resets its kernel high-water mark by writing "5" to
/proc/self/clear_refs, runs forward + backward, and reads VmHWM from /proc/self/status. The figure
is VmHWM minus VmRSS just before the call: every byte the method touched at its peak, including
the head's gradient (V, H), which both methods need. Large tensors are mmap-backed, so they return
to the kernel when freed and the high-water mark is exact up to page granularity. Without
clear_refs (non-Linux), the process peak (ru_maxrss) is used instead; the inputs are built before
the call, so the baseline is still right.

The error figure compares our fp32 chunked log-probs and their gradients (w.r.t. hidden and head)
with a naive fp64 reference on the first 256 of the tokens (fp64 at the full size would take most
of the two-minute budget on two cores): max over values and both gradients of |ours - ref|.

Run: python bench/logprob.py   (last lines: JSON figures; never asserts)
"""
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from grpo import chunked_logprobs  # noqa: E402

V, N, H = 151_936, 2_048, 1_024
N_ERR = 256
CHUNK = 256


def make_inputs(n, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g) * 0.02)    # Qwen-like init scale
    hidden = torch.randn(n, H, generator=g)                          # RMS-normed hidden states
    targets = torch.randint(0, V, (n,), generator=g)
    coef = torch.randn(n, generator=g)                               # stands in for -A * w / n
    return head.to(dtype), hidden.to(dtype).requires_grad_(), targets, coef.to(dtype)


def naive_logprobs(hidden, head, targets, temperature=1.0):
    logits = head(hidden) / temperature                                          # (N, V)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def _status_kb(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def measure(method):
    """Child process: peak extra resident memory (bytes) of one forward + backward."""
    head, hidden, targets, coef = make_inputs(N)
    fn = naive_logprobs if method == "naive" else \
        (lambda h, m, y: chunked_logprobs(h, m, y, chunk_size=CHUNK))
    try:
        Path("/proc/self/clear_refs").write_text("5")
        base, peak_of = _status_kb("VmRSS") * 1024, (lambda: _status_kb("VmHWM") * 1024)
    except OSError:
        base = _status_kb("VmRSS") * 1024 if Path("/proc/self/status").exists() else 0
        peak_of = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # noqa: E731
    t0 = time.perf_counter()
    (fn(hidden, head, targets) * coef).sum().backward()
    seconds = time.perf_counter() - t0
    print(json.dumps({"method": method, "peak_extra_bytes": peak_of() - base, "seconds": seconds}))


def max_abs_err():
    head, hidden, targets, coef = make_inputs(N)
    head_w = head.weight.detach()
    hidden, targets, coef = hidden.detach()[:N_ERR].requires_grad_(), targets[:N_ERR], coef[:N_ERR]
    ours = chunked_logprobs(hidden, head, targets, chunk_size=CHUNK)
    (ours * coef).sum().backward()
    h64 = hidden.detach().double().requires_grad_()
    head64 = torch.nn.Linear(H, V, bias=False).double()
    with torch.no_grad():
        head64.weight.copy_(head_w.double())
    ref = naive_logprobs(h64, head64, targets)
    (ref * coef.double()).sum().backward()
    return max((ours.double() - ref).abs().max().item(),
               (hidden.grad.double() - h64.grad).abs().max().item(),
               (head.weight.grad.double() - head64.weight.grad).abs().max().item())


def main():
    results = {}
    for method in ("naive", "ours"):
        out = subprocess.run([sys.executable, __file__, method], capture_output=True, text=True,
                             check=True).stdout.strip().splitlines()[-1]
        results[method] = json.loads(out)
        print(f"{method:>5}: peak extra {results[method]['peak_extra_bytes'] / 2**20:8.0f} MiB, "
              f"{results[method]['seconds']:.1f} s")
    t0 = time.perf_counter()
    err = max_abs_err()
    seconds = time.perf_counter() - t0
    print(f"error check ({N_ERR} tokens, fp32 vs fp64): {err:.2e} in {seconds:.1f} s")
    ratio = results["ours"]["peak_extra_bytes"] / results["naive"]["peak_extra_bytes"]
    print(json.dumps({"metric": "logprob.peak_mem_ratio_vs_naive", "value": round(ratio, 4),
                      "target": "<= 0.35"}))
    print(json.dumps({"metric": "logprob.max_abs_err", "value": err, "target": "<= 1e-5"}))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        measure(sys.argv[1])
    else:
        main()
