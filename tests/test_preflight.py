"""preflight.py: the memory plan, validated against the one GPU measurement we have, one
Qwen3-30B-A3B plan, the vLLM formulas by hand, the verdict, and one clear line for bad input.

The two full-size cases build their models on fake tensors (no weights, no download) and take
about 1-2 minutes each on 2 cores (marked slow); the Qwen3-30B-A3B one is measured once in the
session (tests/plans.py), for its command, its own check and tests/test_memory_order.py's rows."""
import functools

import pytest

from infra import config
import grpo
from infra import models
from infra import preflight
import train
import plans

GIB = 2 ** 30


def _update(micro_batch_tokens=16384):
    return functools.partial(train.grpo_update, pad_id=0, temperatures={"agent": 1.0},
                             gargs=config.GRPOArgs(kl_coef=0.0,
                                                   micro_batch_tokens=micro_batch_tokens))


@pytest.mark.slow
def test_qwen3_4b_on_one_h200_lands_within_10_percent_of_the_measured_75_3_gib():
    """The configuration measured once on an H200 (train.grpo_update, Qwen3-4B shape, fp32
    masters, AdamW as it then was (foreach), 4 x 8,000 tokens in micro-batches of 16,384, train
    mode, checkpointing): peak 75.3 GiB. Its largest micro-batch is 2 x 8,000 tokens."""
    t = preflight.measure_trainer(models.architecture("Qwen3-4B"), world=1, seqs=2,
                                  seq_len=8000, update=_update(), sample=grpo.Sample, kl=False,
                                  fused=False)
    peak = max(t["update"]["Total"], t["step"]["Total"])
    assert peak == pytest.approx(75.3, rel=0.10)
    assert t["params"] == 4_022_468_096
    assert t["held"]["Total"] == pytest.approx(12 * t["params"] / GIB, rel=0.01)  # w + m + v
    # the foreach step's sqrt(v) temporary: one more parameter-sized fp32 tensor at the step
    assert t["step"]["Total"] - t["held"]["Total"] == pytest.approx(
        8 * t["params"] / GIB, rel=0.01)  # the gradients + the temporary


@pytest.mark.slow
def test_qwen3_30b_a3b_plan_on_8_h100s_and_the_memory_offload_frees(capsys):
    """The games preset at TP 4 on 8 x 80 GB through the command line, then the same measured
    trainer with --offload_trainer: the rollout phase loses exactly the trainer's state, the
    update's forward/backward peak the AdamW moments."""
    argv = ["--model", "Qwen3-30B-A3B", "--tensor_parallel_size", "4", "--preflight",
            "--gpu", "h100-80gb", "--gpus", "8", "--gpu_memory_utilization", "0.35"]
    with plans.shared(), pytest.raises(SystemExit) as done:
        train.main(argv)
    out = capsys.readouterr().out
    assert "MoE routing under fake tensors: even" in out
    for phase in ("rollout", "update", "step", "sync", "start-up", "KV tokens per TP group",
                  "host RAM", "verdict"):
        assert phase in out
    row = out.strip().splitlines()[-1]
    assert row.startswith("| Qwen3-30B-A3B | 8 | games | h100-80gb | off | 0.35 |")
    assert done.value.code in (0, 1)
    # the command's own measurement (the preset's 32,768-token sequences), made once
    t = plans.measure_trainer(models.architecture("Qwen3-30B-A3B"), world=8, seqs=1,
                              seq_len=32768, update=_update(), sample=grpo.Sample, kl=False)
    params = t["params"]
    assert t["held"]["Total"] == pytest.approx(12 * params / 8 / GIB, rel=0.01)  # shards
    assert t["update"]["Total"] > t["held"]["Total"] + 4 * params / 8 / GIB  # + gradients
    v = preflight.vllm_share(models.architecture("Qwen3-30B-A3B"), params=params, tp=4,
                             util=0.35, card=79.6, max_num_seqs=96, max_model_len=32768)
    on, off = (preflight.phases(t, v, world=8, tp=4, card=79.6, offload=o) for o in (True, False))
    # offloaded during the rollouts: the fp32 shards and both moments (no KL reference here)
    kinds = preflight.state_kinds(t)
    assert kinds["params"] == pytest.approx(4 * params / 8 / GIB, rel=0.01)
    assert off["rollout"] - on["rollout"] == pytest.approx(kinds["params"] + kinds["moments"])
    assert on["kv wake"] == on["rollout"] and off["kv wake"] == off["rollout"]
    # the moments come back only for the optimizer step: the update's peak loses them
    assert off["update"] - on["update"] == pytest.approx(t["update"]["OptState"])
    assert t["update"]["OptState"] == pytest.approx(8 * params / 8 / GIB, rel=0.01)
    assert on["step"] == off["step"] and on["sync"] == off["sync"]
    assert on["start-up"] == on["rollout"] < off["start-up"]  # offloaded before vLLM starts


def test_vllm_share_by_hand():
    """Qwen3-30B-A3B at TP 4, util 0.35 of 79.6 GiB, 96 sequences: every term by hand."""
    arch = models.architecture("Qwen3-30B-A3B")
    params = 30_532_122_624
    assert models.parameter_count("Qwen3-30B-A3B") == params
    v = preflight.vllm_share(arch, params=params, tp=4, util=0.35, card=79.6, max_num_seqs=96,
                             max_model_len=32768, max_num_batched_tokens=8192)
    assert v["weights"] == pytest.approx(2 * params / 4 / GIB)
    assert v["kv_token_bytes"] == 2 * 48 * 1 * 128 * 2  # 4 KV heads over TP 4: one per rank
    per_token = 2 * (8 * 2048 + (32 + 2 * 4) * 128 / 4 + 4 * 8 * 768 / 4)
    # the sampler: logits, processed log-probs, probabilities, exponential noise, (B, V) fp32
    profile = (8192 * per_token + 4 * 4 * 96 * 151_936) / GIB
    assert v["profile"] == pytest.approx(profile)
    # asleep it keeps the input embeddings (8192 x 2048 bf16) and the block table (96 x 2048)
    assert v["asleep"] == pytest.approx((8192 * 2048 * 2 + 96 * 2048 * 4) / GIB)
    kv = 0.35 * 79.6 - 2 * params / 4 / GIB - profile - preflight.VLLM_GRAPHS_GIB - v["asleep"]
    assert v["kv"] == pytest.approx(kv)
    assert v["kv_tokens"] == int(kv * GIB / 24576)
    # KV heads replicate when TP exceeds them: 8 KV heads of Qwen3-4B at TP 16 keep 1 per rank
    four = preflight.vllm_share(models.architecture("Qwen3-4B"),
                                params=models.parameter_count("Qwen3-4B"), tp=16, util=0.5,
                                card=80, max_num_seqs=1, max_model_len=1024)
    assert four["kv_token_bytes"] == 2 * 36 * 1 * 128 * 2


def _phases(rollout=10.0, update=10.0, step=10.0, sync=10.0, startup=10.0):
    return {"rollout": rollout, "kv wake": rollout, "update": update, "step": step, "sync": sync,
            "start-up": startup, "context": 1.0}


# A measured trainer by hand (GiB per GPU, FSDPMemTracker's kinds): fp32 shards 4, moments 8, a
# bf16 reference 2 and buffers 0.5 between updates; gradients 4 and activations 6 at the update's
# peak, a temporary 1 at the step's; the largest layer 0.25 in bf16.
TRAINER = {"held": {"Sharded Param": 6.0, "OptState": 8.0, "Buffer": 0.5, "Total": 14.5},
           "update": {"Sharded Param": 6.0, "Sharded Grad": 4.0, "OptState": 8.0,
                      "Activation": 6.0, "Buffer": 0.5, "Total": 24.5},
           "step": {"Sharded Param": 6.0, "Sharded Grad": 4.0, "OptState": 8.0, "Temp": 1.0,
                    "Buffer": 0.5, "Total": 19.5},
           "policy": 4.0, "ref": 2.0, "largest_unit": 0.25, "params": 8 * 2**30}
VLLM = {"share": 28.0, "weights": 3.0, "profile": 1.5, "graphs": 1.0, "asleep": 0.1, "kv": 22.4,
        "kv_token_bytes": 24576, "kv_tokens": 900_000}


def test_the_phases_by_hand():
    """Every phase from its terms (module docstring), at 8 GPUs and TP 4 of an MoE model, so the
    context is the CUDA context and 3 NCCL communicators: dropping any term fails one of these."""
    kinds = preflight.state_kinds(TRAINER)
    assert kinds == {"params": 4.0, "moments": 8.0, "grads": 4.0, "reference": 2.0, "fixed": 0.5,
                     "update": 6.0, "step": 1.0}
    ctx = preflight.CUDA_CONTEXT_GIB + 3 * preflight.NCCL_GIB
    assert preflight.context_gib(8, 4, moe=True) == ctx == 4.0
    for offload in (False, True):
        ph = preflight.phases(TRAINER, VLLM, world=8, tp=4, card=80.0, offload=offload, moe=True)
        between = 0.5 if offload else 14.5  # offloaded, the buffers stay (the reference goes)
        # vLLM starts beside the fp32 shards and the reference (the moments do not exist yet);
        # offloaded, the shards and the reference are in host RAM before it starts
        assert ph["start-up"] == pytest.approx((4.0 + 2.0) * (not offload) + 0.5 + ctx + 28.0)
        assert ph["rollout"] == ph["kv wake"] == pytest.approx(between + ctx + 28.0)
        assert ph["update"] == pytest.approx(24.5 - 8.0 * offload + ctx + 0.1)
        assert ph["step"] == pytest.approx(19.5 + ctx + 0.1)
        assert ph["sync"] == pytest.approx(14.5 + 3.0 + 1.0 + 0.1 + 0.25 + ctx)
        assert ph["context"] == ctx


def test_the_nccl_communicators_vllm_and_accelerate_make():
    """vLLM 0.32 gives each group of more than one rank one PyNccl communicator, eagerly: its TP
    group, and for an MoE model its expert-parallel group (the TP ranks); Accelerate's world group
    spans the GPUs. A dense TP 2 row over 8 GPUs holds 2, an MoE TP 4 row 3, one GPU none."""
    assert preflight.communicators(8, 2) == ["Accelerate's world group", "vLLM's TP PyNccl"]
    assert preflight.communicators(8, 4, moe=True) == [
        "Accelerate's world group", "vLLM's TP PyNccl", "vLLM's EP PyNccl (MoE)"]
    assert preflight.communicators(8, 1, moe=True) == ["Accelerate's world group"]  # EP of 1
    assert preflight.communicators(1, 1, moe=True) == []
    assert preflight.context_gib(8, 2) == preflight.CUDA_CONTEXT_GIB + 2 * preflight.NCCL_GIB


def test_the_report_names_the_nvls_switch_where_there_are_communicators(monkeypatch):
    """NVLS on NVSwitch nodes can make a communicator larger than the 1 GiB counted: the plan
    says so, naming NCCL_NVLS_ENABLE and its value, whenever it counts a communicator."""
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")

    def text(world, tp):
        ph = preflight.phases(TRAINER, VLLM, world=world, tp=tp, card=80.0, offload=False)
        p = {"card": 80.0, "phases": ph, "vllm": VLLM, "trainer": TRAINER, "world": world,
             "tp": tp, "util": 0.35, "offload": False, "seq_len": 32768, "seconds": 1.0,
             "moe": False, "live_episodes": 96, "max_context": 32768, "max_util": 0.5,
             "fits": True, "change": "fits"}
        return preflight.report(p, "m", {"load": 1.0}, disk=2.0)
    assert "NCCL_NVLS_ENABLE=0 turns it off (now 0)" in text(8, 2)
    assert "2 NCCL x 1.0 (Accelerate's world group, vLLM's TP PyNccl)" in text(8, 2)
    assert "NVLS" not in text(1, 1)


def test_a_kv_wake_over_the_card_does_not_fit():
    vllm = dict(VLLM, kv_tokens=500_000)
    kw = dict(card=80.0, util=0.35, offload=True, moments=8.0, max_model_len=32768)
    assert preflight.verdict(_phases(), vllm, **kw) == (True, "fits")
    assert not preflight.verdict(dict(_phases(), **{"kv wake": 79.0}), vllm, **kw)[0]


def test_host_ram_by_hand():
    """GB per node, every term: the main process's fp32 load (+ the bf16 reference), vLLM's sleep
    backups at twice their bytes (torch's pinned allocator rounds each up to a power of two:
    level 2 the CUDA graphs, level 1 the bf16 weights too), the offload arena at its exact 12
    bytes per parameter (14 with the bf16 reference), an export's fp32 state dict and bf16 copy,
    the checkpoint being saved. The checkpoints kept are disk, not host RAM: 12 bytes per
    parameter each (a LoRA run's, the bf16 base: 2)."""
    n, graphs = 30 * 10**9, preflight.VLLM_GRAPHS_GIB * GIB
    two = preflight.host_ram(n, world=8, tp=4, sleep_level=2, offload=True, kl=True)
    assert two == pytest.approx({"load": 6 * n / 1e9, "sleep": 2 * 8 * graphs / 1e9,
                                 "offload": 14 * n / 1e9, "export": 6 * n / 1e9,
                                 "checkpoint": 12 * n / 1e9})
    assert preflight.checkpoint_disk(n, keep=3) == pytest.approx(36 * n / 1e9)
    assert preflight.checkpoint_disk(n, keep=3, lora=True) == pytest.approx(6 * n / 1e9)
    one = preflight.host_ram(n, world=8, tp=4, sleep_level=1, offload=False)
    assert one["load"] == pytest.approx(4 * n / 1e9) and one["offload"] == 0.0
    assert one["sleep"] == pytest.approx(2 * (8 * graphs + 2 * n * 8 / 4) / 1e9)


def test_verdict_names_the_one_change_that_fits():
    vllm = {"share": 28.0, "weights": 14.0, "profile": 1.0, "graphs": 1.0, "asleep": 0.1,
            "kv": 11.9, "kv_token_bytes": 24576, "kv_tokens": 500_000}
    kw = dict(card=80.0, util=0.35, offload=False, moments=20.0, max_model_len=32768)
    assert preflight.verdict(_phases(), vllm, **kw) == (True, "fits")
    # the update over by less than the moments: offload them; by more: nothing but a larger card
    fits, change = preflight.verdict(_phases(update=79.0), vllm, **kw)
    assert not fits and change.startswith("--offload_trainer")
    fits, change = preflight.verdict(_phases(update=79.0), vllm, **dict(kw, moments=2.0))
    assert not fits and "larger card" in change
    # rollout over: 79 - 28 = 51 GiB beside vLLM, room = min(0.95 * 80 - 51, 80 - (10 - 28))
    # = 25 GiB -> util 0.31, whose 24.8 GiB hold the weights, profile, graphs, the runner's
    # buffers and one sequence
    fits, change = preflight.verdict(_phases(rollout=79.0), vllm, **kw)
    assert (fits, change) == (False, "--gpu_memory_utilization 0.31")
    # weights too large for that room and no offload yet: offload; offloaded: more TP
    heavy = dict(vllm, weights=30.0, kv_tokens=1000)
    assert preflight.verdict(_phases(rollout=79.0), heavy, **kw)[1].startswith("--offload")
    assert "tensor_parallel_size" in preflight.verdict(_phases(rollout=79.0), heavy,
                                                       **dict(kw, offload=True))[1]


@pytest.mark.parametrize("gpu,gib", [("h100-80gb", 79.6), ("h200-141gb", 140.4), ("96", 96.0)])
def test_card_names_and_sizes(gpu, gib):
    assert preflight.card_gib(gpu) == gib


@pytest.mark.parametrize("flags,message", [
    (["--gpu", "a100"], "--gpu must be one of h100-80gb, h200-141gb or a size in GiB"),
    (["--gpus", "3", "--tensor_parallel_size", "2", "--engine", "vllm"],
     "--tensor_parallel_size 2 does not divide the 3 processes"),
    (["--model", "nobody/no-such-model"], "cannot be read offline"),
])
def test_bad_input_is_one_clear_line(flags, message):
    with pytest.raises(SystemExit, match=message):
        train.main(["--model", "tiny-moe", "--preflight", *flags])


@pytest.mark.slow
def test_the_exit_status_covers_every_card(capsys, monkeypatch):
    """--gpu a,b: the trainer is measured once, and the run exits 1 when any card does not fit,
    whichever comes first; 0 when every card fits."""
    measured, measure = [], preflight.measure_trainer
    monkeypatch.setattr(preflight, "measure_trainer",
                        lambda *a, **k: measured.append(1) or measure(*a, **k))
    for cards, code in (("8,2", 1), ("2,8", 1), ("8,16", 0)):
        with pytest.raises(SystemExit) as done:
            train.main(["--model", "tiny-moe", "--preflight", "--gpu", cards, "--gpus", "2"])
        assert done.value.code == code, cards
        rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
        assert len(rows) == 2
    assert len(measured) == 3  # once per command


@pytest.mark.slow
def test_tiny_moe_plan_end_to_end(capsys):
    """The whole command on a tiny model at 2 ranks: fits an 8 GiB card (exit 0), not a 2 GiB one
    (exit 1, the update alone needs more than the card with its context)."""
    with pytest.raises(SystemExit) as done:
        train.main(["--model", "tiny-moe", "--preflight", "--gpu", "8", "--gpus", "2"])
    assert done.value.code == 0, capsys.readouterr().out
    assert "verdict: fits" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        train.main(["--model", "tiny-moe", "--preflight", "--gpu", "2", "--gpus", "2"])
    assert done.value.code == 1
    assert "larger card" in capsys.readouterr().out


@pytest.mark.parametrize("world", [1, 2])
def test_the_kl_reference_is_measured_on_one_gpu_and_sharded(world):
    """The bf16 reference beside the fp32 policy: its shards count among the parameters (on one
    GPU the plain tracker refuses frozen parameters, so the plan keeps them trainable there)."""
    arch = models.architecture("tiny")
    plain = preflight.measure_trainer(arch, world=world, seqs=1, seq_len=64, update=_update(),
                                      sample=grpo.Sample, kl=False)
    with_ref = preflight.measure_trainer(arch, world=world, seqs=1, seq_len=64,
                                         update=_update(), sample=grpo.Sample, kl=True)
    ref_bytes = 2 * plain["params"] / world
    extra = (with_ref["held"]["Total"] - plain["held"]["Total"]) * GIB
    # over FSDP2 the tail group (norm + tied head) stays unsharded after its forward, as
    # Accelerate lays it out: at most the whole bf16 head beside the shards
    tail = 2 * arch.vocab_size * arch.hidden_size if world > 1 else 0
    for measured in (with_ref["ref"] * GIB, extra):
        assert 0.99 * ref_bytes <= measured <= 1.01 * ref_bytes + tail


@pytest.mark.slow  # four tiny measurements: 15-35 s each on 2 loaded cores
@pytest.mark.parametrize("world, adapters", [(1, True), (2, False)], ids=["lora-1", "full-2"])
def test_the_device_peak_alone_equals_memtrackers_own(world, adapters, monkeypatch):
    """measure_trainer keeps MemTracker's device-wide peak and drops its per-module peaks (a loop
    over every module after every op): every figure equals the tracker's own bookkeeping."""
    from infra import lora
    arch = models.architecture("tiny")
    adapt = (functools.partial(lora.add_adapters, rank=4, alpha=8.0, dropout=0.0,
                               targets="q_proj,v_proj,down_proj"), lora.Reference) if adapters else None

    def measure():
        return preflight.measure_trainer(arch, world=world, seqs=2, seq_len=48, update=_update(),
                                         sample=grpo.Sample, kl=not adapters, lora=adapt)
    fast = measure()
    monkeypatch.setattr(preflight, "_global_peak_only", lambda tracker: tracker)
    assert measure() == fast
    assert fast["update"]["Total"] > fast["held"]["Total"] > 0
