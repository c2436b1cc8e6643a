"""Benchmark for one lent GPU (an H200): log-prob memory, train.grpo_update, one train.py step.

    python bench/gpu.py                              # GPU: writes $OUT/bench_gpu.json (or --out)
    python bench/gpu.py --smoke --out /tmp/g.json    # CPU, tiny shapes, seconds (CI keeps it alive)

Figures, all on random-initialised weights:
1. gpu.logprob.peak_mem_ratio_vs_naive: peak extra memory of one forward + backward of token
   log-probs in bf16, 16,384 completion tokens, V = 151,936, hidden 4,096 (the Qwen3-8B head):
   ours (logprobs.chunked_logprobs, what logprobs.token_logprobs runs after the model body) over the
   naive head(hidden) -> log_softmax -> gather. Peak extra = torch.cuda.max_memory_allocated
   minus the allocation before the arm, statistics reset between arms; both include the head's
   (V, H) gradient. Context: GiB per arm, a naive arm upcasting the logits to fp32 first, and
   max |ours - naive fp32| of the log-probs.
2. gpu.grpo_update.tokens_per_s, .peak_mem_gib, .held_outside_update_share: train.grpo_update
   itself on a Qwen3-4B-shaped model (hidden 2,560, intermediate 9,728, 36 layers, 32 heads,
   8 KV heads, tied head, V = 151,936; 4.02B parameters), set up as train.py sets it up on one
   GPU: fp32 master weights and AdamW state (16 bytes/parameter with the gradients), Accelerate
   bf16 autocast, activation checkpointing, the model in eval mode until the update (as
   from_pretrained returns it), micro-batches of 16,384 tokens. Batch: 8 multi-turn agent
   sequences of exactly 4,096 tokens (a prompt, then replies (mask 1) and observations (mask 0)
   by turns). tokens/s = tokens / seconds of one update (median of the timed updates, after a
   warm-up update that also allocates the AdamW state); peak = max_memory_allocated over the
   timed updates; held share = memory still allocated after the update (weights + AdamW state:
   what the rollouts of the next step live beside, gradients being freed) over that peak.
   Context: checkpointed layer calls per update (0 would mean checkpointing is off), whether
   the model is back in eval mode and its gradients freed. gpu.sync.gather_s: the weight sync's
   gather half (the loop's time/sync_gather_s) on that trained model: engine.stream_weights,
   every parameter cast to bf16 and cut as vLLM loads it (one GPU: no collective). Its other
   half, vLLM's per-tensor loader (time/sync_load_s), needs vLLM, which the GPU image lacks.
3. gpu.train_step.step_s: one real `python train.py --steps 1` step on CUDA (bf16 autocast via
   ACCELERATE_MIXED_PRECISION) on a random ~0.5B Qwen3 (Qwen3-0.6B widths, 32 layers, the tiny
   BPE tokenizer's 1,024-token vocabulary) saved to a local directory in bf16: the designer
   writes (and the sandbox rejects or accepts) environments, hand-written ones fill the pool,
   hints, 2 x 4 unhinted + 2 x 2 hinted plays of 2 turns, the update, the weight sync. The
   transformers engine generates (vLLM is not assumed installed). Context: the run's time/*
   split (generate, play, update, step) from its metrics.jsonl.
Anchor: NeMo-RL reports ~925 tokens/s/GPU for a whole Qwen3-30B-A3B GRPO step on H100 (context).

Choices, numbered:
    1. The update is measured in train.py's own code and setup, not a replica: fp32 master
       weights (the trainer loads real models in fp32 and computes in bf16 under autocast), so
       a 4B model needs 64 GiB of weights, gradients and AdamW state before activations; the
       issue's 8 x 4,096 tokens at the paper's 4B shape fit one H200.
    2. Each section runs under its own time budget (SIGALRM; the budgets sum to 330 s) and
       catches its own failure (OOM, timeout, anything): its figures are reported with value
       null and the error, and the next section runs. Figures reach the JSON file as soon as
       they exist, and the process hard-exits at Shapes.limit seconds (faulthandler), so a hang
       loses nothing measured before it.
    3. --smoke runs the same code on CPU with tiny shapes (V = 4,096 log-probs, a 2-layer
       hidden-64 Qwen3 for the update and for the train.py step, 64-token sequences). CPU peak
       memory is the resident high-water mark (VmHWM after clear_refs, as bench/logprob.py):
       smoke numbers only show that the code runs.

Output: JSON {"smoke", "device", "torch", "transformers", "figures": [...], "sections": {name:
{"status", "seconds"}}}, and one JSON line per figure as the last stdout lines. Never asserts.
Dependencies: torch, transformers, accelerate; grpo, logprobs, train (and train.py as a subprocess).
Test: pytest tests/test_bench_gpu.py -m ""
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

from infra.logprobs import chunked_logprobs  # noqa: E402

GIB = 2 ** 30
QWEN3_4B = dict(vocab_size=151_936, hidden_size=2_560, intermediate_size=9_728,
                num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                max_position_embeddings=40_960, tie_word_embeddings=True)
# ~0.5B (503M with the tiny BPE's 1,024-token vocabulary): Qwen3-0.6B's widths, 32 layers
QWEN3_HALF_B = dict(hidden_size=1_024, intermediate_size=3_072, num_hidden_layers=32,
                    num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                    max_position_embeddings=40_960, tie_word_embeddings=True)
TINY = dict(vocab_size=1_024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=4_096, tie_word_embeddings=True)
# train.py flags of the one-step run: 2 environments x 4 plays + 2 hinted, 2 turns
STEP_ARGS = ("--num_envs", 2, "--skills_per_regen", 1, "--plays", 4, "--hint_plays", 2,
             "--max_attempts", 1, "--max_turns", 2, "--sandbox_workers", 2, "--transcripts", 0,
             "--checkpoint_every", 1)


@dataclass(frozen=True)
class Shapes:
    """Every size the bench uses; FULL for the GPU, SMOKE for the CPU check."""
    lp_tokens: int = 16_384            # completion tokens of the log-prob arms
    lp_vocab: int = 151_936
    lp_hidden: int = 4_096             # the Qwen3-8B head
    lp_chunk: int = 256                # logprobs.token_logprobs' default chunk
    model: dict = field(default_factory=lambda: QWEN3_4B)
    seqs: int = 8                      # sequences of the GRPO update
    seq_len: int = 4_096               # tokens each
    micro_batch_tokens: int = 16_384   # train.py's default
    timed_updates: int = 2             # after one warm-up update
    step_model: dict = field(default_factory=lambda: QWEN3_HALF_B)
    step_args: tuple = STEP_ARGS + ("--designer_max_tokens", 512, "--hint_max_tokens", 128,
                                    "--max_new_tokens", 256)
    budgets: tuple = (("logprob", 60), ("grpo_update", 120), ("train_step", 150))  # seconds
    limit: int = 345                   # hard exit, seconds after main() starts


FULL = Shapes()
SMOKE = Shapes(lp_tokens=256, lp_vocab=4_096, lp_hidden=64, lp_chunk=64, model=TINY, seqs=4,
               seq_len=64, micro_batch_tokens=128, timed_updates=1,
               step_model={k: v for k, v in TINY.items() if k != "vocab_size"},
               step_args=STEP_ARGS + ("--designer_max_tokens", 16, "--hint_max_tokens", 8,
                                      "--max_new_tokens", 8),
               budgets=(("logprob", 60), ("grpo_update", 60), ("train_step", 150)), limit=280)


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


# 2. train.grpo_update at the Qwen3-4B shape ---------------------------------------------------

def update_samples(n, length, vocab, rng):
    """n multi-turn agent samples (grpo.Sample) of exactly `length` tokens (agent.play's layout): a
    prompt, then a reply (mask 1) and an environment observation (mask 0) per turn."""
    import grpo
    samples = []
    for _ in range(n):
        mask = [0] * rng.randint(length // 16, length // 8)                 # system + task prompt
        while len(mask) < length:
            mask += [1] * rng.randint(length // 32, length // 8)            # reply
            mask += [0] * rng.randint(length // 128, length // 32)          # observation
        mask = mask[:length]
        # a random model's log-probs sit near -log V; the rollout engine's differ by noise
        logprobs = [-math.log(vocab) + rng.gauss(0.0, 0.05) if m else 0.0 for m in mask]
        samples.append(grpo.Sample([rng.randrange(vocab) for _ in range(length)], mask, logprobs,
                                   advantage=rng.gauss(0.0, 1.0), role="agent", weight=1.0))
    return samples


def section_update(s, device):
    """train.grpo_update itself, set up as train.py sets it up for one GPU: fp32 master weights,
    the model in eval mode until the update (as from_pretrained returns it), activation
    checkpointing, Accelerate bf16 autocast, torch AdamW, micro-batches of 16,384 tokens."""
    def run(report):
        import transformers.modeling_utils as mu
        from accelerate import Accelerator

        from infra import config
        import grpo
        import train
        calls, checkpoint = [0], mu.checkpoint

        def counting(*a, **k):
            calls[0] += 1
            return checkpoint(*a, **k)
        mu.checkpoint = counting        # counts the checkpointed layer forwards
        accelerator = Accelerator(cpu=device == "cpu",
                                  mixed_precision="bf16" if device == "cuda" else "no")
        model = build_model(s.model, device, torch.float32).eval()
        model.gradient_checkpointing_enable()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=grpo.BETAS, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        model, opt, sched = accelerator.prepare(model, opt, sched)
        samples = update_samples(s.seqs, s.seq_len, s.model["vocab_size"], random.Random(0))
        kw = dict(pad_id=0, temperatures={"agent": 1.0},
                  gargs=config.GRPOArgs(kl_coef=0.0, micro_batch_tokens=s.micro_batch_tokens))
        times = []
        with PeakMemory(device) as mem:
            for i in range(1 + s.timed_updates):  # update 0: warm-up, allocates AdamW state
                calls[0] = 0
                t0 = time.perf_counter()
                train.grpo_update(train.Trainer(model, opt, sched, accelerator), samples, **kw)
                _sync(device)
                times.append(time.perf_counter() - t0)
                print(f"  update {i}: {times[-1]:.2f} s", flush=True)
        held = torch.cuda.memory_allocated() if device == "cuda" else _status_bytes("VmRSS")
        mu.checkpoint = checkpoint
        params = sum(p.numel() for p in model.parameters())
        tokens = s.seqs * s.seq_len
        context = dict(params=params, layers=s.model["num_hidden_layers"], sequences=s.seqs,
                       tokens=tokens, trained_tokens=sum(sum(x.mask) for x in samples),
                       micro_batch_tokens=s.micro_batch_tokens,
                       checkpointed_layer_calls=calls[0], training_after=model.training,
                       grads_freed=all(p.grad is None for p in model.parameters()),
                       seconds=round(statistics.median(times[1:]), 3),
                       warmup_seconds=round(times[0], 3),
                       setup="train.grpo_update; fp32 master weights, AdamW fp32 state, bf16 "
                             "autocast, activation checkpointing, model in eval mode before")
        report.record("gpu.grpo_update.tokens_per_s", tokens / statistics.median(times[1:]),
                      anchor="NeMo-RL ~925 tokens/s/GPU, whole Qwen3-30B-A3B GRPO step, H100",
                      **context)
        report.record("gpu.grpo_update.peak_mem_gib", mem.total / GIB, **context)
        # what stays allocated between updates (weights + AdamW state; gradients are freed)
        report.record("gpu.grpo_update.held_outside_update_share", held / mem.total,
                      held_gib=round(held / GIB, 3), peak_gib=round(mem.total / GIB, 3),
                      weights_and_adam_gib=round(params * 12 / GIB, 3))
        from infra.engine import stream_weights
        _sync(device)
        t0 = time.perf_counter()
        tensors = sum(len(group) for group in stream_weights(model, torch.bfloat16))
        _sync(device)
        report.record("gpu.sync.gather_s", time.perf_counter() - t0, tensors=tensors,
                      params=params, dtype="bfloat16")
        del model, opt, sched
        accelerator.free_memory()   # the 64 GiB of state go before the train.py step runs
    return run


# 3. one real train.py step -----------------------------------------------------------------------

def section_train_step(s, device):
    """`python train.py` for one step on a random Qwen3 saved to a local directory (the tiny BPE
    tokenizer, so replies decode): design -> validate -> hints -> play -> update -> sync, with
    the transformers engine; its metrics' time/* split is the figure's context."""
    def run(report):
        import tempfile
        with tempfile.TemporaryDirectory(prefix="bench_gpu_") as tmp:  # not $OUT: a 1 GB model
            params, wall, row = _one_train_step(s, device, Path(tmp))
        split = {k: round(v, 3) for k, v in row.items() if k.startswith("time/")}
        report.record("gpu.train_step.step_s", row["time/step_s"], **split,
                      process_wall_s=round(wall, 1), params=params,
                      samples=row.get("losses/samples"),
                      agent_tokens_mean=row.get("agent/tokens_mean"),
                      args=" ".join(map(str, s.step_args)))
    return run


def _one_train_step(s, device, tmp):
    import subprocess

    from infra import models
    model_dir, run_dir = tmp / "model", tmp / "run"
    tok = models.build_tiny_tokenizer()
    model = build_model(dict(s.step_model, vocab_size=len(tok)), device, torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir)   # ships in bf16, as the paper's checkpoints
    tok.save_pretrained(model_dir)
    del model
    env = dict(os.environ, ACCELERATE_MIXED_PRECISION="bf16" if device == "cuda" else "no")
    if device == "cpu":
        env.update(ACCELERATE_USE_CPU="true", CUDA_VISIBLE_DEVICES="")
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, str(root / "train.py"), "--model", str(model_dir), "--engine",
           "transformers", "--output_dir", str(run_dir), "--overwrite", "--steps", "1",
           "--corpus", str(root / "tests" / "fixtures" / "short_corpus.jsonl"),
           *map(str, s.step_args)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"train.py exited {done.returncode}: {done.stderr[-300:]}")
    return params, wall, json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])


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
    sections = {
        "logprob": (section_logprob(s, device, torch.bfloat16),
                    ["gpu.logprob.peak_mem_ratio_vs_naive"]),
        "grpo_update": (section_update(s, device), ["gpu.grpo_update.tokens_per_s",
                                                     "gpu.grpo_update.peak_mem_gib",
                                                     "gpu.grpo_update.held_outside_update_share",
                                                     "gpu.sync.gather_s"]),
        "train_step": (section_train_step(s, device), ["gpu.train_step.step_s"]),
    }
    for name, budget in s.budgets:
        fn, metrics = sections[name]
        report.run_section(name, fn, metrics, budget)
    faulthandler.cancel_dump_traceback_later()
    print(f"wrote {out}")
    for fig in report.data["figures"]:
        print(json.dumps(fig))


if __name__ == "__main__":
    main()
