"""logprobs.py: exact chunked token log-probs (values and gradients against fp64 references, in
fp32 and bf16), what autograd keeps, masking, padding, temperature, wrappers and hooks."""
import copy

import pytest
import torch
import torch.utils.checkpoint

from grpo import policy_loss
from infra.logprobs import chunked_logprobs, token_logprobs


# ---------------------------------------------------------------------------- log-probs ----------

def _naive_logprobs(model, ids, attn, cmask, temperature=1.0):
    logits = model(input_ids=ids, attention_mask=attn).logits / temperature   # (B, T, V)
    lp = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    out = torch.zeros(ids.shape, dtype=lp.dtype)
    out[:, 1:] = lp * cmask[:, 1:]
    return out


def _batch(vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (3, 14), generator=g)
    attn = torch.ones(3, 14, dtype=torch.long)
    attn[1, 10:] = 0                                 # right padding
    cmask = torch.zeros(3, 14)
    cmask[0, 4:8] = 1
    cmask[0, 10:] = 1                                # prompt, reply, observation, reply
    cmask[1, 5:10] = 1
    cmask[2, 1:] = 1
    return ids, attn, cmask


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_token_logprobs_match_fp64_reference_values_and_grads(tiny, temperature):
    model, tok = tiny
    ids, attn, cmask = _batch(len(tok))
    m32 = copy.deepcopy(model)
    m64 = copy.deepcopy(model).double()
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))

    ours = token_logprobs(m32, ids, attn, cmask, temperature=temperature, chunk_size=3)
    ref = _naive_logprobs(m64, ids, attn, cmask, temperature)
    assert ours.dtype == torch.float32
    assert (ours - ref).abs().max().item() < 1e-5
    assert (ours[cmask == 0] == 0).all()

    (ours * weights).sum().backward()
    (ref * weights.double()).sum().backward()
    for (name, p32), p64 in zip(m32.named_parameters(), m64.parameters()):
        assert torch.allclose(p32.grad.double(), p64.grad, rtol=1e-4, atol=1e-5), name

    # the chunking itself is exact: chunked fp64 equals naive fp64 to round-off
    m64.zero_grad()
    ours64 = token_logprobs(m64, ids, attn, cmask, temperature=temperature, chunk_size=5)
    assert (ours64 - ref).abs().max().item() < 1e-10


def test_token_logprobs_moe_matches_naive(tiny_moe):
    model, tok = tiny_moe
    ids, attn, cmask = _batch(len(tok))
    ours = token_logprobs(model, ids, attn, cmask, chunk_size=4)
    with torch.no_grad():
        ref = _naive_logprobs(model, ids, attn, cmask)
    assert (ours - ref).abs().max().item() < 1e-5


def test_chunked_logprobs_large_vocab_toy_head():
    g = torch.Generator().manual_seed(0)
    N, H, V = 37, 8, 50_000
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(0.1 * torch.randn(V, H, generator=g))   # realistic logit scale
    hidden = torch.randn(N, H, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (N,), generator=g)
    coef = torch.randn(N, generator=g)

    ours = chunked_logprobs(hidden, head, targets, temperature=0.7, chunk_size=10)
    (ours * coef).sum().backward()

    h64 = hidden.detach().double().requires_grad_()
    w64 = head.weight.detach().double().requires_grad_()
    ref = torch.log_softmax(h64 @ w64.T / 0.7, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    (ref * coef.double()).sum().backward()
    assert (ours.double() - ref).abs().max().item() < 1e-5
    assert (hidden.grad.double() - h64.grad).abs().max().item() < 1e-5
    assert (head.weight.grad.double() - w64.grad).abs().max().item() < 1e-5


def test_chunked_logprobs_saves_no_full_logits():
    # what autograd keeps for the backward besides the inputs themselves (hidden, head weight):
    # the naive path holds (N, V) tensors, ours one log-sum-exp per token
    N, H, V = 64, 16, 4096
    head = torch.nn.Linear(H, V, bias=False)
    hidden = torch.randn(N, H, requires_grad=True)
    targets = torch.randint(0, V, (N,))
    inputs = {hidden.data_ptr(), head.weight.data_ptr(), targets.data_ptr()}

    def saved_bytes(fn):
        total = [0]

        def pack(t):
            if t.data_ptr() not in inputs:
                total[0] += t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return total[0]

    naive = saved_bytes(lambda: torch.log_softmax(head(hidden), -1).gather(-1, targets[:, None]))
    ours = saved_bytes(lambda: chunked_logprobs(hidden, head, targets, chunk_size=16))
    assert naive >= N * V * 4
    assert ours <= N * 8


def test_token_logprobs_under_activation_checkpointing(tiny):
    model, tok = tiny
    ids, attn, cmask = _batch(len(tok))
    plain, ckpt = copy.deepcopy(model), copy.deepcopy(model)
    token_logprobs(plain, ids, attn, cmask, chunk_size=4).sum().backward()
    out = torch.utils.checkpoint.checkpoint(token_logprobs, ckpt, ids, attn, cmask, 1.0, 4,
                                            use_reentrant=False)
    out.sum().backward()
    for p, q in zip(plain.parameters(), ckpt.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)


def test_padding_does_not_change_a_sample(tiny):
    model, tok = tiny
    ids, attn, cmask = _batch(len(tok))
    full = token_logprobs(model, ids, attn, cmask)
    alone = token_logprobs(model, ids[1:2, :10], attn[1:2, :10], cmask[1:2, :10])
    assert torch.allclose(full[1, :10], alone[0], atol=1e-5)
    assert (full[1, 10:] == 0).all()


def test_token_logprobs_without_completion_tokens(tiny):
    # a filler micro-batch (every rank must run the same forwards under FSDP) has no trained token
    model, tok = tiny
    m = copy.deepcopy(model)
    ids, attn, cmask = _batch(len(tok))
    out = token_logprobs(m, ids, attn, torch.zeros_like(cmask))
    assert out.shape == ids.shape and (out == 0).all()
    none = torch.zeros_like(cmask)
    loss, stats = policy_loss(out, out.detach(), out.detach(), torch.ones(3), none)
    loss.backward()
    assert loss.item() == 0.0 and stats["losses/tokens"] == 0.0
    assert m.lm_head.weight.grad is not None and (m.lm_head.weight.grad == 0).all()


def test_token_logprobs_rejects_mask_on_first_token(tiny):
    model, tok = tiny
    ids, attn, cmask = _batch(len(tok))
    cmask[0, 0] = 1
    with pytest.raises(ValueError):
        token_logprobs(model, ids, attn, cmask)


class _Wrapper(torch.nn.Module):
    """Stands in for DDP / a DeepSpeed engine: holds the model as `.module`, forwards to it."""

    def __init__(self, module):
        super().__init__()
        self.module, self.calls = module, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.module(*args, **kwargs)


def test_token_logprobs_runs_through_wrapper_and_restores_forward(tiny):
    model, tok = tiny
    m = copy.deepcopy(model)
    ids, attn, cmask = _batch(len(tok))
    expected = token_logprobs(m, ids, attn, cmask)
    assert "forward" not in m.__dict__
    marker = m.forward                       # Accelerate sets an instance forward (autocast)
    m.forward = marker
    wrapped = _Wrapper(m)
    got = token_logprobs(wrapped, ids, attn, cmask)
    assert wrapped.calls == 1
    assert torch.equal(got, expected)
    assert m.__dict__["forward"] is marker


def test_token_logprobs_are_fp32_in_any_compute_dtype_and_never_cast_down(tiny):
    """A bf16 model's log-probs come back fp32 (the head's products and log-sum-exp in fp32); a
    wrapper that casts module outputs to bf16 (FSDP2's MixedPrecisionPolicy output_dtype, which
    would round them to bf16 steps) is refused, not followed."""
    model, tok = tiny
    m = copy.deepcopy(model).to(torch.bfloat16)
    ids, attn, cmask = _batch(len(tok))
    with torch.no_grad():
        assert token_logprobs(m, ids, attn, cmask).dtype == torch.float32
        m.register_forward_hook(lambda _module, _args, out: out.to(torch.bfloat16))
        with pytest.raises(TypeError, match="output_dtype=None"):
            token_logprobs(m, ids, attn, cmask)


def _head_case(N, H, V, scale, seed=0):
    """hidden (N, H), a head whose logits reach ~|scale|, targets, per-token loss weights."""
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(scale / H ** 0.5 * torch.randn(V, H, generator=g))
    hidden = torch.randn(N, H, generator=g)
    return hidden, head, torch.randint(0, V, (N,), generator=g), torch.randn(N, generator=g)


def _fp64_reference(hidden, weight, targets, coef, temperature):
    h64 = hidden.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    ref = torch.log_softmax(h64 @ w64.T / temperature, -1).gather(-1, targets[:, None])[:, 0]
    (ref * coef.double()).sum().backward()
    return ref.detach(), h64.grad, w64.grad


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def test_chunked_logprobs_under_bf16_autocast_match_fp64():
    """fp32 master weights under bf16 autocast (single GPU / DDP): the forward's log-sum-exp and
    the backward's logits come from the same bf16 operands, so values and both gradients sit
    within 1e-2 of fp64 on those operands. Logits of magnitude ~30 at T = 0.6, as a trained
    model's (fp32-output logits: 0.2%; a backward recomputing fp32 logits against a bf16
    log-sum-exp, as before, was 20% off)."""
    hidden, head, targets, coef = _head_case(N=256, H=64, V=1024, scale=30.0)
    hidden.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = chunked_logprobs(hidden, head, targets, temperature=0.6, chunk_size=32)
    (ours * coef).sum().backward()          # outside autocast, as accelerator.backward runs
    assert head.weight.grad.dtype == torch.float32 and hidden.grad.dtype == torch.float32
    ref, gh, gw = _fp64_reference(hidden.bfloat16(), head.weight.bfloat16(), targets, coef, 0.6)
    assert _rel(ours, ref) < 1e-2
    assert _rel(head.weight.grad, gw) < 1e-2 and _rel(hidden.grad, gh) < 1e-2


def test_chunked_logprobs_bf16_weights_accumulate_head_grad_in_fp32():
    """bf16 parameters (FSDP2 mixed precision), 256 chunks: the head gradient's running sum over
    chunks is kept in fp32: 0.3% from fp64 (a bf16 running sum was 1.5% off)."""
    hidden, head, targets, coef = _head_case(N=4096, H=32, V=512, scale=3.0, seed=1)
    head = head.to(torch.bfloat16)
    hidden = hidden.to(torch.bfloat16).requires_grad_()
    ours = chunked_logprobs(hidden, head, targets, temperature=1.0, chunk_size=16)
    (ours.float() * coef).sum().backward()
    assert head.weight.grad.dtype == torch.bfloat16
    ref, gh, gw = _fp64_reference(hidden, head.weight, targets, coef, 1.0)
    assert _rel(ours, ref) < 1e-2
    assert _rel(head.weight.grad, gw) < 1e-2 and _rel(hidden.grad, gh) < 1e-2


def test_chunked_logprobs_fp32_match_fp64_at_large_logits():
    """The fp32 path (no autocast) at the same logit scale: 1e-5 relative to fp64."""
    hidden, head, targets, coef = _head_case(N=256, H=64, V=1024, scale=30.0)
    hidden.requires_grad_()
    ours = chunked_logprobs(hidden, head, targets, temperature=0.6, chunk_size=32)
    (ours * coef).sum().backward()
    ref, gh, gw = _fp64_reference(hidden, head.weight, targets, coef, 0.6)
    assert _rel(ours, ref) < 1e-5
    assert _rel(head.weight.grad, gw) < 1e-5 and _rel(hidden.grad, gh) < 1e-5


def test_token_logprobs_right_padded_batch_builds_no_attention_mask(tiny, monkeypatch):
    """Right-padded training batches run SDPA's causal kernel with no mask at all (a (B, 1, T, T)
    mask is 8 GB at 4 x 32k tokens); a left-padded batch still gets its mask."""
    import torch.nn.functional as F
    model, tok = tiny
    assert model.config._attn_implementation == "sdpa"
    ids, attn, cmask = _batch(len(tok))
    masks, sdpa = [], F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask"))
        return sdpa(*args, **kwargs)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        ours = token_logprobs(model, ids, attn, cmask)
        assert masks and all(m is None for m in masks)
        ref = _naive_logprobs(model, ids, attn, cmask)          # with the padding mask
        assert (ours - ref).abs().max().item() < 1e-5
        masks.clear()
        token_logprobs(model, ids, attn.flip(1), cmask * attn.flip(1))   # left padding
        assert masks and all(m is not None for m in masks)
