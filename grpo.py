"""GRPO for both roles of one policy: advantages, memory-efficient token log-probs, and the loss.

SPADE (arXiv 2608.19197), the policy update: one policy is both the Environment Designer and the
Reasoning Agent, and both roles update it with GRPO. Per role:

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
R_i returns (B,); A_i advantages (B,) or (B, T); pi_theta, pi_old, pi_rollout, pi_ref: logp,
old_logp, rollout_logp, ref_logp (B, T); epsilon_low/high clip_low/clip_high; C tis_cap;
beta kl_coef; S role_scale(...); R interval (the regeneration interval).

Deviations from the paper (and from the authors' code):
    1. k3 clamps the log-ratio to [-20, 20] and k3 to [0, 10] (as verl does): one token cannot
       blow up the loss; the paper states only "k3".
    2. Samples without any completion token are left out of the mean over samples.
    3. role_scale is 0.0 when a step has no designer samples.
Token log-probs are computed in chunks without the (B, T, V) log-softmax (see token_logprobs and
the comment above it); policy_loss returns the `losses/*` metrics of the README's metric list.

Dependencies: torch only (transformers models are duck-typed: get_decoder(),
get_output_embeddings()).
Test: `pytest tests/test_grpo.py`
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

BETAS = (0.9, 0.98)               # AdamW betas of the paper's training setup (train.py builds it)
CLIP_LOW, CLIP_HIGH = 0.2, 0.28   # clip-higher, the paper's values
TIS_CAP = 2.0                     # truncated importance-sampling cap, the paper's value
ROLE_SCALE_CAP = 50.0             # cap of the designer's role-balancing scale S


# ALGO: advantages --------------------------------------------------------------------------------

def _groups(ids: Sequence[Hashable]) -> list[list[int]]:
    members = defaultdict(list)
    for i, g in enumerate(ids):
        members[g].append(i)
    return list(members.values())


def agent_advantages(returns: Sequence[float], group_ids: Sequence[Hashable]) -> torch.Tensor:
    """(B,) group-normalised advantages; a group whose returns are all equal gets exactly 0."""
    r = torch.as_tensor(returns, dtype=torch.float64)                       # (B,)
    if r.ndim != 1 or len(group_ids) != r.numel() or not torch.isfinite(r).all():
        raise ValueError(f"need one finite return per group id, got {r.shape} returns and "
                         f"{len(group_ids)} ids")
    adv = torch.zeros_like(r)
    for idx in _groups(group_ids):
        g = r[idx]                                                          # (G,)
        if g.max() > g.min():  # a zero-variance group says nothing about what is better
            adv[idx] = (g - g.mean()) / (g.std(correction=0) + 1e-8)       # population std
    return adv.float()


def role_scale(n_agent: int, n_designer: int, interval: int, cap: float = ROLE_SCALE_CAP) -> float:
    """S = min(cap, N_agent / N_designer * R); 0.0 when there are no designer samples."""
    if n_agent < 0 or n_designer < 0 or interval <= 0:
        raise ValueError(f"bad counts: n_agent={n_agent}, n_designer={n_designer}, "
                         f"interval={interval}")
    return min(float(cap), n_agent / n_designer * interval) if n_designer else 0.0


def designer_advantages(scores: Sequence[float], skills: Sequence[Hashable],
                        scale: float) -> torch.Tensor:
    """(B,) A = S * (score - mean of the same skill's scores); no std division, as in the paper."""
    s = torch.as_tensor(scores, dtype=torch.float64)                        # (B,)
    if s.ndim != 1 or len(skills) != s.numel():
        raise ValueError(f"need one skill per score, got {s.shape} scores and {len(skills)} skills")
    if not (torch.isfinite(s).all() and math.isfinite(scale)):
        raise ValueError("scores and scale must be finite")
    adv = torch.zeros_like(s)
    for idx in _groups(skills):
        adv[idx] = scale * (s[idx] - s[idx].mean())
    return adv.float()


# ALGO: token log-probs without the (B, T, V) log-softmax -----------------------------------------
# Why: at V = 151,936 a 32k-token sequence has a 20 GB fp32 log-softmax. We run the model body to
# hidden states (B, T, H), keep the completion positions (N, H), and project + log-sum-exp
# chunk_size tokens at a time. A custom autograd Function keeps only hidden, the head weight and
# one log-sum-exp per token; its backward recomputes each chunk's logits and writes
#     d logp_n / d logits_n = (onehot(y_n) - softmax(logits_n)) / temperature
# into one (N, H) and one (V, H) gradient buffer: peak extra memory is the head's gradient plus
# about two (chunk, V) fp32 buffers (bench/logprob.py). (torch.utils.checkpoint per chunk is
# simpler, but allocates a fresh (V, H) weight gradient per chunk: a second head at the peak.)
# The head runs in the caller's autocast dtype in both passes (explicit casts), the log-sum-exp
# in fp32, and the head gradient sums its chunks in fp32: the naive log-softmax to fp32 round-off,
# within 1e-2 of fp64 in bf16 (tests). token_logprobs runs inside the OUTERMOST module's call, so
# every unshard / gather hook of a wrapped model fires as in an ordinary forward.

_MM_FP32_OUT = [True]  # torch.mm(..., out_dtype=float32) works on this CUDA build


def _head_logits(h, weight, bias, temperature):
    """(C, V) logits / T in fp32 at least. Half-precision operands are multiplied with an fp32
    output: rounding a logit of 50 to bf16 would move it by up to 0.125, i.e. its probability by
    13% (the product itself is accumulated in fp32 either way)."""
    logits = None
    half = h.dtype in (torch.float16, torch.bfloat16)
    if half and h.is_cuda and _MM_FP32_OUT[0]:
        try:
            logits = torch.mm(h, weight.T, out_dtype=torch.float32)              # (C, V)
        except (RuntimeError, TypeError):  # a torch without the kernel: upcast (slower)
            _MM_FP32_OUT[0] = False
    if logits is None:  # CPU has no half x half -> fp32 kernel: the same products in fp32
        logits = h.float() @ weight.float().T if half else h @ weight.T         # (C, V)
    return (logits if bias is None else logits + bias).div_(temperature)


def _logsumexp_(logits):
    """(C,) logsumexp over the last dim, overwriting logits (C, V) with exp(logits - max): the
    max-shifted formula of torch.logsumexp in place (twice as fast on CPU, no (C, V) temporary)."""
    m = logits.amax(dim=-1, keepdim=True)                                        # (C, 1)
    m.masked_fill_(m.isinf(), 0.0)  # all -inf (or an inf) row: as torch.logsumexp does
    return logits.sub_(m).exp_().sum(-1).log_().add_(m.squeeze(-1))              # (C,)


def _cast(x, dtype):
    return None if x is None else x.to(dtype)


class _ChunkedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size):
        device = hidden.device.type  # compute in the caller's autocast dtype, else the inputs'
        cd = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else \
            torch.promote_types(hidden.dtype, weight.dtype)
        w, b = _cast(weight, cd), _cast(bias, cd)  # one cast per call, not per chunk
        dtype = torch.promote_types(cd, torch.float32)
        out, lse = [hidden.new_zeros(0, dtype=dtype)], [hidden.new_zeros(0, dtype=dtype)]
        with torch.autocast(device, enabled=False):
            for start in range(0, hidden.shape[0], chunk_size):   # (N = 0 still runs the hooks)
                logits = _head_logits(hidden[start:start + chunk_size].to(cd), w, b, temperature)
                y = targets[start:start + chunk_size]
                picked = logits.gather(-1, y[:, None]).squeeze(-1)               # (C,)
                lse.append(_logsumexp_(logits))                                  # (C,)
                out.append(picked - lse[-1])  # log p(y) = logit_y / T - logsumexp(logits / T)
        ctx.save_for_backward(hidden, weight, bias, targets, torch.cat(lse))
        ctx.temperature, ctx.chunk_size, ctx.cd = temperature, chunk_size, cd
        return torch.cat(out)                                                    # (N,)

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        T, C, cd = ctx.temperature, ctx.chunk_size, ctx.cd
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        w, b = _cast(weight, cd), _cast(bias, cd)   # the forward's operands, recast
        acc = torch.promote_types(cd, torch.float32)  # the head gradient sums N / C chunks
        grad_h = torch.empty_like(hidden) if need_h else None                   # (N, H)
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
        grad_b = _cast(grad_b, getattr(bias, "dtype", None))
        return grad_h, _cast(grad_w, weight.dtype), grad_b, None, None, None


def _call_with_forward(module, forward, *args, outer=None):
    """(outer or module)(*args) with `forward` standing in for module.forward during this call:
    __call__ runs every hook of the module (and of `outer`, a wrapper holding it), so FSDP2
    unshards, ZeRO-3 gathers, DDP does its bookkeeping. A prior instance forward (Accelerate's
    autocast one) is put back afterwards."""
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
    """(N,) log softmax(head(hidden) / temperature)[targets], chunk_size rows at a time; hidden
    (N, H), targets (N,), head a linear output layer (`.weight` (V, H), optional `.bias`), called
    through its own __call__ so its hooks fire."""
    def forward(h):
        return _ChunkedLogprob.apply(h, head.weight, getattr(head, "bias", None), targets,
                                     temperature, chunk_size)
    return _call_with_forward(head, forward, hidden)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   completion_mask: torch.Tensor, temperature: float = 1.0,
                   chunk_size: int = 256) -> torch.Tensor:
    """(B, T): out[b, t] = log p(input_ids[b, t] | input_ids[b, :t]) at temperature, 0 where mask 0.
    `model`: a causal LM (get_decoder() the body, get_output_embeddings() the head), as the trainer
    holds it (plain, FSDP2, or a DDP / DeepSpeed engine exposing `.module`). completion_mask[:, 0]
    must be 0 (nothing predicts token 0)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if (completion_mask[:, 0] > 0).any():
        raise ValueError("completion_mask[:, 0] must be 0: the first token has no prediction")
    inner = model
    while isinstance(getattr(inner, "module", None), torch.nn.Module):
        inner = inner.module

    def forward(*_args):  # INFRA: runs as the innermost model's forward, inside model's __call__
        mask = attention_mask
        if bool((mask[:, 1:] <= mask[:, :-1]).all()):
            # right padding only: causal attention never reads the later (pad) positions, and with
            # no mask SDPA / flash-attention run their causal kernels: no (B, 1, T, T) mask is built
            mask = None
        hidden = inner.get_decoder()(input_ids=input_ids, attention_mask=mask,
                                     use_cache=False).last_hidden_state      # (B, T, H)
        # hidden[:, t-1] predicts input_ids[:, t]; only completion positions are projected
        select = completion_mask[:, 1:] > 0                                  # (B, T-1)
        logp = chunked_logprobs(hidden[:, :-1][select], inner.get_output_embeddings(),
                                input_ids[:, 1:][select], temperature, chunk_size)  # (N,)
        b, t = select.nonzero(as_tuple=True)
        out = torch.zeros(input_ids.shape, dtype=logp.dtype, device=hidden.device)  # (B, T)
        return out.index_put((b, t + 1), logp)

    return _call_with_forward(inner, forward, input_ids, outer=model)


# ALGO: the loss ----------------------------------------------------------------------------------

def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, rollout_logp: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor, ref_logp: torch.Tensor | None = None,
                kl_coef: float = 0.0, clip_low: float = CLIP_LOW, clip_high: float = CLIP_HIGH,
                tis_cap: float = TIS_CAP) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped (clip-higher) policy gradient with truncated importance weights. logp (B, T)
    carries the gradient; old_logp, rollout_logp, ref_logp (B, T) are constants; advantages (B,)
    or (B, T); mask (B, T) 1 on trained tokens. Returns (loss, `losses/*` stats); the loss is a
    mean over the B samples given (with gradient accumulation, scale it by B_micro / B_total)."""
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

    def sample_mean(x):  # token-mean within each sample, then over the samples that have tokens
        per_sample = (x * mask).sum(dim=1) / n_tokens.clamp(min=1)           # (B,)
        return per_sample[has_tokens].mean() if has_tokens.any() else (x * mask).sum()

    ratio = torch.exp(logp - old_logp)                                       # rho (B, T)
    # pg = max(-rho * A, -clip(rho, 1 - eps_low, 1 + eps_high) * A)
    pg_plain = -ratio * adv
    pg_clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    pg = torch.maximum(pg_plain, pg_clipped)                                 # (B, T)
    is_raw = torch.exp(old_logp - rollout_logp)                              # (B, T)
    policy_term = torch.clamp(is_raw, max=tis_cap) * pg  # w * pg, w = min(exp(old - rollout), C)
    kl = None
    if ref_logp is not None:  # k3 = exp(ref - logp) - (ref - logp) - 1, clamped (deviation 1)
        log_ratio = torch.clamp(torch.where(on, ref_logp.detach(), 0.0) - logp, -20.0, 20.0)
        kl = torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, 0.0, 10.0)   # (B, T)
    # loss = mean_i token-mean_t (w * pg + beta * k3)
    loss = sample_mean(policy_term + kl_coef * kl if kl_coef else policy_term)
    with torch.no_grad():
        total = on.sum().clamp(min=1)

        def token_mean(x):
            return float(x[on].sum() / total)

        raw_on = is_raw[on] if on.any() else is_raw.new_ones(1)
        stats = {"losses/policy": float(sample_mean(policy_term)),
                 "losses/clip_frac": token_mean((pg_clipped > pg_plain).to(logp.dtype)),
                 "losses/is_weight_min": float(raw_on.min()), "losses/is_weight_mean": float(raw_on.mean()),
                 "losses/is_weight_max": float(raw_on.max()),
                 "losses/is_weight_capped_frac": token_mean((is_raw > tis_cap).to(logp.dtype)),
                 "losses/entropy": -token_mean(logp.detach()), "losses/tokens": float(mask.sum())}
        if kl is not None:
            stats["losses/kl"] = token_mean(kl)
    return loss, stats


# INFRA: batching ---------------------------------------------------------------------------------

def pad_batch(samples: Sequence[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad records {"token_ids", "mask", "logprobs"} (lists of one length) into tensors:
    input_ids (B, T) long, attention_mask (B, T) long, completion_mask (B, T) float (the record's
    mask; 0 on padding), rollout_logp (B, T) float (0 where completion_mask is 0)."""
    if not samples:
        raise ValueError("pad_batch needs at least one sample")
    B, T = len(samples), max(len(s["token_ids"]) for s in samples)
    out = {"input_ids": torch.full((B, T), pad_id, dtype=torch.long),
           "attention_mask": torch.zeros(B, T, dtype=torch.long),
           "completion_mask": torch.zeros(B, T, dtype=torch.float32),
           "rollout_logp": torch.zeros(B, T, dtype=torch.float32)}
    for b, s in enumerate(samples):
        ids, mask, lps = s["token_ids"], s["mask"], s["logprobs"]
        if not (len(ids) == len(mask) == len(lps)) or not ids:
            raise ValueError(f"sample {b}: token_ids, mask and logprobs need one equal, non-zero "
                             f"length, got {len(ids)}, {len(mask)}, {len(lps)}")
        out["input_ids"][b, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        out["attention_mask"][b, :len(ids)] = 1
        out["completion_mask"][b, :len(ids)] = torch.tensor(mask, dtype=torch.float32)
        out["rollout_logp"][b, :len(ids)] = torch.tensor(lps, dtype=torch.float32)
    out["rollout_logp"] *= out["completion_mask"]
    return out
