"""grpo.py: hand-computed advantages and loss, naive-loop equivalence, exact chunked log-probs
(values and gradients against fp64), masking, temperature, wrappers, and two learning checks."""
import copy
import math
import random

import pytest
import torch
import torch.utils.checkpoint

from grpo import (agent_advantages, chunked_logprobs, designer_advantages, pad_batch,
                  policy_loss, role_scale, token_logprobs)



@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread is 4-5x faster than two on a loaded shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------- advantages ---------

def test_agent_advantages_hand_computed():
    # group a: [1, 0, 0, 1] mean 0.5, population std 0.5 -> +-0.5 / (0.5 + 1e-8)
    # group b: [1, 0, 0] mean 1/3, std sqrt(2)/3 -> (2/3) / 0.471405 = 1.414214, -0.707107
    adv = agent_advantages([1, 0, 0, 1, 1, 0, 0], ["a", "a", "a", "a", "b", "b", "b"])
    expected = [1, -1, -1, 1, 1.4142135, -0.7071068, -0.7071068]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    assert adv.dtype == torch.float32


def test_agent_advantages_zero_variance_groups_give_zero():
    adv = agent_advantages([0.3, 0.3, 0.3, 1.0, 0.0, 0.7], [0, 0, 0, 1, 1, 2])
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert adv[5].item() == 0.0                            # a group of one has no variance
    assert adv[3].item() == pytest.approx(1.0, abs=1e-6)


def test_agent_advantages_validates():
    with pytest.raises(ValueError):
        agent_advantages([1.0, float("nan")], [0, 0])
    with pytest.raises(ValueError):
        agent_advantages([1.0, 0.0], [0])


def test_role_scale():
    assert role_scale(192, 24, 4) == pytest.approx(32.0)      # the paper's games runs
    assert role_scale(1000, 10, 4) == 50.0                    # capped
    assert role_scale(100, 0, 4) == 0.0                       # no designer samples
    with pytest.raises(ValueError):
        role_scale(10, 2, 0)


def test_designer_advantages_per_skill_mean_no_std():
    # math mean 0.75 -> 32 * (+-0.25) = +-8; logic mean 0.1 -> 32 * (-0.1, +0.1) = -3.2, 3.2
    adv = designer_advantages([1.0, 0.5, 0.0, 0.2], ["math", "math", "logic", "logic"], 32.0)
    assert adv.tolist() == pytest.approx([8.0, -8.0, -3.2, 3.2], abs=1e-5)
    with pytest.raises(ValueError):
        designer_advantages([1.0, float("inf")], ["m", "m"], 1.0)


# ---------------------------------------------------------------------------- the loss -----------

def _hand_batch():
    # sample 0 (A = 1): two tokens; sample 1 (A = -0.5): one token then an observation token
    logp = torch.tensor([[-1.0, -0.5], [-2.0, 5.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.0], [-1.5, -9.0]])
    rollout = torch.tensor([[-1.2, -2.0], [-1.5, 3.0]])
    adv = torch.tensor([1.0, -0.5])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    return logp, old, rollout, adv, mask


def test_policy_loss_hand_computed():
    logp, old, rollout, adv, mask = _hand_batch()
    loss, stats = policy_loss(logp, old, rollout, adv, mask)
    # s0 t0: rho = e^0.2 = 1.221403 (inside [0.8, 1.28]), w = 1 -> -1.221403
    # s0 t1: rho = e^0.5 = 1.648721 -> clipped 1.28: max(-1.648721, -1.28) = -1.28;
    #        w = min(e, 2) = 2
    #        -> -2.56; sample mean (-1.221403 - 2.56) / 2 = -1.8907015
    # s1 t0: rho = e^-0.5 = 0.606531, A = -0.5: max(0.303265, 0.8 * 0.5) = 0.4, w = 1 -> 0.4
    # loss = (-1.8907015 + 0.4) / 2 = -0.74535075
    assert loss.item() == pytest.approx(-0.74535075, abs=1e-6)
    assert stats["losses/policy"] == pytest.approx(-0.74535075, abs=1e-6)
    assert stats["losses/clip_frac"] == pytest.approx(2 / 3)
    assert stats["losses/is_weight_min"] == pytest.approx(1.0)
    assert stats["losses/is_weight_mean"] == pytest.approx((2 + math.e) / 3, abs=1e-6)
    assert stats["losses/is_weight_max"] == pytest.approx(math.e, abs=1e-6)
    assert stats["losses/is_weight_capped_frac"] == pytest.approx(1 / 3)
    assert stats["losses/entropy"] == pytest.approx(3.5 / 3, abs=1e-6)
    assert stats["losses/tokens"] == 3.0
    assert "losses/kl" not in stats
    loss.backward()
    # d/dlogp: s0 t0 unclipped: -w * rho * A / (2 tokens * 2 samples) = -1.221403 / 4
    # clipped tokens have zero gradient; the observation token too
    assert logp.grad.flatten().tolist() == pytest.approx([-1.221403 / 4, 0.0, 0.0, 0.0], abs=1e-6)


def test_policy_loss_k3_kl_hand_computed_and_clamped():
    logp = torch.tensor([[-1.5]], requires_grad=True)
    ref = torch.tensor([[-1.0]])
    same = logp.detach().clone()
    # A = 0 -> only the KL: k3 = e^0.5 - 0.5 - 1 = 0.1487213, times 0.1
    loss, stats = policy_loss(logp, same, same, torch.zeros(1), torch.ones(1, 1), ref_logp=ref,
                              kl_coef=0.1)
    assert loss.item() == pytest.approx(0.01487213, abs=1e-7)
    assert stats["losses/kl"] == pytest.approx(0.1487213, abs=1e-6)
    # a huge log-ratio is clamped (20) and k3 capped at 10: finite
    loss, stats = policy_loss(logp, same, same, torch.zeros(1), torch.ones(1, 1),
                              ref_logp=torch.tensor([[40.0]]), kl_coef=1.0)
    assert loss.item() == pytest.approx(10.0) and stats["losses/kl"] == pytest.approx(10.0)


def _naive_loss(logp, old, rollout, adv, mask, ref, kl_coef, cl, ch, cap):
    per_sample = []
    for i in range(len(logp)):
        total, n = 0.0, 0
        for t in range(len(logp[0])):
            if mask[i][t] == 0:
                continue
            a = adv[i] if not isinstance(adv[i], list) else adv[i][t]
            rho = math.exp(logp[i][t] - old[i][t])
            pg = max(-rho * a, -min(max(rho, 1 - cl), 1 + ch) * a)
            w = min(math.exp(old[i][t] - rollout[i][t]), cap)
            term = w * pg
            if ref is not None:
                lr = min(max(ref[i][t] - logp[i][t], -20.0), 20.0)
                term += kl_coef * min(max(math.exp(lr) - lr - 1, 0.0), 10.0)
            total, n = total + term, n + 1
        if n:
            per_sample.append(total / n)
    return sum(per_sample) / len(per_sample)


@pytest.mark.parametrize("seed", range(4))
def test_policy_loss_matches_naive_loop(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 9
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    rollout = old + 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64) if seed % 2 else \
        torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.3).double()
    mask[-1] = 0.0                                   # a sample with no trained token is skipped
    kw = dict(kl_coef=0.05, clip_low=0.2, clip_high=0.28, tis_cap=2.0)
    loss, _ = policy_loss(logp, old, rollout, adv, mask, ref_logp=ref, **kw)
    expected = _naive_loss(logp.tolist(), old.tolist(), rollout.tolist(),
                           adv.tolist(), mask.tolist(), ref.tolist(),
                           kw["kl_coef"], 0.2, 0.28, 2.0)
    assert loss.item() == pytest.approx(expected, abs=1e-12)


def test_policy_loss_masked_tokens_contribute_nothing():
    logp, old, rollout, adv, mask = _hand_batch()
    loss_a, _ = policy_loss(logp, old, rollout, adv, mask)
    garbage = logp.detach().clone()
    garbage[1, 1] = 123.0                            # the observation token's values change
    old2, roll2 = old.clone(), rollout.clone()
    old2[1, 1], roll2[1, 1] = -50.0, 40.0
    g = garbage.requires_grad_()
    loss_b, stats = policy_loss(g, old2, roll2, adv, mask)
    assert loss_b.item() == pytest.approx(loss_a.item(), abs=1e-7)
    assert stats["losses/is_weight_max"] == pytest.approx(math.e, abs=1e-6)
    loss_b.backward()
    assert g.grad[1, 1].item() == 0.0


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


def test_pad_batch():
    batch = pad_batch([{"token_ids": [1, 2, 3, 4, 9], "mask": [0, 0, 1, 0, 1],
                        "logprobs": [0.0, 0.0, -1.0, 0.0, -2.0]},
                       {"token_ids": [5, 6, 7], "mask": [0, 1, 1], "logprobs": [0.0, -0.5, -0.25]}], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 9], [5, 6, 7, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch["completion_mask"].tolist() == [[0, 0, 1, 0, 1], [0, 1, 1, 0, 0]]
    assert batch["rollout_logp"].tolist() == [[0, 0, -1.0, 0, -2.0], [0, -0.5, -0.25, 0, 0]]
    with pytest.raises(ValueError):
        pad_batch([{"token_ids": [1, 2], "mask": [1], "logprobs": [0.0, 0.0]}], pad_id=0)
    with pytest.raises(ValueError):
        pad_batch([], pad_id=0)


# ---------------------------------------------------------------------------- learning ----------

def _sample(model, prompt, n, length, generator):
    """n completions of `length` tokens at temperature 1, with their sampling log-probs."""
    ids = torch.tensor([prompt] * n)
    lps = []
    with torch.no_grad():
        for _ in range(length):
            logp = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), -1)   # (n, V)
            nxt = torch.multinomial(logp.exp(), 1, generator=generator)               # (n, 1)
            lps.append(logp.gather(-1, nxt))
            ids = torch.cat([ids, nxt], dim=1)
    return ids[:, len(prompt):].tolist(), torch.cat(lps, 1).tolist()


def _records(prompt, completions, logprobs):
    return [{"token_ids": prompt + c, "mask": [0] * len(prompt) + [1] * len(c),
             "logprobs": [0.0] * len(prompt) + lp} for c, lp in zip(completions, logprobs)]


def _update(model, opt, records, advantages, pad_id):
    batch = pad_batch(records, pad_id)
    logp = token_logprobs(model, batch["input_ids"], batch["attention_mask"],
                          batch["completion_mask"])
    loss, stats = policy_loss(logp, logp.detach(), batch["rollout_logp"], advantages,
                              batch["completion_mask"])
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return stats


def _seq_logprob(model, prompt, completion, pad_id):
    batch = pad_batch(_records(prompt, [completion], [[0.0] * len(completion)]), pad_id)
    with torch.no_grad():
        return token_logprobs(model, batch["input_ids"], batch["attention_mask"],
                              batch["completion_mask"]).sum().item()


def test_designer_update_moves_logprobs_the_right_way(tiny):
    model, tok = tiny
    torch.manual_seed(0)
    m = copy.deepcopy(model)
    prompt = tok.encode("Design an environment for logic.")
    good, bad = tok.encode(" class LockEnv: pass"), tok.encode(" print('no env')")
    before = [_seq_logprob(m, prompt, c, tok.pad_token_id) for c in (good, bad)]
    records = _records(prompt, [good, bad], [[0.0] * len(good), [0.0] * len(bad)])
    scale = role_scale(192, 24, 4)                              # 32
    adv = designer_advantages([0.9, 0.0], ["logic", "logic"], scale)
    assert adv.tolist() == pytest.approx([14.4, -14.4])
    # a higher lr than the paper's 1e-6 so one step is visible on a random tiny model
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.1)
    # rollout log-probs of 0 make exp(old - rollout) < 1: the IS weight stays in play, uncapped
    _update(m, opt, records, adv, tok.pad_token_id)
    after = [_seq_logprob(m, prompt, c, tok.pad_token_id) for c in (good, bad)]
    assert after[0] > before[0] + 0.1
    assert after[1] < before[1] - 0.1


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_learns_a_toy_reward(tiny, seed):
    """Reward = share of completion tokens in the preferred half of the vocabulary (id < V/2)."""
    model, tok = tiny
    torch.manual_seed(seed)
    random.seed(seed)
    m = copy.deepcopy(model)
    V = len(tok)
    prompt = tok.encode("Say something:")
    gen = torch.Generator().manual_seed(seed)

    def reward(c):
        return sum(t < V // 2 for t in c) / len(c)

    def mean_reward(n=128):
        comps, _ = _sample(m, prompt, n, 4, gen)
        return sum(map(reward, comps)) / n

    start = mean_reward()
    # lr 1e-2 instead of the paper's 1e-6: a random tiny model, 30 steps (about 0.5 -> 0.95+)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.9, 0.98), weight_decay=0.1)
    for step in range(30):
        comps, lps = _sample(m, prompt, 16, 4, gen)
        adv = agent_advantages([reward(c) for c in comps], [0] * len(comps))
        stats = _update(m, opt, _records(prompt, comps, lps), adv, tok.pad_token_id)
        assert stats["losses/is_weight_max"] < 1.01        # engine and trainer log-probs agree
    end = mean_reward()
    assert end > start + 0.3 and end > 0.8, (start, end)


def test_policy_loss_validates():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        policy_loss(x, x, x, torch.zeros(2), torch.ones(2, 4))
    with pytest.raises(ValueError):
        policy_loss(x, x, x, torch.zeros(2), torch.ones(2, 3), kl_coef=0.1)   # no ref_logp


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
