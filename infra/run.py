"""train.py's infrastructure, none of it the paper's: Accelerate, the policy with its optimizer
and frozen reference, the rollout engine (rollout_engine, eval.py's too) and the sampler bound to
it, the distributed set-up (process groups, FSDP2, the engine's limits), and --preflight's
reading of the run for preflight.py (preflight_plan). A reader of Algorithm 1 may skip this file:
what the paper logs is computed in metrics.py, what it trains in train.py. The run directory's files
(metrics.jsonl rows, reduced over ranks here; checkpoints, exports, the per-step files) are
written by rundir.py, whose docstring is their schema; the held-out evaluations during the run
(--eval_every) by evaluation.py.
Test: `pytest tests/test_train.py tests/test_train_e2e.py -m ""` (-m "": the runs too).
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import importlib.util
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, gather_object, set_seed
from tqdm.auto import tqdm

import agent
import grpo
from infra import (config, engine, evaluation, lora, metrics, models, offload, preflight,
                   rundir, sampling, telemetry, vllm_engine)


@dataclass
class Trainer:
    """What one GRPO update (train.grpo_update) acts on: the policy, AdamW and its learning-rate
    schedule, prepared by the Accelerator (which runs the update's collectives, backward and
    gradient clipping), and the frozen KL reference (None without a KL term)."""
    model: Any
    optimizer: Any
    scheduler: Any
    accelerator: Any
    ref_model: Any = None


@dataclass
class StepLog:
    """What one step's phases leave for Run.log: its metrics and phase times (its metrics.jsonl
    row), and the records of its per-step files (rundir.write_step_files)."""
    step: int
    metrics: dict = field(default_factory=dict)    # filled phase by phase
    times: dict = field(default_factory=dict)      # phase -> its start (train.phase)
    episodes: list = field(default_factory=list)   # the step's plays (agent.Episode)
    new_pool: list = field(default_factory=list)   # a regeneration's new pool (train.PoolEnv)
    proposals: list = field(default_factory=list)  # a regeneration's designer attempts, as logged
    scored: list = field(default_factory=list)     # the finished epoch's train.Design, scored


class Run:
    """The infrastructure around the loop: Accelerate, the policy with its optimizer and frozen
    reference, the rollout engine and the samplers bound to it, the run directory."""

    def __init__(self, cfg: config.Config):
        self.config = cfg
        margs, rargs = cfg.model, cfg.run
        expandable_segments(os.environ)  # before CUDA starts (Accelerator below starts it)
        # INFRA: collectives wait for the slowest rank (16k-token designer rounds, uneven
        # tensor-parallel groups): NCCL's 10-minute default would abort a healthy run
        timeout = [InitProcessGroupKwargs(timeout=pg_timeout(margs))]
        self.accelerator = acc = Accelerator(log_with=trackers(rargs.log_with),
                                             project_dir=rargs.output_dir, kwargs_handlers=timeout)
        self.run_dir = Path(rargs.output_dir)
        # the Config as config.json saves it, one flat dict (the resume check, the trackers)
        self.flat_config = config.config_dict(cfg)
        self.resume_from = rundir.prepare_run_dir(self.run_dir, self.flat_config, rargs, acc)
        set_seed(rargs.seed)
        self.rank, self.world, self.main = acc.process_index, acc.num_processes, acc.is_main_process
        # this rank's designer slots
        self.n_slots = len(range(self.rank, cfg.loop.num_envs, self.world))
        self.evaluation = evaluation.from_config(cfg, self.run_dir, self.rank, self.world,
                                                 self.gather)  # --eval_every, before any weights
        self.eval_row: dict = {}  # the next metrics row's eval/* and time/eval_s (evaluate)
        check_vllm_fits(margs, self.world)  # before any weight loads
        fp32_gradient_reduce(acc)
        # fp32 master weights (bf16 compute comes from Accelerate's mixed precision); the
        # shipped dtype (bf16 for the paper's models) for the reference model and the exports
        self.shipped = models.shipped_dtype(margs.model)
        # INFRA: with FSDP2's cpu_ram_efficient_loading Accelerate's prepare fills every rank's
        # shards from the main process: only it reads the weights, the others build on `meta`
        fsdp = getattr(acc.state, "fsdp_plugin", None)
        empty = bool(fsdp2(acc) and fsdp.cpu_ram_efficient_loading and not self.main)
        model, self.tokenizer = load_policy(margs, rargs.seed, self.shipped, empty)
        if empty:
            unwritten_storage(model)
        model.eval()  # rollouts run in eval mode; grpo_update switches to train mode and back
        tiny = models.is_tiny(margs.model)
        fsdp_checkpoints = getattr(fsdp, "activation_checkpointing", False)
        if margs.gradient_checkpointing and not tiny and not fsdp_checkpoints:
            model.gradient_checkpointing_enable()  # FSDP configs checkpoint layers themselves
        self.trainer = t = build_trainer(acc, model, cfg, self.shipped, empty)
        # FSDP2 runs the transformers engine too (ranks decode in lockstep); ZeRO-3 and FSDP1
        # need vLLM
        sharded = acc.distributed_type.value == "DEEPSPEED" or (
            fsdp is not None and getattr(fsdp, "fsdp_version", 1) != 2)
        # the trainer's state (and the KL reference) in host RAM while vLLM generates (no-ops
        # without the flag), away before vLLM starts: it wants util x card free at start-up
        self.offload = offload.TrainerOffload(t.model, t.optimizer, reference=t.ref_model,
                                              enabled=margs.offload_trainer)
        self.engine = make_engine(cfg, acc.unwrap_model(t.model), self.tokenizer,
                                  rargs.seed, sharded, before_start=self.offload.offload)
        self.temperatures = config.role_temperatures(cfg)
        self.peak = mfu_peak(model.config, self.main)
        # the streams of every designer, hint and agent request: seeds from (seed, step, role, n),
        # with a rank's seed: --seed itself on rank 0 (a one-process run's), on rank r > 0
        # derive_seed(seed, "rank", r)
        seed = rargs.seed if self.rank == 0 else sampling.derive_seed(rargs.seed, "rank", self.rank)
        self.sampler = sampling.Sampler(self.engine, self.tokenizer, seed)

    def resume(self) -> dict | None:
        """With --resume: the checkpoint's weights and optimizer, the engine synced to them, and
        this rank's saved loop state (the metrics of the steps to replay are dropped). vLLM
        sleeps first and the parameters come back from the start-up offload: the optimizer state
        lands on the device beside no KV cache (which comes back at the first step, after the
        offload, as every step's does)."""
        if self.resume_from is None:
            return None
        self.engine.sleep()
        self.offload.reload()
        self.accelerator.load_state(str(self.resume_from))
        st = rundir.load_state(self.resume_from, self.rank)
        if st["world"] != self.world:
            raise SystemExit(f"--resume: the run used {st['world']} processes, this launch has "
                             f"{self.world}")
        if self.main:
            rundir.cut_metrics(self.run_dir, st["metrics_lines"])
        self.engine.sync_weights(self.accelerator.unwrap_model(self.trainer.model))
        return st

    def steps(self, start: int, sandbox_level: str):
        """The steps still to run, as the main process's progress bar (`sandbox_level`: the
        sandbox's, which each metrics row records). Each step starts with the
        rollouts' memory, in this order: the trainer's state to host RAM (--offload_trainer),
        then vLLM's KV cache mapped (released since the last update) into what that freed (at a
        fresh run's first step both are no-ops: the state left before vLLM started, whose KV
        cache has been mapped since)."""
        if self.main:  # W&B's offline files in the run directory; each tracker's run named as it
            name = self.run_dir.resolve().name
            self.accelerator.init_trackers("spade", config=self.flat_config, init_kwargs={
                "wandb": {"dir": str(self.run_dir), "name": name}, "trackio": {"name": name}})
            print(f"[spade] run dir {self.run_dir.resolve()}  sandbox level: {sandbox_level}  "
                  f"world {self.world}")
        steps, self.sandbox_level = self.config.loop.steps, sandbox_level
        self.bar = tqdm(range(start, steps), initial=start, total=steps, desc="spade",
                        disable=not self.main)
        for step in self.bar:
            self.offload.offload()
            self.engine.wake()
            yield step

    @contextlib.contextmanager
    def trainer_on_device(self):
        """The update's memory, in this order: colocated vLLM sleeps (frees its weights and KV
        cache), then the trainer's parameters come back (the AdamW moments come back at the
        optimizer's step, a pre-hook of offload.TrainerOffload, so they are away during the
        forward and backward passes); after the body whatever is still away comes back (an
        update without samples never called the optimizer). No-ops without --offload_trainer
        and vLLM. An exception in the body stops the run: nothing is reloaded."""
        self.engine.sleep()
        self.offload.reload(optimizer=False)
        yield
        self.offload.reload()

    def evaluate(self, step: int) -> None:
        """INFRA: the held-out suites (--eval_every, evaluation.py) on the current weights, when
        `step` is due: a step's before its phases (its eval/* and time/eval_s join the step's
        row), step S after the last update, in a row of its own, with the rollouts' memory of a
        step's start (the trainer's state off the device, vLLM's KV cache mapped) and the
        update's after it, as finish() expects."""
        if self.evaluation is None or not self.evaluation.due(step):
            return
        last = step == self.config.loop.steps
        if last:
            self.offload.offload()
            self.engine.wake()
        self.eval_row = self.evaluation.run(step, self.engine, self.tokenizer,
                                            max_model_len(self.config))
        if last:
            self.engine.sleep()
            self.offload.reload()
            row, self.eval_row = {**self.eval_row, "charts/step": step}, {}
            if self.main:
                rundir.append_metrics(self.run_dir, row)
                self.accelerator.log(row, step=step)

    def gather(self, items: list) -> list:
        """Every rank's items, rank after rank (a collective: every rank calls it)."""
        if self.world == 1:
            return list(items)
        return gather_object(items)

    def log(self, step_log: StepLog) -> None:
        """The step's files (rundir.write_step_files) and one metrics.jsonl row (and the
        trackers), reduced over the ranks."""
        step, m, episodes = step_log.step, step_log.metrics, step_log.episodes
        rundir.write_step_files(self.run_dir, step, step_log.new_pool, episodes,
                                self.config.run.transcripts, step_log.proposals, self.rank,
                                step_log.scored)
        m.update(metrics.episode_metrics(episodes))
        seconds = telemetry.phase_seconds(step_log.times, time.perf_counter())
        engine_s = getattr(self.engine, "seconds", {})  # vLLM's sleep and wake (vllm_engine.py)
        m.update({"charts/lr": self.trainer.scheduler.get_last_lr()[0],
                  **{f"time/{k}_s": v for k, v in {**seconds, **engine_s}.items()},
                  "time/step_s": sum(seconds.values())})
        generated, self.sampler.generated = self.sampler.generated, 0
        if hasattr(self.engine, "sync_bytes"):  # the weight sync's bytes (a LoRA run: adapters)
            m["perf/sync_bytes"] = self.engine.sync_bytes
        m.update(telemetry.step_telemetry(
            seconds, generated_tokens=generated, batch_tokens=m.get("perf/batch_tokens", 0),
            update_tokens=m.get("perf/update_tokens", 0),
            update_flops=m.get("perf/update_flops", 0.0), peak=self.peak,
            sleep_s=engine_s.get("sleep", 0.0)))
        m = {**(reduce_metrics(self.gather([m])) if self.world > 1 else m), "charts/step": step}
        m, self.eval_row = {**m, **self.eval_row}, {}  # the same on every rank: not reduced
        if self.main:
            rundir.append_metrics(self.run_dir, {**m, "sandbox/level": self.sandbox_level})
            self.accelerator.log(m, step=step)
            self.bar.set_postfix(ret=f"{m.get('agent/return_mean', 0):.2f}",
                                 learnable=f"{m.get('env/learnable_share', 0):.2f}")

    def save(self, step: int, st) -> None:
        """memory.json every step; checkpoint-<k> every --checkpoint_every
        steps, exports/step-<k> every --export_every steps, both at the end too."""
        done, rargs, end = step + 1, self.config.run, step + 1 == self.config.loop.steps
        if self.main and not self.config.designer.no_memory:
            st.memory.save()
        if done % rargs.checkpoint_every == 0 or end:
            n_lines = rundir.metrics_lines(self.run_dir) if self.main else 0
            rundir.save_checkpoint(self.accelerator, self.run_dir, done,
                                   st.to_dict(done, self.world, n_lines), rargs.keep_checkpoints)
        if rargs.export_every and (done % rargs.export_every == 0 or end):
            rundir.save_export(self.accelerator, self.trainer.model, self.tokenizer, self.run_dir,
                               done, self.shipped, rargs.keep_checkpoints, export=self.export)

    def export(self, accelerator, model, tokenizer, dest: Path, dtype) -> None:
        """The policy at `dest` in Hugging Face format (rundir.export_policy), or a LoRA run's
        adapter in PEFT's (lora.export; with --lora_merge also dest/merged/, the merged model)."""
        if self.config.model.lora_rank:
            lora.export(accelerator, model, tokenizer, dest, dtype,
                        merge=self.config.model.lora_merge)
        else:
            rundir.export_policy(accelerator, model, tokenizer, dest, dtype)

    def finish(self) -> Path:
        """The final policy in Hugging Face format (a LoRA run: its adapter), for eval.py and for
        sharing."""
        self.offload.reload()  # a run with no step left exports what the start-up offloaded
        self.export(self.accelerator, self.trainer.model, self.tokenizer,
                    self.run_dir / "final_model", self.shipped)
        best = self.run_dir / "eval" / "checkpoints.json"
        if self.main and self.evaluation is not None and best.is_file():
            print(f"[spade] held-out best: {json.loads(best.read_text())['best']} "
                  f"({self.run_dir / 'eval' / 'checkpoints.md'})")
        if self.main:
            print(f"[spade] done: metrics {self.run_dir / 'metrics.jsonl'}, "
                  f"policy {self.run_dir / 'final_model'}; its page: python -m tools.report "
                  f"{self.run_dir}")
        self.engine.close()  # before end_training: vLLM tears its process groups down first
        self.accelerator.end_training()
        return self.run_dir


def build_trainer(acc, model, cfg: config.Config, shipped, empty: bool) -> Trainer:
    """The Trainer around the loaded policy: AdamW over its trainable parameters (LoRA: the
    adapters) at a constant learning rate (the paper's), both prepared by `acc`, and with
    --kl_coef > 0 the frozen KL reference (kl_reference: `shipped` dtype, `empty` as the policy)."""
    # fused on CUDA: one kernel, no parameter-sized temporary (foreach's sqrt(v) is one)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.grpo.lr, betas=grpo.BETAS,
                                  weight_decay=cfg.grpo.weight_decay,
                                  fused=acc.device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)  # constant (paper)
    trainer = Trainer(*acc.prepare(model, optimizer, scheduler), accelerator=acc)
    if cfg.grpo.kl_coef > 0:
        trainer.ref_model = kl_reference(acc, trainer.model, cfg.model, shipped, cfg.run.seed,
                                         empty)
    return trainer


def load_policy(margs, seed: int, shipped, empty: bool):
    """(policy, tokenizer): the model in fp32 master weights, or with --lora_rank its frozen base
    in the shipped dtype (no masters to keep) with fp32 adapters (lora.add_adapters)."""
    model, tokenizer = models.load_model_and_tokenizer(
        margs.model, dtype=shipped if margs.lora_rank else torch.float32, seed=seed, empty=empty)
    if margs.lora_rank:
        lora.add_adapters(model, rank=margs.lora_rank, alpha=margs.lora_alpha,
                          dropout=margs.lora_dropout, targets=margs.lora_targets,
                          base="" if models.is_tiny(margs.model) else  # built, not loaded
                          models.resolve_model_name(margs.model))
    return model, tokenizer


def expandable_segments(environ) -> None:
    """INFRA: the trainer's CUDA allocator grows its segments by mapping pages (expandable
    segments), so empty_cache returns every free page to the driver. With fixed segments one live
    block (AdamW's moments, made lazily at the first step where freed activations were) pins its
    whole segment, which vLLM's KV cache, a pool of its own, then cannot map. vLLM 0.32 turns the
    option off inside its own pools and back on after (device_allocator/cumem.py). Set in the
    allocator's variable (PYTORCH_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF) unless it names the
    option already; read when CUDA starts."""
    name = "PYTORCH_ALLOC_CONF" if environ.get("PYTORCH_ALLOC_CONF") else \
        "PYTORCH_CUDA_ALLOC_CONF"
    conf = environ.get(name, "")
    if "expandable_segments" not in conf:
        environ[name] = ",".join(filter(None, [conf, "expandable_segments:True"]))


def trackers(log_with: str | None) -> list[str] | None:
    """--log_with's Accelerate trackers: "tensorboard,wandb" is two."""
    return [t.strip() for t in log_with.split(",") if t.strip()] if log_with else None


def wants_vllm(margs) -> bool:
    """vLLM colocated on GPU when installed (or asked for); the transformers engine otherwise."""
    installed = importlib.util.find_spec("vllm") is not None
    return margs.engine == "vllm" or (margs.engine == "auto" and torch.cuda.is_available()
                                      and installed)


def card_bytes() -> int | None:
    """This rank's GPU memory (None on CPU, where vLLM's budget is its KV-cache bytes)."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


def mfu_peak(config, main: bool) -> float | None:
    """The device's peak FLOP/s for the update's MFU (none on CPU: telemetry.py, deviation 2);
    the main process prints the numbers MFU uses once."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    peak = telemetry.peak_flops(device)
    if main:
        print(telemetry.describe(telemetry.model_flops(config), peak, device))
    return peak


def check_vllm_fits(margs, world: int) -> None:
    """INFRA: fail fast, before anything loads, when --offload_trainer has no vLLM to free the
    GPU for, the TP size does not divide the processes or vLLM's share of the card
    (--gpu_memory_utilization x card memory) cannot hold one rank's share of the shipped weights
    (counted from the architecture: preflight.vllm_fit_error)."""
    if margs.offload_trainer and not wants_vllm(margs):
        raise SystemExit("--offload_trainer needs the vLLM engine (the transformers engine "
                         "generates with the trainer's own weights)")
    card = card_bytes() if wants_vllm(margs) else None  # None: only the TP check (CPU, no vLLM)
    weights = 0 if card is None else \
        models.parameter_count(margs.model) * models.shipped_dtype(margs.model).itemsize
    error = preflight.vllm_fit_error(world=world, tp=margs.tensor_parallel_size,
                                     weight_bytes=weights,
                                     utilization=margs.gpu_memory_utilization, card_bytes=card)
    if error:
        raise SystemExit(error)


def make_engine(cfg: config.Config, model, tokenizer, seed: int, sharded: bool,
                before_start=lambda: None):
    """train.py's rollout engine (rollout_engine on the run's flags): vLLM colocated on GPU when
    installed (or asked for), before_start() called just before it starts, with the memory plan's
    scheduler limits (preflight.py: as many sequences as the TP group plays at once, prefill
    chunks whose profile leaves the KV cache its share) and the run's collective timeout; the
    transformers engine otherwise. A LoRA run's vLLM engine gets the policy's adapters at once
    (the transformers engine samples from the policy itself)."""
    margs = cfg.model
    use_vllm = wants_vllm(margs)
    if sharded and not use_vllm:  # ranks would generate different token counts through one model
        raise SystemExit("DeepSpeed / FSDP1 runs need the vLLM engine (pip install -r "
                         "requirements/gpu.txt); FSDP2 runs can use either engine")
    started = {}
    if use_vllm:
        world = int(os.environ.get("WORLD_SIZE", 1))
        # each rank writes its own copy of a LoRA run's adapters (rundir.py: adapter-sync/)
        adapters = Path(cfg.run.output_dir) / "adapter-sync" / f"rank-{os.environ.get('RANK', 0)}"
        started = dict(max_num_seqs=live_episodes(cfg, world),
                       max_num_batched_tokens=preflight.MAX_NUM_BATCHED_TOKENS,
                       group_timeout=pg_timeout(margs), before_start=before_start,
                       **lora_engine_args(margs, model, adapters))
    eng = rollout_engine(margs.model, tokenizer, use_vllm=use_vllm, model=model, seed=seed,
                         max_model_len=max_model_len(cfg),
                         tensor_parallel_size=margs.tensor_parallel_size,
                         gpu_memory_utilization=margs.gpu_memory_utilization,
                         batch_tokens=margs.batch_tokens, **started)
    if use_vllm and margs.lora_rank:
        eng.sync_weights(model)  # the first adapter (a collective under FSDP2)
    return eng


def rollout_engine(name: str, tokenizer, *, use_vllm: bool, model, seed: int, max_model_len: int,
                   tensor_parallel_size: int, gpu_memory_utilization: float, batch_tokens: int,
                   progress: bool = False, before_start=lambda: None, **vllm_args):
    """The rollout engine of model `name`, train.py's (make_engine) and eval.py's (build_sampler):
    use_vllm, vllm_engine.VLLMEngine in the model's shipped dtype (a tiny model, built in memory,
    not on disk, is `model` saved to a temporary directory for vLLM to load; then before_start()
    runs), vllm_args its further arguments; else the transformers engine on `model`. Either
    stops a reply at the chat's end of turn (agent.turn_end): a base model's EOS is not it."""
    stops = [agent.turn_end(tokenizer)[1]]
    if use_vllm:
        name = models.resolve_model_name(name)
        dtype = str(models.shipped_dtype(name)).removeprefix("torch.")
        with tempfile.TemporaryDirectory(prefix="spade-vllm-") as tmp:
            if models.is_tiny(name):
                if lora.is_adapted(model):  # the base, as Run built it (its save: the adapter)
                    model = models.load_model_and_tokenizer(name, dtype=torch.float32,
                                                            seed=seed)[0]
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
                name = tmp
            before_start()
            return vllm_engine.VLLMEngine(name, tensor_parallel_size=tensor_parallel_size,
                                          gpu_memory_utilization=gpu_memory_utilization,
                                          max_model_len=max_model_len, dtype=dtype, seed=seed,
                                          stop_ids=stops, **vllm_args)
    if tensor_parallel_size != 1:
        raise SystemExit("--tensor_parallel_size applies to the vLLM engine only")
    # The prefix cache reuses each episode's KV across turns (sync_weights clears it every step);
    # a real model's long episode holds gigabytes of KV, past the bound: tiny models only.
    tiny = models.is_tiny(name)
    return engine.TransformersEngine(model, tokenizer, stop_ids=stops,
                                     max_batch_tokens=batch_tokens, progress=progress,
                                     prefix_cache_bytes=PREFIX_CACHE_BYTES if tiny else 0)


PREFIX_CACHE_BYTES = 1 << 30  # the transformers engine's prefix KV cache bound (tiny models)
# The engine's room for a designer prompt (instructions, memory exemplars, the corpus document)
# beside its reply's --designer_max_tokens.
DESIGNER_PROMPT_TOKENS = 16384


def max_model_len(cfg: config.Config) -> int:
    """The engine's longest sequence: an agent's context, or a designer prompt and its reply."""
    return max(cfg.agent.max_context, DESIGNER_PROMPT_TOKENS + cfg.designer.designer_max_tokens)


def live_episodes(cfg: config.Config, world: int) -> int:
    """The episodes one vLLM TP group plays at once at a regeneration step: each of its ranks
    plays its environments' G unhinted + H hinted episodes."""
    loop = cfg.loop
    return cfg.model.tensor_parallel_size * -(-loop.num_envs // world) * (loop.plays +
                                                                          loop.hint_plays)


def preflight_plan(cfg: config.Config, update) -> int:
    """train.py --preflight: preflight.memory_plan of this run on each --gpu card
    (comma-separated), in plain numbers, `update` (train.grpo_update) measured; returns its exit
    status. Here, not in preflight.py, which is a leaf: it reads the Config and the engine's
    limits as make_engine sets them."""
    rargs, name = cfg.run, cfg.model.model
    cards = [preflight.card_gib(gpu) for gpu in rargs.gpu.split(",")]
    if rargs.gpus <= 0:
        raise SystemExit(f"--gpus must be positive, got {rargs.gpus}")
    try:
        arch = models.architecture(name)
    except (OSError, ValueError) as e:
        raise SystemExit(f"--preflight: the config of {name} cannot be read offline "
                         f"({type(e).__name__}); ship it in configs/models/ or pass a local "
                         "directory") from None
    # --keep_checkpoints all keeps every checkpoint the run writes: one each --checkpoint_every
    # steps and one at the end
    written = -(-cfg.loop.steps // rargs.checkpoint_every)
    keep = int(rargs.keep_checkpoints) if rargs.keep_checkpoints.isdigit() else written
    return preflight.memory_plan(arch, preflight_launch(cfg, update), name=name,
                                 setting=cfg.loop.setting, cards=cards,
                                 sleep_level=vllm_engine.SLEEP_LEVEL, keep=keep)


def preflight_launch(cfg: config.Config, update) -> dict:
    """preflight.plan's keyword arguments (but the card) for this run as it launches: its flags,
    the engine's limits as make_engine sets them, `update` (train.grpo_update) with the run's
    settings."""
    m, gpus = cfg.model, cfg.run.gpus
    update = functools.partial(update, pad_id=0, gargs=cfg.grpo,
                               temperatures=config.role_temperatures(cfg))
    adapt = functools.partial(lora.add_adapters, rank=m.lora_rank, alpha=m.lora_alpha,
                              dropout=m.lora_dropout, targets=m.lora_targets)
    return dict(world=gpus, tp=m.tensor_parallel_size, util=m.gpu_memory_utilization,
                lora=(adapt, lora.Reference) if m.lora_rank else None,
                offload=m.offload_trainer, max_model_len=max_model_len(cfg),
                micro_batch_tokens=cfg.grpo.micro_batch_tokens, max_context=cfg.agent.max_context,
                live_episodes=live_episodes(cfg, gpus), kl=cfg.grpo.kl_coef > 0,
                update=update, sample=grpo.Sample, checkpointing=m.gradient_checkpointing)


def lora_engine_args(margs, model, adapter_dir) -> dict:
    """VLLMEngine's LoRA arguments ({} without --lora_rank). vLLM 0.32's CPU build runs no LoRA
    on a MoE model (its LoRA MoE layers are Triton kernels): refused here, before vLLM starts."""
    if not margs.lora_rank:
        return {}
    moe = getattr(model.config, "num_experts", 0)
    if moe and not torch.cuda.is_available():
        raise SystemExit("--lora_rank with a MoE model needs vLLM on GPUs: vLLM 0.32's CPU build "
                         "runs LoRA on MoE layers through Triton kernels it lacks (use --engine "
                         "transformers on CPU)")
    return dict(lora_rank=margs.lora_rank, adapter_dir=str(adapter_dir),
                expert_adapters=lora.adapts_experts(model))


def pg_timeout(margs) -> datetime.timedelta:
    """How long a collective may wait for the slowest rank (the default process group and the
    tensor-parallel subgroups) before the run fails."""
    return datetime.timedelta(seconds=margs.process_group_timeout)


def fsdp2(accelerator) -> bool:
    """Whether Accelerate runs this process under FSDP2."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    return accelerator.distributed_type.value == "FSDP" and getattr(plugin, "fsdp_version", 1) == 2


def unwritten_storage(model) -> None:
    """Give every `meta` parameter of `model` CPU storage that is allocated and never written.
    Its own address: Accelerate 1.15's FSDP2 prepare maps the optimizer's parameters to the
    sharded ones by data_ptr(), which is 0 for every meta tensor (all would map to one). No host
    RAM: the OS backs a page only once it is written, and prepare writes none (it moves the model
    back to `meta` and fills the shards from the main process)."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and p.is_meta:
                module._parameters[name] = torch.nn.Parameter(
                    torch.empty_like(p, device="cpu"), requires_grad=p.requires_grad)
    model.tie_weights()  # the loop gave a tied head storage of its own


def kl_reference(accelerator, model, margs, dtype, seed: int, empty: bool):
    """The frozen KL reference pi_ref: a LoRA run's policy with its adapters off (lora.Reference,
    no second model), else the starting policy loaded again (reference_model)."""
    if margs.lora_rank:
        return lora.Reference(model)
    return reference_model(accelerator, margs.model, dtype, seed, empty)


def reference_model(accelerator, name: str, dtype, seed: int, empty: bool):
    """The frozen KL reference pi_ref of grpo.policy_loss: the starting policy, loaded as the
    policy was (`empty`: on `meta`, see Run) in `dtype` (the shipped one, bf16 for the paper's
    models). Under FSDP2 it is prepared as the policy is, by Accelerate's own fsdp2_prepare_model:
    the same units and mixed precision, sharded, every shard filled from the main process;
    otherwise moved to the device. It is rebuilt from the same source on every start, a resume
    included, so checkpoints never hold it. (A copy of the policy made before prepare would hold
    the zeros or `meta` tensors of the ranks Accelerate fills, unsharded, on the host.)"""
    kind = accelerator.distributed_type.value
    if kind in ("DEEPSPEED", "FSDP") and not fsdp2(accelerator):
        raise SystemExit("--kl_coef > 0 builds its reference model under FSDP2, DDP or one "
                         "process, not DeepSpeed or FSDP1: use configs/fsdp2_8gpu.yaml")
    ref, _ = models.load_model_and_tokenizer(name, dtype=dtype, seed=seed, empty=empty)
    # frozen before prepare: Accelerate upcasts only trainable parameters to fp32
    ref.eval().requires_grad_(False)
    if not fsdp2(accelerator):
        return ref.to(accelerator.device)
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from torch.distributed.fsdp import FSDPModule
    ref = fsdp2_prepare_model(accelerator, ref)
    # Accelerate's [norm, head] unit stays gathered after a forward, for the backward that
    # follows; a frozen model runs none, so it is resharded after each forward instead
    units = [m for m in ref.modules() if isinstance(m, FSDPModule)]

    def reshard(*_):
        for unit in units:
            unit.reshard()
    ref.register_forward_hook(reshard)
    return ref


def fp32_gradient_reduce(accelerator) -> None:
    """FSDP2 computes in bf16 but reduce-scatters gradients in fp32 (Accelerate's default policy
    reduces in bf16, too coarse for lr 1e-6 updates), and no unit casts its outputs
    (output_dtype None): Accelerate's default casts them to bf16, and its [norm, head] unit
    returns logprobs.py's fp32 log-probs, which the k3 KL and the TIS weight need unrounded (a
    decoder layer's outputs stay bf16, the dtype they are computed in). Applied before prepare()."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is not None and getattr(plugin, "fsdp_version", 1) == 2:
        from torch.distributed.fsdp import MixedPrecisionPolicy
        param = getattr(plugin.mixed_precision_policy, "param_dtype", None) or torch.bfloat16
        plugin.mixed_precision_policy = MixedPrecisionPolicy(
            param_dtype=param, reduce_dtype=torch.float32, output_dtype=None)


def reduce_metrics(rows: list[dict]) -> dict:
    """Every rank's metrics -> the mean of every scalar over the ranks that report it (counts are
    per-rank means too); `_min` / `_max` statistics reduce as min / max."""
    merged: dict = {}
    for d in rows:
        for k, v in d.items():
            merged.setdefault(k, []).append(v)
    reduce = {"_min": min, "_max": max}
    return {k: reduce.get(k[-4:], lambda v: sum(v) / len(v))(v) for k, v in merged.items()}
