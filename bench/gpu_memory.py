"""Per-GPU memory of the shipped recipes, computed from parameter counts (the README's table).

    python bench/gpu_memory.py          # prints the markdown table of README "Memory per GPU"

Nothing here runs a model: parameter counts come from the Qwen3 configs' shapes (checked against
transformers on the meta device in tests/test_bench_gpu.py), and every other row is a formula:

    state (fp32 masters, as train.py loads them): weights 4 B + gradients 4 B + AdamW 8 B
                                                  = 16 B/param, over the FSDP2 shards (8 GPUs)
    bf16 KL reference (only when the preset's KL > 0): 2 B/param / shards
    autocast weight copies (1 GPU, no FSDP): bf16 casts of every weight, cached by autocast
                                             during the forward: 2 B/param
    activations, one micro-batch of T tokens (T = 32,768: one episode at the paper's context
    fills a micro-batch by itself):
        checkpoints  T * layers * hidden * b    (b = 4: fp32 residual under autocast; 2 under FSDP2)
        recompute    T * (6 hidden + 3 active intermediate) * 2 B * 2   (one layer, fwd + bwd)
        head         V * hidden * (4 + 2) B     (fp32 gradient sum + one bf16 chunk product)
        FSDP2 only   2 unsharded bf16 layers (prefetch) + the unsharded embedding and head
    vLLM (colocated): gpu_memory_utilization (0.35) of the card during rollouts; asleep (level 2:
    weights discarded, KV cache freed) during the update.
    update phase  = state + reference + autocast copies + activations
    rollout phase = state - gradients (freed after optimizer.step) + reference + vLLM's share

Cards: H100 80 GB = 79.6 GiB, H200 141 GB = 140.4 GiB (as CUDA reports them). A phase is "fits"
below 95% of the card (allocator fragmentation, NCCL buffers, CUDA context). These are estimates:
the 4B update's peak was measured once on an H200 (issue 11, 75.3 GiB at 16,000-token
micro-batches, checkpointing on) against 77.8 GiB from these formulas at that length.
"""
from dataclasses import dataclass

GIB = 2 ** 30
CARDS = {"H100 80 GB": 79.6, "H200 141 GB": 140.4}
VLLM_SHARE = 0.35     # train.py --gpu_memory_utilization
MICRO_TOKENS = 32_768


@dataclass(frozen=True)
class Qwen3:
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int          # dense MLP, or one expert's (moe_intermediate_size)
    experts: int = 0           # 0: dense
    active_experts: int = 0    # experts per token
    tied: bool = False

    def params(self) -> int:
        """Every parameter, as transformers builds the model (norms and router included)."""
        h, d = self.hidden, self.head_dim
        attn = h * d * (self.heads + 2 * self.kv_heads) + self.heads * d * h + 2 * d  # qkvo, norms
        if self.experts:
            mlp = self.experts * (3 * h * self.intermediate + h)                # experts, router
        else:
            mlp = 3 * h * self.intermediate
        layer = attn + mlp + 2 * h                                               # 2 RMSNorms
        embed = self.vocab * h * (1 if self.tied else 2)
        return self.layers * layer + embed + h                                   # final norm

    def active_intermediate(self) -> int:
        return self.intermediate * (self.active_experts or 1)


MODELS = [
    # (model, GPUs, KL in its games/tool presets) -- configs of the Hugging Face checkpoints
    (Qwen3("Qwen3-4B", 151_936, 2_560, 36, 32, 8, 128, 9_728, tied=True), 1, "games 0, tool 0.005"),
    (Qwen3("Qwen3-8B", 151_936, 4_096, 36, 32, 8, 128, 12_288), 8, "0.005"),
    (Qwen3("Qwen3-30B-A3B", 151_936, 2_048, 48, 32, 4, 128, 768, 128, 8), 8, "games 0, tool 0.005"),
]


def rows(model: Qwen3, gpus: int, tokens: int = MICRO_TOKENS) -> dict[str, float]:
    """GiB per GPU of each part, for one recipe."""
    n, shards, fsdp = model.params(), gpus, gpus > 1
    act_b = 2 if fsdp else 4
    layer_params = (n - model.vocab * model.hidden * (1 if model.tied else 2)) / model.layers
    r = {
        "weights (fp32)": 4 * n / shards,
        "gradients (fp32)": 4 * n / shards,
        "AdamW state (fp32)": 8 * n / shards,
        "bf16 KL reference": 2 * n / shards,
        "autocast bf16 weight copies": 0 if fsdp else 2 * n,
        "checkpointed activations": tokens * model.layers * model.hidden * act_b,
        "one layer's recompute": tokens * (6 * model.hidden + 3 * model.active_intermediate()) * 4,
        "head (fp32 gradient sum)": model.vocab * model.hidden * 6,
        "FSDP2 unsharded buffers": (2 * layer_params + model.vocab * model.hidden * 2) * 2
        if fsdp else 0,
    }
    return {k: v / GIB for k, v in r.items()}


def phases(r: dict[str, float], card: float, kl: bool) -> tuple[float, float]:
    """(update peak, rollout) GiB per GPU on a card of `card` GiB."""
    ref = r["bf16 KL reference"] if kl else 0.0
    update = sum(v for k, v in r.items() if k != "bf16 KL reference") + ref
    rollout = r["weights (fp32)"] + r["AdamW state (fp32)"] + ref + VLLM_SHARE * card
    return update, rollout


def table() -> str:
    head = ["", *(f"{m.name} ({g} GPU{'s' if g > 1 else ''}, {m.params() / 1e9:.2f}B)"
                  for m, g, _ in MODELS)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    parts = [rows(m, g) for m, g, _ in MODELS]
    for key in parts[0]:
        out.append(f"| {key} | " + " | ".join(f"{p[key]:.1f}" for p in parts) + " |")
    for card, gib in CARDS.items():
        for kl in (False, True):
            cells = []
            for p in parts:
                update, rollout = phases(p, gib, kl)
                ok = "fits" if max(update, rollout) < 0.95 * gib else "**over**"
                cells.append(f"{update:.0f} / {rollout:.0f} {ok}")
            label = f"{card}: update / rollout peak{' with KL' if kl else ''}"
            out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table())
