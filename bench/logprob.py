"""Benchmark: memory of logprobs.chunked_logprobs (forward + backward) against the naive log-softmax.

Shape: V = 151,936 (Qwen3), 2,048 completion tokens, hidden 1,024, fp32 on CPU.
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
with a naive fp64 reference at the same V on the first 64 tokens, in chunks of 16 (so the head's
gradient is accumulated across chunks as in the full run): max over values and both gradients of
|ours - ref|. Each token's error comes from its own length-V log-sum-exp and gradient row, so the
slice sees the same round-off as the full 2,048 tokens at a fraction of the fp64 cost.

Runtime on a shared 2-core machine: the two measuring processes and the error check run
concurrently, one thread each (the matmuls are large enough to keep a core busy alone, and two
OpenMP threads that lose their core to a neighbour's process wait on each other at every
barrier). Peak memory is per process (VmHWM), so concurrency does not change either figure.
The floor is the arithmetic: a (2048 x 1024) @ (1024 x 151,936) fp32 matmul is 0.64 TFLOP,
~14 s on one core here; the naive method needs 3 of them, ours 4 (it recomputes the logits in the
backward), so the whole script is ~130 s of CPU time: ~70 s of wall time on two free cores, over
3 minutes when other jobs hold the load average at 5.

Run: python bench/logprob.py   (last lines: JSON figures; never asserts)
     python bench/logprob.py --smoke   (V = 4,096, 128 tokens, hidden 64: seconds, figures
                                        that only show the code runs)
"""
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from infra.logprobs import chunked_logprobs  # noqa: E402

V, N, H = 151_936, 2_048, 1_024
N_ERR, CHUNK_ERR = 64, 16
CHUNK = 256
SMOKE = "--smoke" in sys.argv  # the children get it too (tests/test_bench.py runs this size)
if SMOKE:
    V, N, H, CHUNK = 4_096, 128, 64, 32


def make_inputs(n):
    """The head (V, H), hidden (n, H), targets (n,) and a per-token coefficient (n,), fp32."""
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(H, V, bias=False, device="meta")  # no throwaway init of 155M weights
    head.weight = torch.nn.Parameter(torch.randn(V, H, generator=g).mul_(0.02))  # Qwen-like scale
    hidden = torch.randn(n, H, generator=g).requires_grad_()         # RMS-normed hidden states
    targets = torch.randint(0, V, (n,), generator=g)
    coef = torch.randn(n, generator=g)                               # stands in for -A * w / n
    return head, hidden, targets, coef


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
    head, hidden, targets, coef = make_inputs(N_ERR)
    ours = chunked_logprobs(hidden, head, targets, chunk_size=CHUNK_ERR)
    (ours * coef).sum().backward()
    h64 = hidden.detach().double().requires_grad_()
    head64 = torch.nn.Linear(H, V, bias=False, device="meta")
    head64.weight = torch.nn.Parameter(head.weight.detach().double())
    ref = naive_logprobs(h64, head64, targets)
    (ref * coef.double()).sum().backward()
    return max((ours.double() - ref).abs().max().item(),
               (hidden.grad.double() - h64.grad).abs().max().item(),
               (head.weight.grad.double() - head64.weight.grad).abs().max().item())


def main():
    t_all = time.perf_counter()
    children = {method: subprocess.Popen([sys.executable, __file__, method, *sys.argv[1:]],
                                         text=True, stdout=subprocess.PIPE)
                for method in ("naive", "ours")}
    t0 = time.perf_counter()
    err = max_abs_err()  # meanwhile, in this process
    seconds = time.perf_counter() - t0
    print(f"error check ({N_ERR} tokens, V = {V}, fp32 vs fp64): {err:.2e} in {seconds:.1f} s")
    results = {}
    for method, child in children.items():
        out, _ = child.communicate()
        if child.returncode:
            raise SystemExit(f"{method} failed with exit code {child.returncode}")
        results[method] = json.loads(out.strip().splitlines()[-1])
        print(f"{method:>5}: peak extra {results[method]['peak_extra_bytes'] / 2**20:8.0f} MiB, "
              f"forward + backward {results[method]['seconds']:.1f} s")
    print(f"total {time.perf_counter() - t_all:.1f} s")
    ratio = results["ours"]["peak_extra_bytes"] / results["naive"]["peak_extra_bytes"]
    print(json.dumps({"metric": "logprob.peak_mem_ratio_vs_naive", "value": round(ratio, 4),
                      "target": "<= 0.35"}))
    print(json.dumps({"metric": "logprob.max_abs_err", "value": err, "target": "<= 1e-5"}))


if __name__ == "__main__":
    torch.set_num_threads(1)  # see the docstring: concurrent single-threaded processes
    if len(sys.argv) > 1 and sys.argv[1] != "--smoke":
        measure(sys.argv[1])
    else:
        main()
