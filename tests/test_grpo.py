"""grpo.py: hand-computed advantages and loss, naive-loop equivalence, masking, batching, and two
learning checks (token log-probs from logprobs.py, tested in tests/test_logprobs.py)."""
import copy
import math
import random

import pytest
import torch

from grpo import Sample, agent_advantages, designer_advantages, pad_batch, policy_loss, role_scale
from infra.logprobs import token_logprobs


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
    assert stats["losses/tokens"] == 1.5  # trained tokens per sample: (2 + 1) / 2
    assert "losses/kl" not in stats
    loss.backward()
    # d/dlogp: s0 t0 unclipped: -w * rho * A / (2 tokens * 2 samples) = -1.221403 / 4
    # clipped tokens have zero gradient; the observation token too
    assert logp.grad.flatten().tolist() == pytest.approx([-1.221403 / 4, 0.0, 0.0, 0.0], abs=1e-6)


def test_policy_loss_weighted_sum_of_token_means():
    """weights u (B,): loss = sum_i u_i * token-mean_i, the two samples above (-1.8907015, 0.4)
    weighted 0.25 and 0.5: -0.47267538 + 0.2 = -0.27267538; the unweighted mean would be
    -0.74535075."""
    logp, old, rollout, adv, mask = _hand_batch()
    loss, _ = policy_loss(logp, old, rollout, adv, mask, weights=torch.tensor([0.25, 0.5]))
    assert loss.item() == pytest.approx(-0.27267538, abs=1e-6)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-1.221403 / 8, 0.0, 0.0, 0.0], abs=1e-6)


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


def test_policy_loss_computes_in_fp32_from_bf16_logprobs():
    """bf16 log-probs (both exactly representable) are upcast before any arithmetic: x = ref -
    logp = -2^-7 gives k3 = e^x - x - 1 = 3.0438e-5, which bf16 arithmetic rounds to exactly 0
    (e^x rounds to 1 - 2^-7) and fp32 to within one ulp of e^x (6e-8, 0.3%); the loss comes back
    in fp32, the gradient in logp's bf16."""
    logp = torch.tensor([[-1.0]], dtype=torch.bfloat16, requires_grad=True)
    ref = torch.tensor([[-1.0 - 2**-7]], dtype=torch.bfloat16)
    same = logp.detach().clone()
    loss, stats = policy_loss(logp, same, same, torch.zeros(1), torch.ones(1, 1), ref_logp=ref,
                              kl_coef=1.0)
    k3 = math.exp(-2**-7) + 2**-7 - 1
    assert k3 == pytest.approx(3.0438e-5, rel=1e-4)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(k3, rel=1e-2)
    assert stats["losses/kl"] == pytest.approx(k3, rel=1e-2)
    loss.backward()  # d k3 / d logp = 1 - e^x = 2^-7 - ...
    assert logp.grad.dtype == torch.bfloat16 and logp.grad.item() == pytest.approx(
        1 - math.exp(-2**-7), rel=1e-2)


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

def test_policy_loss_rollout_trainer_mismatch_hand_computed():
    """mismatch/*: d = old - rollout on mask-1 tokens; mean |d| and mean exp(d) - d - 1."""
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    rollout = torch.tensor([[-1.5, -2.0, 9.0]])  # the last token is masked: anything goes
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, st = policy_loss(old.clone(), old, rollout, torch.tensor([1.0]), mask)
    assert st["mismatch/logp_abs_diff"] == pytest.approx((0.5 + 0.0) / 2)
    assert st["mismatch/k3"] == pytest.approx((math.exp(0.5) - 1.5 + 0.0) / 2)
    _, same = policy_loss(old.clone(), old, old, torch.tensor([1.0]), mask)
    assert same["mismatch/logp_abs_diff"] == 0.0 and same["mismatch/k3"] == 0.0



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


def test_pad_batch():
    batch = pad_batch([Sample([1, 2, 3, 4, 9], [0, 0, 1, 0, 1], [0.0, 0.0, -1.0, 0.0, -2.0]),
                       Sample([5, 6, 7], [0, 1, 1], [0.0, -0.5, -0.25])], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 9], [5, 6, 7, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch["completion_mask"].tolist() == [[0, 0, 1, 0, 1], [0, 1, 1, 0, 0]]
    assert batch["rollout_logp"].tolist() == [[0, 0, -1.0, 0, -2.0], [0, -0.5, -0.25, 0, 0]]
    with pytest.raises(ValueError):
        pad_batch([Sample([1, 2], [1], [0.0, 0.0])], pad_id=0)
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
    return [Sample(prompt + c, [0] * len(prompt) + [1] * len(c), [0.0] * len(prompt) + lp)
            for c, lp in zip(completions, logprobs)]


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
