"""Rollout engines: where SPADE's tokens come from (infrastructure).

SPADE (arXiv 2608.19197) trains one policy that both writes environments (designer) and plays them
(agent); every token either role emits is sampled here, from a model that models.py loads, or in
vllm_engine.py's `VLLMEngine`, which takes this file's weight plan; it comes back as a
stream.Completion through a request stream (stream.py: the protocol agent.play and
designer.regenerate take, and the turn barrier).

1. `TransformersEngine`: a turn barrier's engine (its streams: `barrier`, stream.Batched over its
   generate); length-sorted, token-budgeted, left-padded batches with a KV cache, on CPU
   or on GPUs under FSDP2 (ranks decode in lockstep); top-k / top-p sampling over the k sorted
   candidates, and over the whole vocabulary unsorted when nothing is truncated (one uniform
   per row against the fp64 cumulative probabilities; bench/rollout.py times it against
   transformers' own `generate`). It returns log p(token) under
   softmax(logits / T), NOT renormalised after top-k / top-p: exactly what the trainer recomputes
   (logprobs.token_logprobs), so the truncated importance weight sees only numeric drift; a head
   that computes in bf16 (autocast, FSDP2: the GPU runs) returns fp32 logits (`fp32_head`). An
   optional prefix KV cache, bounded in bytes, lets each agent turn prefill only its new tokens
   (run.rollout_engine keeps one for the tiny models only: an episode's fp32 KV is
   2 x layers x KV heads x head dim x 4 bytes per token, gigabytes for a real model's 32k-token
   episode).
2. Weight sync after each update, for vLLM (vllm_engine.py): `vllm_weight_plan` maps trainer names
   and shapes to the checkpoint names vLLM loads (pure, so it runs on a meta-device model),
   un-fusing transformers-v5 Qwen3-MoE experts; `stream_weights` gathers full tensors (FSDP2,
   ZeRO-3) one decoder layer at a time, cast to vLLM's dtype before the gather (bf16: half the
   bytes of fp32 master weights), for vLLM's in-place reload. A LoRA run (--lora_rank,
   infra/lora.py) syncs its adapters alone (`adapter_weights`); the transformers engine samples
   from the trainer's own (adapted) model and syncs nothing.

Symbols: B batch, T tokens, V vocabulary, E experts, H hidden, I expert intermediate size.
Dependencies: stream.py beside it; torch, transformers.
Test: `pytest tests/test_engine*.py -m ""` (-m "": the ranks too); bench: `python bench/rollout.py`.
"""
from __future__ import annotations

import contextlib
import itertools
import re

import torch
import torch.distributed as dist

from infra.stream import Batched, Completion, per_prompt_caps


# ----------------------------------------------------------------------------------------------
# INFRA: the transformers engine's request stream (stream.py: the protocol and the barrier)


def barrier(engine, sampling: dict, seed, max_new_tokens: int | None = None, render=None,
            on_reply=None) -> Batched:
    """A turn barrier (stream.Batched) over engine.generate(prompts, *, max_new_tokens, seed,
    temperature, top_p, top_k): one role's sampling bound, the k-th generate call seeded seed(k).
    render: chat -> tokens (None: prompts are tokens); on_reply(completions): told of every
    collected reply (the sampler's token count)."""
    calls = itertools.count(1)

    def generate(prompts, caps):
        return engine.generate(prompts, max_new_tokens=caps, seed=seed(next(calls)), **sampling)
    return Batched(generate, max_new_tokens, render, on_reply, serve=engine.serve)


class Batching:
    """What an engine with only a batched generate(prompts, *, max_new_tokens, temperature,
    top_p, top_k, seed) adds for the loop: its streams (turn barriers), serve and the end of a
    phase."""

    def stream(self, sampling: dict, seed, max_new_tokens: int | None = None, render=None,
               on_reply=None) -> Batched:
        return barrier(self, sampling, seed, max_new_tokens, render, on_reply)

    def serve(self, fn):
        return fn()

    def drain(self) -> None:
        """The end of a phase: nothing to wait for on one process."""


# ----------------------------------------------------------------------------------------------
# INFRA: top-k / top-p sampling


def _candidates(scaled: torch.Tensor, top_k: int, top_p: float):
    """The tokens top-k / top-p sampling may pick: (values, ids), sorted descending, with -inf on
    tokens outside the smallest prefix holding top_p of the (top-k) mass. Only k columns are
    sorted and sampled over, which keeps a batched step cheap. Nothing truncated (top_k off or
    >= V, top_p 1): (scaled, None), the whole vocabulary in its own order, never sorted (the sort
    was a fifth of a decode step)."""
    if 0 < top_k < scaled.shape[-1]:
        values, ids = torch.topk(scaled, top_k, dim=-1)                       # (B, k), sorted
    elif top_p < 1.0:
        values, ids = torch.sort(scaled, dim=-1, descending=True)             # (B, V)
    else:
        return scaled, None
    if top_p < 1.0:
        probs = torch.softmax(values, dim=-1)
        drop = probs.cumsum(-1) - probs > top_p  # mass BEFORE a token already reaches top_p
        values = values.masked_fill(drop, float("-inf"))
    return values, ids


@contextlib.contextmanager
def fp32_head(model):
    """The model's output head returns fp32 logits inside this block. A head computed in half
    precision (bf16 under Accelerate's autocast, or FSDP2's bf16 parameters: the GPU runs) rounds
    each logit to bf16, steps of 0.0625 at |logit| in [8, 16), before the sampler sees it, while
    the trainer's log-probs come from fp32 logits (logprobs.py): every rollout log-prob, and so
    the TIS weight, would carry that rounding. Half operands are multiplied with an fp32 result
    (the trainer's arithmetic: on CUDA one bf16 x bf16 -> fp32 matmul, no fp32 weight copy); a
    head already computed in fp32 runs as before. The head's own hooks (FSDP2's unshard) still
    fire: only its forward is swapped."""
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        yield
        return
    own, had = head.forward, "forward" in head.__dict__

    def forward(h):                                                            # (B, T, H)
        device = h.device.type
        cd = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else \
            torch.promote_types(h.dtype, head.weight.dtype)
        if cd not in (torch.float16, torch.bfloat16):
            return own(h)
        x, w = h.reshape(-1, h.shape[-1]).to(cd), head.weight.to(cd)        # (B*T, H), (V, H)
        logits = None
        with torch.autocast(device, enabled=False):
            if x.is_cuda:
                with contextlib.suppress(RuntimeError, TypeError):  # a torch without the kernel
                    logits = torch.mm(x, w.T, out_dtype=torch.float32)         # (B*T, V)
            if logits is None:  # CPU has no half x half -> fp32 kernel: the same products
                logits = x.float() @ w.float().T
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias.float()
        return logits.reshape(*h.shape[:-1], -1)                               # (B, T, V)
    head.forward = forward
    try:
        yield
    finally:
        if had:
            head.forward = own
        else:
            del head.forward


def _inverse_cdf(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """(B,) one token per row of probs (B, V): the first whose cumulative probability exceeds u
    ~ U(0, 1) x the row's total. One random number per row instead of torch.multinomial's B x V
    exponentials (the costlier part of a step's sampling over a whole vocabulary); the running
    sum is fp64, so no token's share moves by more than 1e-16 (in fp32 a tail token below
    half an ulp of the sum, 3e-8, could not be drawn at all)."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)                              # (B, V)
    u = torch.rand((len(probs), 1), generator=gen, dtype=torch.float64, device=probs.device)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1)       # (B,)


class TransformersEngine(Batching):
    """Batched sampling with a plain transformers model (CPU, or GPUs under FSDP2).

    Prompts sorted by length fill batches of rows x (longest prompt + largest cap) <=
    max_batch_tokens, bounding KV cache and padding (a tqdm bar per batch when progress). A batch
    is one left-padded prefill, then one decode step per token; rows leave at EOS or their cap.
    prefix_cache_bytes > 0 (0: off) keeps the KV of each prompt + reply that ended at EOS for the
    prompt that extends it (the agent's next turn); entries go when used, oldest first beyond the
    bound, and on sync_weights. FSDP2 with several ranks: every forward all-gathers (a
    collective), so ranks vote before each forward and step a 1-token dummy until all are done
    (transformers' synced_gpus); drain() ends a phase. Sampling runs under no_grad, not
    inference_mode, whose tensors, kept by FSDP2, would break the next training forward.
    """

    def __init__(self, model, tokenizer, prefix_cache_bytes: int = 0, stop_ids=(),
                 max_batch_tokens: int = 65536, progress: bool = False):
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_tokens, self.progress = max_batch_tokens, progress
        self.synced = hasattr(next(model.parameters()), "full_tensor") and \
            dist.is_initialized() and dist.get_world_size() > 1
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos = [eos] if isinstance(eos, int) else list(eos or ())
        self.eos_ids = {tokenizer.eos_token_id, *eos, *stop_ids}  # + the chat's end of turn
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
            else tokenizer.eos_token_id
        self.prefix_cache, self.cache_bytes = prefix_cache_bytes > 0, prefix_cache_bytes
        self._pasts: dict[tuple, torch.Tensor] = {}  # tokens -> their KV, (layers, 2, h, n, d)

    def _take_past(self, prompt: list[int]):
        """The longest cached (length, KV) that is a strict prefix of prompt, taken out."""
        for n in sorted({len(k) for k in self._pasts}, reverse=True):
            key = tuple(prompt[:n])
            if n < len(prompt) and key in self._pasts:
                return n, self._pasts.pop(key)
        return 0, None

    def _keep_past(self, cache, k: int, attn_row: torch.Tensor, tokens: list[int]) -> None:
        """Store batch row k's KV (padding removed), which covers `tokens`."""
        valid = attn_row.nonzero().squeeze(1)                                    # (n,)
        assert len(valid) == len(tokens)
        self._pasts[tuple(tokens)] = torch.stack([torch.stack(
            (layer.keys[k, :, valid], layer.values[k, :, valid])) for layer in cache.layers])
        while self.cached_bytes() > self.cache_bytes:  # dicts keep insertion order: oldest first
            del self._pasts[next(iter(self._pasts))]

    def cached_bytes(self) -> int:
        return sum(kv.nbytes for kv in self._pasts.values())

    def _prefill(self, prompts: list[list[int]], device):
        """Left-padded prefill of the prompts' uncached suffixes on top of their cached pasts."""
        B = len(prompts)
        pasts = [self._take_past(p) if self.prefix_cache else (0, None) for p in prompts]
        P = max(n for n, _ in pasts)
        S = max(len(p) - n for p, (n, _) in zip(prompts, pasts))
        ids = torch.full((B, S), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, P + S), dtype=torch.long)
        pos = torch.zeros((B, S), dtype=torch.long)
        for b, (p, (n, _)) in enumerate(zip(prompts, pasts)):
            # row layout: [pad | cached past (n) | pad | new tokens]; every row ends at column P+S
            new = p[n:]
            ids[b, S - len(new):] = torch.tensor(new, dtype=torch.long)
            attn[b, P - n:P] = 1
            attn[b, P + S - len(new):] = 1
            pos[b, S - len(new):] = torch.arange(n, len(p))
        cache = None
        if P > 0:  # the rows' pasts, left-padded into one batch cache (holes are masked)
            like = next(kv for _, kv in pasts if kv is not None)                # (L, 2, h, n, d)
            L, _, h, _, d = like.shape
            kv = like.new_zeros((L, 2, B, h, P, d))                             # (L, 2, B, h, P, d)
            for b, (n, past) in enumerate(pasts):
                if past is not None:
                    kv[:, :, b, :, P - n:] = past
            from transformers import DynamicCache
            cache = DynamicCache([(k, v) for k, v in kv], config=self.model.config)
        ids, attn, pos = ids.to(device), attn.to(device), pos.to(device)
        out = self._forward(input_ids=ids, attention_mask=attn, position_ids=pos,
                            past_key_values=cache, use_cache=True,
                            logits_to_keep=1)  # only the last position's logits: (B, 1, V)
        return out, attn, pos

    def _tick(self, active: bool) -> bool:
        """INFRA (FSDP2, several ranks): the vote before a forward; True while any rank has one."""
        if not self.synced:
            return active
        flag = torch.tensor([int(active)], device=next(self.model.parameters()).device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _forward(self, **inputs):
        self._tick(True)
        with fp32_head(self.model):
            return self.model(**inputs)

    @torch.no_grad()
    def drain(self) -> None:
        """End of a phase: join the other ranks' forwards until every rank has finished."""
        while self._tick(False):
            self.model(input_ids=torch.full((1, 1), self.pad_id, dtype=torch.long,
                                            device=next(self.model.parameters()).device),
                       use_cache=False, logits_to_keep=1)

    def _batches(self, prompts: list[list[int]], caps: list[int]) -> list[list[int]]:
        """Prompt indices by length, cut into batches of rows x (longest + largest cap) tokens
        <= max_batch_tokens (a longer prompt alone is its own batch)."""
        batches, top_cap = [[]], 0
        for i in sorted(range(len(prompts)), key=lambda i: len(prompts[i])):
            top_cap = max(top_cap, caps[i])
            if batches[-1] and (len(batches[-1]) + 1) * (len(prompts[i]) + top_cap) > \
                    self.max_batch_tokens:
                batches.append([])
                top_cap = caps[i]
            batches[-1].append(i)
        return [sorted(b) for b in batches if b]

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int | list[int],
                 temperature: float = 0.6, top_p: float = 0.95, top_k: int = 20,
                 seed: int | None = None) -> list[Completion]:
        from tqdm.auto import tqdm
        caps = per_prompt_caps(max_new_tokens, len(prompts))
        gen = torch.Generator(device=next(self.model.parameters()).device)
        if seed is None:
            gen.seed()  # fresh entropy: unseeded calls differ
        else:
            gen.manual_seed(seed)
        done: list[Completion | None] = [None] * len(prompts)
        for batch in tqdm(self._batches(prompts, caps), desc="generate", unit="batch",
                          leave=False, disable=not self.progress):
            outs = self._sample([prompts[i] for i in batch], [caps[i] for i in batch],
                                temperature, top_p, top_k, gen)
            for i, completion in zip(batch, outs):
                done[i] = completion
        return done

    def _sample(self, prompts: list[list[int]], caps: list[int], temperature: float,
                top_p: float, top_k: int, gen: torch.Generator) -> list[Completion]:
        """One batch: a left-padded prefill, then one decode step per token for the live rows."""
        B, device = len(prompts), gen.device
        out, attn, pos = self._prefill(prompts, device)
        pos = pos[:, -1:]                                                        # (B, 1)
        cache, logits = out.past_key_values, out.logits[:, -1, :].float()       # (B, V)
        tokens, logps = [[] for _ in range(B)], [[] for _ in range(B)]
        reasons = ["length" if c <= 0 else "" for c in caps]
        rows = list(range(B))  # batch row k holds prompt rows[k]; finished rows leave the batch
        for _ in range(max(caps)):
            if temperature > 0:
                scaled = logits / temperature
                values, ids = _candidates(scaled, top_k, top_p)
                probs = torch.softmax(values, dim=-1)
                if ids is None:  # the whole vocabulary, in its own order
                    nxt = _inverse_cdf(probs, gen)                               # (b,)
                else:
                    pick = torch.multinomial(probs, 1, generator=gen)           # (b, 1)
                    nxt = ids.gather(1, pick).squeeze(1)
            else:
                scaled, nxt = logits, logits.argmax(-1)
            # log p(token) under softmax(logits / T), un-truncated: what the trainer recomputes
            lp = torch.log_softmax(scaled, dim=-1).gather(1, nxt[:, None]).squeeze(1)  # (b,)
            for k, (b, t, l) in enumerate(zip(rows, nxt.tolist(), lp.tolist())):
                if reasons[b]:  # a row asked for 0 new tokens
                    continue
                tokens[b].append(t)
                logps[b].append(l)
                if t in self.eos_ids:
                    reasons[b] = "stop"
                    if self.prefix_cache:  # the cache holds prompt + reply minus its last token
                        self._keep_past(cache, k, attn[k], prompts[b] + tokens[b][:-1])
                elif len(tokens[b]) >= caps[b]:
                    reasons[b] = "length"
            keep = [k for k, b in enumerate(rows) if not reasons[b]]
            if not keep:
                break
            if len(keep) < len(rows):  # drop finished rows so each step costs only live ones
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                attn, pos, nxt = attn[index], pos[index], nxt[index]
                rows = [rows[k] for k in keep]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)         # (b, L + step)
            pos = pos + 1
            out = self._forward(input_ids=nxt[:, None], attention_mask=attn, position_ids=pos,
                                past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache, logits = out.past_key_values, out.logits[:, -1, :].float()
        return [Completion(t, l, self.tokenizer.decode(t, skip_special_tokens=True), r)
                for t, l, r in zip(tokens, logps, reasons)]

    def sync_weights(self, model) -> None:
        """Copy the trainer's weights in (nothing to copy when the engine samples from the same
        model, a LoRA run's included: it samples with the adapters the trainer updates in place);
        cached prefixes were computed with the old weights and are dropped."""
        self._pasts.clear()
        self.sync_bytes = 0  # perf/sync_bytes: what this sync copies
        if model is self.model:
            return
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, param in model.named_parameters():
                full = _full_tensor(param)
                own[checkpoint_name(name)].copy_(full)
                self.sync_bytes += full.nbytes

    def sleep(self) -> None:
        """Nothing to free, restore or shut down: the transformers engine shares the trainer's
        model (wake and close are this no-op too)."""

    wake = close = sleep


# ----------------------------------------------------------------------------------------------
# INFRA: weight sync, trainer parameters -> vLLM checkpoint names

WRAPPER_PARTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def checkpoint_name(name: str) -> str:
    """Strip wrapper components (FSDP1, activation checkpointing, torch.compile, DDP/DeepSpeed
    `module.`) from a parameter name."""
    parts = [p for p in name.split(".") if p not in WRAPPER_PARTS]
    while parts and parts[0] == "module":
        parts.pop(0)
    return ".".join(parts)


def vllm_weight_plan(name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...], tuple]]:
    """Map one trainer parameter to the checkpoint tensors vLLM's `load_weights` expects.

    Returns [(checkpoint name, shape, index)] where `full_tensor[index]` is that checkpoint tensor.
    Pure (names and shapes only), so it runs on a meta-device model. transformers v5 keeps Qwen3-MoE
    experts fused; checkpoints (and save_pretrained, which converts back) are per expert:
      mlp.experts.gate_up_proj [E, 2I, H] -> mlp.experts.{e}.gate_proj.weight = [e, :I]  (I, H)
                                             mlp.experts.{e}.up_proj.weight   = [e, I:]  (I, H)
      mlp.experts.down_proj    [E, H, I]  -> mlp.experts.{e}.down_proj.weight = [e]      (H, I)
    """
    name = checkpoint_name(name)
    if name.endswith("mlp.experts.gate_up_proj"):
        E, two_i, H = shape
        I, stem = two_i // 2, name[:-len("gate_up_proj")]
        gate, up = slice(0, I), slice(I, two_i)  # gate rows first, as save_pretrained splits them
        return [item for e in range(E) for item in (
            (f"{stem}{e}.gate_proj.weight", (I, H), (e, gate)),
            (f"{stem}{e}.up_proj.weight", (I, H), (e, up)))]
    if name.endswith("mlp.experts.down_proj"):
        E, H, I = shape
        stem = name[:-len("down_proj")]
        return [(f"{stem}{e}.down_proj.weight", (H, I), (e,)) for e in range(E)]
    return [(name, tuple(shape), ())]


def _full_tensor(param: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole tensor behind a possibly sharded parameter, cast to `dtype` BEFORE the gather
    (a collective on sharded ones: every rank must call this in the same order)."""
    if hasattr(param, "ds_id"):  # DeepSpeed ZeRO-3: gather into place, copy out, re-partition
        import deepspeed
        with deepspeed.zero.GatheredParameters([param]):
            return param.data.detach().to(dtype or param.dtype, copy=True)
    param = param.detach().to(dtype or param.dtype)
    return param.full_tensor() if hasattr(param, "full_tensor") else param  # FSDP2: DTensors


def adapter_weights(model, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """A LoRA model's adapter tensors (parameters named lora_A / lora_B), full (gathered: a
    collective on sharded ones) and cast to `dtype`, under the names PEFT saves them with:
    base_model.model.<module>.lora_A.weight (the adapter's own name, `default`, taken out)."""
    out = {}
    for name, param in model.named_parameters():
        if "lora_" in name:
            key = re.sub(r"\.(lora_[AB])\.[^.]+\.", r".\1.", checkpoint_name(name))
            out[f"base_model.model.{key}"] = _full_tensor(param, dtype)
    return out


def _layer_of(name: str) -> str:
    parts = checkpoint_name(name).split(".")
    return ".".join(parts[:3]) if len(parts) > 2 and parts[1] == "layers" else ""


def stream_weights(model, dtype: torch.dtype | None = None):
    """Yield the full weights one decoder layer at a time, as [(checkpoint name, tensor)] lists in
    `dtype` (None: the parameters' own). Peak extra memory is one layer's full tensors (its
    parameter count x the bytes of `dtype`), never the whole model."""
    group, layer = [], None
    for name, param in model.named_parameters():
        if group and _layer_of(name) != layer:
            yield group
            group = []
        layer = _layer_of(name)
        full = _full_tensor(param, dtype)
        group += [(target, full[index]) for target, _, index in
                  vllm_weight_plan(name, tuple(full.shape))]
    if group:
        yield group
