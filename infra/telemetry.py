"""Step telemetry (infrastructure, none of it the paper's): how fast a step ran and how much of
the accelerator's peak the update used.

Per step, per rank (one GPU each on GPUs; metrics.jsonl holds the mean over ranks):

    time/<phase>_s            = start of the next phase - start of this one (the last: to now)
    perf/generate_tokens_per_s = sampled tokens (designer, hint, agent replies)
                                 / (time/regenerate_s + time/play_s)
    perf/update_tokens_per_s   = tokens forwarded by the update (every optimizer pass)
                                 / (time/update_s - time/sleep_s)
    perf/step_tokens_per_s     = tokens of the step's training batch (one pass) / time/step_s
    perf/mfu                   = update FLOPs / (time/update_s - time/sleep_s) / peak FLOP/s
    time/sleep_s, time/wake_s  = vLLM's sleep before the update; its wakes: the weights' in the
                                 weight sync, the KV cache's at the step's start
    time/sync_gather_s, time/sync_load_s = the sync's reload: gathering the full tensors
                                 (engine.stream_weights), then the rest, vLLM's loaders (a
                                 LoRA run: the adapters' gather, then their file and vLLM's load)

The update's FLOPs (the model FLOPs of PaLM, arXiv 2204.02311, App. B: no recomputation counted)
for sequences of lengths n_i, with P the matrix parameters a token passes through (attention,
MLP, or the router and its k chosen experts of an MoE layer, the LM head; not the embedding
lookup), L layers and A = heads * head_dim:

    FLOPs = passes * sum_i (2 * P * n_i + 4 * L * A * n_i^2)
    passes = 3 (forward, backward) + 1 with a frozen reference model's forward (--kl_coef > 0)

i.e. 6P + 12 L A n per trained token. Deviations:
    1. Attention is counted over the whole n x n score matrix (PaLM's convention), not the causal
       half, and with bf16 dense peaks (`PEAK_FLOPS`): an fp32 run's MFU reads low.
    2. MFU is reported only on a device named in `PEAK_FLOPS` (torch.cuda.get_device_name); on CPU
       the key is left out rather than guessed.

Dependencies: stdlib only. Test: `pytest tests/test_telemetry.py -m ""` (-m "": its runs too).
"""
from __future__ import annotations

# Dense bf16 tensor-core peaks from the vendors' datasheets, in FLOP/s; the first entry whose
# name occurs in the device name wins, so the longer names come first (GH200 before H200).
PEAK_FLOPS = (
    ("GH200", 989e12), ("H200 NVL", 835e12), ("H200", 989e12), ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12), ("H100", 989e12), ("H800", 989e12), ("GB200", 2500e12),
    ("B200", 2250e12), ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("L4", 121e12),
    ("RTX 4090", 165e12), ("MI300X", 1307e12),
)


def peak_flops(device_name: str | None) -> float | None:
    """The device's dense bf16 peak, or None (CPU, or a device not in PEAK_FLOPS)."""
    return next((peak for key, peak in PEAK_FLOPS if device_name and key in device_name), None)


def model_flops(config) -> dict:
    """From a Hugging Face decoder config: {"params": matrix parameters, "active_params": those a
    token passes through, "layers": L, "attention_dim": A}. MoE layers (Qwen3-MoE, Mixtral
    style): the router and k of E experts are active; `mlp_only_layers` and
    `decoder_sparse_step` mark the dense layers as transformers builds them."""
    c = getattr(config, "text_config", None) or config  # multimodal configs nest the decoder
    hidden, layers, heads = c.hidden_size, c.num_hidden_layers, c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv)  # q and o; k and v
    experts = getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None) or 0
    total = active = c.vocab_size * hidden  # the LM head (tied or not: a matmul either way)
    for i in range(layers):
        sparse = experts and i not in (getattr(c, "mlp_only_layers", None) or []) and (
            (i + 1) % (getattr(c, "decoder_sparse_step", None) or 1) == 0)
        if not sparse:
            mlp = 3 * hidden * c.intermediate_size  # gate, up, down
            total, active = total + attention + mlp, active + attention + mlp
            continue
        expert = 3 * hidden * (getattr(c, "moe_intermediate_size", None) or c.intermediate_size)
        shared = 3 * hidden * (getattr(c, "shared_expert_intermediate_size", None) or 0)
        fixed = attention + hidden * experts + shared  # attention, router, shared expert
        total += fixed + experts * expert
        active += fixed + c.num_experts_per_tok * expert
    return {"params": total, "active_params": active, "layers": layers,
            "attention_dim": heads * head_dim}


def sequence_flops(figures: dict, lengths, passes: int = 3) -> float:
    """passes * sum_i (2 P n_i + 4 L A n_i^2): the model FLOPs of training on these sequences."""
    p, la = figures["active_params"], figures["layers"] * figures["attention_dim"]
    return float(passes * sum(2 * p * n + 4 * la * n * n for n in lengths))


def describe(figures: dict, peak: float | None, device_name: str | None) -> str:
    """The numbers MFU uses, in one line (printed once at the start of a run)."""
    per_token = (f"6 x {figures['active_params']:.4g} active of {figures['params']:.4g} matrix "
                 f"params + 12 x {figures['layers']} layers x {figures['attention_dim']} x n")
    if peak is None:
        return (f"[spade] update FLOPs per token: {per_token}; MFU not logged (no known peak for "
                f"{device_name or 'CPU'})")
    return f"[spade] update FLOPs per token: {per_token}; peak {peak:.4g} FLOP/s ({device_name})"


def phase_seconds(starts: dict, now: float) -> dict:
    """{phase: start time} in phase order -> {phase: seconds until the next phase (the last:
    until `now`)}."""
    names, times = list(starts), list(starts.values()) + [now]
    return {name: times[i + 1] - times[i] for i, name in enumerate(names)}


def step_telemetry(seconds: dict, *, generated_tokens: int, batch_tokens: int, update_tokens: int,
                   update_flops: float, peak: float | None, sleep_s: float = 0.0) -> dict:
    """The step's perf/* figures from its phase seconds and token counts (module docstring); a
    rate whose phase took no time, and MFU without a peak, are left out. The update phase opens
    with the rollout engine's sleep (`sleep_s`), which the update's rates leave out."""
    out = {"perf/generated_tokens": generated_tokens}
    generate_s = seconds.get("regenerate", 0.0) + seconds.get("play", 0.0)
    update_s, step_s = seconds.get("update", 0.0) - sleep_s, sum(seconds.values())
    if generate_s > 0:
        out["perf/generate_tokens_per_s"] = generated_tokens / generate_s
    if update_s > 0:
        out["perf/update_tokens_per_s"] = update_tokens / update_s
        if peak:
            out["perf/mfu"] = update_flops / update_s / peak
    if step_s > 0:
        out["perf/step_tokens_per_s"] = batch_tokens / step_s
    return out
