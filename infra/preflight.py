"""Memory preflight: does a run fit its GPUs, and how much KV cache do its rollouts get? Measured on
a laptop, without weights or a GPU (infrastructure, none of it the paper's).

    python train.py --model Qwen3-30B-A3B --preflight --gpu h100-80gb --gpus 8 [run flags]

What is measured. The configured model is built at full size under torch's FakeTensorMode (tensors
with shapes and no memory), in fp32 master weights, and set up as the launch would: over --gpus > 1
ranks FSDP2-sharded per decoder layer at rank 0 of torch's fake process group (bf16 compute, fp32
reduce-scatter, layers checkpointed: configs/fsdp2_8gpu.yaml), on one GPU whole under bf16
autocast (configs/single_gpu.yaml). Then train.grpo_update itself (logprobs.token_logprobs,
grpo.policy_loss, the optimizer step) runs once on the run's largest micro-batch under torch's
memory tracker (torch.distributed._tools: FSDPMemTracker, or MemTracker on one GPU), which
attributes every allocation to parameters, gradients, activations, optimizer state and FSDP2's
all-gather / reduce-scatter buffers. The AdamW state and the gradients already exist when it
starts: the micro-batch is measured as a later micro-batch of a step sees it.

What is computed, printed with its inputs: vLLM's share (weights / TP, an activation-profile
estimate for its batch limits, the KV cache left and its tokens per TP group against the run's
demand), what vLLM keeps on the GPU asleep, the CUDA context and NCCL communicators (estimates),
host RAM.

Phases, GiB per GPU, in the order train.py runs them (a phase fits below FIT_SHARE of the card:
allocator fragmentation); `between` is the trainer's state between updates (fp32 shards, AdamW
moments, the bf16 KL reference), with --offload_trainer only what offload.py leaves (buffers):
    start-up = fp32 parameter shards + KL reference + context + util x card (vLLM starts beside
               them and refuses to start above the card); with --offload_trainer the shards are
               in host RAM before vLLM starts: the rollout's figure
    rollout  = between + context + util x card
    kv wake  = the moment vLLM maps its KV cache again (engine.wake, at a step's start, after the
               offload): the rollout's footprint, its own line because an order that left the
               trainer's state on the device would fail here (cuMemCreate)
    update   = the measured forward/backward peak + context + vLLM asleep (with --offload_trainer
               less the AdamW moments, which come back only for the optimizer step)
    step     = the measured optimizer-step peak + context + vLLM asleep
    sync     = trainer state + vLLM's weights and CUDA graphs (they wake together) + vLLM asleep +
               the largest layer's full bf16 tensors + context; the KV cache stays released
    vLLM asleep = the model runner's persistent buffers (the CUDA graphs wait in host RAM,
               sleep_mode_offload_cudagraph; the NCCL communicators are in the context)
    context  = the CUDA context + NCCL_GIB per NCCL communicator (communicators(); NVLS can
               make one larger, which the output says with the NCCL_NVLS_ENABLE that stops it)
With --lora_rank (never offloaded: config.check_lora) the trainer's state is the frozen bf16
base, the fp32 adapters and their AdamW moments, with no reference copy (the reference is the
policy with its adapters off); start-up adds the first adapter's gather; vLLM's sleep releases
its KV cache alone, so update and step hold its weights and CUDA graphs too; the sync gathers
the adapters alone (phases()).
tests/test_memory_order.py runs train.py's loop on a ledger of these pools and checks that these
phases are its timeline's maxima.

Deviations from a real GPU run (numbered):
  1. MoE routing runs evenly (every expert T * k / E tokens): top-k routing has
     data-dependent shapes that fake tensors cannot follow; the output says so.
  2. Values read back to Python from fake tensors (loss statistics, the gradient norm) read 1;
     the memory does not depend on them. Boolean masks from real inputs stay exact.
  3. Every token of the measured micro-batch is a completion token (an upper bound on the head).
  4. Not modelled: the caching allocator's fragmentation (hence FIT_SHARE); CUDA graphs, NCCL and
     vLLM's non-torch memory are the estimates below, not measurements; vLLM's scratch workspace
     (inside its profile) is not counted at the sync.
Validation: tests/test_preflight.py pins the plan of the one configuration whose update peak was
measured on a GPU (docs/gpu.md, "Memory per GPU": the figure, the card and the configuration).
Dependencies: torch, transformers. Test: `pytest tests/test_preflight.py -m ""` (-m "": the
full-size plans too).
"""
from __future__ import annotations

import math
import os
import random
import time
import types

import torch

GIB = 2 ** 30
CARDS = {"h100-80gb": 79.6, "h200-141gb": 140.4}  # GiB as CUDA reports them
FIT_SHARE = 0.95
CUDA_CONTEXT_GIB = 1.0  # one process's CUDA context, kernels and library workspaces (estimate)
# One NCCL communicator's device buffers on an NVLink node (estimate; reported: 1.6 GB after one
# all-reduce, NVIDIA/nccl#864; 0.54-0.69 GB per group on 4 A100s, nccl#964; 1.06 GB on 8 H100s
# before any all-to-all, nccl#1685); vLLM's custom all-reduce buffers (3 x 8 MiB) ride on it.
NCCL_GIB = 1.0
# On NVSwitch nodes (H100 / H200 SXM) NCCL's NVLink SHARP buffers can take more than that
NVLS_NOTE = ("  NVLS (NVSwitch nodes) can raise a communicator above 1 GiB (NVIDIA/nccl#864: "
             "1.6 GB for one); NCCL_NVLS_ENABLE=0 turns it off")
VLLM_GRAPHS_GIB = 1.0  # vLLM's CUDA graphs and non-torch memory (estimate)
MAX_NUM_BATCHED_TOKENS = 8192  # vLLM's prefill chunk: its profile follows it
KV_BLOCK = 16  # vLLM's KV block size in tokens: its block table holds ceil(len / 16) per sequence


def card_gib(gpu: str) -> float:
    """--gpu: h100-80gb, h200-141gb, or the card's memory in GiB."""
    if gpu in CARDS:
        return CARDS[gpu]
    try:
        gib = float(gpu)
    except ValueError:
        gib = 0.0
    if not gib > 0:
        raise SystemExit(f"--gpu must be one of {', '.join(CARDS)} or a size in GiB, not {gpu!r}")
    return gib


# ----------------------------------------------------------------------------------------------
# INFRA: fake tensors, the fake process group, the tracker


class _Readout(torch.utils._python_dispatch.TorchDispatchMode):
    """Runs train.grpo_update's small Python-side tensors for real inside the fake mode, so its
    control flow and boolean selections stay exact: ops whose tensor arguments are all real, and
    small factories (the micro-batch's ids and masks), run outside the fake mode; a real boolean
    mask indexing a fake tensor becomes its real indices. Deviation 2: a value read back from a
    fake tensor (a loss statistic, the gradient norm) is 1."""

    SMALL = 1 << 20  # elements: larger factories (FSDP2's buffers, the weights) stay fake

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.utils._pytree import tree_leaves
        aten, kwargs = torch.ops.aten, kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if func is aten._local_scalar_dense.default and type(args[0]) is not torch.Tensor:
            return True if args[0].dtype == torch.bool else 1
        if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
            with unset_fake_temporarily():
                idx = [list(i.nonzero(as_tuple=True)) if type(i) is torch.Tensor and
                       i.dtype == torch.bool else [i] for i in args[1]]
            args = (args[0], [j for i in idx for j in i], *args[2:])
        elif tensors and all(type(t) is torch.Tensor for t in tensors):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if not tensors and isinstance(out, torch.Tensor) and out.numel() <= self.SMALL:
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        return out


def _even_experts(self, hidden, top_k_index, top_k_weights):
    """Deviation 1: fused experts (E, 2I, H) / (E, H, I) on T * k / E tokens each."""
    (T, H), k, E = hidden.shape, top_k_index.shape[1], self.gate_up_proj.shape[0]
    n = -(-T * k // E)                                                         # tokens per expert
    x = hidden.repeat(-(-n * E // T), 1)[: n * E].view(E, n, H)               # (E, n, H)
    gate, up = torch.bmm(x, self.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
    out = torch.bmm(self.act_fn(gate) * up, self.down_proj.transpose(1, 2))  # (E, n, H)
    out = out.reshape(E * n, H)[: T * k].view(T, k, H) * top_k_weights[..., None].to(out.dtype)
    return out.sum(1).to(hidden.dtype)                                         # (T, H)


class _Accelerator:
    """The six things train.grpo_update asks of Accelerate, for rank 0 of `world` equal ranks."""

    def __init__(self, world: int, autocast: bool):
        self.num_processes, self.device, self.cast = world, torch.device("cpu"), autocast

    def gather(self, t):
        return t.repeat(self.num_processes)

    def autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cast)

    def backward(self, loss):
        loss.backward()

    def unwrap_model(self, model):
        return model

    def clip_grad_norm_(self, params, max_norm):
        # per tensor, as on CUDA (torch's foreach path takes no DTensors): each gradient's norm
        # stays a partial norm of its shard (forced foreach here would gather whole gradients)
        return torch.nn.utils.clip_grad_norm_(list(params), max_norm, foreach=False)


def _fake_mesh(world: int):
    """Rank 0 of `world` on torch's fake process group (no peers, no communication)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized() and dist.get_world_size() != world:
        dist.destroy_process_group()
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    return init_device_mesh("cpu", (world,))  # outside the fake mode: it reads real ranks


def _build(config, dtype, mesh, checkpointing: bool, adapt=None):
    """The model at full size on fake tensors, experts routed evenly (with `adapt`, a LoRA run's
    adapters added as run.load_policy adds them, before any wrapping); on a mesh laid out as
    Accelerate's FSDP2 prepare lays it out (configs/fsdp2_8gpu.yaml): each decoder layer in a
    checkpoint wrapper and sharded alone, the embedding alone unless tied, the final norm and head
    together and kept unsharded after the forward, the root last."""
    from transformers import AutoModelForCausalLM
    if adapt is None:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    else:  # PEFT's adapter layers cannot be built on fake tensors (its dtype moves swap them)
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        with unset_fake_temporarily(), torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                     attn_implementation="sdpa")
            adapt(model)
        _fake_storage(model)
    for m in model.modules():
        if getattr(getattr(m, "gate_up_proj", None), "dim", lambda: 0)() == 3:
            m.forward = types.MethodType(_even_experts, m)
    if mesh is None:
        if checkpointing:  # one GPU: transformers' own checkpointing, as run.Run sets it
            model.gradient_checkpointing_enable({"use_reentrant": False})
        return model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kw = dict(mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                        reduce_dtype=torch.float32))
    layers = model.get_decoder().layers
    for i, layer in enumerate(layers):
        fully_shard(layer, **kw)
        if checkpointing:
            layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = embed.weight is head.weight
    if not tied:
        fully_shard(embed, **kw)
    fully_shard([model.get_decoder().norm, head, *([embed] if tied else [])], **kw,
                reshard_after_forward=False)
    fully_shard(model, **kw)
    return model


def _fake_storage(model) -> None:
    """Every `meta` parameter and buffer of `model` as a CPU tensor of the active fake mode (no
    memory), a tensor shared by several modules (a tied head) still shared."""
    made = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in list(table.items()):
                if t is None or not t.is_meta:
                    continue
                if id(t) not in made:
                    new = torch.empty_like(t, device="cpu")
                    made[id(t)] = torch.nn.Parameter(new, requires_grad=t.requires_grad) \
                        if isinstance(t, torch.nn.Parameter) else new
                table[name] = made[id(t)]


class _NoHook:
    """A hook handle with nothing to remove (MemTracker removes its handles on exit)."""

    def remove(self) -> None:
        pass


def _global_peak_only(tracker):
    """MemTracker updates, after every op, the peak of each module it has entered: a loop over
    every module (thousands for a 36-layer model with LoRA adapters) for per-module figures this
    plan never reads. Only the device-wide peak it reads is kept, as MemTracker updates it."""
    def update(_state) -> None:
        for dev, snap in tracker._curr_mem_snap.items():
            if tracker._peak_mem.get(dev, 0) < snap["Total"]:
                tracker._peak_mem[dev], tracker._peak_mem_snap[dev] = snap["Total"], dict(snap)
    tracker._update_peak_stats = update
    return tracker


def _restart_peak(tracker) -> dict:
    """The tracker's peak so far (GiB by category), then its peak restarted at the current total
    (MemTracker has no public reset: its two peak fields are set here)."""
    peak = _gib(tracker.get_tracker_snapshot("peak"))
    for dev, snap in tracker._curr_mem_snap.items():
        tracker._peak_mem[dev], tracker._peak_mem_snap[dev] = snap["Total"], dict(snap)
    return peak


def _gib(snapshot) -> dict:
    (by_kind,) = snapshot.values()  # one device
    return {str(getattr(k, "value", k)): v / GIB for k, v in by_kind.items()}


def _policy_and_reference(config, mesh, checkpointing: bool, kl: bool, lora):
    """(policy, KL reference or None) as run.Run builds them: fp32 masters and a bf16 reference
    model, or (`lora`) the frozen bf16 base with fp32 adapters and the policy as reference."""
    if lora is None:
        return (_build(config, torch.float32, mesh, checkpointing),
                _build(config, torch.bfloat16, mesh, False) if kl else None)
    model = _build(config, torch.bfloat16, mesh, checkpointing, adapt=lora[0])
    return model, (lora[1](model) if kl else None)


def _frozen_ok(tracker, model):
    """MemTracker hooks every parameter it meets for its gradient, which a frozen one (a LoRA
    base) refuses: such parameters are marked hooked already."""
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
    return tracker


def measure_trainer(config, *, world: int, seqs: int, seq_len: int, update, sample, kl: bool,
                    checkpointing: bool = True, fused: bool = True, lora=None) -> dict:
    """GiB per GPU of one train.grpo_update call on `seqs` sequences of `seq_len` tokens:
    {"update": forward/backward peak, "step": optimizer-step peak, "held": what stays after it,
    each a dict by category with "Total"}, plus "params" and "largest_unit" (bf16 GiB of the
    largest weight-sync group). `update(trainer, samples)` is train.grpo_update with the run's
    settings bound (trainer: run.Trainer's fields, here a stand-in), `sample` the record it takes
    (grpo.Sample, passed in: this module imports nothing of the repository). `lora`: a LoRA run's
    (adapt, reference), adapt(model) adding its adapters and reference(policy) its KL reference
    (lora.add_adapters and lora.Reference, bound by train.py): the base in bf16, AdamW over the
    adapters, no second model; "largest_unit" is then the whole adapter, what its sync gathers."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    mesh = _fake_mesh(world) if world > 1 else None
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model, ref = _policy_and_reference(config, mesh, checkpointing, kl, lora)
        # frozen as run.Run freezes it, except on one GPU: MemTracker hooks every parameter it
        # meets for its gradient (grpo_update runs the reference under no_grad: none is made)
        if ref is not None and mesh is not None:
            ref.requires_grad_(False)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-6, weight_decay=0.1,
                                      **({"fused": True} if fused else {"foreach": True}))
        for p in trainable:  # AdamW state and a previous micro-batch's gradients
            p.grad = torch.zeros_like(p)
        optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    tracker = FSDPMemTracker(model, optimizer) if mesh is not None else _frozen_ok(MemTracker(),
                                                                                   model)
    _global_peak_only(tracker)
    tracker.track_external(model, optimizer, *([ref] if ref is not None else []))
    peaks = {}
    def before_step(*_):
        peaks["update"] = _restart_peak(tracker)
    optimizer.register_step_pre_hook(before_step)
    rng = random.Random(0)
    samples = [sample([rng.randrange(config.vocab_size) for _ in range(seq_len)],
                      [0] + [1] * (seq_len - 1), [0.0] * seq_len, advantage=1.0, role="agent",
                      weight=1.0) for _ in range(seqs)]
    trainer = types.SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler,
                                    accelerator=_Accelerator(world, mesh is None), ref_model=ref)
    with fake, tracker, _Readout():
        update(trainer, samples)
    peaks["step"] = _gib(tracker.get_tracker_snapshot("peak"))
    peaks["held"] = _gib(tracker.get_tracker_snapshot("current"))
    params = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)  # the base
    units = [sum(p.numel() for p in layer.parameters())
             for layer in model.get_decoder().layers]
    units += [m.weight.numel() for m in (model.get_input_embeddings(),
                                         model.get_output_embeddings())]
    if lora is not None:  # a LoRA sync gathers every adapter at once, and nothing else
        units = [sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)]
    # this rank's shards (the trackers file the reference's under different kinds): the policy's
    # (fp32; a LoRA run's bf16 base and its adapters) and the reference's bf16 ones, which
    # offload.py moves together (a LoRA run's reference is the policy itself: none)
    return {**peaks, "params": params, "largest_unit": 2 * max(units) / GIB,
            "policy": _shard_gib(model), "ref": _shard_gib(ref) if kl else 0.0}


def _shard_gib(model) -> float:
    return sum(_local(p).numel() * p.element_size() for p in model.parameters()) / GIB


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


# ----------------------------------------------------------------------------------------------
# INFRA: vLLM's share, the phases, the verdict


def vllm_share(config, *, params: int, tp: int, util: float, card: float, max_num_seqs: int,
               max_model_len: int, max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
               adapter: float = 0.0) -> dict:
    """GiB per GPU inside vLLM's util x card (`params`: the model's parameter count, as
    measure_trainer counts it): bf16 weights / TP, the activation profile of one
    max_num_batched_tokens forward plus the sampler's fp32 (B, V) tensors for max_num_seqs rows
    (an estimate of vLLM's profile run), graphs, the model runner's persistent buffers (what stays
    while vLLM sleeps: `asleep`), and the KV cache left, in tokens per TP group (each rank holds
    its heads' share of every token; KV heads replicate when TP exceeds them). `adapter`: GiB
    of a LoRA run's adapter in bf16, vLLM's adapter slot, counted whole on every rank (vLLM
    shards only some of its factors) with the weights."""
    H, V, L = config.hidden_size, config.vocab_size, config.num_hidden_layers
    hd = getattr(config, "head_dim", None) or H // config.num_attention_heads
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    experts_k = getattr(config, "num_experts_per_tok", 0)
    inter = experts_k * config.moe_intermediate_size if experts_k else config.intermediate_size
    weights = 2 * params / tp / GIB + adapter
    per_token = 2 * (8 * H + (heads + 2 * kv) * hd / tp + 4 * inter / tp)      # bf16 bytes
    # alive together in the sampler: the logits, the processed log-probs' log_softmax, the
    # probabilities and the exponential noise, each (B, V) fp32
    sampler = 4 * 4 * max_num_seqs * V
    profile = (max_num_batched_tokens * per_token + sampler) / GIB
    # outside every sleep pool: the input embeddings (bf16) and the block table (int32)
    asleep = (max_num_batched_tokens * H * 2 +
              max_num_seqs * -(-max_model_len // KV_BLOCK) * 4) / GIB
    kv_token = 2 * L * max(1, kv // tp) * hd * 2                               # K and V, bf16
    kv_gib = util * card - weights - profile - VLLM_GRAPHS_GIB - asleep
    return {"share": util * card, "weights": weights, "profile": profile,
            "graphs": VLLM_GRAPHS_GIB, "asleep": asleep, "kv": kv_gib, "kv_token_bytes": kv_token,
            "kv_tokens": max(0, int(kv_gib * GIB / kv_token))}


def communicators(world: int, tp: int, moe: bool = False) -> list[str]:
    """The NCCL communicators each rank holds for the whole run (sleep frees none): Accelerate's
    world group (FSDP2's all-gathers) over several GPUs; under tensor parallelism vLLM's PyNccl
    communicator of its TP group and, for an MoE model, of its expert-parallel group (the same
    ranks): vLLM 0.32 makes one per group of more than one rank, eagerly. Its torch device groups
    are made lazily and used only without PyNccl; the project's own TP exchange runs on gloo."""
    return ((["Accelerate's world group"] if world > 1 else []) +
            (["vLLM's TP PyNccl"] if tp > 1 else []) +
            (["vLLM's EP PyNccl (MoE)"] if tp > 1 and moe else []))


def context_gib(world: int, tp: int, moe: bool = False) -> float:
    """The CUDA context + NCCL_GIB per communicator, GiB per GPU."""
    return CUDA_CONTEXT_GIB + NCCL_GIB * len(communicators(world, tp, moe))


def _kind(snapshot: dict, *names: str) -> float:
    """GiB of one kind in a tracker snapshot (FSDPMemTracker and MemTracker name kinds apart)."""
    return next((snapshot[n] for n in names if n in snapshot), 0.0)


def _moments(trainer: dict) -> float:
    """GiB of optimizer state at the update's peak (the two trackers spell the kind apart)."""
    return _kind(trainer["update"], "OptState", "Optstate")


def state_kinds(trainer: dict) -> dict:
    """GiB per GPU of the trainer's state by kind, as offload.py moves it: `params` (the
    policy's fp32 shards), `moments` (AdamW's), `grads` (at the update's peak), `reference` (the
    KL reference's bf16 shards), `fixed` (what stays: buffers), and what each pass adds beyond
    the state: `update` (activations, FSDP2's buffers) and `step` (the optimizer's
    temporaries)."""
    held, update, step = trainer["held"], trainer["update"], trainer["step"]
    params, moments = trainer["policy"], _kind(held, "OptState", "Optstate")
    grads, ref = _kind(update, "Sharded Grad", "Gradient"), trainer["ref"]
    return {"params": params, "moments": moments, "grads": grads, "reference": ref,
            "fixed": held["Total"] - params - moments - ref,
            "update": update["Total"] - held["Total"] - grads,
            "step": step["Total"] - held["Total"] - _kind(step, "Sharded Grad", "Gradient")}


def phases(trainer: dict, vllm: dict, *, world: int, tp: int, card: float,
           offload: bool, moe: bool = False, lora: bool = False) -> dict:
    """GiB per GPU of each phase (module docstring) from the measured trainer and vLLM's share.
    LoRA: vLLM's sleep releases its KV cache alone (the base never changes), so its weights and
    CUDA graphs stay through the update and the optimizer step."""
    ctx, kinds = context_gib(world, tp, moe), state_kinds(trainer)
    asleep = vllm["asleep"] + (vllm["weights"] + vllm["graphs"] if lora else 0.0)
    held = trainer["held"]["Total"]
    rollout = (kinds["fixed"] if offload else held) + ctx + vllm["share"]
    # offloaded, the AdamW moments return at the optimizer step (offload.py), so the forward and
    # backward peak loses them: they are constant over the pass, so subtracting them is exact
    update = trainer["update"]["Total"] - (kinds["moments"] if offload else 0.0)
    # offloaded, the shards leave before vLLM starts (run.Run): start-up is the rollout's memory;
    # LoRA (never offloaded: config.check_lora) gathers vLLM's first adapter at start-up, beside
    # its whole share
    startup = rollout if offload else held - kinds["moments"] + ctx + vllm["share"] + \
        (trainer["largest_unit"] if lora else 0.0)
    return {"start-up": startup, "rollout": rollout,
            "kv wake": rollout, "update": update + ctx + asleep,
            "step": trainer["step"]["Total"] + ctx + asleep,
            "sync": held + vllm["weights"] + vllm["graphs"] + vllm["asleep"] +
            trainer["largest_unit"] + ctx, "context": ctx}


def verdict(ph: dict, vllm: dict, *, card: float, util: float, offload: bool, moments: float,
            max_model_len: int, lora: bool = False) -> tuple[bool, str]:
    """(fits, the one change that makes it fit or why none does); `moments`: GiB of the AdamW
    moments, which --offload_trainer keeps off the device until the optimizer step."""
    limit = FIT_SHARE * card
    over = [k for k in ("rollout", "kv wake", "update", "step", "sync") if ph[k] > limit]
    if ph["start-up"] > card:
        over.append("start-up")
    short = vllm["kv_tokens"] < max_model_len  # vLLM refuses a KV cache below one sequence
    if not over and not short:
        return True, "fits"
    if set(over) & {"update", "step"}:
        if lora:  # vLLM's weights stay beside the update; --offload_trainer is not for LoRA
            return False, ("the update does not fit beside vLLM's weights: more GPUs (FSDP2 "
                           "and --tensor_parallel_size) or a larger card")
        if not offload and ph["update"] - moments <= limit and ph["step"] <= limit:
            return False, "--offload_trainer (then --gpu_memory_utilization from this plan)"
        return False, ("the update does not fit one card whatever vLLM gets: shard it over more "
                       "GPUs (FSDP2) or take a larger card")
    best = max_util(ph, vllm, card=card)
    kv_need = vllm["weights"] + vllm["profile"] + vllm["graphs"] + vllm["asleep"] + \
        max_model_len * vllm["kv_token_bytes"] / GIB
    if best * card >= kv_need:
        return False, f"--gpu_memory_utilization {best:.2f}"
    if not offload:
        return False, "--offload_trainer (then --gpu_memory_utilization from this plan)"
    return False, "more tensor parallelism (--tensor_parallel_size) or a larger card"


def max_util(ph: dict, vllm: dict, *, card: float) -> float:
    """The largest --gpu_memory_utilization (2 decimals) the rollout phase (and the KV wake, its
    twin) and vLLM's start-up leave room for."""
    room = min(FIT_SHARE * card - (max(ph["rollout"], ph["kv wake"]) - vllm["share"]),
               card - (ph["start-up"] - vllm["share"]))
    return max(0.0, math.floor(room / card * 100) / 100)


def vllm_fit_error(*, world: int, tp: int, weight_bytes: float, utilization: float,
                   card_bytes: float | None) -> str | None:
    """The start-up check of a colocated vLLM, pure (run.Run runs it before anything loads, plan
    its TP part; the README's GPU table is checked with it): None when TP divides the world and
    one rank's share of the shipped weights fits within vLLM's share of the card, utilization x
    card memory, which is vLLM's whole budget (weights + activations + KV cache: weights that fill
    it leave no KV cache and vLLM fails at start-up; card_bytes None: no card to check, TP only).
    Otherwise a one-line error naming the fix."""
    if tp < 1 or world % tp:
        return f"--tensor_parallel_size {tp} does not divide the {world} processes"
    if card_bytes is None:
        return None
    share, per_rank, gib = utilization * card_bytes, weight_bytes / tp, 2**30
    if per_rank < share:
        return None
    bigger = [t for t in range(tp + 1, world + 1) if world % t == 0 and weight_bytes / t < share]
    fix = (f"--tensor_parallel_size {bigger[0]} or " if bigger else "") + \
        f"--gpu_memory_utilization above {per_rank / card_bytes:.2f}"
    return (f"vLLM's weights at --tensor_parallel_size {tp} ({per_rank / gib:.1f} GiB per GPU) "
            f"fill its share of the card (--gpu_memory_utilization {utilization} x "
            f"{card_bytes / gib:.1f} GiB = {share / gib:.1f} GiB): use {fix}")


def plan(config, *, world: int, tp: int, card: float, util: float, offload: bool,
         micro_batch_tokens: int, max_model_len: int, max_context: int, live_episodes: int,
         kl: bool, update, sample, fused: bool = True, checkpointing: bool = True,
         trainer: dict | None = None, lora=None) -> dict:
    """The whole preflight of one run (the arguments: train.py's flags as the plan reads them;
    live_episodes: the episodes a TP group plays at once at a regeneration step; `trainer`: a
    measure_trainer result to reuse for another card; `lora`: measure_trainer's, for a LoRA
    run)."""
    if tp_error := vllm_fit_error(world=world, tp=tp, weight_bytes=0, utilization=util,
                                  card_bytes=None):  # TP only: the card's fit is the plan's
        raise SystemExit(tp_error)
    t0 = time.perf_counter()
    # the largest micro-batch: one sequence as long as the budget or the longest sample
    seq_len = max(micro_batch_tokens, max_model_len)
    trainer = trainer or measure_trainer(config, world=world, seqs=1, seq_len=seq_len,
                                         update=update, sample=sample, kl=kl,
                                         checkpointing=checkpointing,
                                         fused=fused, lora=lora)
    vllm = vllm_share(config, params=trainer["params"], tp=tp, util=util, card=card,
                      max_num_seqs=live_episodes, max_model_len=max_model_len,
                      adapter=trainer["largest_unit"] if lora else 0.0)
    moe = bool(getattr(config, "num_experts", 0))
    ph = phases(trainer, vllm, world=world, tp=tp, card=card, offload=offload, moe=moe,
                lora=lora is not None)
    fits, change = verdict(ph, vllm, card=card, util=util, offload=offload,
                           moments=_moments(trainer), max_model_len=max_model_len,
                           lora=lora is not None)
    best = max_util(ph, vllm, card=card)
    return {"trainer": trainer, "vllm": vllm, "phases": ph, "fits": fits, "change": change,
            "max_util": best,
            "seq_len": seq_len, "world": world, "tp": tp, "card": card, "util": util,
            "offload": offload, "live_episodes": live_episodes, "max_context": max_context,
            "lora": lora is not None, "moe": moe, "seconds": time.perf_counter() - t0}


def memory_plan(config, launch: dict, *, name: str, setting: str, cards: list[float],
                sleep_level: int, keep: int) -> int:
    """--preflight: the plan of `config` on each card of `cards` GiB (`launch`: plan's other
    keyword arguments, the run as it launches), the trainer measured once, each printed with its
    host RAM (`sleep_level`: vLLM's) and the disk of its `keep` kept checkpoints, then one table
    row per card (`name`: the model; `setting`). Returns the exit status: 0 when it fits every
    card."""
    status, trainer, rows = 0, None, []
    for card in cards:
        p = plan(config, card=card, trainer=trainer, **launch)
        trainer = p["trainer"]
        lora = launch.get("lora") is not None
        host = host_ram(trainer["params"], world=launch["world"], tp=launch["tp"],
                        sleep_level=sleep_level, offload=launch["offload"], kl=launch["kl"],
                        lora=lora)
        print(report(p, name, host, checkpoint_disk(trainer["params"], keep=keep, lora=lora)))
        rows.append(table_row(p, name, setting))
        status = status or (0 if p["fits"] else 1)
    print("\n".join(rows))
    return status


def host_ram(params: int, *, world: int, tp: int, sleep_level: int, offload: bool,
             kl: bool = False, lora: bool = False) -> dict:
    """GB of host RAM per node (one node of `world` GPUs), each term what a part of the run holds
    at once: the checkpoint load (the main process alone reads it, in fp32, and with a KL term
    the bf16 reference; the other ranks build on `meta` and Accelerate's FSDP2 prepare fills
    their shards); vLLM's sleep backups (level 2: the CUDA graphs, VLLM_GRAPHS_GIB per GPU;
    level 1: the bf16 weights too), pinned by torch's host allocator, which rounds each buffer up
    to a power of two (counted at that bound, twice the bytes); the offload arena, pinned at
    exactly its bytes (offload.py: fp32 shards + AdamW moments, 12 bytes per parameter, + the
    bf16 reference's 2 with a KL term); an export (the main process: the full fp32 state dict and
    its bf16 copy); the resumable checkpoint being saved (fp32 + AdamW: checkpoint_bytes). LoRA
    (the adapters' own bytes neglected): the main process reads the bf16 base alone, vLLM backs
    nothing up (its sleep releases the KV cache alone), an export is the adapter."""
    if lora:
        return {"load": 2 * params / 1e9, "sleep": 0.0, "offload": 0.0, "export": 0.0,
                "checkpoint": checkpoint_bytes(params, lora=True) / 1e9}
    weights = 2 * params * world / tp if sleep_level == 1 else 0.0  # bf16, every GPU's TP share
    return {"load": (4 + 2 * kl) * params / 1e9,
            "sleep": 2 * (VLLM_GRAPHS_GIB * GIB * world + weights) / 1e9,
            "offload": (12 + 2 * kl) * params / 1e9 if offload else 0.0,
            "export": (4 + 2) * params / 1e9, "checkpoint": checkpoint_bytes(params) / 1e9}


def checkpoint_bytes(params: int, lora: bool = False) -> int:
    """One resumable checkpoint: the fp32 parameters and AdamW's two moments, 12 bytes per
    parameter; a LoRA run's, the bf16 base (Accelerate saves the whole model) with the adapters'
    AdamW state (neglected)."""
    return 2 * params if lora else 12 * params


def checkpoint_disk(params: int, *, keep: int, lora: bool = False) -> float:
    """GB of disk the run's `keep` kept checkpoints take (--keep_checkpoints; one more while a
    save writes the next beside them, before it prunes the oldest)."""
    return checkpoint_bytes(params, lora) * keep / 1e9


PHASES = ("start-up", "rollout", "kv wake", "update", "step", "sync")  # in the loop's order


def report(p: dict, name: str, host: dict, disk: float) -> str:
    """The plan as text: one line per phase, the KV cache, host RAM, the checkpoints' disk
    (`disk` GB), the verdict."""
    card, ph, v, t = p["card"], p["phases"], p["vllm"], p["trainer"]
    out = [f"preflight {name}: {p['world']} GPU(s) of {card:.1f} GiB, TP {p['tp']}, "
           f"util {p['util']:.2f}, offload {'on' if p['offload'] else 'off'}, micro-batch "
           f"{p['seq_len']:,} tokens ({p['seconds']:.0f} s)"]
    if p.get("lora"):
        out.append(f"  LoRA: frozen bf16 base, adapter {t['largest_unit']:.2f} GiB (bf16); vLLM "
                   "keeps its weights and graphs through the update (only its KV cache sleeps)")
    if p["moe"]:
        out.append("  MoE routing under fake tensors: even (every expert T*k/E tokens)")
    for k in PHASES:
        out.append(f"  {k:<9}{ph[k]:7.1f} GiB  {ph[k] / card:4.0%}")
    by = {k: round(val, 1) for k, val in t["update"].items() if val >= 0.05 and k != "Total"}
    out.append(f"  update peak by kind (GiB): {by}")
    comms = communicators(p["world"], p["tp"], p["moe"])
    nccl = f" + {len(comms)} NCCL x {NCCL_GIB:.1f} ({', '.join(comms)})" if comms else ""
    away = t["held"]["Total"] - state_kinds(t)["fixed"]
    out.append(f"  trainer state between updates {t['held']['Total']:.1f} GiB"
               f"{f' ({away:.1f} in host RAM during rollouts)' if p['offload'] else ''}; context "
               f"{ph['context']:.1f} GiB = CUDA {CUDA_CONTEXT_GIB:.1f}{nccl} (estimates)")
    if comms:
        out.append(NVLS_NOTE + f" (now {os.environ.get('NCCL_NVLS_ENABLE', 'unset')})")
    out.append(f"  vLLM share {v['share']:.1f} GiB = weights {v['weights']:.1f} + profile "
               f"{v['profile']:.1f} (estimate) + graphs {v['graphs']:.1f} (estimate) + runner "
               f"buffers {v['asleep']:.2f} + KV {v['kv']:.1f}; asleep it keeps the runner buffers")
    demand = p["live_episodes"] * p["max_context"]
    out.append(f"  KV tokens per TP group {v['kv_tokens']:,} ({v['kv_token_bytes'] // 1024} KiB "
               f"per token per rank) vs demand {demand:,} ({p['live_episodes']} live episodes x "
               f"{p['max_context']:,}): {v['kv_tokens'] / demand:.0%}")
    out.append("  host RAM per node (GB): " + ", ".join(f"{k} {val:,.0f}"
                                                      for k, val in host.items()))
    out.append(f"  disk (GB): checkpoints kept {disk:,.0f}")
    out.append(f"  largest --gpu_memory_utilization that fits: {p['max_util']:.2f}")
    out.append(f"  vLLM settings: --gpu_memory_utilization {p['util']:.2f}, max_num_seqs "
               f"{p['live_episodes']}, max_num_batched_tokens {MAX_NUM_BATCHED_TOKENS}")
    out.append(f"  verdict: {'fits' if p['fits'] else 'does not fit: ' + p['change']}")
    return "\n".join(out)


def table_row(p: dict, name: str, setting: str) -> str:
    """One memory-table row (docs/gpu.md, "Memory per GPU"): model, GPUs, setting, card, offload,
    util, start-up / rollout / update / step / sync GiB, KV tokens per TP group, the largest util
    that fits, the verdict."""
    ph, gpu = p["phases"], next((k for k, v in CARDS.items() if v == p["card"]), p["card"])
    setting = f"{setting}, LoRA" if p.get("lora") else setting
    cells = [name, str(p["world"]), setting, str(gpu), "on" if p["offload"] else "off",
             f"{p['util']:.2f}",
             *(f"{ph[k]:.1f}" for k in ("start-up", "rollout", "update", "step", "sync")),
             f"{p['vllm']['kv_tokens'] / 1e6:.2f}M", f"{p['max_util']:.2f}",
             "fits" if p["fits"] else p["change"]]
    return "| " + " | ".join(cells) + " |"
