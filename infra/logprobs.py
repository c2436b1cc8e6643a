"""Token log-probs of a causal LM without the (B, T, V) log-softmax: the trainer's side of GRPO.

SPADE (arXiv 2608.19197) trains with GRPO (grpo.py), whose loss needs log pi(y_t | y_<t) of every
completion token under the current, old and reference policies. This module computes them:

    out[b, t] = log softmax(head(body(input_ids)[b, t - 1]) / T)[input_ids[b, t]]   (mask 1 only)

Why: at V = 151,936 a 32k-token sequence has a 20 GB fp32 log-softmax. We run the model body to
hidden states (B, T, H), keep the completion positions (N, H), and project + log-sum-exp
chunk_size tokens at a time. A custom autograd Function keeps only hidden, the head weight and
one log-sum-exp per token; its backward recomputes each chunk's logits and writes

    d logp_n / d logits_n = (onehot(y_n) - softmax(logits_n)) / T

into one (N, H) and one (V, H) gradient buffer: peak extra memory is the head's gradient plus
about two (chunk, V) fp32 buffers (bench/logprob.py). (torch.utils.checkpoint per chunk is
simpler, but allocates a fresh (V, H) weight gradient per chunk: a second head at the peak.)
The head runs in the caller's autocast dtype in both passes (explicit casts), the log-sum-exp in
fp32, and the head gradient sums its chunks in fp32: the naive log-softmax to fp32 round-off,
within 1e-2 of fp64 in bf16 (tests).

Distributed use: token_logprobs takes the model as the trainer holds it (plain, FSDP2
fully_shard-ed in place, or a DDP / DeepSpeed engine exposing `.module`) and runs inside the
OUTERMOST module's call, with the innermost model's forward swapped for ours, so every unshard /
gather hook fires as in an ordinary forward. The log-probs come back in fp32 whatever the compute
dtype; a wrapper that casts module outputs to half precision (FSDP2's MixedPrecisionPolicy with
an output_dtype, which Accelerate's default sets to bf16) would round them to bf16 steps
(0.03 at log p = -6), so token_logprobs raises instead of returning them.

Symbols: B samples, T tokens, V vocabulary, H hidden size, N completion tokens, C chunk size.
Dependencies: torch only (transformers models are duck-typed: get_decoder(),
get_output_embeddings()).
Test: `pytest tests/test_logprobs.py`
"""
from __future__ import annotations

import torch

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

    out = _call_with_forward(inner, forward, input_ids, outer=model)
    if out.dtype in (torch.float16, torch.bfloat16):  # _ChunkedLogprob returns fp32 at least
        raise TypeError(f"a wrapper of the model cast the log-probs to {out.dtype}: an FSDP2 "
                        "MixedPrecisionPolicy(output_dtype=...) does; use output_dtype=None")
    return out
