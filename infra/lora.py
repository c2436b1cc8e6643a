"""LoRA: the policy trains low-rank adapters instead of every weight (infrastructure; the paper
fine-tunes every weight of Qwen3-4B/8B/30B-A3B, README deviation 38).

    W x  ->  W x + (alpha / r) B (A x)        A (r, in) random, B (out, r) = 0 at the start

Each targeted weight W stays frozen in the shipped dtype (bf16 for the paper's models); only A and
B train, in fp32, so AdamW holds state for them alone. B = 0 makes the starting policy the base
model, so the KL reference pi_ref of grpo.policy_loss is the same model with its adapters switched
off (`Reference`): no second copy of the weights. After each update the rollout engine receives
A and B alone (engine.py: vLLM gets them as a new adapter, the transformers engine samples from
the trainer's own model); the base never changes, so it is never sent again.

Targets (--lora_targets): Qwen3's module names, attention q/k/v/o_proj and MLP gate/up/down_proj.
On Qwen3-MoE the MLP names are its routed experts, which transformers v5 holds fused, one
(E, 2I, H) gate/up and one (E, H, I) down tensor: PEFT 0.21 maps the names to those tensors and
gives every expert its own A and B (the fused gate/up pair at rank 2r and alpha 2 alpha, so its
scale stays alpha / r):
    W_e -> W_e + (alpha / r) B_e A_e,   A (E r, in) viewed (E, r, in), B (out, E r) as (out, r, E)
The router, norms and embeddings are never adapted. What the engines take (vLLM 0.32): a dense
model's adapters on CPU and GPU; on CPU no LoRA on a MoE model at all (under LoRA vLLM runs every
MoE layer through Triton kernels its CPU build lacks, with attention-only adapters too:
run.lora_engine_args refuses); on GPUs the expert adapters in PEFT's fused layout
(`is_3d_lora_weight`), not run here.

Format: PEFT's own (adapter_config.json + adapter_model.safetensors, tensors named
base_model.model.<module>.lora_A.weight), as transformers' save_pretrained writes an adapter, so
peft, transformers and vLLM load what a run saves (tests/test_lora.py loads it in all three).

Symbols: r rank (--lora_rank), alpha (--lora_alpha), E experts, H hidden size, I expert
intermediate size. Dependencies: torch, transformers, peft.
Test: `pytest tests/test_lora.py`.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import torch

def lora_config(*, rank: int, alpha: float, dropout: float, targets: str, base: str = ""):
    """peft.LoraConfig of --lora_targets (comma-separated module names); `base`: the base model's
    name, written in the adapter."""
    from peft import LoraConfig
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, bias="none",
                      target_modules=[t.strip() for t in targets.split(",") if t.strip()],
                      base_model_name_or_path=base)


def adapts_experts(model) -> bool:
    """Whether the model's adapters include fused MoE experts (PEFT's parameter wrappers)."""
    return any(".experts." in n and "lora_" in n for n, _ in model.named_parameters())


def add_adapters(model, *, rank: int, alpha: float, dropout: float, targets: str,
                 base: str = ""):
    """Adapters on `model` in place (transformers' add_adapter: the model keeps its class, so
    Accelerate, logprobs.py and the engines take it as they take a plain one). PEFT freezes every
    other parameter; A and B become fp32 (a bf16 base would give them its dtype). Returns the
    adapted parameters' names."""
    with warnings.catch_warnings():
        # peft 0.21 gives the fused gate/up tensor rank 2r through a pattern it then reports as
        # matching no module (it matches the parameter: the doubled rank is applied)
        warnings.filterwarnings("ignore", message="The following (rank|alpha)_pattern keys")
        model.add_adapter(lora_config(rank=rank, alpha=alpha, dropout=dropout, targets=targets,
                                      base=base))
    from peft.tuners.tuners_utils import BaseTunerLayer
    ends = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
    if any(isinstance(m, BaseTunerLayer) and id(m) in ends for m in model.modules()):
        # logprobs.py projects the hidden states with the head's own weight, chunk by chunk: an
        # adapter on the head would reach the engine's tokens and never the trainer's log-probs
        raise SystemExit(f"--lora_targets {targets} adapts the embeddings or the output head: "
                         "adapters go on the attention and MLP projections only")
    for cfg in model.peft_config.values():  # add_adapter names the base by the model's path
        cfg.base_model_name_or_path = base  # (empty for a model built in memory, as tiny)
    names = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.data = p.data.float()  # fp32 masters, as full fine-tuning's
            names.append(name)
    if not names:
        raise SystemExit(f"--lora_targets {targets} matches no module of the model")
    return names


def is_adapted(model) -> bool:
    """Whether the model carries adapters (transformers' add_adapter sets its peft_config)."""
    return bool(getattr(model, "peft_config", None))


@contextlib.contextmanager
def adapters_off(model):
    """Every adapter of `model` switched off inside the block: each adapted layer returns its
    base layer's output alone, W x, exactly (a flag per layer, no weight changes)."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


class Reference(torch.nn.Module):
    """The KL reference pi_ref of a LoRA run: the policy with its adapters off, which is the
    starting policy (B = 0 at the start). It holds the policy as `module` without registering
    it, so it has no parameters of its own; logprobs.token_logprobs calls it as it calls any
    wrapper (every hook of the policy fires, FSDP2's unshards included)."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        object.__setattr__(self, "module", policy)  # not a submodule: no second set of weights

    def forward(self, *args, **kwargs):
        with adapters_off(self.module):
            return self.module(*args, **kwargs)


# what wrappers put into parameter names (activation checkpointing, torch.compile, FSDP1)
WRAPPER_PARTS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module")


def plain_name(name: str) -> str:
    """A parameter's name without the wrappers' parts (engine.checkpoint_name does the same)."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_PARTS)


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapters' full tensors by the model's own parameter names (a collective on FSDP2's
    sharded parameters: every rank calls it, in the same order)."""
    out = {}
    for name, p in model.named_parameters():
        if "lora_" in name:
            p = p.detach()
            out[plain_name(name)] = p.full_tensor() if hasattr(p, "full_tensor") else p
    return out


def export(accelerator, model, tokenizer, dest: Path, dtype, merge: bool = False) -> None:
    """The adapter in PEFT's format at `dest` (written beside it, then renamed into place), in
    `dtype`, with the tokenizer; merge: also dest/merged/, the base with the adapter merged in.
    Every rank takes part (the gathers); the main process writes."""
    from safetensors.torch import save_file
    unwrapped = accelerator.unwrap_model(model)
    adapters = {peft_name(k): v.to(dtype).contiguous() for k, v in adapter_state(model).items()}
    full = accelerator.get_state_dict(model) if merge else None  # the base too (a collective)
    if accelerator.is_main_process:
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file(adapters, str(tmp / "adapter_model.safetensors"))
        next(iter(unwrapped.peft_config.values())).save_pretrained(str(tmp))
        if getattr(unwrapped, "generation_config", None) is not None:  # its EOS ids
            unwrapped.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if merge:
            merged(type(unwrapped), unwrapped.config, full, tmp).save_pretrained(
                tmp / "merged", state_dict=None)
            tokenizer.save_pretrained(tmp / "merged")
            config = json.loads((tmp / "merged" / "config.json").read_text())
            (tmp / "merged" / "config.json").write_text(
                json.dumps({**config, "dtype": str(dtype).removeprefix("torch.")}, indent=2))
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    accelerator.wait_for_everyone()


def peft_name(name: str) -> str:
    """A trainer's adapter name as PEFT saves it: base_model.model.<module>.lora_A.weight (the
    adapter's own name, `default`, taken out)."""
    return "base_model.model." + re.sub(r"\.(lora_[AB])\.[^.]+\.", r".\1.", plain_name(name))


def base_state(state: dict) -> dict:
    """The base model's weights out of an adapted model's state dict: adapter tensors dropped,
    the wrapping layers' `base_layer.` taken out of the names."""
    return {plain_name(k).replace(".base_layer", ""): v for k, v in state.items()
            if "lora_" not in k}


def merged(cls, config, state: dict, adapter_dir: Path):
    """The base (`cls` of `config`, weights from the adapted model's `state`) with the adapter
    saved at `adapter_dir` merged in by peft itself (PeftModel.from_pretrained, merge_and_unload:
    W + (alpha / r) B A, what a user of the adapter would do), in the adapter's dtype."""
    from accelerate import init_empty_weights
    from peft import PeftModel
    with init_empty_weights(include_buffers=False):  # rotary tables are computed, not loaded
        base = cls(config)
    base.load_state_dict(base_state(state), assign=True, strict=False)
    base.tie_weights()  # a tied head is not in the state dict
    assert not any(p.is_meta for p in base.parameters()), "a base weight is missing"
    dtype = next(iter(adapter_tensors(adapter_dir).values())).dtype
    base.to(dtype)
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()


def adapter_tensors(adapter_dir: Path) -> dict[str, torch.Tensor]:
    """An adapter directory's tensors (adapter_model.safetensors), by their PEFT names."""
    from safetensors.torch import load_file
    return load_file(Path(adapter_dir) / "adapter_model.safetensors")
