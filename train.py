"""SPADE training: Algorithm 1 of arXiv 2608.19197, one policy as designer and agent, GRPO.

    for step in 0 .. S-1:                                          (train(): one call per phase)
      1. if step % R == 0, regenerate (Alg. 1 lines 3-6, Sec. 3.1-3.2): skills round robin; N
         environments <- designer(corpus doc, memory), validated; hint(e) <- the same policy
      2. play every environment G times unhinted (seeded); at regeneration the fresh ones H hinted
      3. regret(e) = mean R_hint - mean R_nohint                                     # Eq. (3)
      4. at regeneration the finished epoch's designer samples (the buffer `State.designs`) get
         score = 0.4 * clip(regret / 0.15, 0, 1) + 0.6 * plateau(w),
         A = S_role * (score - mean_skill);
         agent samples: A = (R - mean_e) / (std_e + 1e-8)                            # Eq. (1)
      5. one GRPO step over both roles' samples (Sec. 3.4)  6. weight sync
      7. fresh environments -> memory
    (tool use, the authors' filters: episodes that did not terminate and malformed tool-call
    replies keep their place in the group statistics but get loss mask 0)

Symbols: S steps, R regeneration interval, N environments per regeneration, G unhinted plays,
H hinted plays, w the environment's mean unhinted return over its epoch, S_role the designer's
role-balancing scale (`scale`; grpo.role_scale). What the ALGO blocks run on is in infra/: flags
in config.py, the statistics (Figs. 7, 9, 19; train()'s one `INFRA: statistics` block) in
metrics.py, the Fixed-env baseline in baseline.py, Accelerate and the engine in run.py, the run
directory and checkpoints in rundir.py, the held-out evaluations (--eval_every) in evaluation.py.

Deviations (README, "Deviations", has the reasons):
  1. Fewer than N valid environments: the pool is topped up from the previous pool and, at step
     0, from --fallback_envs (the hand-written `data/envs/`); those carry no designer sample
     (authors: fewer games, played more often; the missing ones designed at later steps).
  2. An environment fault drops the episode from the agent batch, the environment from the pool
     for its epoch, and scores its designer sample 0 (authors: -1 to the agent); as theirs, the
     environment still enters the memory, a crashed play counted as lost (with regret 0;
     authors: its regret from the completed plays).
  3. The last epoch's designer samples are trained at the final step (authors: in effect never;
     their final flush runs only if the last step itself has designer samples).
  4. Every sampling request's seed derives from (seed, step, role, turn or attempt) and its
     episode or slot, and the corpus sampler is checkpointed, so a resumed run replays exactly
     on CPU (on GPUs vLLM's logits follow its batches: docs/gpu.md, "No turn barrier").
  5. Hinted plays (so regret and hints) only for freshly designed environments; a hint still
     empty after designer.HINT_ATTEMPTS requests: regret 0 (and, as the authors', r_hint 0).
  6. The N slots are split over the ranks, so each GRPO group stays on one rank; one vLLM
     tensor-parallel group serves its ranks' requests, gathered before every engine step.
  7. Without a preset, log-probs at each role's sampling temperature (--logprob_temperature); one
     batch of all agent and designer samples (authors: trimmed to 192), the loss a mean over
     the real samples however few (authors: a short batch padded, its loss shrunk when KL > 0);
     weight decay on every parameter (README rows 18, 21-25, 37).
  8. Only with --lora_rank r (off by default; the paper fine-tunes every weight): LoRA adapters on
     a frozen base, the KL reference that base (adapters off), AdamW over the adapters, weight
     syncs of the adapters alone (infra/lora.py; README row 38).

Launch: `python train.py --model tiny ...` (CPU) or `accelerate launch --config_file
configs/fsdp2_8gpu.yaml train.py --model Qwen3-30B-A3B`.
Test: `pytest tests/test_train.py tests/test_train_e2e.py -m ""` (-m "": the runs too).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import agent
import designer
import grpo
import memory as memory_lib
import regret
import sandbox
from infra import baseline, config, imported, logprobs, metrics, models, openenv, telemetry
from infra.run import Run, StepLog, Trainer, preflight_plan
from infra.sampling import derive_seed

HERE = Path(__file__).resolve().parent


def phase(name: str, times: dict) -> None:
    """Enter phase `name` (an ALGO block's, metrics.PHASES, or "log"): its time/<name>_s starts."""
    times[name] = time.perf_counter()


def skill_list(setting: str, two_skills: bool = False) -> list[str]:
    """The names of the setting's skills (Sec. 4.1, 4.2; --two_skills: the ablation's two)."""
    if setting == "tool":
        return [s.name for s in designer.TOOL_SKILLS]
    return [s.name for s in (designer.TWO_SKILLS if two_skills else designer.GAME_SKILLS)]


@dataclass
class PoolEnv:
    """One environment in the pool, with its statistics over the current regeneration epoch."""
    env_id: str
    skill: str
    source: str
    class_name: str
    origin: str  # designer | carried | fallback | fixed
    hint: str | None = None
    faulty: bool = False
    timed_out: bool = False  # a fault that was a step or episode timeout
    returns: list = field(default_factory=list)  # unhinted returns over the epoch
    regret: float | None = None
    r_hint: float | None = None
    r_nohint: float | None = None
    suite: str | None = None  # an imported GEM / Gymnasium / OpenEnv id (infra/imported.py)


@dataclass
class Design:
    """A designer sample in the epoch's buffer (Sec. 3.3): the reply that wrote `env`, trained
    when the epoch ends, R steps later, with a score from what `env` gathered over the epoch."""
    env: PoolEnv
    prompt: list
    reply: list
    logprobs: list
    score: float | None = None  # set when its epoch ends (score_epoch)


@dataclass
class State:
    """The loop's state that a checkpoint saves besides the weights and the optimizer."""
    pool: list  # PoolEnv: this rank's share of the environment pool
    designs: list  # Design: the buffer of this epoch's designer samples, drained at its end
    memory: Any  # memory.EnvironmentMemory
    corpus: Any  # designer.Corpus, or None without a corpus
    lp: dict = field(default_factory=dict)  # learning_potential ablation: skill -> [fast, slow]
    hist: dict = field(default_factory=lambda: {"epochs": [], "sources": []})  # figure windows
    step: int = 0

    def to_dict(self, step: int, world: int, metrics_lines: int) -> dict:
        return {"step": step, "world": world, "pool": [dataclasses.asdict(e) for e in self.pool],
                "designs": [dict(dataclasses.asdict(d), env=d.env.env_id) for d in self.designs],
                "corpus": self.corpus.state_dict() if self.corpus is not None else None,
                "memory": self.memory.to_dict(), "learning_potential": self.lp,
                "figures": self.hist, "metrics_lines": metrics_lines}

    def restore(self, d: dict) -> None:
        self.step, self.lp, self.hist = d["step"], d["learning_potential"], d["figures"]
        self.pool = [PoolEnv(**e) for e in d["pool"]]
        by_id = {e.env_id: e for e in self.pool}  # a buffered sample's environment is in the pool
        self.designs = [Design(**dict(x, env=by_id[x["env"]])) for x in d["designs"]]
        self.memory = memory_lib.EnvironmentMemory.from_dict(d["memory"], path=self.memory.path)
        if self.corpus is not None:
            self.corpus.load_state_dict(d["corpus"])


def start_state(run, cfg: config.Config, plan) -> State:
    """A fresh state (its memory seeded from --memory_from), or with --resume the checkpoint's,
    memory included as saved: --memory_from seeds a run once, never again on resume. plan: the
    run's baseline.Schedule (a corpus only for a run whose designer writes environments)."""
    dargs, setting, corpus = cfg.designer, cfg.loop.setting, None
    # one sampler per rank, seed --corpus_seed + rank (one rank: 42, Sec. 3.2)
    if plan.designs and not dargs.no_corpus:
        corpus = designer.Corpus(dargs.corpus, max_words=designer.CORPUS_MAX_WORDS[setting],
                                 seed=dargs.corpus_seed + run.rank)
    mem = memory_lib.EnvironmentMemory(capacity=dargs.memory_capacity,
                                       path=run.run_dir / "memory.json", seed=cfg.run.seed)
    st = State(pool=[], designs=[], memory=mem, corpus=corpus)
    saved = run.resume()
    if saved is not None:
        st.restore(saved)
    elif cfg.pools.memory_from:  # another run's records as exemplars (text only, never executed)
        imported.seed_memory(st.memory, cfg.pools.memory_from, setting)
    return st


# ----------------------------------------------------------------------------------------------
# ALGO: Algorithm 1, one call per phase

def train(cfg: config.Config, *, sb) -> Path:
    """Algorithm 1; every rank runs it on its own share of the pool (deviation 6)."""
    run = Run(cfg)  # INFRA: Accelerate, policy, engine, run dir
    # SPADE's regenerations every R steps, or the Fixed-env GRPO baseline's draws and no designer
    plan = baseline.Schedule(cfg.pools, cfg.loop, sb, run.rank, run.world, env=PoolEnv)
    st = start_state(run, cfg, plan)
    loop, R = cfg.loop, cfg.loop.regen_interval
    for step in run.steps(st.step, sb.level):  # INFRA: each opens with the rollouts' memory
        run.evaluate(step)  # INFRA: held-out suites every --eval_every steps, outside time/step_s
        log, ended = StepLog(step), []  # INFRA: what the phases leave for run.log
        m = log.metrics
        regen, last = plan.regenerates(step), plan.closes_epoch(step)
        st.pool = plan.pool(step, st.pool)
        epoch_pool = st.pool  # INFRA: the finished epoch's environments, for the statistics
        # ALGO: 1. regenerate: designer proposals, sandbox validation, hints (Alg. 1 lines 3-6)
        phase("regenerate", log.times)
        if regen:
            ended = st.designs  # the finished epoch's designer samples, scored in phase 4
            st.pool, st.designs, gm, log.proposals = regenerate(
                step, st, run.sampler, sb, cfg.designer, loop, run.rank, run.world)
            log.new_pool = st.pool
            m.update(gm)
        # ALGO: 2. play: G unhinted plays per environment, H hinted per fresh one at a regeneration
        phase("play", log.times)
        episodes = log.episodes = play_pool(step, st.pool, run.sampler, sb, run.tokenizer,
                                            cfg.agent, loop, seed=cfg.run.seed,
                                            hinted_arm=regen and loop.hint_plays > 0)
        # ALGO: 3. regret (Eq. 3) of the fresh environments, after the plays mark faults and returns
        phase("regret", log.times)
        record_plays(st.pool, episodes, regen, loop.setting)
        m.update(hint_regrets(st.pool, episodes) if regen else {})
        # ALGO: 4. delayed designer scoring of the finished epoch (deviation 3: and of the last)
        phase("score", log.times)
        if last:
            ended, st.designs = ended + st.designs, []
        scored = log.scored = score_epoch(ended, cfg.regret, st.lp)
        samples = agent_samples(episodes, compact=tool_filters(cfg.agent, loop.setting))
        if (regen or last) and not cfg.designer.no_designer_training:  # a collective
            ds, dm = designer_samples(scored, samples, run.gather, run.rank, regen_interval=R,
                                      cap=cfg.grpo.role_scale_cap)
            samples += ds
            m.update(dm)
        # ALGO: 5. one GRPO update over both roles (INFRA: vLLM asleep, the trainer state back)
        phase("update", log.times)
        with run.trainer_on_device():
            m.update(grpo_update(run.trainer, samples, pad_id=run.tokenizer.pad_token_id,
                                 temperatures=run.temperatures, gargs=cfg.grpo))
        # ALGO: 6. weight sync into the rollout engine (INFRA: its weights wake, its KV cache not)
        phase("sync", log.times)
        run.engine.sync_weights(run.accelerator.unwrap_model(run.trainer.model))
        # ALGO: 7. memory update: a record for every freshly designed environment
        phase("memory", log.times)
        if regen and not cfg.designer.no_memory:
            remember(step, st.pool, st.memory, loop.setting, episodes, run.gather)
        # INFRA: statistics (Figs. 7, 9, 19; env/*), never trained on; step files, checkpoint
        phase("log", log.times)
        if regen and step > 0:  # Fig. 7 over the epoch that ended at this regeneration
            m.update(metrics.epoch_learnable(st.hist, epoch_pool, step - R, run.n_slots))
        m.update(metrics.env_metrics(st.pool, episodes))
        m.update(metrics.regen_figures(step, st.pool, regen, episodes, st.hist, loop.steps,
                                       random.Random(derive_seed("vendi", cfg.run.seed, step)),
                                       run.gather))
        if last:  # and over the last epoch
            m.update(metrics.epoch_learnable(st.hist, st.pool, step - step % R, run.n_slots))
        run.log(log)
        run.save(step, st)
    run.evaluate(loop.steps)  # INFRA: and after the last update
    return run.finish()


def regenerate(step, st: State, sampler, sb, dargs: config.DesignerArgs, loop: config.LoopArgs,
               rank=0, world=1):
    """Alg. 1 lines 3-6: active skills, designer proposals validated in the sandbox, hints, from
    the state's memory, corpus and pool (the one it replaces). Returns the new pool, the designer
    samples of its fresh environments (the new epoch's buffer), the designer/* statistics and
    every attempt's log record. Each rank designs its share of N slots."""
    active = designer.active_skills(step, skill_list(loop.setting, dargs.two_skills),
                                    dargs.skills_per_regen, loop.regen_interval)
    slots = designer.slot_skills(active, loop.num_envs)[rank::world]  # Sec. 3.1
    # mem.prompt_block draws exemplars with the memory's own seeded, checkpointed rng
    block = (lambda skill: "") if dargs.no_memory else st.memory.prompt_block
    try:
        proposals, stats = designer.regenerate(
            slots, stream=sampler.stream(  # the designer's sampling (Sec. 4)
                step, "designer", dict(temperature=dargs.designer_temperature, top_p=loop.top_p,
                                       top_k=loop.top_k),
                render=sampler.chats(dargs.designer_thinking),
                max_new_tokens=dargs.designer_max_tokens),
            validate=lambda src: sb.validate(src, setting=loop.setting), corpus=st.corpus,
            memory_block=block, setting=loop.setting,
            rng=random.Random(derive_seed("prompts", dargs.corpus_seed, step, rank)),
            max_attempts=dargs.max_attempts, concurrency=sb.workers, max_turns=loop.max_turns)
    finally:
        sampler.drain()
    ok = [p for p in proposals if p.ok]
    fresh = [PoolEnv(f"s{step}-r{rank}-e{i}", p.skill, p.source, p.class_name, "designer")
             for i, p in enumerate(ok)]
    designs = [] if dargs.no_designer_training else [
        Design(e, sampler.prompt_ids(p.messages, dargs.designer_thinking), list(p.reply.token_ids),
               list(p.reply.logprobs)) for e, p in zip(fresh, ok)]
    # Deviation 1: top up from the previous pool, then (step 0) from the hand-written envs.
    carried = [dataclasses.replace(e, origin="carried", returns=[], regret=None, r_hint=None,
                                   r_nohint=None) for e in st.pool if not e.faulty]
    if step == 0 and len(fresh) + len(carried) < len(slots):
        fallback = baseline.load(dargs.fallback_envs or str(HERE / "data" / "envs"), loop.setting,
                                 sb, "fallback")
        carried += [PoolEnv(**e) for e in fallback][rank::world]
    new_pool = fresh + carried[: max(0, len(slots) - len(fresh))]
    hinted = fresh if loop.hint_plays > 0 else []  # deviation 5: the fresh environments only
    hint_stream = sampler.stream(
        step, "hint", dict(temperature=dargs.hint_temperature, top_p=loop.top_p, top_k=loop.top_k),
        render=sampler.chats(dargs.hint_thinking), max_new_tokens=dargs.hint_max_tokens)
    try:
        hints = designer.write_hints([e.source for e in hinted], loop.setting, hint_stream)
    finally:
        sampler.drain()
    for e, h in zip(hinted, hints):
        e.hint = h
    stats = {**{f"designer/{k}": v for k, v in stats.items()}, "designer/accepted": len(fresh),
             "env/from_fallback": sum(e.origin == "fallback" for e in new_pool)}
    return new_pool, designs, stats, [p.to_log() for p in proposals]


def play_pool(step, pool, sampler, sb, tokenizer, aargs: config.AgentArgs, loop: config.LoopArgs,
              *, hinted_arm: bool, seed: int):
    """Alg. 1 line 7: G unhinted plays per environment, plus H hinted at a regeneration step for
    the freshly designed environments (the ones whose regret scores a designer sample). Both arms
    draw their seeds from one list (common random numbers, our deviation)."""
    seeds = [derive_seed("play", seed, step, i) for i in range(max(loop.plays, loop.hint_plays))]
    jobs = []
    for e in pool:
        if e.faulty:
            continue
        jobs += [(e, s, None) for s in seeds[:loop.plays]]
        if hinted_arm and e.hint and e.origin == "designer":
            jobs += [(e, s, e.hint) for s in seeds[:loop.hint_plays]]
    stream = sampler.stream(step, "agent", dict(temperature=aargs.agent_temperature,
                                                top_p=loop.top_p, top_k=loop.top_k))
    step_many, reset_many, specs = sb.step_many, sb.reset_many, []
    if any(e.suite for e in pool):  # INFRA: imported GEM / Gymnasium / OpenEnv entries
        step_many, reset_many = imported.batched(sb, True), imported.batched(sb, False)
    play = functools.partial(agent.play, tokenizer=tokenizer,
                             step_many=step_many, reset_many=reset_many,
                             setting=loop.setting, max_turns=loop.max_turns,
                             max_context=aargs.max_context, max_new_tokens=aargs.max_new_tokens,
                             enable_thinking=aargs.enable_thinking,
                             hinted_thinking=aargs.hinted_thinking,
                             strip_thinking_history=aargs.strip_thinking_history,
                             mask_malformed=tool_filters(aargs, loop.setting))
    try:  # an infrastructure fault (SandboxInfraError) propagates: it is never the env's fault
        for e, s, hint in jobs:
            handle = (imported.handle(e.suite) if e.suite
                      else sb.open(e.source, setting=loop.setting))
            specs.append(agent.EpisodeSpec(e.env_id, s, hint, handle))
        if any(e.suite for e in pool):  # INFRA: at most an OpenEnv server's sessions at once
            return openenv.play_rounds(specs, stream, lambda s, g: play(s, stream=g))
        return play(specs, stream=stream)
    finally:
        sampler.drain()
        for spec in specs:
            spec.handle.close()


def record_plays(pool, episodes, regen: bool = False, setting: str = "games") -> None:
    """Extend each environment's epoch returns with this step's unhinted returns; mark the
    environments whose code faulted (every env_error is: a fault of the sandbox itself raises
    SandboxInfraError and ends no episode), and as timed out those with a play, hinted or not,
    that stamps the regret ablation's -0.5 at a regeneration step (the authors stamp it only in
    the regeneration rollout; `stamps_timeout`)."""
    by_env = {e.env_id: e for e in pool}
    for ep in episodes:
        e = by_env[ep.env_id]
        if ep.status == "env_error":
            e.faulty = True
            e.timed_out |= regen and stamps_timeout(ep, setting)
        elif not ep.hinted:
            e.returns.append(ep.ret)


def stamps_timeout(ep, setting: str) -> bool:
    """Whether a faulted play earns the regret ablation's -0.5, as the authors flag one: a load,
    reset or step() call past its deadline; in tool use a step unless it makes tool calls (an
    answer, or a reply with neither, which they step raw; their tool calls run through
    execute_tool, whose timeouts they do not flag); never the episode's whole time budget (their
    300 s play limit is not flagged either)."""
    if ep.error != "timeout":
        return False
    return setting != "tool" or not ep.actions or not ep.actions[-1].startswith("<tool_call>")


def hint_regrets(pool, episodes) -> dict:
    """Alg. 1's regret phase at a regeneration step: Eq. (3) for each fault-free environment that
    has both arms, set in place (regret, r_hint, r_nohint), and the step's regret/* metrics. A
    fresh designer environment without a hint has no hinted arm: regret 0 and, as the authors'
    missing cached hint reward, r_hint 0 (the regret ablation then scores max(0, -w)).
    Run it after record_plays, which marks the faulty environments."""
    arms = {}  # (env_id, hinted) -> returns of the episodes that did not end in a fault
    for ep in episodes:
        if ep.status != "env_error":
            arms.setdefault((ep.env_id, ep.hinted), []).append(ep.ret)
    regs = []
    for e in pool:
        plain, hinted = arms.get((e.env_id, False)), arms.get((e.env_id, True))
        if e.faulty or not plain:
            continue
        if hinted:
            e.regret = regret.hint_regret(hinted, plain)  # Eq. (3)
            e.r_hint = sum(hinted) / len(hinted)
        elif e.origin == "designer" and e.hint is None:
            e.regret, e.r_hint = 0.0, 0.0
        else:
            continue
        e.r_nohint = sum(plain) / len(plain)
        regs.append(e)
    if not regs:
        return {}
    return {"regret/mean": sum(e.regret for e in regs) / len(regs),
            "regret/positive_share": sum(e.regret > 0 for e in regs) / len(regs),
            "regret/r_hint": sum(e.r_hint for e in regs) / len(regs),
            "regret/r_nohint": sum(e.r_nohint for e in regs) / len(regs)}


def score_epoch(designs, reward: config.RegretArgs, lp: dict | None = None) -> list[Design]:
    """The finished epoch's designer samples with their scores (Sec. 3.3): --designer_reward's
    function of regret.SCORES, passed the inputs it names, or regret.fault_score for an environment
    that faulted or lacks one. `lp` (skill -> [mu_fast, mu_slow]) carries the learning_potential
    ablation's trackers: each skill's is updated with the epoch mean of its scored environments'
    plays before scoring."""
    mode, out = reward.designer_reward, []
    score = regret.SCORES[mode]
    names = inspect.signature(score).parameters  # the inputs this mode scores with
    band = (reward.plateau_lo, reward.plateau_hi, reward.plateau_ramp)  # plateau(w)'s
    envs = [d.env for d in designs]
    if mode == "learning_potential" and lp is not None:
        for skill in sorted({e.skill for e in envs}):
            rets = [r for e in envs if e.skill == skill and not e.faulty for r in e.returns]
            if rets:
                lp[skill] = regret.learning_potential_update(lp.get(skill), sum(rets) / len(rets))
    for d, e in zip(designs, envs):
        inputs = {"regret": e.regret, "r_hint": e.r_hint,
                  "mean_return": sum(e.returns) / len(e.returns) if e.returns else None,
                  "mu_slow": (lp or {}).get(e.skill, [None, None])[1],  # the skill's slow tracker
                  "band": band}
        args = {name: inputs[name] for name in names}
        # a fault (a timeout is one), or no plays or no regret to score: deviation 2
        if e.faulty or e.timed_out or any(v is None for v in args.values()):
            out.append(dataclasses.replace(d, score=regret.fault_score(mode, e.timed_out)))
        else:
            out.append(dataclasses.replace(d, score=score(**args)))
    return out


def remember(step, pool, mem, setting: str, episodes, gather=None) -> None:
    """Alg. 1's memory update: each freshly designed environment enters the memory with its win
    rate (share of this regeneration step's unhinted plays with return > 0) and regret (0 without
    one). As the authors', a faulty one enters too: a play ended by a fault other than a timeout
    counts as lost (their crash scores -1, a "too hard" negative), a timed-out play is left out
    (theirs fails and is dropped), and an environment with no play left enters nothing. `gather`
    collects every rank's records so all ranks hold the same memory."""
    won = {}  # env_id -> [whether the play won], the counted unhinted plays
    for ep in episodes:
        if not ep.hinted and ep.error not in ("timeout", "episode_timeout"):
            won.setdefault(ep.env_id, []).append(ep.status != "env_error" and ep.ret > 0)
    recs = [memory_lib.MemoryRecord(skill=e.skill, source=e.source, regret=e.regret or 0.0,
                                    step=step, win_rate=memory_lib.win_rate(won[e.env_id]),
                                    class_name=e.class_name, setting=setting)
            for e in pool if e.origin == "designer" and won.get(e.env_id)]
    for r in (gather(recs) if gather else recs):
        mem.add(r)


def tool_filters(aargs: config.AgentArgs, setting: str) -> bool:
    """The authors' tool-use training filters (every tool run): on in --setting tool."""
    return setting == "tool" and not aargs.no_tool_filters


def agent_samples(episodes, compact: bool = False) -> list[grpo.Sample]:
    """Unhinted, fault-free episodes -> training samples with group advantages (Eq. 1). compact
    (the authors' tool-use filter): an episode that did not terminate (token cap, context, budget,
    turn limit) counts in its group's statistics with loss mask 0: no policy failure to push down.
    A stripped-history episode trains one sample per turn, all with the episode's advantage; a
    sample's `weight` is its share of the episode's trained tokens, so each episode weighs 1 in
    the loss whatever its turn count (the authors average an episode's turn samples as one)."""
    eps = [ep for ep in episodes if not ep.hinted and ep.status != "env_error"]
    adv = grpo.agent_advantages([ep.ret for ep in eps], [ep.env_id for ep in eps])
    out = []
    for ep, a in zip(eps, adv):
        turns = ep.turn_samples or [(list(ep.token_ids), list(ep.mask), list(ep.logprobs))]
        if compact and ep.status != "terminated":
            turns = [(t, [0] * len(m), lp) for t, m, lp in turns]
        n = sum(sum(m) for _, m, _ in turns)  # the episode's trained tokens
        out += [grpo.Sample(t, m, lp, advantage=a, role="agent",
                            weight=sum(m) / n if n else 1 / len(turns)) for t, m, lp in turns]
    return out


def designer_samples(scored: list[Design], agent_batch, gather=list, rank=0, *,
                     regen_interval: int, cap: float = grpo.ROLE_SCALE_CAP
                     ) -> tuple[list[grpo.Sample], dict]:
    """Scored designer samples -> advantages A = S_role * (score - mean_skill) over all ranks,
    S_role = min(cap, N_agent / N_designer * R); N_agent counts every rank's agent episodes
    (`agent_batch`: this rank's agent samples, the turns of a stripped-history episode weighing 1
    together), as the authors count before their per-turn fan-out (`gather`: every rank's items,
    rank after rank; a collective)."""
    n_agent = sum(gather([round(sum(s.weight for s in agent_batch))]))
    everyone = gather([(rank, d.env.skill, d.score) for d in scored])
    if not everyone:
        return [], {}
    ranks, skills, scores = zip(*everyone)
    scale = grpo.role_scale(n_agent, len(everyone), regen_interval, cap=cap)
    adv = grpo.designer_advantages(list(scores), list(skills), scale)
    mine = [a for r, a in zip(ranks, adv) if r == rank]  # this rank's, in the order of `scored`
    out = [grpo.Sample(d.prompt + d.reply, [0] * len(d.prompt) + [1] * len(d.reply),
                       [0.0] * len(d.prompt) + d.logprobs, advantage=a, role="designer")
           for d, a in zip(scored, mine)]
    return out, {"designer/score_mean": sum(scores) / len(scores), "designer/samples": len(scores),
                 "designer/scale": scale}


def micro_batches(samples, budget: int) -> list[list[grpo.Sample]]:
    """Split samples into same-role micro-batches of at most `budget` tokens (one may exceed)."""
    out = []
    for role in ("agent", "designer"):
        cur, n = [], 0
        for s in sorted((s for s in samples if s.role == role), key=lambda s: len(s.token_ids)):
            if cur and n + len(s.token_ids) > budget:
                out.append(cur)
                cur, n = [], 0
            cur.append(s)
            n += len(s.token_ids)
        out += [cur] if cur else []
    return out


def grpo_update(trainer: Trainer, samples, *, pad_id, temperatures,
                gargs: config.GRPOArgs) -> dict:
    """One GRPO step (Sec. 3.4) of `trainer` (run.Trainer: policy, optimizer, schedule,
    Accelerator, KL reference): token-mean per sample, then a mean over all ranks' episodes and
    designer samples, each sample weighted by its `weight` (a stripped-history turn: its share of
    its episode's tokens, so an episode's turns pool into one token-mean; otherwise 1).

    Train mode only here (transformers checkpoints activations only in train mode; rollouts keep
    their KV cache in eval mode); gradients are freed right after the optimizer step. Without a KL
    term a sample with advantage exactly 0, or an all-zero loss mask, has zero gradient: counted
    in the mean over samples, never forwarded (zero-variance groups cost nothing)."""
    model, accelerator = trainer.model, trainer.accelerator
    dev = accelerator.device
    n_global = float(accelerator.gather(torch.tensor([sum(s.weight for s in samples)],
                                                     dtype=torch.float64, device=dev)).sum())
    if n_global == 0:
        return {}
    trained = [s for s in samples
               if any(s.mask) and (s.advantage != 0.0 or gargs.kl_coef > 0)]
    batches = micro_batches(trained, gargs.micro_batch_tokens)
    # INFRA: every rank runs the same number of forwards (FSDP collectives), at least one so
    # every parameter gets a (zero) gradient and AdamW steps as it would on zero advantages;
    # extras weigh 0.
    n_mb = max(1, int(accelerator.gather(torch.tensor([len(batches)], device=dev)).max()))
    filler = [grpo.Sample([pad_id, pad_id], [0, 1], [0.0, 0.0], advantage=0.0, weight=0.0)]
    model.train()
    try:
        stats_acc, grad_norm = _update_epochs(trainer, batches, n_mb, filler, n_global,
                                              temperatures=temperatures, gargs=gargs)
    finally:
        model.eval()
    out = {}
    for k, vals in stats_acc.items():  # sample-weighted means; extremes stay extremes
        if k.endswith("_min") or k.endswith("_max"):
            out[k] = (min if k.endswith("_min") else max)(v for v, _ in vals)
        else:
            out[k] = sum(v * n for v, n in vals) / sum(n for _, n in vals)
    out["losses/grad_norm"] = float(grad_norm)
    out["losses/samples"] = round(n_global)
    # INFRA: the token counts and model FLOPs of step telemetry (telemetry.py; padding not counted)
    lengths = [len(s.token_ids) for s in trained] * gargs.ppo_epochs
    out["perf/batch_tokens"] = sum(len(s.token_ids) for s in samples)
    out["perf/update_tokens"] = sum(lengths)
    model_config = getattr(accelerator.unwrap_model(model), "config", None)  # None: no transformer
    if model_config is not None:
        passes = 3 + (trainer.ref_model is not None)  # + the frozen reference's forward
        out["perf/update_flops"] = telemetry.sequence_flops(telemetry.model_flops(model_config),
                                                            lengths, passes=passes)
    return out


def _update_epochs(trainer: Trainer, batches, n_mb, filler, n_global, *, temperatures,
                   gargs: config.GRPOArgs):
    """The optimizer passes of grpo_update; returns (per-micro-batch stats, last grad norm)."""
    model, ref_model, accelerator = trainer.model, trainer.ref_model, trainer.accelerator
    dev, world = accelerator.device, accelerator.num_processes
    stats_acc, old_cache, grad_norm = {}, {}, 0.0
    for epoch in range(gargs.ppo_epochs):
        for b in range(n_mb):
            mb = batches[b] if b < len(batches) else filler
            t = grpo.pad_batch(mb, pad_id=filler[0].token_ids[0])
            t = {k: v.to(dev) for k, v in t.items()}
            temp = temperatures[mb[0].role]
            with accelerator.autocast():  # bf16 compute under mixed precision, fp32 masters
                logp = logprobs.token_logprobs(model, t["input_ids"], t["attention_mask"],
                                               t["completion_mask"], temperature=temp)
            if epoch == 0:  # pi_old = the policy before this step's first optimizer step
                old_cache[b] = logp.detach()
            ref = None
            if ref_model is not None:
                with torch.no_grad(), accelerator.autocast():
                    ref = logprobs.token_logprobs(ref_model, t["input_ids"], t["attention_mask"],
                                                  t["completion_mask"], temperature=temp)
            adv = torch.tensor([s.advantage for s in mb], device=dev)
            # sum_i w_i * token-mean_i / n_global: a mean over all ranks' episodes and designer
            # samples (DDP/FSDP average gradients over ranks, hence the factor `world`)
            w = torch.tensor([s.weight * world / n_global for s in mb], device=dev)
            loss, st = grpo.policy_loss(logp, old_cache[b], t["rollout_logp"], adv,
                                        t["completion_mask"], ref_logp=ref, kl_coef=gargs.kl_coef,
                                        clip_low=gargs.clip_low, clip_high=gargs.clip_high,
                                        tis_cap=gargs.tis_cap, weights=w)
            accelerator.backward(loss)
            if mb is not filler:
                for k, v in st.items():
                    stats_acc.setdefault(k, []).append((float(v), len(mb)))
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), gargs.grad_clip)
        trainer.optimizer.step()
        trainer.scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)  # free the gradients before the next rollouts
    return stats_acc, grad_norm


# ----------------------------------------------------------------------------------------------
# INFRA: the command line, Accelerate, the policy and its rollout engine, logging, checkpoints

def main(argv=None) -> Path | None:
    """Run SPADE (or, with --generate_pool, write the Fixed-env baseline's pool); returns the run
    directory."""
    argv = sys.argv[1:] if argv is None else list(argv)
    cfg = config.parse(argv, aliases=models.MODEL_ALIASES)
    if cfg.run.print_config:  # the resolved configuration, without loading a model
        resolve(cfg)
        print(json.dumps(cfg.flat(), sort_keys=True))
        return None
    if cfg.run.preflight:  # the memory plan of this run, measured without weights or a GPU
        resolve(cfg)
        raise SystemExit(preflight_plan(cfg, update=grpo_update))
    models.check_loadable(cfg.model.model, "train.py")  # e.g. a hub id not cached, offline
    resolve(cfg)  # a bad flag stops here, before any process starts
    # The sandbox's zygote is a fresh interpreter started before the model loads: it never holds
    # the model, its memory or its secrets.
    sb = sandbox.Sandbox(workers=cfg.run.sandbox_workers, step_timeout=cfg.run.step_timeout,
                         memory_mb=cfg.run.sandbox_memory_mb, max_turns=cfg.loop.max_turns)
    try:
        if cfg.pools.generate_pool:
            skills = skill_list(cfg.loop.setting, cfg.designer.two_skills)
            return baseline.generate_pool(cfg, sb=sb, skills=skills)
        return train(cfg, sb=sb)
    finally:  # never leave the zygote and its workers behind, even on a crash
        sb.close()


def resolve(cfg: config.Config) -> None:
    """config.resolve with this code's skills and designer rewards, in place (each path of main
    resolves once); an unknown model fails here."""
    config.resolve(cfg, skills=len(skill_list(cfg.loop.setting, cfg.designer.two_skills)),
                   designer_modes=regret.DESIGNER_MODES, tiny=models.is_tiny(cfg.model.model))
    baseline.check(cfg.pools, cfg.designer)
    try:
        models.resolve_model_name(cfg.model.model)
    except ValueError as e:
        raise SystemExit(str(e)) from None


if __name__ == "__main__":
    main()
