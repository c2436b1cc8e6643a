"""Benchmark for one lent GPU (an H200): log-prob memory, one GRPO update, generation throughput.

    python bench/gpu.py                              # GPU: writes $OUT/bench_gpu.json (or --out)
    python bench/gpu.py --smoke --out /tmp/g.json    # CPU, tiny shapes, seconds (CI keeps it alive)

Figures (BENCH.md, "On a lent GPU"), all in bf16 on random-initialised weights:
1. gpu.logprob.peak_mem_ratio_vs_naive: peak extra memory of one forward + backward of token
   log-probs, 16,384 completion tokens, V = 151,936, hidden 4,096 (the Qwen3-8B head): ours
   (grpo.chunked_logprobs, what grpo.token_logprobs runs after the model body) over the naive
   head(hidden) -> log_softmax -> gather in bf16. Peak extra = torch.cuda.max_memory_allocated
   minus the allocation before the arm, statistics reset between arms; both include the head's
   (V, H) gradient. Context: GiB per arm, a naive arm upcasting the logits to fp32 first, and
   max |ours - naive fp32| of the log-probs.
2. gpu.grpo_update.tokens_per_s, gpu.grpo_update.peak_mem_gib: one GRPO update of a
   Qwen3-8B-shaped model (hidden 4,096, intermediate 12,288, 36 layers, 32 heads, 8 KV heads,
   head_dim 128, V = 151,936, untied head) as train.grpo_update does it: activation
   checkpointing, micro-batches of <= 16,384 tokens (train.py's default) with gradient
   accumulation, token_logprobs -> policy_loss -> backward, clipping, torch AdamW. Batch: 8
   multi-turn agent sequences of 3-4k tokens (a prompt, then replies (mask 1) and observations
   (mask 0) by turns), right-padded. tokens/s = non-padding tokens / seconds of one update
   (median over the timed updates, after a warm-up update that also allocates the AdamW state);
   peak = the process's max_memory_allocated (weights, gradients, AdamW state, activations).
3. gpu.generate.tokens_per_s_64seq / _256seq: engine.TransformersEngine on a Qwen3-8B-shaped
   model, 64 and 256 concurrent prompts of 256 random tokens, exactly 256 new tokens each (EOS
   suppressed: the engine's stop set is emptied), temperature 0.6, top-p 0.95, top-k 20.
   tokens/s = new tokens / seconds of the generate call, prefill included (as vLLM counts it).
Anchors: vLLM on one H100 generates ~4.3k tokens/s for Qwen3-8B at 64 sequences; NeMo-RL reports
~925 tokens/s/GPU for a whole Qwen3-30B-A3B GRPO step on H100 (a whole step: context only).

Choices, numbered:
    1. Optimizer memory: train.py runs real models in bf16 with plain torch AdamW, whose state
       follows the parameter dtype, so it is bf16: 8.19B params x (2 weights + 2 gradients +
       4 state) bytes = 61 GiB plus activations fits an H200 at all 36 layers (fp32 master
       weights and state, 16 bytes/param = 122 GiB before activations, would not). We measure
       what the trainer does. Should 36 layers still run out of memory, the update is retried at
       16 layers and `layers` and `note` say so (figures are then for 16 layers, not scaled).
    2. Generation uses the 8B shape too, to compare with the vLLM anchor: we expect a decode
       step to be bound by kernel launches (~50 per layer) and KV-cache concatenation rather than
       by the 16 GB of weights, so 2 x 256 steps take well under the section's budget. Its
       tokenizer is a WordLevel one of the special tokens only (engine.SPECIAL_TOKENS, the tiny
       BPE's ids; that BPE takes ~10 s to train): throughput never looks at text.
    3. Each section runs under its own time budget (SIGALRM; the budgets sum to 430 s) and
       catches its own failure (OOM, timeout, anything): its figures are reported with value
       null and the error, and the next section runs. Figures reach the JSON file as soon as
       they exist, and the process hard-exits at Shapes.limit seconds (faulthandler), so a hang
       loses nothing measured before it.
    4. --smoke runs the same code on CPU with tiny shapes (V = 4,096, a 2-layer hidden-64 Qwen3,
       64-token sequences, 16-token prompts, 8 new tokens; 64 and 256 rows kept). CPU peak
       memory is the resident high-water mark (VmHWM after clear_refs, as bench/logprob.py):
       smoke numbers only show that the code runs.

Output: JSON {"smoke", "device", "torch", "transformers", "figures": [...], "sections": {name:
{"status", "seconds"}}}, and one JSON line per figure as the last stdout lines. Never asserts.
Dependencies: torch, transformers, tokenizers; grpo and engine. Test: pytest tests/test_bench_gpu.py
"""
import argparse
import ctypes
import faulthandler
import gc
import json
import math
import os
import random
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # less fragmentation
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine import SPECIAL_TOKENS, TransformersEngine  # noqa: E402
from grpo import (BETAS, GRAD_CLIP, LR, WEIGHT_DECAY, chunked_logprobs,  # noqa: E402
                  pad_batch, policy_loss, token_logprobs)

GIB = 2 ** 30
QWEN3_8B = dict(vocab_size=151_936, hidden_size=4_096, intermediate_size=12_288,
                num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                max_position_embeddings=40_960, tie_word_embeddings=False)
TINY = dict(vocab_size=1_024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=4_096, tie_word_embeddings=False)
VLLM_TOKENS_PER_S_64 = 4_300   # anchor: vLLM, Qwen3-8B, 64 sequences, one H100


@dataclass(frozen=True)
class Shapes:
    """Every size the bench uses; FULL for the GPU, SMOKE for the CPU check."""
    lp_tokens: int = 16_384            # completion tokens of the log-prob arms
    lp_vocab: int = 151_936
    lp_hidden: int = 4_096
    lp_chunk: int = 256                # grpo.token_logprobs' default chunk
    model: dict = field(default_factory=lambda: QWEN3_8B)
    fallback_layers: int = 16          # update retried at this depth after an OOM
    seqs: int = 8                      # sequences of the GRPO update
    seq_len: int = 4_096               # their maximum length (each is 75-100% of it)
    micro_batch_tokens: int = 16_384   # train.py's default
    timed_updates: int = 2             # after one warm-up update
    concurrency: tuple = (64, 256)     # generation rows
    prompt_len: int = 256
    new_tokens: int = 256
    budgets: tuple = (("logprob", 60), ("grpo_update", 220), ("generate", 150))  # seconds
    limit: int = 450                   # hard exit, seconds after main() starts


FULL = Shapes()
SMOKE = Shapes(lp_tokens=256, lp_vocab=4_096, lp_hidden=64, lp_chunk=64, model=TINY,
               fallback_layers=1, seqs=4, seq_len=64, micro_batch_tokens=128, timed_updates=1,
               prompt_len=16, new_tokens=8,
               budgets=(("logprob", 60), ("grpo_update", 60), ("generate", 60)), limit=200)


# INFRA: memory, time budgets, output -------------------------------------------------------------

def _status_bytes(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


class PeakMemory:
    """Peak memory inside a `with` block: .extra (above the level at entry) and .total.

    CUDA: allocator statistics (reset on entry). CPU (smoke only, Linux): the resident high-water
    mark, reset by writing 5 to /proc/self/clear_refs, after returning freed heap to the kernel.
    """

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def __enter__(self):
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            try:
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            except (OSError, AttributeError):
                pass
            Path("/proc/self/clear_refs").write_text("5")
            self.base = _status_bytes("VmRSS")
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.total = torch.cuda.max_memory_allocated()
        else:
            self.total = _status_bytes("VmHWM")
        self.extra = self.total - self.base
        return False


class SectionTimeout(BaseException):
    """Raised by SIGALRM when a section overruns; BaseException so library code cannot eat it."""


class Report:
    """Figures and section outcomes, rewritten to the JSON file after every change."""

    def __init__(self, path, header):
        self.path, self.data = Path(path), dict(header, figures=[], sections={})
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, metric, value, **context):
        fig = {"metric": metric, "value": None if value is None else round(float(value), 4),
               **context}
        self.data["figures"].append(fig)
        print(f"  {metric} = {fig['value']}  {json.dumps(context)}", flush=True)
        self.save()

    def save(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)

    def run_section(self, name, fn, metrics, budget):
        """Run fn(report) within budget seconds; a failure reports its missing figures as null."""
        def alarm(signum, frame):
            raise SectionTimeout(f"over its {budget} s budget")
        print(f"[{name}] budget {budget} s", flush=True)
        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, budget)
        t0, status = time.perf_counter(), "ok"
        try:
            fn(self)
        except (SectionTimeout, Exception) as e:  # noqa: BLE001 - a section reports, never kills
            status = f"{type(e).__name__}: {e}"[:400]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        seconds = time.perf_counter() - t0
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        done = {f["metric"] for f in self.data["figures"]}
        for m in metrics:
            if m not in done:
                self.record(m, None, error=status)
        self.data["sections"][name] = {"status": status, "seconds": round(seconds, 2)}
        print(f"[{name}] {status} in {seconds:.1f} s", flush=True)
        self.save()


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def build_model(dims, device, dtype):
    """A random-initialised Qwen3 with these dimensions, built directly on `device`."""
    from transformers import AutoModelForCausalLM, Qwen3Config
    config = Qwen3Config(bos_token_id=None, eos_token_id=2, pad_token_id=0, **dims)
    torch.manual_seed(0)
    with torch.device(device):   # built and initialised on the GPU: seconds, not minutes
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(device)


# 1. log-prob memory ------------------------------------------------------------------------------

def naive_logprobs(hidden, head, targets, upcast=False):
    logits = head(hidden)                                                   # (N, V)
    logits = logits.float() if upcast else logits
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)  # (N,)


def section_logprob(s, device, dtype):
    def run(report):
        g = torch.Generator(device=device).manual_seed(0)
        V, N, H = s.lp_vocab, s.lp_tokens, s.lp_hidden
        head = torch.nn.Linear(H, V, bias=False, device=device, dtype=dtype)
        with torch.no_grad():
            head.weight.normal_(0.0, 0.02, generator=g)                     # (V, H) Qwen-like
        hidden = torch.randn(N, H, device=device, generator=g).to(dtype).requires_grad_()  # (N, H)
        targets = torch.randint(0, V, (N,), device=device, generator=g)     # (N,)
        coef = torch.randn(N, device=device, generator=g)   # (N,) stands in for -A * w / n
        arms = {"ours": lambda h, y: chunked_logprobs(h, head, y, chunk_size=s.lp_chunk),
                "naive": lambda h, y: naive_logprobs(h, head, y),
                "naive_fp32": lambda h, y: naive_logprobs(h, head, y, upcast=True)}
        for fn in arms.values():   # warm-up: kernels, cuBLAS workspaces, outside any measurement
            (fn(hidden[:64], targets[:64]).float() * coef[:64]).sum().backward()
        peak, seconds, out = {}, {}, {}
        for name, fn in arms.items():
            hidden.grad = head.weight.grad = None
            with PeakMemory(device) as mem:
                t0 = time.perf_counter()
                logp = fn(hidden, targets)                                  # (N,)
                (logp.float() * coef).sum().backward()
                _sync(device)
                seconds[name] = time.perf_counter() - t0
            peak[name], out[name] = mem.extra, logp.detach().float()
            del logp
        err = (out["ours"] - out["naive_fp32"]).abs().max().item()
        report.record("gpu.logprob.peak_mem_ratio_vs_naive", peak["ours"] / peak["naive"],
                      target="<= 0.35", ours_gib=round(peak["ours"] / GIB, 3),
                      naive_gib=round(peak["naive"] / GIB, 3),
                      naive_fp32_gib=round(peak["naive_fp32"] / GIB, 3),
                      ratio_vs_naive_fp32=round(peak["ours"] / peak["naive_fp32"], 4),
                      max_abs_err_vs_naive_fp32=err,
                      seconds={k: round(v, 3) for k, v in seconds.items()},
                      tokens=N, vocab=V, hidden=H, dtype=str(dtype))
    return run


# 2. one GRPO update ------------------------------------------------------------------------------

def agent_samples(n, max_len, vocab, rng):
    """Multi-turn agent records (agent.play's layout): a prompt, then a reply (mask 1) and an
    environment observation (mask 0) per turn, truncated to 75-100% of max_len."""
    samples = []
    for _ in range(n):
        T = rng.randint(3 * max_len // 4, max_len)
        mask = [0] * rng.randint(max_len // 16, max_len // 8)               # system + task prompt
        while len(mask) < T:
            mask += [1] * rng.randint(max_len // 32, max_len // 8)          # reply
            mask += [0] * rng.randint(max_len // 128, max_len // 32)        # observation
        mask = mask[:T]
        # a random model's log-probs sit near -log V; the rollout engine's differ by noise
        logprobs = [-math.log(vocab) + rng.gauss(0.0, 0.05) if m else 0.0 for m in mask]
        samples.append({"token_ids": [rng.randrange(vocab) for _ in range(T)], "mask": mask,
                        "logprobs": logprobs, "advantage": rng.gauss(0.0, 1.0)})
    return samples


def micro_batches(samples, budget):
    """Greedy split, shortest first, into batches of at most `budget` tokens (as train.py)."""
    out, cur, n = [], [], 0
    for s in sorted(samples, key=lambda s: len(s["token_ids"])):
        if cur and n + len(s["token_ids"]) > budget:
            out.append(cur)
            cur, n = [], 0
        cur.append(s)
        n += len(s["token_ids"])
    return out + ([cur] if cur else [])


def grpo_update(model, optimizer, batches, n_samples, device):
    """One update as train.grpo_update does it: pi_old = this policy (first epoch), loss a mean
    over all samples via per-micro-batch weights, clip, step."""
    optimizer.zero_grad(set_to_none=True)
    for mb in batches:
        t = {k: v.to(device) for k, v in pad_batch(mb, pad_id=0).items()}   # (B, T) each
        logp = token_logprobs(model, t["input_ids"], t["attention_mask"],
                              t["completion_mask"])                         # (B, T)
        adv = torch.tensor([s["advantage"] for s in mb], device=device)     # (B,)
        loss, _ = policy_loss(logp, logp.detach(), t["rollout_logp"], adv, t["completion_mask"])
        (loss * len(mb) / n_samples).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()


def _update_at_depth(s, dims, device, dtype, samples):
    model = build_model(dims, device, dtype)
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS,
                                  weight_decay=WEIGHT_DECAY)
    batches = micro_batches(samples, s.micro_batch_tokens)
    times = []
    with PeakMemory(device) as mem:
        for i in range(1 + s.timed_updates):    # update 0: warm-up, allocates the AdamW state
            t0 = time.perf_counter()
            grpo_update(model, optimizer, batches, len(samples), device)
            _sync(device)
            times.append(time.perf_counter() - t0)
            print(f"  update {i}: {times[-1]:.2f} s", flush=True)
    params = sum(p.numel() for p in model.parameters())
    return {"seconds": statistics.median(times[1:]), "warmup_seconds": times[0],
            "peak_total": mem.total, "params": params, "micro_batches": len(batches),
            "weights_gib": round(params * torch.finfo(dtype).bits / 8 / GIB, 2)}


def section_update(s, device, dtype):
    def run(report):
        samples = agent_samples(s.seqs, s.seq_len, s.model["vocab_size"], random.Random(0))
        tokens = sum(len(x["token_ids"]) for x in samples)
        trained = sum(sum(x["mask"]) for x in samples)
        layers, note, r = s.model["num_hidden_layers"], "", None
        try:
            r = _update_at_depth(s, s.model, device, dtype, samples)
        except torch.OutOfMemoryError as e:
            note = f"OOM at {layers} layers ({str(e)[:120]}); measured at {s.fallback_layers}"
        if r is None:   # retried outside the except: its traceback no longer pins the model
            print(f"  {note}", flush=True)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            layers = s.fallback_layers
            r = _update_at_depth(s, dict(s.model, num_hidden_layers=layers), device, dtype,
                                 samples)
        context = dict(layers=layers, params=r["params"],
                       weights_gib=r["weights_gib"], sequences=s.seqs, tokens=tokens,
                       trained_tokens=trained, micro_batches=r["micro_batches"],
                       seconds=round(r["seconds"], 3), warmup_seconds=round(r["warmup_seconds"], 3),
                       optimizer="torch AdamW, bf16 weights/grads/state (as train.py)",
                       gradient_checkpointing=True, note=note)
        report.record("gpu.grpo_update.tokens_per_s", tokens / r["seconds"],
                      anchor="NeMo-RL ~925 tokens/s/GPU, whole Qwen3-30B-A3B GRPO step, H100",
                      **context)
        report.record("gpu.grpo_update.peak_mem_gib", r["peak_total"] / GIB, **context)
    return run


# 3. generation throughput ------------------------------------------------------------------------

def bench_tokenizer():
    """A real (WordLevel) tokenizer of the special tokens only, ids as in the tiny BPE."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIAL_TOKENS)},
                                     unk_token="<|endoftext|>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", padding_side="left")


def section_generate(s, device, dtype):
    def run(report):
        model = build_model(s.model, device, dtype).eval()
        engine = TransformersEngine(model, bench_tokenizer())
        engine.eos_ids = set()          # EOS suppressed: every row generates exactly new_tokens
        rng, V = random.Random(1), s.model["vocab_size"]
        engine.generate([[1, 2, 3]] * 2, max_new_tokens=2, seed=0)          # warm-up
        for B in s.concurrency:
            prompts = [[rng.randrange(V) for _ in range(s.prompt_len)] for _ in range(B)]
            with PeakMemory(device) as mem:
                t0 = time.perf_counter()
                outs = engine.generate(prompts, max_new_tokens=s.new_tokens, temperature=0.6,
                                       top_p=0.95, top_k=20, seed=0)
                _sync(device)
                seconds = time.perf_counter() - t0
            new = sum(len(c.token_ids) for c in outs)
            report.record(f"gpu.generate.tokens_per_s_{B}seq", new / seconds, sequences=B,
                          prompt_tokens=s.prompt_len, new_tokens=new, seconds=round(seconds, 3),
                          layers=s.model["num_hidden_layers"],
                          peak_mem_gib=round(mem.total / GIB, 3),
                          ratio_vs_vllm_64seq_anchor=round(new / seconds / VLLM_TOKENS_PER_S_64, 4))
    return run


# INFRA: main -------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, a few seconds")
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/bench_gpu.json)")
    args = parser.parse_args()
    s = SMOKE if args.smoke else FULL
    faulthandler.dump_traceback_later(s.limit, exit=True)   # last resort: figures are on disk
    out = args.out or str(Path(os.environ.get("OUT", ".")) / "bench_gpu.json")
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)   # tiny shapes on a shared machine: threads only contend
    import transformers
    report = Report(out, {"smoke": args.smoke, "device": torch.cuda.get_device_name() if
                          device == "cuda" else "cpu", "torch": torch.__version__,
                          "transformers": transformers.__version__})
    dtype = torch.bfloat16
    sections = {
        "logprob": (section_logprob, ["gpu.logprob.peak_mem_ratio_vs_naive"]),
        "grpo_update": (section_update, ["gpu.grpo_update.tokens_per_s",
                                         "gpu.grpo_update.peak_mem_gib"]),
        "generate": (section_generate, [f"gpu.generate.tokens_per_s_{b}seq"
                                        for b in s.concurrency]),
    }
    for name, budget in s.budgets:
        make, metrics = sections[name]
        report.run_section(name, make(s, device, dtype), metrics, budget)
    faulthandler.cancel_dump_traceback_later()
    print(f"wrote {out}")
    for fig in report.data["figures"]:
        print(json.dumps(fig))


if __name__ == "__main__":
    main()
