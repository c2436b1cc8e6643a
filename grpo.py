"""GRPO for both roles of one policy: per-role advantages and the clipped policy-gradient loss.

SPADE (arXiv 2608.19197, Sec. 3.4), the policy update: one policy is both the Environment Designer
and the Reasoning Agent, and both roles update it with GRPO. Per role:

    agent:     A_i = (R_i - mean_g(R)) / (std_g(R) + 1e-8)     g = the G plays of one environment
                                                               (Eq. 1)
    designer:  A_i = S_role * (score_i - mean_k(score))        k = the designer samples of one skill
               S_role = min(50, N_agent / N_designer * R)  role balance (~32 in the paper)

The loss, per completion token t of sample i (mask 1 only), with clip-higher and a truncated
importance weight against the rollout engine's log-probs:

    rho_t = exp(logp_t - old_logp_t)
    pg_t  = max(-rho_t * A_i, -clip(rho_t, 1 - 0.2, 1 + 0.28) * A_i)
    w_t   = min(exp(old_logp_t - rollout_logp_t), 2.0)
    l_t   = w_t * pg_t + beta * k3_t,   k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1
    loss  = mean_i [ sum_t mask_it * l_t / sum_t mask_it ]   (token-mean per sample, then samples)
    or, given weights u_i:  sum_i u_i * [ sum_t mask_it * l_t / sum_t mask_it ]

Symbols (paper -> code; shapes: B samples, G plays per group, T tokens, V vocabulary):
R_i returns (B,); A_i advantages (B,) or (B, T); pi_theta, pi_old, pi_rollout, pi_ref: logp,
old_logp, rollout_logp, ref_logp (B, T); epsilon_low/high clip_low/clip_high; C tis_cap;
beta kl_coef; S_role role_scale(...); R interval (the regeneration interval).

Deviations from the paper (and from the authors' code):
    1. k3 clamps the log-ratio to [-20, 20] and k3 to [0, 10] (as verl does, and as the authors'
       Slime clamps its low_var_kl to [-10, 10], so only the paper's text differs: it states only
       "k3"): one token cannot blow up the loss.
    2. Without weights, samples without any completion token are left out of the mean over
       samples (train.py passes weights: such a sample counts in its denominator with loss 0).
    3. role_scale is 0.0 when a step has no designer samples.
The token log-probs logp, old_logp and ref_logp come from logprobs.token_logprobs (the trainer
calls it; it never builds the (B, T, V) log-softmax). policy_loss returns the `losses/*` metrics
of the README's metric list, and the rollout/trainer mismatch (`mismatch/*`): the token-means of
|old_logp - rollout_logp| and of its k3, exp(d) - d - 1 with d = old_logp - rollout_logp.

Dependencies: torch only.
Test: `pytest tests/test_grpo.py`
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

BETAS = (0.9, 0.98)               # AdamW betas of the paper's training setup (infra/run.py)
CLIP_LOW, CLIP_HIGH = 0.2, 0.28   # clip-higher, the paper's values
TIS_CAP = 2.0                     # truncated importance-sampling cap, the paper's value
ROLE_SCALE_CAP = 50.0             # cap of the designer's role-balancing scale S_role


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
            adv[idx] = (g - g.mean()) / (g.std(correction=0) + 1e-8)       # Eq. (1); population std
    return adv.float()


def role_scale(n_agent: int, n_designer: int, interval: int, cap: float = ROLE_SCALE_CAP) -> float:
    """S_role = min(cap, N_agent / N_designer * R); 0.0 when there are no designer samples."""
    if n_agent < 0 or n_designer < 0 or interval <= 0:
        raise ValueError(f"bad counts: n_agent={n_agent}, n_designer={n_designer}, "
                         f"interval={interval}")
    return min(float(cap), n_agent / n_designer * interval) if n_designer else 0.0


def designer_advantages(scores: Sequence[float], skills: Sequence[Hashable],
                        scale: float) -> torch.Tensor:
    """(B,) A = S_role * (score - mean of the same skill's scores); no std division, as in the
    paper."""
    s = torch.as_tensor(scores, dtype=torch.float64)                        # (B,)
    if s.ndim != 1 or len(skills) != s.numel():
        raise ValueError(f"need one skill per score, got {s.shape} scores and {len(skills)} skills")
    if not (torch.isfinite(s).all() and math.isfinite(scale)):
        raise ValueError("scores and scale must be finite")
    adv = torch.zeros_like(s)
    for idx in _groups(skills):
        adv[idx] = scale * (s[idx] - s[idx].mean())
    return adv.float()


# ALGO: the loss ----------------------------------------------------------------------------------

def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, rollout_logp: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor, ref_logp: torch.Tensor | None = None,
                kl_coef: float = 0.0, clip_low: float = CLIP_LOW, clip_high: float = CLIP_HIGH,
                tis_cap: float = TIS_CAP, weights=None) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped (clip-higher) policy gradient with truncated importance weights. logp (B, T)
    carries the gradient; old_logp, rollout_logp, ref_logp (B, T) are constants; advantages (B,)
    or (B, T); mask (B, T) 1 on trained tokens. Returns (loss, `losses/*` stats): the mean of the
    samples' token-means, or their sum weighted by weights (B,) (train.py: shares of its batch)."""
    if not (logp.shape == old_logp.shape == rollout_logp.shape == mask.shape):
        raise ValueError(f"logp, old_logp, rollout_logp and mask need one (B, T) shape, got "
                         f"{logp.shape}, {old_logp.shape}, {rollout_logp.shape}, {mask.shape}")
    if kl_coef and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp")
    on = mask > 0                                                            # (B, T)
    # fp32 at least, whatever the log-probs come in: in bf16 exp(x) = 1 for |x| < 0.004 (k3
    # and its gradient vanish) and token counts round above 256
    dt = torch.promote_types(logp.dtype, torch.float32)
    mask = on.to(dt)
    adv = advantages.to(dt).reshape(len(logp), -1)                           # (B, 1) or (B, T)
    # masked positions (prompt, observations, padding) may hold anything: zero them before any
    # exp() so an overflow there cannot turn into inf * 0 = NaN in the loss or its gradient
    logp = torch.where(on, logp.to(dt), 0.0)
    old_logp = torch.where(on, old_logp.detach().to(dt), 0.0)
    rollout_logp = torch.where(on, rollout_logp.detach().to(dt), 0.0)
    n_tokens = mask.sum(dim=1)                                               # (B,)

    def sample_mean(x, u=None):  # token-mean per sample; their mean (over those with tokens) or
        per_sample = (x * mask).sum(dim=1) / n_tokens.clamp(min=1)           # (B,)  u-weighted sum
        has = n_tokens.clamp(max=1)                                          # (B,) 1 or 0
        u = has / has.sum().clamp(min=1) if u is None else u.to(x.dtype)
        return (per_sample * u).sum()

    ratio = torch.exp(logp - old_logp)                                       # rho (B, T)
    # pg = max(-rho * A, -clip(rho, 1 - eps_low, 1 + eps_high) * A)
    pg_plain = -ratio * adv
    pg_clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    pg = torch.maximum(pg_plain, pg_clipped)                                 # (B, T)
    is_raw = torch.exp(old_logp - rollout_logp)                              # (B, T)
    policy_term = torch.clamp(is_raw, max=tis_cap) * pg  # w * pg, w = min(exp(old - rollout), C)
    kl = None
    if ref_logp is not None:  # k3 = exp(ref - logp) - (ref - logp) - 1, clamped (deviation 1)
        ref_logp = torch.where(on, ref_logp.detach().to(dt), 0.0)
        log_ratio = torch.clamp(ref_logp - logp, -20.0, 20.0)
        kl = torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, 0.0, 10.0)   # (B, T)
    # loss = mean_i token-mean_t (w * pg + beta * k3), or sum_i u_i token-mean_t (...)
    loss = sample_mean(policy_term + kl_coef * kl if kl_coef else policy_term, weights)
    with torch.no_grad():
        total = on.sum().clamp(min=1)
        def token_mean(x):
            return float(x[on].sum() / total)

        raw_on = is_raw[on] if on.any() else is_raw.new_ones(1)
        stats = {"losses/policy": float(sample_mean(policy_term)),
                 "losses/clip_frac": token_mean((pg_clipped > pg_plain).to(logp.dtype)),
                 "losses/is_weight_min": float(raw_on.min()),
                 "losses/is_weight_mean": float(raw_on.mean()),
                 "losses/is_weight_max": float(raw_on.max()),
                 "losses/is_weight_capped_frac": token_mean((is_raw > tis_cap).to(logp.dtype)),
                 "losses/entropy": -token_mean(logp.detach()),
                 "losses/tokens": float(mask.sum() / len(mask))}  # per sample (README)
        if kl is not None:
            stats["losses/kl"] = token_mean(kl)
        stats.update(rollout_mismatch(old_logp, rollout_logp, on))
    return loss, stats


def rollout_mismatch(old_logp: torch.Tensor, rollout_logp: torch.Tensor,
                     on: torch.Tensor) -> dict[str, float]:
    """The rollout/trainer mismatch on the sampled tokens (what the TIS weight corrects), over
    the mask-1 tokens `on` (B, T): d = log p_trainer - log p_rollout, the token-means of |d| and
    of k3 = exp(d) - d - 1 (KL(rollout || trainer), samples from the rollout engine); d is clamped
    as the reference KL's log-ratio is (deviation 1)."""
    d = torch.clamp(old_logp - rollout_logp, -20.0, 20.0)[on]                 # (tokens,)
    if d.numel() == 0:
        return {"mismatch/logp_abs_diff": 0.0, "mismatch/k3": 0.0}
    return {"mismatch/logp_abs_diff": float(d.abs().mean()),
            "mismatch/k3": float((torch.exp(d) - d - 1.0).mean())}


# INFRA: batching ---------------------------------------------------------------------------------

@dataclass
class Sample:
    """One training sample of either role, as the loss reads it; T_i is its own length:
        token_ids (T_i,)  the prompt's and the completion's tokens, one sequence
        mask      (T_i,)  1 on the tokens the loss trains (the policy's sampled tokens), 0 on the
                          prompt, on observations between turns, on a filtered episode's tokens
        logprobs  (T_i,)  the rollout engine's log-probs of the sampled tokens (0 where mask 0)
        advantage A_i     Eq. (1) for the agent, S_role * (score - mean_k) for the designer
        role      "agent" | "designer": its micro-batches and log-prob temperature
        weight    u_i     its weight in the loss' mean over samples (the formula above)"""
    token_ids: list[int]
    mask: list[int]
    logprobs: list[float]
    advantage: float = 0.0
    role: str = "agent"
    weight: float = 1.0


def pad_batch(samples: Sequence[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad samples (token_ids, mask and logprobs of one length each) into tensors:
    input_ids (B, T) long, attention_mask (B, T) long, completion_mask (B, T) float (the sample's
    mask; 0 on padding), rollout_logp (B, T) float (0 where completion_mask is 0)."""
    if not samples:
        raise ValueError("pad_batch needs at least one sample")
    B, T = len(samples), max(len(s.token_ids) for s in samples)
    out = {"input_ids": torch.full((B, T), pad_id, dtype=torch.long),
           "attention_mask": torch.zeros(B, T, dtype=torch.long),
           "completion_mask": torch.zeros(B, T, dtype=torch.float32),
           "rollout_logp": torch.zeros(B, T, dtype=torch.float32)}
    for b, s in enumerate(samples):
        ids, mask, lps = s.token_ids, s.mask, s.logprobs
        if not (len(ids) == len(mask) == len(lps)) or not ids:
            raise ValueError(f"sample {b}: token_ids, mask and logprobs need one equal, non-zero "
                             f"length, got {len(ids)}, {len(mask)}, {len(lps)}")
        out["input_ids"][b, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        out["attention_mask"][b, :len(ids)] = 1
        out["completion_mask"][b, :len(ids)] = torch.tensor(mask, dtype=torch.float32)
        out["rollout_logp"][b, :len(ids)] = torch.tensor(lps, dtype=torch.float32)
    out["rollout_logp"] *= out["completion_mask"]
    return out
