"""Trainer-state offload: the trainer's fp32 parameters and AdamW moments wait in host RAM while
vLLM generates, and come back for the update (infrastructure, none of it the paper's).

Colocated GRPO holds two copies of the policy on each GPU: the trainer's (fp32 master shards,
AdamW's two moments: 12 bytes per parameter over the FSDP2 shards; with a KL term the frozen
bf16 reference, 2 more) and vLLM's (bf16 weights and the KV cache). Nothing reads the trainer's
copy between the weight sync and the next update, so `offload()` copies every tensor storage
behind it into host RAM and resizes the storage to zero, and `reload()` grows the storages back
and copies the bytes in. The tensors themselves
(parameters, optimizer state, FSDP2's sharded DTensors) stay the same Python objects, so the
optimizer, FSDP2 and the checkpointing code never notice. This is what verl (`param_offload`,
`optimizer_offload`) and slime (`offload_train`) do for the same reason. During the rollout it
frees the trainer's 12 bytes per parameter over the shards (4 for the fp32 parameters, 8 for the
two moments; 14 with the reference) for vLLM's KV cache; `python train.py --preflight` prints
the phases with and without it, and docs/gpu.md ("Memory per GPU") gives them for the paper's
models.

What the freed memory can serve depends on the caller's order. vLLM's KV cache is a pool of its
own (cuMemCreate under sleep mode), not torch's caching allocator: storage freed here stays in
torch's cache until `torch.cuda.empty_cache()`, which offload() calls, and it helps the KV cache
only if the KV cache is mapped after the offload. So the first offload runs before vLLM starts
(run.Run: vLLM maps its KV cache at start-up), train.py wakes vLLM's weights for the sync while
the trainer's state is on the device, offloads at the next step's start, and only then maps the
KV cache (vllm_engine.VLLMEngine.wake); the resume loads the optimizer state while vLLM sleeps.
`resident()` says where the state is at any moment (tests/test_memory_order.py replays the
loop's order on a ledger of device memory with it).

Deviations: none from the paper (it does not say where its trainer state lives). The host copies
live in one arena per process holding exactly their bytes (each storage's slot on an ALIGN
boundary), pinned on CUDA by registering its pages with the driver (cudaHostRegister): torch's
pinned allocator would round each buffer up to a power of two (a 192 MiB expert shard takes
256 MiB). Registering faults in and locks every page (seconds per 10 GiB), so the arena is
allocated and pinned once, at the first offload, sized for the parameters and the optimizer state
still to come (AdamW's moments appear at the first optimizer step: their shapes and dtypes are
the parameters'); it is replaced only by state larger than that (another optimizer's).
Bench: `python bench/offload.py` (round trip GB/s against a plain copy of the same bytes).
Dependencies: torch only. Test: `pytest tests/test_offload.py -m ""` (-m "": the loop's run too).
"""
from __future__ import annotations

import torch

ALIGN = 512  # bytes: each storage's slot in the arena starts on this boundary


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor that owns memory on this rank (an FSDP2 DTensor's local shard, else itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


def arena_layout(sizes: list[int], align: int = ALIGN) -> tuple[list[int], int]:
    """(each storage's offset, the arena's bytes) for storages of `sizes` bytes packed in one
    host arena: slots in order, each starting on an `align` boundary."""
    offsets, total = [], 0
    for n in sizes:
        offsets.append(total)
        total += -(-n // align) * align
    return offsets, total


def pin(buffer: torch.Tensor) -> None:
    """Page-lock a CPU tensor's memory in place, exactly its bytes, so copies to and from the GPU
    run at PCIe speed without a staging copy (unpin() undoes it)."""
    err = int(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.nbytes, 0))
    if err:
        raise RuntimeError(f"cudaHostRegister of the {buffer.nbytes:,}-byte offload arena failed "
                           f"(CUDA error {err})")


def unpin(buffer: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())


def release_cached(device: torch.device) -> None:
    """Give the memory that resize_(0) freed back to the driver: torch keeps it cached, where
    vLLM's KV cache (its own cuMemCreate pool) cannot map it."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


class TrainerOffload:
    """offload() / reload() the storages of `model`'s parameters, `optimizer`'s state tensors and
    the frozen `reference` model's parameters (the KL term's; None: none). Disabled
    (enabled=False) both calls do nothing, so the loop calls them unconditionally.

    reload(optimizer=False) brings back the parameters (the reference's too) only: the AdamW
    moments then come back in a pre-hook of the optimizer's step, so they are not on the device
    during the forward and backward passes: the update's forward/backward peak is lower by their
    8 bytes per parameter over the shards (docs/gpu.md, "Memory per GPU", gives the preflight's
    figures)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 reference: torch.nn.Module | None = None, enabled: bool = True):
        self.model, self.optimizer, self.enabled = model, optimizer, enabled
        self.reference = reference
        # the host copies: one buffer, laid out (arena_layout) anew at each offload
        self.arena: torch.Tensor | None = None
        self.pinned = False
        self.away: list[tuple[torch.UntypedStorage, int, int, bool]] = []  # (.., bytes, at, param)
        if enabled:  # whatever is still away comes back before the step reads it
            inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper holds it
            inner.register_step_pre_hook(self._before_step)

    def _state(self) -> dict[str, list[torch.Tensor]]:
        """The tensors behind the trainer's state, by kind (resident() names the kinds)."""
        params = list(self.model.parameters())
        return {"params": params, "grads": [p.grad for p in params if p.grad is not None],
                "moments": [v for state in self.optimizer.state.values() for v in state.values()
                            if isinstance(v, torch.Tensor)],
                "reference": list(self.reference.parameters()) if self.reference else []}

    def _storages(self) -> list[tuple[torch.UntypedStorage, bool]]:
        """(storage, is a parameter's) of each distinct non-empty storage behind the parameters,
        the reference's and the optimizer state (one shared by several views, as FSDP2's padded
        shards, is listed once), parameters first."""
        state = self._state()
        seen, out = set(), []
        for is_param, tensors in ((True, state["params"]), (True, state["reference"]),
                                  (False, state["moments"])):
            for t in tensors:
                local = _local(t)
                if not local.untyped_storage().resizable():  # torch.load's (a resume on CPU)
                    with torch.no_grad():
                        local.set_(local.clone())  # the same tensor, on storage of its own
                storage = local.untyped_storage()
                if storage.nbytes() and storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    out.append((storage, is_param))
        return out

    def resident(self) -> dict[str, int]:
        """Bytes of the trainer's state on its device now, by kind: "params", "grads" (from a
        backward until the optimizer step's zero_grad), "moments" (the optimizer's state) and
        "reference" (its parameters), each storage counted once. Works disabled too (then
        everything stays resident)."""
        seen, out = set(), {}
        for kind, tensors in self._state().items():
            out[kind] = 0
            for t in tensors:
                storage = _local(t).untyped_storage()
                if storage.nbytes() and storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    out[kind] += storage.nbytes()
        return out

    def _before_step(self, *_) -> None:
        self.reload()

    def state_to_come(self) -> list[int]:
        """Bytes of each optimizer state tensor that does not exist yet, from the parameters:
        Adam / AdamW (what run.py builds) give each trainable parameter without state its step
        counter (an fp32 scalar) and two moments shaped and typed as its local shard (three with
        amsgrad). Other optimizers: none known (the arena grows when their state appears)."""
        inner = getattr(self.optimizer, "optimizer", self.optimizer)  # Accelerate's wrapper
        if not isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            return []
        out = []
        for group in inner.param_groups:
            moments = 3 if group.get("amsgrad") else 2
            for p in group["params"]:
                if p.requires_grad and not inner.state.get(p):
                    local = _local(p)
                    out += [4] + [local.numel() * local.element_size()] * moments
        return out

    def _arena_for(self, sizes: list[int], device: torch.device) -> list[int]:
        """The offsets of storages of `sizes` bytes in the arena: allocated (and pinned) at the
        first offload for them and the state still to come, replaced only if they outgrow it."""
        offsets, total = arena_layout(sizes)
        if self.arena is None or total > self.arena.nbytes:
            if self.pinned:
                unpin(self.arena)
            self.arena = None  # the old arena is freed before the new one is allocated
            self.arena = torch.empty(arena_layout(sizes + self.state_to_come())[1],
                                     dtype=torch.uint8)
            self.pinned = device.type == "cuda"
            if self.pinned:
                pin(self.arena)
        return offsets

    def offload(self) -> int:
        """Move the trainer's state to host RAM; returns the bytes freed on the device."""
        if not self.enabled or self.away:
            return 0
        storages = self._storages()
        if not storages:
            return 0
        sizes, device = [s.nbytes() for s, _ in storages], storages[0][0].device
        for (storage, is_param), n, at in zip(storages, sizes, self._arena_for(sizes, device)):
            view = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)  # (n,)
            self.arena[at:at + n].copy_(view, non_blocking=storage.device.type == "cuda")
            self.away.append((storage, n, at, is_param))
        if device.type == "cuda":
            torch.cuda.synchronize()  # every copy landed before the memory is given back
        for storage, *_ in self.away:
            storage.resize_(0)
        release_cached(device)
        return sum(n for _, n, _, _ in self.away)

    def reload(self, optimizer: bool = True) -> int:
        """Bring the trainer's state (without `optimizer`: its parameters only) back to its
        device; returns the bytes restored."""
        back = [a for a in self.away if optimizer or a[3]]
        self.away = [a for a in self.away if not (optimizer or a[3])]
        for storage, n, at, _ in back:
            storage.resize_(n)
            view = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            view.copy_(self.arena[at:at + n], non_blocking=storage.device.type == "cuda")
        if back and back[0][0].device.type == "cuda":
            torch.cuda.synchronize()
        return sum(n for _, n, _, _ in back)
