"""Benchmark: one GRPO update (train.grpo_update, the loop's own) with and without LoRA on the same
model, in one process: update tokens/s, peak memory, and the bytes a weight sync hands to vLLM.

    python bench/lora.py            # the 10.7M-parameter Qwen3 of bench/step.py, rank 16
    python bench/lora.py --smoke    # the tiny model, 2 short samples: seconds, shows it runs

Both arms start from the same random-initialised model (seed 0) and update it on the same batch
(8 agent samples of 256 tokens, 192 of them trained, advantages +-1, no KL term, one micro-batch:
MemTracker follows one forward per module), as run.Run
sets them up: full fine-tuning with AdamW over every fp32 weight; LoRA (--lora_rank 16, alpha 32,
attention and MLP projections: infra/lora.py) with the base frozen and AdamW over the adapters.
On CPU the base stays fp32 (the tiny models' shipped dtype); on GPUs a LoRA run's base is bf16
against full fine-tuning's fp32 masters, so the memory ratio here understates LoRA's saving there.

Figures (JSON lines, last): lora.update_tokens_per_s_ratio, LoRA over full fine-tuning, the
median over 3 interleaved rounds of each arm's update tokens / update seconds (forward, backward,
optimizer step; one warm-up update per arm first); lora.peak_mem_ratio, LoRA over full
fine-tuning, the peak of the tensors alive during one update (torch's MemTracker, which counts
every storage by kind: parameters, gradients, optimizer state, activations), each figure's
absolute values beside it; lora.sync_bytes_ratio, what vllm_engine.VLLMEngine.sync_weights hands vLLM
per update in bf16, LoRA's adapters (engine.adapter_weights) over the whole model's
(engine.stream_weights). Never asserts.
"""
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

import grpo  # noqa: E402
from infra import config, engine, lora, models  # noqa: E402
import train  # noqa: E402

SMOKE = "--smoke" in sys.argv
RANK, ALPHA, TARGETS = 16, 32.0, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
SAMPLES, LENGTH, PROMPT = (2, 32, 8) if SMOKE else (8, 256, 64)
ROUNDS = 1 if SMOKE else 3
# bench/step.py's model (10.7M parameters with the tiny tokenizer's 1,024 tokens)
SHAPE = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2,
             head_dim=64, intermediate_size=1152)


def build(adapted: bool):
    """(model, optimizer, tokenizer) of one arm, as run.Run builds them."""
    from transformers import AutoModelForCausalLM, Qwen3Config
    if SMOKE:
        model, tok = models.build_tiny("tiny", seed=0)
    else:
        tok = models.build_tiny_tokenizer()
        cfg = Qwen3Config(vocab_size=len(tok), tie_word_embeddings=True, bos_token_id=None,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **SHAPE)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if adapted:
        lora.add_adapters(model, rank=RANK, alpha=ALPHA, dropout=0.0, targets=TARGETS)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-5, betas=grpo.BETAS, weight_decay=0.1)
    return model, opt, tok


def batch(vocab: int) -> list:
    g = torch.Generator().manual_seed(0)
    return [grpo.Sample(torch.randint(0, vocab, (LENGTH,), generator=g).tolist(),
                        [0] * PROMPT + [1] * (LENGTH - PROMPT), [0.0] * PROMPT +
                        [-6.0] * (LENGTH - PROMPT), advantage=1.0 if i % 2 else -1.0,
                        role="agent") for i in range(SAMPLES)]


def update(model, opt, tok, samples) -> dict:
    """One train.grpo_update; returns its metrics."""
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    return train.grpo_update(train.Trainer(model, opt, sched, Accelerator(cpu=True)), samples,
                             pad_id=tok.pad_token_id, temperatures={"agent": 1.0},
                             gargs=config.GRPOArgs(kl_coef=0.0, micro_batch_tokens=SAMPLES * LENGTH))


class NoHook:
    def remove(self) -> None:
        pass


def peak_gib(model, opt, tok, samples) -> float:
    """GiB of the tensors alive at the peak of one update (MemTracker)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    tracker = MemTracker()
    tracker.track_external(model, opt)
    for p in model.parameters():  # MemTracker hooks every parameter it meets for its gradient;
        if not p.requires_grad:  # a frozen one (LoRA's base) takes no hook: mark it hooked
            tracker._param_to_grad_hook_handles[p] = (NoHook(), NoHook())
    with tracker:
        update(model, opt, tok, samples)
    (by_kind,) = tracker.get_tracker_snapshot("peak").values()
    return by_kind["Total"] / 2**30


def main() -> None:
    arms = {name: build(name == "lora") for name in ("full", "lora")}
    samples = batch(len(arms["full"][2]))
    rates = {name: [] for name in arms}
    for name, (model, opt, tok) in arms.items():
        update(model, opt, tok, samples)  # warm-up: lazy inits, the AdamW state
    for _ in range(ROUNDS):
        for name, (model, opt, tok) in arms.items():
            start = time.perf_counter()
            out = update(model, opt, tok, samples)
            rates[name].append(out["perf/update_tokens"] / (time.perf_counter() - start))
    rate = {name: statistics.median(r) for name, r in rates.items()}
    peak = {name: peak_gib(*arm, samples) for name, arm in arms.items()}
    adapters = sum(t.nbytes for t in engine.adapter_weights(arms["lora"][0],
                                                            torch.bfloat16).values())
    whole = sum(t.nbytes for group in engine.stream_weights(arms["full"][0], torch.bfloat16)
                for _, t in group)
    trained = {n: sum(p.numel() for p in a[0].parameters() if p.requires_grad)
               for n, a in arms.items()}
    print(f"update tokens/s: full {rate['full']:.0f}, LoRA {rate['lora']:.0f}; peak GiB: full "
          f"{peak['full']:.3f}, LoRA {peak['lora']:.3f}; trained parameters: full "
          f"{trained['full']:,}, LoRA {trained['lora']:,}; sync bytes (bf16): full {whole:,}, "
          f"LoRA {adapters:,}")
    workload = (f"{SAMPLES} x {LENGTH} tokens, rank {RANK}, "
                f"{sum(p.numel() for p in arms['full'][0].parameters()):,} parameters")
    for name, value, extra in (
            ("lora.update_tokens_per_s_ratio", rate["lora"] / rate["full"],
             {"lora": rate["lora"], "full": rate["full"]}),
            ("lora.peak_mem_ratio", peak["lora"] / peak["full"],
             {"lora_gib": peak["lora"], "full_gib": peak["full"]}),
            ("lora.sync_bytes_ratio", adapters / whole, {"lora": adapters, "full": whole})):
        print(json.dumps({"metric": name, "value": round(value, 4), **extra,
                          "workload": workload}))


if __name__ == "__main__":
    main()
