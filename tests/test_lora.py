"""LoRA (infra/lora.py, README deviation 38) on the tiny models: the adapted forward and gradient
against the low-rank update written out by hand (dense and MoE, the MoE experts included); the
KL reference (adapters off) equals the base model exactly; one GRPO step moves the adapters and
nothing else, with optimizer state for them alone; the engines sample from the trainer's adapters
(the transformers engine: the same model; vLLM's CPU build: a new adapter at each sync, only the
adapters' bytes handed over, its log-probs the trainer's); a run with --lora_rank exports an
adapter that peft, transformers and vLLM load with the same log-probs, and resumes exactly."""
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from infra import config, engine, lora, logprobs, models, vllm_engine
import grpo
import train

TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
ROOT = Path(__file__).resolve().parents[1]


def adapted(kind: str, rank: int = 4, alpha: float = 8.0, seed: int = 1):
    """(base, the same base with adapters whose B is random, tokenizer): B = 0, as a fresh adapter
    has it, would make every comparison with the base trivially exact."""
    base, tok = models.build_tiny(kind, seed=0)
    model, _ = models.build_tiny(kind, seed=0)
    torch.manual_seed(seed)  # peft draws A from the global generator: the same A whatever ran first
    lora.add_adapters(model, rank=rank, alpha=alpha, dropout=0.0, targets=TARGETS)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return base.eval(), model.eval(), tok


def batch(vocab: int, rows: int = 2, length: int = 12):
    ids = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(0))
    completion = torch.zeros_like(ids)
    completion[:, 4:] = 1
    return ids, torch.ones_like(ids), completion


def by_hand(base, factors: dict, scale: float) -> dict:
    """The base's weights with the low-rank update written out: W + scale B A for a linear layer;
    for fused experts W_e + scale B_e A_e with A (E r, in) viewed as (E, r, in) and B (out, E r)
    as (out, r, E) (PEFT's layout), so W (E, out, in). `factors`: base weight name -> (A, B)."""
    weights = dict(base.named_parameters())
    for name, (a, b) in factors.items():
        w = weights[name]
        if w.dim() == 2:
            weights[name] = w + scale * b @ a                                        # (out, in)
        else:
            E = w.shape[0]
            a3 = a.reshape(E, -1, a.shape[-1])                                       # (E, r, in)
            b3 = b.reshape(b.shape[0], -1, E)                                        # (out, r, E)
            weights[name] = w + scale * torch.einsum("ore,eri->eoi", b3, a3)        # (E, out, in)
    return weights


def factor_names(model) -> dict:
    """base weight name -> (lora_A name, lora_B name) of every adapted weight. PEFT wraps a fused
    expert tensor in a parameter wrapper: the outer one (mlp.experts.lora_*) adapts down_proj, the
    one inside it (mlp.experts.base_layer.lora_*) gate_up_proj."""
    out = {}
    for name, _ in model.named_parameters():
        if ".lora_A." not in name:
            continue
        stem = name.split(".lora_A.")[0]
        if stem.endswith("mlp.experts"):
            target = stem + ".down_proj"
        elif stem.endswith("mlp.experts.base_layer"):
            target = stem.removesuffix(".base_layer") + ".gate_up_proj"
        else:
            target = stem + ".weight"
        out[target] = (name, name.replace(".lora_A.", ".lora_B."))
    return out


@pytest.mark.parametrize("kind", ["tiny", "tiny-moe"])
def test_forward_and_gradient_are_the_hand_written_low_rank_update(kind):
    base, model, tok = adapted(kind)
    names = factor_names(model)
    if kind == "tiny-moe":  # peft maps gate/up/down_proj onto the fused experts
        assert any(n.endswith("experts.gate_up_proj") for n in names)
        assert any(n.endswith("experts.down_proj") for n in names)
    assert len(names) == (14 if kind == "tiny" else 12)  # 2 layers x (4 attention + 3 or 2)
    params = dict(model.named_parameters())
    assert {n for n, p in params.items() if p.requires_grad} == \
        {x for pair in names.values() for x in pair}  # PEFT froze everything else
    ids, mask, completion = batch(len(tok))
    logp = logprobs.token_logprobs(model, ids, mask, completion)                    # (B, T)
    loss = -(logp * torch.linspace(0.5, 1.5, logp.shape[1])).sum()
    loss.backward()
    # the same loss through the base with its weights replaced by W + (alpha / r) B A
    leaves = {n: (params[a].detach().clone().requires_grad_(),
                  params[b].detach().clone().requires_grad_()) for n, (a, b) in names.items()}
    weights = by_hand(base, leaves, scale=8.0 / 4)
    hand_logp = with_weights(base, weights, ids, mask, completion)
    assert torch.allclose(logp, hand_logp, atol=1e-5), float((logp - hand_logp).abs().max())
    (-(hand_logp * torch.linspace(0.5, 1.5, logp.shape[1])).sum()).backward()
    for n, (a, b) in names.items():
        for leaf, name in zip(leaves[n], (a, b)):
            # fp32 round-off of two summation orders, against the gradient's own scale: at most
            # 2.5e-5 of it over 40 draws of A on tiny-moe (1e-5 failed one draw in 40)
            scale = float(leaf.grad.abs().max())
            assert torch.allclose(params[name].grad, leaf.grad, atol=1e-4 * scale, rtol=1e-4), name
    # and with B = 0, as a fresh adapter starts, the adapted model is the base model
    base_logp = logprobs.token_logprobs(base, ids, mask, completion)
    with torch.no_grad():
        for _, b in names.values():
            params[b].zero_()
        assert torch.equal(logprobs.token_logprobs(model, ids, mask, completion), base_logp)


def with_weights(base, weights, ids, mask, completion):
    """token_logprobs of `base` with the tensors `weights` (autograd graphs of their own) in place
    of its parameters of the same names, put back afterwards."""
    originals = dict(base.named_parameters())
    for name in weights:
        module, _, leaf = name.rpartition(".")
        base.get_submodule(module)._parameters[leaf] = weights[name]
    try:
        return logprobs.token_logprobs(base, ids, mask, completion)
    finally:
        for name in weights:
            module, _, leaf = name.rpartition(".")
            base.get_submodule(module)._parameters[leaf] = originals[name]


@pytest.mark.parametrize("kind", ["tiny", "tiny-moe"])
def test_the_reference_is_the_base_model_exactly(kind):
    """lora.Reference, the KL reference of a LoRA run: the policy with its adapters off gives the
    base model's log-probs bit for bit, holds no parameters of its own, and leaves the adapters
    on for the policy's next forward."""
    base, model, tok = adapted(kind)
    ids, mask, completion = batch(len(tok))
    ref = lora.Reference(model)
    assert list(ref.parameters()) == []
    with torch.no_grad():
        off = logprobs.token_logprobs(ref, ids, mask, completion)
        assert torch.equal(off, logprobs.token_logprobs(base, ids, mask, completion))
        on = logprobs.token_logprobs(model, ids, mask, completion)
    assert (on - off)[completion.bool()].abs().max() > 1e-2  # the adapters are on again


def test_one_grpo_step_changes_only_the_adapters():
    """train.grpo_update with the KL term, the optimizer built as run.Run builds it: every adapter
    factor moves (A through B's gradient, B through the loss), no base weight changes by a bit,
    and AdamW holds state for the adapters alone."""
    from accelerate import Accelerator
    base, model, tok = adapted("tiny")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-2, betas=grpo.BETAS, weight_decay=0.1)
    rng = torch.Generator().manual_seed(0)
    samples = []
    for i, a in enumerate([1.0, -1.0, 0.5, -0.5]):
        ids = torch.randint(0, len(tok), (10,), generator=rng).tolist()
        samples.append(grpo.Sample(ids, [0] * 4 + [1] * 6, [0.0] * 4 + [-7.0] * 6, advantage=a,
                                   role="agent"))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    trainer = train.Trainer(model, opt, sched, Accelerator(cpu=True), ref_model=lora.Reference(model))
    out = train.grpo_update(trainer, samples, pad_id=tok.pad_token_id,
                            temperatures={"agent": 1.0},
                            gargs=config.GRPOArgs(kl_coef=0.05, micro_batch_tokens=64))
    assert out["losses/kl"] > 0 and out["losses/grad_norm"] > 0
    after = dict(model.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n].detach())}
    assert moved == {n for n in before if "lora_" in n}
    assert {id(p) for p in opt.state} == {id(p) for p in trainable}
    assert all(p.dtype == torch.float32 for p in trainable)


def test_the_transformers_engine_samples_from_the_trainers_adapters():
    """The transformers engine holds the trainer's own model: a sync hands it nothing, and what it
    samples carries the adapters' log-probs (the trainer's recomputation equals them)."""
    _, model, tok = adapted("tiny")
    eng = engine.TransformersEngine(model, tok)
    eng.sync_weights(model)
    assert eng.sync_bytes == 0
    prompt = tok.encode("Say anything.")
    [c] = eng.generate([prompt], max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=0, seed=0)
    ids = torch.tensor([prompt + c.token_ids])
    completion = torch.zeros_like(ids)
    completion[0, len(prompt):] = 1
    with torch.no_grad():
        trainer = logprobs.token_logprobs(model, ids, torch.ones_like(ids), completion)
        base = logprobs.token_logprobs(lora.Reference(model), ids, torch.ones_like(ids),
                                       completion)
    rollout = torch.tensor(c.logprobs)
    assert torch.allclose(trainer[0, len(prompt):], rollout, atol=1e-5)
    assert (base[0, len(prompt):] - rollout).abs().max() > 1e-2  # not the base's


def test_adapter_weights_are_what_peft_saves(tmp_path):
    """engine.adapter_weights (what a vLLM sync writes) names and holds exactly the tensors of
    the adapter transformers saves in PEFT's format, and nothing of the base."""
    from safetensors.torch import load_file
    for kind in ("tiny", "tiny-moe"):
        _, model, _ = adapted(kind)
        model.save_pretrained(tmp_path / kind)
        saved = load_file(tmp_path / kind / "adapter_model.safetensors")
        mine = engine.adapter_weights(model)
        assert mine.keys() == saved.keys()
        assert all(torch.equal(mine[k], saved[k]) for k in saved)


def vllm_trainer_gap(eng, model, tok, prompts) -> float:
    """Sample from the engine (untruncated, T 1) and return the largest |rollout - trainer|
    log-prob over the sampled tokens, the trainer's model with its adapters on."""
    outs = eng.generate(prompts, max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=0, seed=3)
    gap = 0.0
    for prompt, c in zip(prompts, outs):
        ids = torch.tensor([prompt + c.token_ids])
        completion = torch.zeros_like(ids)
        completion[0, len(prompt):] = 1
        with torch.no_grad():
            lp = logprobs.token_logprobs(model, ids, torch.ones_like(ids), completion)
        gap = max(gap, float((lp[0, len(prompt):] - torch.tensor(c.logprobs)).abs().max()))
    return gap


@pytest.mark.slow
@pytest.mark.needs_vllm
def test_vllm_samples_each_synced_adapter_and_receives_only_the_adapters(tmp_path):
    """vLLM's CPU build with enable_lora: each sync_weights writes the adapters (and only them)
    under adapter_dir and hands vLLM a new adapter, which every later request samples from with
    the trainer's log-probs (fp32 here, untruncated sampling); the previous one is removed."""
    set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it for the process
    base, model, tok = adapted("tiny")
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    eng = vllm_engine.VLLMEngine(str(tmp_path / "base"), dtype="float32", max_model_len=512, seed=0,
                            cpu_kv_cache_gib=0.25, lora_rank=4,
                            adapter_dir=str(tmp_path / "sync"))
    try:
        prompts = [tok.encode("Say anything."), tok.encode("Play the game.")]
        eng.sync_weights(model)
        adapters = {n: p for n, p in model.named_parameters() if "lora_" in n}
        # only the adapters went over: their bytes in vLLM's dtype, against the whole model's
        assert eng.sync_bytes == sum(p.numel() * 4 for p in adapters.values())
        whole = sum(p.numel() * 4 for p in base.parameters())
        print(f"\n[lora] sync bytes {eng.sync_bytes:,} of the model's {whole:,}")
        [path] = (tmp_path / "sync").iterdir()
        from safetensors.torch import load_file
        assert load_file(path / "adapter_model.safetensors").keys() == \
            engine.adapter_weights(model).keys()
        first = vllm_trainer_gap(eng, model, tok, prompts)
        print(f"[lora] vLLM CPU vs trainer, adapter 1: max |d log p| {first:.2e}")
        assert first < 1e-4
        with torch.no_grad():  # an update: new B; the engine follows it at the next sync
            for n, p in adapters.items():
                if "lora_B" in n:
                    p.mul_(-1.5)
        stale = vllm_trainer_gap(eng, model, tok, prompts)
        eng.sync_weights(model)
        [path] = (tmp_path / "sync").iterdir()  # the previous adapter's directory is gone
        assert path.name == "adapter-2" and eng.adapter.lora_int_id == 2
        second = vllm_trainer_gap(eng, model, tok, prompts)
        print(f"[lora] adapter 2: {second:.2e} (before its sync: {stale:.2e})")
        assert second < 1e-4 < stale
    finally:
        eng.close()
        torch.set_num_threads = set_num_threads
    assert not (tmp_path / "sync").exists()


def metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl without wall times and the rates over them (they differ between runs)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k.startswith("time/") or k.endswith("_per_s"))}
            for r in rows]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """train.py --lora_rank 4 --lora_merge for 2 steps, a checkpoint after each, on the Fixed-env
    parity games of tests/test_fsdp2.py with a tiny model whose replies end (every 8th token is an
    EOS), so groups differ in return and the adapters move. Returns (root, argv, run dir)."""
    from runs import parity_world
    root = tmp_path_factory.mktemp("lora-run")
    parity_world(root)
    argv = ["--model", str(root / "model"), "--fixed_envs", str(root / "envs"), "--num_envs", "2",
            "--steps", "2", "--plays", "4", "--max_turns", "1", "--max_new_tokens", "6",
            "--lr", "1e-2", "--kl_coef", "0.01", "--lora_rank", "4", "--lora_merge",
            "--checkpoint_every", "1", "--sandbox_workers", "1", "--transcripts", "0"]
    out = train.main(argv + ["--output_dir", str(root / "run")])
    return root, argv, out


def trainers_model(root: Path, run_dir: Path, checkpoint: str):
    """The policy as the trainer held it at `checkpoint`: the base with adapters, their tensors
    read from Accelerate's checkpoint."""
    from safetensors.torch import load_file
    model, _ = models.load_model_and_tokenizer(str(root / "model"), dtype=torch.float32)
    lora.add_adapters(model, rank=4, alpha=32.0, dropout=0.0, targets=TARGETS)
    state = load_file(run_dir / checkpoint / "model.safetensors")
    adapters = {k: v for k, v in state.items() if "lora_" in k}
    assert adapters and model.load_state_dict(adapters, strict=False).unexpected_keys == []
    return model.eval()


@pytest.mark.slow
def test_a_lora_run_trains_the_adapters_and_resumes_exactly(lora_run, tmp_path):
    root, argv, out = lora_run
    rows = metrics(out)
    assert [r["charts/step"] for r in rows] == [0, 1]
    assert all(r["losses/grad_norm"] > 0 for r in rows)
    assert rows[0]["losses/kl"] < 1e-9 < rows[1]["losses/kl"]  # the reference: adapters off
    assert all(r["perf/sync_bytes"] == 0 for r in rows)  # the transformers engine holds the model
    # the transformers engine sampled from the trainer's adapters: no rollout/trainer mismatch
    assert all(r["mismatch/logp_abs_diff"] < 1e-5 for r in rows)
    model = trainers_model(root, out, "checkpoint-2")
    assert any(p.abs().max() > 0 for n, p in model.named_parameters() if "lora_B" in n)
    # resume from checkpoint-1: step 1 again, identically (metrics and the final adapter)
    again = tmp_path / "run"
    shutil.copytree(out, again)
    (again / "latest").write_text("checkpoint-1")
    shutil.rmtree(again / "checkpoint-2")
    train.main(argv + ["--output_dir", str(again), "--resume"])
    assert metrics(again) == rows
    from safetensors.torch import load_file
    first = load_file(out / "final_model" / "adapter_model.safetensors")
    second = load_file(again / "final_model" / "adapter_model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.slow
def test_the_exported_adapter_loads_in_peft_and_transformers(lora_run):
    """final_model/ is a PEFT adapter naming its base: peft, and transformers on its own, load it
    with the trainer's log-probs; merged/ (--lora_merge) is a plain model with the same ones."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    root, _, out = lora_run
    final = out / "final_model"
    saved = json.loads((final / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(root / "model") and saved["r"] == 4
    assert sorted(p.name for p in final.glob("*.safetensors")) == ["adapter_model.safetensors"]
    trainer = trainers_model(root, out, "checkpoint-2")
    base = AutoModelForCausalLM.from_pretrained(root / "model")
    loaded = {"peft": PeftModel.from_pretrained(base, str(final)),
              "transformers": AutoModelForCausalLM.from_pretrained(final),
              "merged": AutoModelForCausalLM.from_pretrained(final / "merged")}
    ids, mask, completion = batch(1024)
    with torch.no_grad():
        want = logprobs.token_logprobs(trainer, ids, mask, completion)
        off = logprobs.token_logprobs(lora.Reference(trainer), ids, mask, completion)
        for name, model in loaded.items():
            got = logprobs.token_logprobs(model.eval(), ids, mask, completion)
            assert torch.allclose(got, want, atol=1e-5), (name, float((got - want).abs().max()))
    assert (want - off).abs().max() > 1e-4  # the adapter changes them


@pytest.mark.slow
@pytest.mark.needs_vllm
def test_the_exported_adapter_loads_in_vllm(lora_run):
    """vLLM (its CPU build, the user's own LLM) serves final_model/ as a LoRARequest on the base:
    its log-probs are the trainer's."""
    import os
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm
    from vllm.lora.request import LoRARequest
    set_num_threads = torch.set_num_threads
    root, _, out = lora_run
    trainer = trainers_model(root, out, "checkpoint-2")
    llm = vllm.LLM(model=str(root / "model"), dtype="float32", enable_lora=True, max_lora_rank=8,
                   max_model_len=256, kv_cache_memory_bytes=1 << 28, enforce_eager=True,
                   enable_chunked_prefill=False, max_num_batched_tokens=256)
    try:
        prompt = [5, 17, 230, 42]
        params = vllm.SamplingParams(temperature=1.0, max_tokens=12, logprobs=0, seed=0,
                                     ignore_eos=True)
        [o] = llm.generate([vllm.TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False,
                           lora_request=LoRARequest("final", 1, str(out / "final_model")))
        reply = list(o.outputs[0].token_ids)
        served = torch.tensor([s[t].logprob for s, t in zip(o.outputs[0].logprobs, reply)])
        ids = torch.tensor([prompt + reply])
        completion = torch.zeros_like(ids)
        completion[0, len(prompt):] = 1
        with torch.no_grad():
            want = logprobs.token_logprobs(trainer, ids, torch.ones_like(ids), completion)
        gap = float((want[0, len(prompt):] - served).abs().max())
        print(f"\n[lora] vLLM serving final_model/ vs the trainer: max |d log p| {gap:.2e}")
        assert gap < 1e-4
    finally:
        llm.llm_engine.engine_core.shutdown()
        torch.set_num_threads = set_num_threads


@pytest.mark.slow
def test_the_preflight_counts_a_lora_run():
    """train.py --preflight of a LoRA run (tiny, one GPU, with a KL term): AdamW state for the
    adapters alone (two fp32 moments each), no reference model, vLLM's weights sized on the base
    alone, the adapter gathered at a sync (bf16), and vLLM's weights and graphs resident through
    the update and the step (its sleep releases the KV cache alone)."""
    from infra import preflight, run
    cfg = config.parse(["--model", "tiny", "--lora_rank", "8", "--kl_coef", "0.01"],
                       models.MODEL_ALIASES)
    train.resolve(cfg)
    # a 512-token micro-batch (the run's own is 40,960 tokens: minutes on fake tensors here)
    launch = dict(run.preflight_launch(cfg, train.grpo_update), micro_batch_tokens=512,
                  max_model_len=512)
    p = preflight.plan(models.architecture("tiny"), card=80.0, **launch)
    model, _ = models.build_tiny("tiny")
    base = sum(x.numel() for x in model.parameters())
    lora.add_adapters(model, rank=8, alpha=32.0, dropout=0.0, targets=TARGETS)
    adapters = sum(x.numel() for x in model.parameters() if x.requires_grad)
    gib, t = 2 ** 30, p["trainer"]
    assert t["params"] == base and t["ref"] == 0.0
    assert t["held"]["Optstate"] == pytest.approx(2 * 4 * adapters / gib, rel=0.01)
    assert t["largest_unit"] == pytest.approx(2 * adapters / gib)
    v, ph = p["vllm"], p["phases"]
    assert v["weights"] == pytest.approx(2 * base / gib + t["largest_unit"])
    assert ph["update"] == pytest.approx(t["update"]["Total"] + ph["context"] + v["asleep"] +
                                         v["weights"] + v["graphs"])
    full = preflight.plan(models.architecture("tiny"), card=80.0, **dict(launch, lora=None))
    assert full["trainer"]["held"]["Optstate"] > 3 * t["held"]["Optstate"]
    assert full["phases"]["update"] == pytest.approx(full["trainer"]["update"]["Total"] +
                                                     ph["context"] + v["asleep"])


def test_a_lora_vllm_engine_keeps_its_weights_through_the_update(tmp_path, monkeypatch):
    """VLLMEngine with lora_rank, against test_engine's fake vLLM 0.32 on a GPU platform: one
    adapter slot of the smallest rank vLLM allows at or above r, the lm_head still in fp32
    (vllm_engine.FP32_HEAD: vLLM's LoRA logits path keeps head_dtype); a sync hands over a new adapter
    (add_lora: its directory holds the adapter, nothing else) and drops the previous one, never
    waking or reloading the weights; sleep pauses the engine and releases the KV cache alone
    (level 0, then the release: the base never changes, so nothing re-sends it); wake maps the KV
    cache again; every request carries the newest adapter."""
    import types
    from unittest import mock
    from fake_vllm import FakeVLLM, built

    class FakeLoRAVLLM(FakeVLLM):
        def __init__(self):
            super().__init__()
            self.requests = []
            self.llm_engine.add_lora = lambda r: self.log.append(
                ("add_lora", r.lora_int_id, sorted(p.name for p in Path(r.lora_path).iterdir())))
            self.llm_engine.remove_lora = lambda i: self.log.append(("remove_lora", i))
            self.llm_engine.add_request = lambda rid, prompt, params, lora_request=None: (
                self.added.append((rid, prompt, params)), self.requests.append(lora_request))

        def sleep(self, level=1, mode="abort"):
            assert level in (0, 1, 2) and mode in ("abort", "wait", "keep"), (level, mode)
            self.log.append(("sleep", level))

        def release_kv_cache_memory(self):
            self.log.append(("release_kv_cache_memory",))

    fake = FakeLoRAVLLM()
    request = types.SimpleNamespace(LoRARequest=lambda name, i, path, **kw: types.SimpleNamespace(
        lora_name=name, lora_int_id=i, lora_path=path, **kw))
    with mock.patch.dict(sys.modules, {"vllm.lora": types.SimpleNamespace(request=request),
                                       "vllm.lora.request": request}):
        eng = built(fake, "tiny", lora_rank=4, adapter_dir=str(tmp_path / "sync"))
        [(_, kwargs)] = fake.log
        assert (kwargs["enable_lora"], kwargs["max_lora_rank"], kwargs["max_loras"]) == \
            (True, 8, 1)
        assert kwargs["hf_overrides"] == {"head_dtype": "float32"}  # the fp32 head stays on
        fake.log.clear()
        _, model, _ = adapted("tiny")
        eng.sync_weights(model)  # the first adapter, engine awake (start-up)
        eng.sleep()
        eng.sync_weights(model)
        eng.wake()
        eng.generate([[1, 2, 3]], max_new_tokens=2, seed=0)
    files = ["adapter_config.json", "adapter_model.safetensors"]
    assert fake.log[:7] == [("add_lora", 1, files), ("reset_prefix_cache",), ("sleep", 0),
                            ("release_kv_cache_memory",), ("add_lora", 2, files),
                            ("remove_lora", 1), ("wake_up", ["kv_cache"])]
    assert [r.lora_int_id for r in fake.requests] == [2]
    assert eng.sync_bytes == sum(p.numel() * 2 for n, p in model.named_parameters()
                                 if "lora_" in n)  # bf16, vLLM's dtype here
    # time/sync_gather_s, time/sync_load_s: the adapters' gather, then their file and add_lora
    assert eng.seconds["sync_gather"] >= 0 and eng.seconds["sync_load"] > 0
    # the KV wake's free-memory check (on a GPU) names no --offload_trainer, which LoRA refuses
    gib = 2**30
    eng.sleep()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(vllm_engine, "_kv_wake_room", lambda: (40 * gib, 38.5 * gib, 9 * gib))
    with pytest.raises(RuntimeError) as error:
        eng.wake()
    assert str(error.value) == (
        "vLLM's KV cache needs 40.0 GiB of GPU memory to map again, 38.5 GiB is free (9.0 GiB "
        "kept by torch's allocator for the trainer): lower --gpu_memory_utilization (python "
        "train.py <flags> --preflight prints the plan)")


def test_a_lora_plan_counts_the_nccl_communicators_of_its_launch():
    """The LoRA phases hold the same context as full fine-tuning's (preflight.communicators):
    Qwen3-30B-A3B at TP 2 over 2 GPUs (README's LoRA row) holds Accelerate's world group and
    vLLM's TP and EP PyNccl (1 + 3 GiB), a dense model at TP 2 two of them (1 + 2)."""
    from infra import preflight
    trainer = {"held": {"Parameter": 7.6, "Optstate": 0.2, "Total": 7.8},
               "update": {"Parameter": 7.6, "Gradient": 0.1, "Optstate": 0.2, "Total": 29.9},
               "step": {"Parameter": 7.6, "Gradient": 0.1, "Optstate": 0.2, "Total": 8.0},
               "policy": 7.6, "ref": 0.0, "largest_unit": 0.05}
    vllm = {"share": 28.0, "weights": 7.55, "profile": 1.7, "graphs": 1.0, "asleep": 0.05}
    moe, dense = (preflight.phases(trainer, vllm, world=2, tp=2, card=80.0, offload=False,
                                   moe=m, lora=True) for m in (True, False))
    assert (moe["context"], dense["context"]) == (4.0, 3.0)
    assert moe["update"] - dense["update"] == moe["start-up"] - dense["start-up"] == 1.0


@pytest.mark.parametrize("targets", ["q_proj,lm_head", "embed_tokens"])
def test_the_head_and_the_embeddings_are_refused(targets):
    """logprobs.py computes the trainer's log-probs from the head's own weight (chunked), so an
    adapter there would steer the engine's samples and never the trainer's log-probs."""
    model, _ = models.build_tiny("tiny")
    with pytest.raises(SystemExit, match="adapts the embeddings or the output head"):
        lora.add_adapters(model, rank=2, alpha=4.0, dropout=0.0, targets=targets)


def test_vllms_cpu_build_is_refused_lora_on_a_moe_model(tmp_path):
    """vLLM 0.32 runs every MoE layer of a LoRA engine through Triton kernels, which its CPU build
    lacks (attention-only adapters too): the run stops before vLLM starts, naming the way out."""
    from infra import run
    margs = config.ModelArgs(lora_rank=4)
    moe, _ = models.build_tiny("tiny-moe")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--engine transformers on CPU"):
            run.lora_engine_args(margs, moe, tmp_path)
    dense, _ = models.build_tiny("tiny")
    assert run.lora_engine_args(margs, dense, tmp_path) == dict(
        lora_rank=4, adapter_dir=str(tmp_path), expert_adapters=False)
    assert run.lora_engine_args(config.ModelArgs(), dense, tmp_path) == {}
