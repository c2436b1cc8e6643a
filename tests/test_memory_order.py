"""The loop's order of device memory, replayed on a ledger: train.py's real loop (2 steps with a
checkpoint after each, then a --resume that runs a third) on the tiny model, with only vLLM's `LLM`
object replaced by a ledger of tagged pools (weights, KV cache, CUDA graphs, the runner's buffers)
sized as infra/preflight.py plans them for a row of the README's GPU table. infra/offload.py says
at every call where the trainer's state is (resident bytes by kind), and the ledger counts each
resident kind at the plan's per-GPU size for that row, not at the tiny model's bytes.

The test fails when any moment exceeds the card, or when the plan's phases are not this
timeline's maxima (within 5%), so the plan cannot describe an order the code does not run. Two
earlier orders are replayed too and must fail: the loop's before round 2's fix (the KV cache
mapped at the end of the weight sync, beside the whole trainer state; the optimizer state loaded
beside an awake vLLM), and the start-up before round 3's (vLLM built beside the trainer's fp32
shards, offloaded only at the first step), which the rows' raised utils no longer leave room for.

One rank stands for each of a row's ranks (they all run this order). The plans measure the
full-size trainer on fake tensors (minutes each on 2 cores: marked slow); each is measured once
in the session (tests/plans.py), here and in tests/test_preflight.py.
"""
import importlib.machinery
import sys
import types

import pytest
import yaml
from accelerate import Accelerator

from infra import config, lora, models, offload, preflight, vllm_engine
from infra import run, rundir
import train
from fake_vllm import FakeTPLLM
from gpu_table import ROOT, table_rows
import plans
from runs import CORPUS

CARD = {"H100 80 GB": "h100-80gb", "H200 141 GB": "h200-141gb"}
TOLERANCE = 0.05


def row_flags(row) -> tuple[list[str], str]:
    """(train.py's flags with --gpus, the --gpu card) of a README GPU table row."""
    model, setting, config_file, tp, flags, card = row
    world = yaml.safe_load((ROOT / config_file).read_text())["num_processes"]
    return (["--model", model, "--setting", setting, "--tensor_parallel_size", str(tp),
             "--gpus", str(world), *flags.split()], CARD[card])


def row_args(row):
    """A README row's resolved Config, its preset applied."""
    cfg = config.parse(row_flags(row)[0], aliases=models.MODEL_ALIASES)
    train.resolve(cfg)
    return cfg


def row_plan(row) -> dict:
    """The preflight's plan of a README row, as `train.py <flags> --preflight` computes it."""
    cfg = row_args(row)
    gpu = row_flags(row)[1]
    with plans.shared():  # a trainer measured once for every row (and test) that plans it
        return preflight.plan(models.architecture(cfg.model.model), card=preflight.card_gib(gpu),
                              **run.preflight_launch(cfg, train.grpo_update))


class Ledger(FakeTPLLM):
    """vLLM's `LLM` (and the `vllm` module around it, tests/fake_vllm.py's scripted replies) as
    a ledger of device memory. vLLM's pools, sized by the plan, map and release as vLLM 0.32's
    sleep mode does them (device_allocator/cumem.py: sleep releases every pool, the CUDA graphs
    to host RAM when sleep_mode_offload_cudagraph is set; a wake maps the tags it names and every
    non-deferrable one; the runner's persistent buffers are in no pool); the activation profile
    comes and goes with the KV cache (its first forward). The trainer's state counts at the plan's
    per-GPU size of each kind, scaled by the share of it offload.py reports on the device.
    Every call appends (label, GiB) to `timeline`."""

    def __init__(self, tok, plan: dict, timeline: list):
        super().__init__(tok)
        self.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # as an imported module's
        self.plan, self.timeline = plan, timeline
        self.kinds = preflight.state_kinds(plan["trainer"])
        v = plan["vllm"]
        self.pools = {"weights": v["weights"], "kv_cache": v["kv"] + v["profile"],
                      "graphs": v["graphs"], "runner": v["asleep"]}
        self.mapped: set[str] = set()
        self.offload = None  # the run's offload.TrainerOffload, once it exists
        self.full: dict[str, int] = {}
        # a LoRA run's adapters: each sync loads one (the trainer's gathered adapters beside it)
        self.llm_engine.add_lora = lambda request: self.record(
            "sync" if "kv_cache" not in self.mapped else "start-up",
            transient=plan["trainer"]["largest_unit"])
        self.llm_engine.remove_lora = lambda lora_id: True
        self.lora = types.SimpleNamespace(request=types.SimpleNamespace(
            LoRARequest=lambda name, lora_id, path, **kw: types.SimpleNamespace(
                lora_name=name, lora_int_id=lora_id, lora_path=path)))

    # the trainer's side
    def watch(self, off: offload.TrainerOffload) -> None:
        """The run's TrainerOffload exists: its state's full bytes by kind, and the moments
        recorded before it (vLLM's start-up: nothing has moved the state since) get its state."""
        self.offload = off
        state = off.resident()
        # what trains: every parameter, or a LoRA run's adapters (their gradients and moments)
        trainable = [p for p in off.model.parameters() if p.requires_grad]
        trained = state["params"] if len(trainable) == len(list(off.model.parameters())) else \
            sum(p.numel() * p.element_size() for p in trainable)
        self.full = {"params": state["params"], "grads": trained, "moments": 2 * trained,
                     "reference": state["reference"]}
        self.timeline[:] = [(label, extra + self._trainer(state) if gib is None else gib, extra)
                            for label, gib, extra in self.timeline]

    def _trainer(self, state: dict) -> float:
        """GiB of the trainer's state now: each kind's planned size x its share on the device (a
        kind offload.py does not hold, e.g. a reference it was not given, stays whole)."""
        return self.kinds["fixed"] + sum(
            self.kinds[k] * (min(1.0, state[k] / self.full[k]) if self.full[k] else 1.0)
            for k in ("params", "grads", "moments", "reference"))

    def record(self, label: str, transient: float = 0.0) -> None:
        """One moment: vLLM's mapped pools + the context + a transient + the trainer's state."""
        extra = sum(self.pools[p] for p in self.mapped) + self.plan["phases"]["context"] + \
            transient
        if self.offload is None:
            self.timeline.append((label, None, extra))
        else:
            self.timeline.append((label, extra + self._trainer(self.offload.resident()), extra))

    # vLLM's side
    def LLM(self, **kwargs):
        self.offload_graphs = kwargs.get("sleep_mode_offload_cudagraph", False)
        self.mapped = set(self.pools)
        self.record("start-up")
        return self

    def sleep(self, level):
        if level > 0:  # level 0 (a LoRA engine's) only pauses the scheduler
            self.mapped = {"runner"} | ({"graphs"} if not self.offload_graphs else set())
        self.record("sleep")

    def release_kv_cache_memory(self):
        self.mapped.discard("kv_cache")
        self.record("sleep")

    def wake_up(self, tags=None):
        tags = list(self.pools) if tags is None else tags
        self.mapped |= {"graphs", *tags}
        self.record("kv wake" if "kv_cache" in tags else "sync")

    def collective_rpc(self, method, args=()):
        self.record("sync", transient=self.plan["trainer"]["largest_unit"])
        return super().collective_rpc(method, args)

    def _rollout(self):
        assert self.mapped == set(self.pools), f"vLLM generates with {self.mapped} mapped"
        self.record("rollout")

    def _add(self, request_id, prompt, params, lora_request=None):
        self._rollout()
        return super()._add(request_id, prompt, params)

    def _step(self):
        self._rollout()
        return super()._step()

    def generate(self, prompts, sampling_params, use_tqdm):
        self._rollout()
        return super().generate(prompts, sampling_params, use_tqdm)


def run_on_ledger(plan: dict, tmp_path, monkeypatch, *, offload_trainer: bool, kl_coef: float,
                  before_fix: bool = False, vllm_first: bool = False,
                  lora_rank: int = 0) -> list:
    """train.main for 2 steps (a checkpoint after each), then --resume for a third, on a Ledger
    of `plan`; returns the timeline. before_fix: the order the loop ran before round 2: the KV
    cache woke at the end of the sync, and the resume loaded the checkpoint with vLLM awake.
    vllm_first: the start-up before round 3: vLLM built before the trainer's state left."""
    timeline, ledgers = [], []
    kinds = preflight.state_kinds(plan["trainer"])
    init, step_off, step_re = (offload.TrainerOffload.__init__, offload.TrainerOffload.offload,
                               offload.TrainerOffload.reload)

    def watched_init(self, model, optimizer, **kw):
        init(self, model, optimizer, **kw)
        ledgers[-1].watch(self)
        inner = getattr(optimizer, "optimizer", optimizer)  # after offload's own pre-hook
        inner.register_step_pre_hook(lambda *_: ledgers[-1].record("step", kinds["step"]))

    def traced(method, label):
        def call(self, *a, **k):
            out = method(self, *a, **k)
            ledgers[-1].record(label)
            return out
        return call

    def before(function, label):
        def call(*a, **k):
            ledgers[-1].record(label)
            return function(*a, **k)
        return call
    monkeypatch.setattr(offload.TrainerOffload, "__init__", watched_init)
    monkeypatch.setattr(offload.TrainerOffload, "offload", traced(step_off, "offload"))
    monkeypatch.setattr(offload.TrainerOffload, "reload", traced(step_re, "reload"))
    backward = Accelerator.backward
    monkeypatch.setattr(Accelerator, "backward", lambda self, loss, **k: (
        backward(self, loss, **k), ledgers[-1].record("update", kinds["update"]))[0])
    monkeypatch.setattr(Accelerator, "load_state", traced(Accelerator.load_state, "resume"))
    monkeypatch.setattr(rundir, "save_checkpoint", before(rundir.save_checkpoint, "checkpoint"))
    monkeypatch.setattr(rundir, "export_policy", before(rundir.export_policy, "export"))
    monkeypatch.setattr(lora, "export", before(lora.export, "export"))
    if before_fix:
        sync, resume = vllm_engine.VLLMEngine.sync_weights, run.Run.resume

        def sync_then_kv(self, model):
            sync(self, model)
            self.wake()

        def resume_awake(self):
            self.engine.sleep = lambda: None  # the instance's: vLLM stays awake
            try:
                return resume(self)
            finally:
                del self.engine.sleep
        monkeypatch.setattr(vllm_engine.VLLMEngine, "sync_weights", sync_then_kv)
        monkeypatch.setattr(run.Run, "resume", resume_awake)
    if vllm_first:  # no offload before vLLM starts: the first step's start moves the state
        rollout_engine = run.rollout_engine
        monkeypatch.setattr(run, "rollout_engine",
                            lambda *a, before_start, **k: rollout_engine(*a, **k))
    tiny = ["--model", "tiny", "--engine", "vllm", "--steps", "2", "--regen_interval", "2",
            "--num_envs", "2", "--skills_per_regen", "1", "--plays", "2", "--hint_plays", "1",
            "--max_attempts", "1", "--designer_max_tokens", "16", "--hint_max_tokens", "8",
            "--max_turns", "1", "--max_new_tokens", "8", "--sandbox_workers", "1",
            "--checkpoint_every", "1", "--corpus", str(CORPUS), "--kl_coef", str(kl_coef),
            "--output_dir", str(tmp_path / "run"), "--lora_rank", str(lora_rank)] + \
        (["--offload_trainer"] if offload_trainer else [])
    for argv in (tiny, tiny + ["--resume", "--steps", "3", "--allow_config_change"]):
        ledgers.append(Ledger(models.build_tiny_tokenizer(), plan, timeline))
        # the ledger is the vllm module while the run lasts (monkeypatch restores these keys
        # alone: modules the run imports meanwhile stay imported)
        monkeypatch.setitem(sys.modules, "vllm", ledgers[-1])
        monkeypatch.setitem(sys.modules, "vllm.platforms", ledgers[-1].platforms)
        monkeypatch.setitem(sys.modules, "vllm.lora", ledgers[-1].lora)
        monkeypatch.setitem(sys.modules, "vllm.lora.request", ledgers[-1].lora.request)
        train.main(argv)
    return timeline


def peaks(timeline: list) -> dict[str, float]:
    """The largest GiB of each label of the timeline."""
    out: dict[str, float] = {}
    for label, gib, _ in timeline:
        out[label] = max(out.get(label, 0.0), gib)
    return out


def check(plan: dict, timeline: list) -> list[str]:
    """What is wrong with the plan against the timeline (empty: nothing)."""
    card, ph, seen = plan["card"], plan["phases"], peaks(timeline)
    wrong = [f"{label} {gib:.1f} GiB above the {card:.1f} GiB card"
             for label, gib in seen.items() if gib > card]
    for name in preflight.PHASES:
        if abs(seen.get(name, 0.0) - ph[name]) > TOLERANCE * ph[name]:
            wrong.append(f"{name}: plan {ph[name]:.1f} GiB, timeline {seen.get(name, 0.0):.1f}")
    top = max(ph[name] for name in preflight.PHASES)
    wrong += [f"{label} {gib:.1f} GiB above every phase of the plan ({top:.1f})"
              for label, gib in seen.items() if gib > (1 + TOLERANCE) * top]
    return wrong


def on_ledger(row, tmp_path, monkeypatch, **order) -> tuple[dict, list]:
    """(the plan of a README row, the loop's timeline on a Ledger of it; `order`: run_on_ledger's
    earlier orders)."""
    plan, cfg = row_plan(row), row_args(row)
    return plan, run_on_ledger(plan, tmp_path, monkeypatch, offload_trainer=cfg.model.offload_trainer,
                               kl_coef=cfg.grpo.kl_coef, lora_rank=cfg.model.lora_rank,
                               **order)


def ledger_rows():
    """The README's --offload_trainer rows, and the rows of the same model, setting and config
    file without it (their trainers are measured already), and its LoRA rows."""
    rows = table_rows()
    offloaded = [r for r in rows if "--offload_trainer" in r[4]]
    same = {r[:3] for r in offloaded}
    twins = [r for r in rows if r[:3] in same and r not in offloaded and "--lora" not in r[4]]
    return offloaded + twins + [r for r in rows if "--lora_rank" in r[4]]


def row_id(row) -> str:
    return "-".join([row[0], row[1], CARD[row[5]], *(["offload"] if "--offload" in row[4]
                                                     else []),
                     *(["lora"] if "--lora_rank" in row[4] else [])])


def show(title: str, plan: dict, timeline: list) -> dict:
    seen = peaks(timeline)
    print(f"\n[ledger{title}] peak {max(seen.values()):.1f} GiB of {plan['card']:.1f}; " +
          ", ".join(f"{k} {v:.1f}" for k, v in seen.items()))
    return seen


# A plan by hand, one GPU of 80 GiB at util 0.9 (a 4B-sized trainer, GiB): fp32 shards 15,
# moments 30, gradients 15 and activations 22 at the update's peak; vLLM's share 72.
HAND = {"held": {"Parameter": 15.0, "Optstate": 30.0, "Total": 45.0},
        "update": {"Parameter": 15.0, "Gradient": 15.0, "Activation": 22.0, "Optstate": 30.0,
                   "Total": 82.0},
        "step": {"Parameter": 15.0, "Gradient": 15.0, "Optstate": 30.0, "Total": 60.0},
        "policy": 15.0, "ref": 0.0, "largest_unit": 0.7, "params": 4 * 10**9}
HAND_VLLM = {"share": 72.0, "weights": 7.5, "profile": 1.7, "graphs": 1.0, "asleep": 0.05,
             "kv": 61.75}


@pytest.mark.slow  # train.py's loop, three times
def test_the_order_on_a_hand_made_plan(tmp_path, monkeypatch, capsys):
    """The ledger on a plan by hand (no measurement): the loop's order matches the plan, vLLM
    starting with the trainer's state away (0 + 1 + 72 GiB); the order before round 2's fix maps
    the KV cache beside the whole state, 45 + 1 + 72 GiB on an 80 GiB card, and the resume's
    sync beside an awake vLLM adds the largest layer; the start-up before round 3's builds vLLM
    beside the fp32 shards, 15 + 1 + 72."""
    phases = preflight.phases(HAND, HAND_VLLM, world=1, tp=1, card=80.0, offload=True)
    plan = {"trainer": HAND, "vllm": HAND_VLLM, "phases": phases, "card": 80.0}
    assert phases["start-up"] == phases["rollout"] == phases["kv wake"] == 0.0 + 1.0 + 72.0
    timeline = run_on_ledger(plan, tmp_path / "fixed", monkeypatch, offload_trainer=True,
                             kl_coef=0.0)
    assert check(plan, timeline) == []
    assert timeline[0][0] == "offload" and peaks(timeline)["start-up"] == pytest.approx(73.0)
    monkeypatch.undo()
    before = run_on_ledger(plan, tmp_path / "before", monkeypatch, offload_trainer=True,
                           kl_coef=0.0, before_fix=True)
    seen = peaks(before)
    assert seen["kv wake"] == pytest.approx(45.0 + 1.0 + 72.0)
    assert seen["sync"] == pytest.approx(45.0 + 1.0 + 72.0 + 0.7)
    assert "kv wake 118.0 GiB above the 80.0 GiB card" in check(plan, before)
    monkeypatch.undo()
    first = run_on_ledger(plan, tmp_path / "first", monkeypatch, offload_trainer=True,
                          kl_coef=0.0, vllm_first=True)
    assert peaks(first)["start-up"] == pytest.approx(15.0 + 1.0 + 72.0)
    assert "start-up 88.0 GiB above the 80.0 GiB card" in check(plan, first)


@pytest.mark.slow  # train.py's loop
def test_the_kl_reference_waits_in_host_ram_on_a_hand_made_plan(tmp_path, monkeypatch):
    """With a KL term the frozen reference (7 GiB here) is read only by the update: offloaded
    with the trainer, the rollouts and vLLM's start-up run without it, and it is back for the
    update's forward."""
    kl = {"held": {**HAND["held"], "Parameter": 22.0, "Total": 52.0},
          "update": {**HAND["update"], "Parameter": 22.0, "Total": 89.0},
          "step": {**HAND["step"], "Parameter": 22.0, "Total": 67.0}, "ref": 7.0}
    trainer = {**HAND, **kl}
    phases = preflight.phases(trainer, HAND_VLLM, world=1, tp=1, card=80.0, offload=True)
    plan = {"trainer": trainer, "vllm": HAND_VLLM, "phases": phases, "card": 80.0}
    assert phases["start-up"] == phases["rollout"] == 0.0 + 1.0 + 72.0  # no reference
    timeline = run_on_ledger(plan, tmp_path, monkeypatch, offload_trainer=True, kl_coef=0.01)
    assert check(plan, timeline) == []
    seen = peaks(timeline)
    assert seen["update"] == pytest.approx(89.0 - 30.0 + 1.0 + 0.05)  # moments away, ref back


# A LoRA plan by hand, one GPU of 80 GiB at util 0.35 (a 4B-sized run, GiB): the frozen bf16 base
# 7.5 with adapters 0.1, their moments 0.2, activations 22 at the update's peak; the adapter in
# bf16 0.05.
HAND_LORA = {"held": {"Parameter": 7.6, "Optstate": 0.2, "Total": 7.8},
             "update": {"Parameter": 7.6, "Gradient": 0.1, "Activation": 22.0, "Optstate": 0.2,
                        "Total": 29.9},
             "step": {"Parameter": 7.6, "Gradient": 0.1, "Optstate": 0.2, "Total": 8.0},
             "policy": 7.6, "ref": 0.0, "largest_unit": 0.05, "params": 4 * 10**9}
HAND_LORA_VLLM = {"share": 28.0, "weights": 7.55, "profile": 1.7, "graphs": 1.0, "asleep": 0.05,
                  "kv": 17.7}


def test_the_lora_order_on_a_hand_made_plan(tmp_path, monkeypatch):
    """A LoRA run's loop on the ledger of a plan by hand: vLLM's sleep releases the KV cache
    alone (level 0, then the release), so its weights and graphs stay through the update, the
    step and the adapter's sync, as the plan's phases count them, and the rollouts find every
    pool mapped (a level-2 sleep would leave the weights released: nothing re-sends them)."""
    phases = preflight.phases(HAND_LORA, HAND_LORA_VLLM, world=1, tp=1, card=80.0,
                              offload=False, lora=True)
    plan = {"trainer": HAND_LORA, "vllm": HAND_LORA_VLLM, "phases": phases, "card": 80.0}
    assert phases["update"] == pytest.approx(29.9 + 1.0 + 7.55 + 1.0 + 0.05)
    assert phases["sync"] == pytest.approx(7.8 + 7.55 + 1.0 + 0.05 + 0.05 + 1.0)
    timeline = run_on_ledger(plan, tmp_path, monkeypatch, offload_trainer=False, kl_coef=0.0,
                             lora_rank=4)
    assert check(plan, timeline) == []


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the one-GPU Qwen3-4B LoRA plan alone took 522 s here (load 2-3)
@pytest.mark.parametrize("row", ledger_rows(), ids=row_id)
def test_the_loop_runs_the_order_the_plan_describes(row, tmp_path, monkeypatch, capsys):
    plan, timeline = on_ledger(row, tmp_path, monkeypatch)
    with capsys.disabled():
        seen = show(f" {row_id(row)}", plan, timeline)
    assert {"start-up", "rollout", "kv wake", "update", "step", "sync", "offload", "reload",
            "sleep", "checkpoint", "export", "resume"} <= seen.keys()
    assert check(plan, timeline) == []


@pytest.mark.slow
@pytest.mark.parametrize("row", [r for r in ledger_rows() if "--offload_trainer" in r[4]],
                         ids=row_id)
def test_the_order_before_the_fix_runs_out_of_memory(row, tmp_path, monkeypatch, capsys):
    """The KV cache mapped at the sync's end beside the fp32 shards and both moments: the
    rollout's figure without the offload, above the card on every --offload_trainer row."""
    plan, timeline = on_ledger(row, tmp_path, monkeypatch, before_fix=True)
    with capsys.disabled():
        seen = show(f", before the fix, {row_id(row)}", plan, timeline)
    assert seen["kv wake"] > plan["card"]
    held = plan["trainer"]["held"]["Total"]
    assert seen["kv wake"] == pytest.approx(held + plan["phases"]["context"] +
                                            plan["vllm"]["share"], rel=0.01)
    assert check(plan, timeline)


@pytest.mark.slow
@pytest.mark.parametrize("row", [r for r in ledger_rows() if "--offload_trainer" in r[4]],
                         ids=row_id)
def test_vllm_started_beside_the_trainer_state_does_not_fit_the_rows_util(row, tmp_path,
                                                                          monkeypatch, capsys):
    """The start-up before round 3's fix: vLLM built beside the fp32 shards (and the KL
    reference), offloaded only at the first step. At the util each offload row now takes, the
    one its rollout allows, that start-up is above the card: vLLM would refuse to start."""
    plan, timeline = on_ledger(row, tmp_path, monkeypatch, vllm_first=True)
    with capsys.disabled():
        seen = show(f", vLLM first, {row_id(row)}", plan, timeline)
    kinds = preflight.state_kinds(plan["trainer"])
    beside = kinds["params"] + kinds["reference"] + kinds["fixed"]
    assert seen["start-up"] == pytest.approx(beside + plan["phases"]["context"] +
                                             plan["vllm"]["share"], rel=0.01)
    assert seen["start-up"] > plan["card"] >= plan["phases"]["start-up"]
