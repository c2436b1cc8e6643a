"""GRPO for both roles of one policy: advantages, memory-efficient token log-probs, and the loss.

SPADE (arXiv 2608.19197), the policy update of both roles. One policy is both
the Environment Designer and the Reasoning Agent; both roles update it with GRPO. Per role:

    agent:     A_i = (R_i - mean_g(R)) / (std_g(R) + 1e-8)     g = the G plays of one environment
    designer:  A_i = S * (score_i - mean_k(score))             k = the designer samples of one skill
               S   = min(50, N_agent / N_designer * R)         role balance (~32 in the paper)

The loss, per completion token t of sample i (mask 1 only), with clip-higher and a truncated
importance weight against the rollout engine's log-probs:

    rho_t = exp(logp_t - old_logp_t)
    pg_t  = max(-rho_t * A_i, -clip(rho_t, 1 - 0.2, 1 + 0.28) * A_i)
    w_t   = min(exp(old_logp_t - rollout_logp_t), 2.0)
    l_t   = w_t * pg_t + beta * k3_t,   k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1
    loss  = mean_i [ sum_t mask_it * l_t / sum_t mask_it ]   (token-mean per sample, then samples)

Symbols (paper -> code; shapes: B samples, G plays per group, T tokens, V vocabulary, H hidden):
    R_i            returns (B,)                A_i      advantages (B,) or (B, T)
    pi_theta       logp (B, T)                 pi_old   old_logp (B, T)
    pi_rollout     rollout_logp (B, T)         pi_ref   ref_logp (B, T)
    epsilon_low/high  clip_low / clip_high     C        tis_cap    beta  kl_coef
    S              role_scale(...)             R        interval (regeneration interval)

Deviations from the paper (and from the authors' code):
    1. The k3 KL term clamps the log-ratio to [-20, 20] and k3 to [0, 10] (as verl does) so a
       single token cannot blow up the loss; the paper states only "k3".
    2. Samples without any completion token are left out of the mean over samples (they carry no
       gradient; counting them would silently shrink the loss).
    3. role_scale returns 0.0 when a step has no designer samples (nothing to scale).
    Not a deviation, but how it is done: token log-probs come from the body's hidden states and
    the output head in chunks of completion tokens (a custom autograd Function, see below); they
    match the naive full log-softmax to fp32 round-off (tested against an fp64 reference). The
    head runs in the caller's autocast dtype in both passes (explicit casts), the log-sum-exp in
    fp32, and the head gradient sums its chunks in fp32: within 1e-2 of fp64 in bf16.

Distributed use: token_logprobs(model, ...) takes the model as the trainer holds it (plain, FSDP2
fully_shard-ed in place, or a DDP / DeepSpeed engine exposing `.module`). It swaps the innermost
model's forward for the log-prob computation during one call through the OUTERMOST module, and
the chunk loop runs inside the output head's own call, so every unshard / gather hook fires as in
an ordinary forward. The loss is a mean over the samples it is given: with gradient accumulation,
scale each micro-batch's loss by B_micro / B_total.

Metrics returned by policy_loss (token means are over trained tokens of the whole batch), under
the names train.py logs:
    losses/policy                     mean_i token-mean_t (w_t * pg_t)  (the loss without the KL term)
    losses/kl                         token-mean k3 (only when ref_logp is given)
    losses/clip_frac                  share of tokens where the clipped branch is taken (no gradient)
    losses/is_weight_min|mean|max     exp(old_logp - rollout_logp) before the cap
    losses/is_weight_capped_frac      share of tokens whose weight hit tis_cap
    losses/entropy                    -token-mean logp (a one-sample entropy estimate)
    losses/tokens                     number of trained tokens

Dependencies: torch only (transformers models are duck-typed: get_decoder(),
get_output_embeddings()).
Test: `pytest tests/test_grpo.py`
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

# Optimizer constants of the paper's training setup: AdamW, constant lr 1e-6,
# betas (0.9, 0.98), weight decay 0.1, gradient clipping at 1.0, bf16 (train.py builds it).
LR = 1e-6
BETAS = (0.9, 0.98)
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
CLIP_LOW, CLIP_HIGH = 0.2, 0.28   # clip-higher, the paper's values
TIS_CAP = 2.0                     # truncated importance-sampling cap, the paper's value
ROLE_SCALE_CAP = 50.0             # cap of the designer's role-balancing scale S


# ALGO: advantages --------------------------------------------------------------------------------

def agent_advantages(returns: Sequence[float], group_ids: Sequence[Hashable]) -> torch.Tensor:
    """(B,) group-normalised advantages; a group whose returns are all equal gets exactly 0."""
    r = torch.as_tensor(returns, dtype=torch.float64)                       # (B,)
    if r.ndim != 1 or len(group_ids) != r.numel():
        raise ValueError(f"need one group id per return, got {r.shape} returns and "
                         f"{len(group_ids)} ids")
    if not torch.isfinite(r).all():
        raise ValueError("returns must be finite")
    members = defaultdict(list)
    for i, g in enumerate(group_ids):
        members[g].append(i)
    adv = torch.zeros_like(r)
    for idx in members.values():
        g = r[idx]                                                          # (G,)
        if g.max() == g.min():      # zero variance: the group says nothing about what is better
            continue
        # A = (R - mean) / (std + 1e-8), population std
        adv[idx] = (g - g.mean()) / (g.std(correction=0) + 1e-8)
    return adv.float()


def role_scale(n_agent: int, n_designer: int, interval: int, cap: float = ROLE_SCALE_CAP) -> float:
    """S = min(cap, N_agent / N_designer * R); 0.0 when there are no designer samples."""
    if n_agent < 0 or n_designer < 0 or interval <= 0:
        raise ValueError(f"bad counts: n_agent={n_agent}, n_designer={n_designer}, "
                         f"interval={interval}")
    if n_designer == 0:
        return 0.0
    return min(float(cap), n_agent / n_designer * interval)   # S = min(50, N_a / N_d * R)


def designer_advantages(scores: Sequence[float], skills: Sequence[Hashable],
                        scale: float) -> torch.Tensor:
    """(B,) A = S * (score - mean of the same skill's scores); no std division, as in the paper."""
    s = torch.as_tensor(scores, dtype=torch.float64)                        # (B,)
    if s.ndim != 1 or len(skills) != s.numel():
        raise ValueError(f"need one skill per score, got {s.shape} scores and {len(skills)} skills")
    if not (torch.isfinite(s).all() and math.isfinite(scale)):
        raise ValueError("scores and scale must be finite")
    members = defaultdict(list)
    for i, k in enumerate(skills):
        members[k].append(i)
    adv = torch.zeros_like(s)
    for idx in members.values():
        adv[idx] = scale * (s[idx] - s[idx].mean())             # A = S * (score - mean_skill)
    return adv.float()


# ALGO: token log-probs without the (B, T, V) log-softmax -----------------------------------------
# Why: at V = 151,936 a 32k-token sequence has a 20 GB fp32 log-softmax. We run the model body to
# hidden states (B, T, H), keep only the completion positions (N, H), and project + log-sum-exp
# chunk_size tokens at a time. A custom autograd Function keeps only hidden, the head weight and
# one log-sum-exp per token for the backward, which recomputes each chunk's logits and writes
#     d logp_n / d logits_n = (onehot(y_n) - softmax(logits_n)) / temperature
# straight into one (N, H) and one (V, H) gradient buffer. Peak extra memory is the head's
# gradient plus about two (chunk, V) fp32 buffers, against several (N, V) ones for the naive
# log_softmax -> gather (bench/logprob.py). I tried torch.utils.checkpoint per chunk first: it is
# simpler, but autograd then allocates a fresh (V, H) weight gradient for every chunk before
# adding it to .grad, which costs a second copy of the head at the peak.


def _head_logits(h, weight, bias, temperature):
    """(C, V) logits / T in fp32 at least. Half-precision operands are multiplied with an fp32
    output: rounding a logit of 50 to bf16 would move it by up to 0.125, i.e. its probability by
    13% (the product itself is accumulated in fp32 either way)."""
    if h.dtype not in (torch.float16, torch.bfloat16):
        logits = h @ weight.T                                                     # (C, V)
    elif h.is_cuda and _MM_FP32_OUT[0]:
        try:
            logits = torch.mm(h, weight.T, out_dtype=torch.float32)              # (C, V)
        except (RuntimeError, TypeError):  # a torch without the kernel: upcast (slower)
            _MM_FP32_OUT[0] = False
            return _head_logits(h, weight, bias, temperature)
    else:  # CPU has no half x half -> fp32 kernel: the same products in fp32
        logits = h.float() @ weight.float().T                                    # (C, V)
    return (logits if bias is None else logits + bias).div_(temperature)


_MM_FP32_OUT = [True]  # torch.mm(..., out_dtype=float32) works on this CUDA build


def _logsumexp_(logits):
    """(C,) logsumexp over the last dim, overwriting logits (C, V) with exp(logits - max).

    The same max-shifted formula as torch.logsumexp, done in place: on CPU it is about twice as
    fast (no (C, V) temporaries), and the chunk buffer is dead afterwards anyway."""
    m = logits.amax(dim=-1, keepdim=True)                                        # (C, 1)
    m.masked_fill_(m.isinf(), 0.0)  # all -inf (or an inf) row: as torch.logsumexp does
    return logits.sub_(m).exp_().sum(-1).log_().add_(m.squeeze(-1))              # (C,)


def _compute_dtype(hidden, weight):
    """The head matmul's dtype: the caller's autocast dtype if autocast is on, else the inputs'.
    Both passes cast to it explicitly (autocast is on in the forward, off in the backward)."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _cast(x, dtype):
    return None if x is None else x.to(dtype)


class _ChunkedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size):
        cd = _compute_dtype(hidden, weight)
        w, b = _cast(weight, cd), _cast(bias, cd)  # one cast per call, not per chunk
        dtype = torch.promote_types(cd, torch.float32)
        out, lse = [hidden.new_zeros(0, dtype=dtype)], [hidden.new_zeros(0, dtype=dtype)]
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk_size):   # (N = 0 still runs the hooks)
                logits = _head_logits(hidden[start:start + chunk_size].to(cd), w, b, temperature)
                y = targets[start:start + chunk_size]
                picked = logits.gather(-1, y[:, None]).squeeze(-1)               # (C,)
                lse.append(_logsumexp_(logits))                                  # (C,)
                # log p(y) = logit_y / T - logsumexp(logits / T)
                out.append(picked - lse[-1])                                     # (C,)
        ctx.save_for_backward(hidden, weight, bias, targets, torch.cat(lse))
        ctx.temperature, ctx.chunk_size, ctx.cd = temperature, chunk_size, cd
        return torch.cat(out)                                                    # (N,)

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        T, C, cd = ctx.temperature, ctx.chunk_size, ctx.cd
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        w, b = _cast(weight, cd), _cast(bias, cd)   # the forward's operands, recast
        grad_h = torch.empty_like(hidden) if need_h else None                   # (N, H)
        # the head gradient sums N / C chunk products: accumulate them in fp32 (at least)
        acc = torch.promote_types(cd, torch.float32)
        grad_w = torch.zeros_like(weight, dtype=acc) if need_w else None        # (V, H)
        grad_b = torch.zeros_like(bias, dtype=acc) if need_b else None          # (V,)
        with torch.autocast(hidden.device.type, enabled=False):  # as the forward's loop
            for start in range(0, hidden.shape[0], C):
                h, y = hidden[start:start + C].to(cd), targets[start:start + C]
                g = grad_out[start:start + C].to(lse.dtype)                         # (C,)
                logits = _head_logits(h, w, b, T)                                    # (C, V)
                # d logp / d logits = (onehot(y) - softmax) / T, scaled by the incoming gradient
                grad_logits = logits.sub_(lse[start:start + C, None]).exp_().mul_(-g[:, None] / T)
                grad_logits[torch.arange(len(y), device=y.device), y] += g / T
                grad_logits = grad_logits.to(cd)                                     # (C, V)
                if need_h:
                    grad_h[start:start + C] = grad_logits @ w                        # (C, H)
                if need_w and cd == acc:
                    grad_w.addmm_(grad_logits.T, h)                                  # (V, H)
                elif need_w:  # the chunk's product in bf16, the running sum in fp32
                    grad_w += grad_logits.T @ h                                      # (V, H)
                if need_b:
                    grad_b += grad_logits.sum(0)
        grad_b = grad_b if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, _cast(grad_w, weight.dtype), grad_b, None, None, None


def _call_with_forward(module, forward, *args, outer=None):
    """(outer or module)(*args) with `forward` standing in for module.forward during this call.

    Going through __call__ keeps every hook on the module (and on `outer`, a wrapper holding it):
    FSDP2 unshards the module's parameters in its pre-forward hook (and again before the
    backward), DeepSpeed ZeRO-3 gathers them, DDP does its bookkeeping. Whatever instance-level
    forward was set before (Accelerate sets one for autocast) is put back afterwards.
    """
    saved = module.__dict__.get("forward")
    module.forward = forward
    try:
        return (outer if outer is not None else module)(*args)
    finally:
        if saved is None:
            del module.forward
        else:
            module.forward = saved


def chunked_logprobs(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor,
                     temperature: float = 1.0, chunk_size: int = 256) -> torch.Tensor:
    """(N,) log softmax(head(hidden) / temperature)[targets], chunk_size rows at a time.

    hidden (N, H), targets (N,); head is a linear output layer (`.weight` (V, H), optional
    `.bias`), as in every transformers causal LM. The chunk loop runs inside head's own __call__,
    so wrapper hooks on the head fire (see _call_with_forward).
    """
    def forward(h):
        return _ChunkedLogprob.apply(h, head.weight, getattr(head, "bias", None), targets,
                                     temperature, chunk_size)
    return _call_with_forward(head, forward, hidden)


def _logprob_forward(inner, input_ids, attention_mask, completion_mask, temperature, chunk_size):
    """The forward that replaces the model's own for one call (see token_logprobs)."""
    body, head = inner.get_decoder(), inner.get_output_embeddings()
    if bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all()):
        # right padding only: causal attention never reads the later (pad) positions, and with
        # no mask SDPA / flash-attention run their causal kernels: no (B, 1, T, T) mask is built
        attention_mask = None
    hidden = body(input_ids=input_ids, attention_mask=attention_mask,
                  use_cache=False).last_hidden_state                         # (B, T, H)
    B, T = input_ids.shape
    # hidden[:, t-1] predicts input_ids[:, t]; only completion positions are projected
    select = completion_mask[:, 1:] > 0                                      # (B, T-1)
    logp = chunked_logprobs(hidden[:, :-1][select], head, input_ids[:, 1:][select],
                            temperature, chunk_size)                         # (N,)
    b, t = select.nonzero(as_tuple=True)
    out = torch.zeros(B, T, dtype=logp.dtype, device=hidden.device)         # (B, T)
    return out.index_put((b, t + 1), logp)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   completion_mask: torch.Tensor, temperature: float = 1.0,
                   chunk_size: int = 256) -> torch.Tensor:
    """(B, T): out[b, t] = log p(input_ids[b, t] | input_ids[b, :t]) at temperature, 0 where mask 0.

    `model` is a causal LM (transformers: get_decoder() gives the body, get_output_embeddings() the
    head), possibly wrapped: DDP / DeepSpeed engines (found through `.module`) or FSDP2
    (fully_shard wraps in place). completion_mask[:, 0] must be 0 (nothing predicts token 0).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if (completion_mask[:, 0] > 0).any():
        raise ValueError("completion_mask[:, 0] must be 0: the first token has no prediction")
    # INFRA: run the whole computation INSIDE the outermost module's __call__ so wrapper hooks
    # fire (FSDP2's root unshards its parameters, often the embeddings and the head; a DeepSpeed
    # engine or DDP runs its own forward), with the innermost model's forward swapped for ours.
    inner = model
    while isinstance(getattr(inner, "module", None), torch.nn.Module):
        inner = inner.module

    def forward(*_args):
        return _logprob_forward(inner, input_ids, attention_mask, completion_mask,
                                temperature, chunk_size)

    return _call_with_forward(inner, forward, input_ids, outer=model)


# ALGO: the loss ----------------------------------------------------------------------------------

def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, rollout_logp: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor, ref_logp: torch.Tensor | None = None,
                kl_coef: float = 0.0, clip_low: float = CLIP_LOW, clip_high: float = CLIP_HIGH,
                tis_cap: float = TIS_CAP) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped (clip-higher) policy gradient with truncated importance weights.

    logp (B, T) carries the gradient; old_logp, rollout_logp, ref_logp (B, T) are constants;
    advantages (B,) or (B, T); mask (B, T) 1 on trained tokens. Returns (loss, stats) where loss is
    the mean over the B samples given: with gradient accumulation over micro-batches, scale it by
    B_micro / B_total. Stats: floats, keys listed in the module docstring.
    """
    if not (logp.shape == old_logp.shape == rollout_logp.shape == mask.shape):
        raise ValueError(f"logp, old_logp, rollout_logp and mask need one (B, T) shape, got "
                         f"{logp.shape}, {old_logp.shape}, {rollout_logp.shape}, {mask.shape}")
    if kl_coef and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp")
    on = mask > 0                                                            # (B, T)
    mask = on.to(logp.dtype)
    adv = advantages.to(logp.dtype)
    adv = adv[:, None] if adv.ndim == 1 else adv                             # (B, 1) or (B, T)
    # masked positions (prompt, observations, padding) may hold anything: zero them before any
    # exp() so an overflow there cannot turn into inf * 0 = NaN in the loss or its gradient
    logp = torch.where(on, logp, 0.0)
    old_logp = torch.where(on, old_logp.detach(), 0.0)
    rollout_logp = torch.where(on, rollout_logp.detach(), 0.0)
    n_tokens = mask.sum(dim=1)                                               # (B,)
    has_tokens = n_tokens > 0

    def sample_mean(x):
        """token-mean within each sample, then the mean over samples that have tokens"""
        per_sample = (x * mask).sum(dim=1) / n_tokens.clamp(min=1)           # (B,)
        return per_sample[has_tokens].mean() if has_tokens.any() else (x * mask).sum()

    # rho = exp(logp - old_logp)
    ratio = torch.exp(logp - old_logp)                                       # (B, T)
    # pg = max(-rho * A, -clip(rho, 1 - eps_low, 1 + eps_high) * A)
    pg_plain = -ratio * adv
    pg_clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    pg = torch.maximum(pg_plain, pg_clipped)                                 # (B, T)
    # w = min(exp(old_logp - rollout_logp), C)
    is_raw = torch.exp(old_logp - rollout_logp)                              # (B, T)
    policy_term = torch.clamp(is_raw, max=tis_cap) * pg                      # (B, T)
    kl = None
    if ref_logp is not None:
        # k3 = exp(ref - logp) - (ref - logp) - 1, log-ratio clamped to [-20, 20], k3 to [0, 10]
        log_ratio = torch.clamp(torch.where(on, ref_logp.detach(), 0.0) - logp, -20.0, 20.0)
        kl = torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, 0.0, 10.0)   # (B, T)
    # loss = mean_i token-mean_t (w * pg + beta * k3)
    loss = sample_mean(policy_term + kl_coef * kl if kl_coef else policy_term)

    with torch.no_grad():
        total = on.sum().clamp(min=1)

        def token_mean(x):
            return float(x[on].sum() / total)

        raw_on = is_raw[on] if on.any() else is_raw.new_ones(1)
        stats = {
            "losses/policy": float(sample_mean(policy_term)),
            "losses/clip_frac": token_mean((pg_clipped > pg_plain).to(logp.dtype)),
            "losses/is_weight_min": float(raw_on.min()),
            "losses/is_weight_mean": float(raw_on.mean()),
            "losses/is_weight_max": float(raw_on.max()),
            "losses/is_weight_capped_frac": token_mean((is_raw > tis_cap).to(logp.dtype)),
            "losses/entropy": -token_mean(logp.detach()),
            "losses/tokens": float(mask.sum()),
        }
        if kl is not None:
            stats["losses/kl"] = token_mean(kl)
    return loss, stats


# INFRA: batching ---------------------------------------------------------------------------------

def _field(record, name):
    return record[name] if isinstance(record, dict) else getattr(record, name)


def pad_batch(samples: Sequence, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad records with token_ids / mask / logprobs (dicts or objects) into tensors.

    Returns input_ids (B, T) long, attention_mask (B, T) long, completion_mask (B, T) float
    (the record's mask; 0 on padding), rollout_logp (B, T) float (0 where completion_mask is 0).
    """
    if not samples:
        raise ValueError("pad_batch needs at least one sample")
    rows = []
    for i, s in enumerate(samples):
        ids, mask, lps = (list(_field(s, k)) for k in ("token_ids", "mask", "logprobs"))
        if not (len(ids) == len(mask) == len(lps)) or not ids:
            raise ValueError(f"sample {i}: token_ids, mask and logprobs need one equal, non-zero "
                             f"length, got {len(ids)}, {len(mask)}, {len(lps)}")
        rows.append((ids, mask, lps))
    T = max(len(ids) for ids, _, _ in rows)
    B = len(rows)
    out = {"input_ids": torch.full((B, T), pad_id, dtype=torch.long),
           "attention_mask": torch.zeros(B, T, dtype=torch.long),
           "completion_mask": torch.zeros(B, T, dtype=torch.float32),
           "rollout_logp": torch.zeros(B, T, dtype=torch.float32)}
    for b, (ids, mask, lps) in enumerate(rows):
        n = len(ids)
        out["input_ids"][b, :n] = torch.tensor(ids, dtype=torch.long)
        out["attention_mask"][b, :n] = 1
        out["completion_mask"][b, :n] = torch.tensor(mask, dtype=torch.float32)
        out["rollout_logp"][b, :n] = torch.tensor(lps, dtype=torch.float32)
    out["rollout_logp"] *= out["completion_mask"]
    return out
