"""SPADE training: Algorithm 1 of arXiv 2608.19197, one policy as designer and agent, GRPO.

    for step in 0 .. S-1:
        if step % R == 0:                      # regeneration (Sec. 3, Alg. 1 lines 3-6)
            skills <- round robin; N environments <- designer(corpus doc, memory), validated
            hint(e) <- same policy, for each freshly designed environment
        play every pool environment G times unhinted (seeded);  at regeneration also H hinted
        regret(e) = mean R_hint - mean R_nohint                       # Eq. (3)
        agent samples: A = (R - mean_e) / (std_e + 1e-8)              # Eq. (1)
        at regeneration: previous epoch's designer samples get
            score = 0.4 * clip(regret / 0.15, 0, 1) + 0.6 * plateau(w),  A = S * (score - mean_skill)
        one GRPO step over designer + agent samples; sync weights into the rollout engine
        (tool use, the authors' filters: episodes that did not terminate and malformed tool-call
        replies keep their place in the group statistics but get loss mask 0)

Symbols: S steps, R regeneration interval, N environments per regeneration, G unhinted plays,
H hinted plays, w the environment's mean unhinted return over its epoch, S role-balancing scale
(code: `scale`). `--model` + `--setting` select the authors' launcher values (PRESETS; flags win).

Deviations (from the paper and the authors' code; also in the README):
  1. When fewer than N environments validate, the pool is topped up from the previous pool and, at
     step 0, from the hand-written `data/envs/`; those carry no designer sample.
  2. Environment faults drop the faulted episode from the agent batch, take the environment out
     of the pool for the rest of its epoch and give its designer score 0 (authors: -1 to the agent).
  3. The last epoch's designer samples are trained in the final step's update, scored on the
     statistics they have by then (authors drop them).
  4. Every sampling call gets a seed derived from (seed, step, phase, call), so a resumed run
     replays exactly; the corpus sampler's state is checkpointed for the same reason.
  5. Hinted plays (and so regret and hints) are for the freshly designed environments only:
     carried and hand-written ones have no designer sample to score. An empty hint: regret 0.
  6. The N slots are split over all ranks (each samples with its own seeds), so each GRPO group
     stays on one rank. The ranks of one vLLM tensor-parallel group run one engine: each generate
     call serves the group's different prompts together, once; each rank trains its own samples.
  7. Without a preset, trained log-probs use each role's sampling temperature (the authors'
     trainer: 1.0; --logprob_temperature). One batch holds all agent and designer samples of a
     designer step (the authors trim it to 192); weight decay covers every parameter. README
     deviations 18 and 21-25 give the reasons.

Launch: `python train.py --model tiny ...` (CPU) or `accelerate launch --config_file
configs/fsdp2_8gpu.yaml train.py --model Qwen3-30B-A3B`. Test: `pytest tests/test_train.py`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

import agent
import designer
import memory as memory_lib
import regret
import sandbox

HERE = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------------------------
# Config. Every default that comes from the paper cites it.

@dataclass
class ModelArgs:
    model: str = field(default="tiny", metadata={"help": "Alias (Qwen3-4B, Qwen3-8B, Qwen3-30B-A3B), hub id, local dir, or tiny / tiny-moe (random, offline)."})
    engine: str = field(default="auto", metadata={"help": "Rollout engine: auto (vLLM on GPU when installed, else transformers), vllm, transformers."})
    gradient_checkpointing: bool = field(default=True, metadata={"help": "Activation checkpointing for real models."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM tensor parallel size within a node (the ranks of a group share one engine; each plays its own environments)."})
    enable_thinking: bool | None = field(default=None, metadata={"help": "Passed to the chat template for agent turns (hybrid Qwen3 models); default: the template's."})
    strip_thinking_history: bool = field(default=False, metadata={"help": "Agent: drop earlier turns' <think> blocks from the context (re-rendered each turn, one training sample per turn), as the authors' thinking 8B agent."})
    gpu_memory_utilization: float = field(default=0.35, metadata={"help": "vLLM KV-cache share of GPU memory when colocated with training."})
    batch_tokens: int = field(default=65536, metadata={"help": "Transformers engine: prompts batched by length up to rows x (longest prompt + reply cap) tokens, a bound on its KV cache."})
    micro_batch_tokens: int = field(default=16384, metadata={"help": "Tokens per forward/backward micro-batch (gradient accumulation over the step's samples)."})


@dataclass
class SpadeArgs:
    setting: str = field(default="games", metadata={"help": "games (cognitive games, Sec. 4.1) or tool (multi-turn tool use, Sec. 4.2)."})
    steps: int = field(default=400, metadata={"help": "Training steps (paper: 400)."})
    regen_interval: int | None = field(default=None, metadata={"help": "R, steps between regenerations (paper: 4 games, 8 tool use)."})
    num_envs: int = field(default=24, metadata={"help": "N, environments per regeneration (paper: 24)."})
    plays: int = field(default=8, metadata={"help": "G, unhinted plays per environment per step (paper: 8)."})
    hint_plays: int = field(default=16, metadata={"help": "H, hinted plays per environment at a regeneration step (paper: 16)."})
    skills_per_regen: int | None = field(default=None, metadata={"help": "k, active skills per regeneration (paper: 3 of 6 games, all 6 tool use)."})
    max_attempts: int = field(default=5, metadata={"help": "Designer attempts per slot (paper: 5)."})
    corpus: str = field(default=str(HERE / "data" / "corpus.jsonl"), metadata={"help": "Grounding corpus, JSONL with `text` (or `orig_doc`) per line."})
    corpus_seed: int = field(default=42, metadata={"help": "Seed of the document sampler (paper: 42)."})
    memory_capacity: int = field(default=200, metadata={"help": "Environment memory FIFO capacity (paper: 200)."})
    designer_temperature: float = field(default=0.6, metadata={"help": "Designer sampling temperature (paper: 0.6)."})
    designer_thinking: bool | None = field(default=None, metadata={"help": "enable_thinking for designer prompts (authors' 8B: off); default: the template's."})
    hint_thinking: bool | None = field(default=None, metadata={"help": "enable_thinking for hint prompts (authors' 8B: off); default: the template's."})
    designer_max_tokens: int = field(default=16384, metadata={"help": "Designer max new tokens (paper: 16,384)."})
    hint_temperature: float = field(default=0.3, metadata={"help": "Hint sampling temperature (paper: 0.3)."})
    hint_max_tokens: int | None = field(default=None, metadata={"help": "Hint max new tokens (paper: 4,096 games, 2,048 tool use)."})
    agent_temperature: float = field(default=0.6, metadata={"help": "Agent sampling temperature (paper: 0.6)."})
    top_p: float = field(default=0.95, metadata={"help": "Top-p for designer and agent (paper: 0.95)."})
    top_k: int = field(default=20, metadata={"help": "Top-k for designer and agent (paper: 20)."})
    max_turns: int = field(default=25, metadata={"help": "Agent turns per episode (paper: 25)."})
    max_context: int = field(default=32768, metadata={"help": "Agent context in tokens (paper: 32,768)."})
    max_new_tokens: int = field(default=8192, metadata={"help": "Agent new tokens per turn (paper: 8,192)."})
    designer_reward: str = field(default="blend", metadata={"help": "blend (paper runs); ablations: regret (the authors' regret_based), solve_rate, learning_potential (regret.designer_score)."})
    role_scale_cap: float = field(default=50.0, metadata={"help": "Cap of the role-balancing scale S = min(cap, N_agent / N_designer * R) (paper: 50)."})
    no_corpus: bool = field(default=False, metadata={"help": "Ablation: designer prompts without a reference document."})
    no_memory: bool = field(default=False, metadata={"help": "Ablation: no environment memory."})
    no_designer_training: bool = field(default=False, metadata={"help": "Ablation: the designer role is never trained."})
    two_skills: bool = field(default=False, metadata={"help": "Ablation: two-skill curriculum {Math, Pattern}."})
    fixed_envs: str | None = field(default=None, metadata={"help": "Fixed-env GRPO baseline: the agent trains on --num_envs environments per step drawn without replacement (seed 42) from the validated *.py in this directory."})
    generate_pool: int | None = field(default=None, metadata={"help": "Write this many validated environments into --output_dir with the designer (memory off, no training; resumable) and exit: the Fixed-env GRPO pool."})
    no_tool_filters: bool = field(default=False, metadata={"help": "Tool use: keep episodes that did not terminate (reply cut by the token cap, turn limit, budget) and malformed tool-call replies in the loss (the authors mask them in every tool run)."})


@dataclass
class OptimArgs:
    lr: float = field(default=1e-6, metadata={"help": "AdamW learning rate, constant (paper: 1e-6)."})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay (paper: 0.1)."})
    grad_clip: float = field(default=1.0, metadata={"help": "Gradient norm clip (paper: 1.0)."})
    clip_low: float = field(default=0.2, metadata={"help": "PPO clip epsilon low (paper: 0.2)."})
    clip_high: float = field(default=0.28, metadata={"help": "PPO clip epsilon high, clip-higher (paper: 0.28)."})
    tis_cap: float = field(default=2.0, metadata={"help": "Truncated importance-sampling cap (paper: 2)."})
    kl_coef: float | None = field(default=None, metadata={"help": "k3 KL to the initial policy (paper: 0 games, 0.005 tool use)."})
    ppo_epochs: int = field(default=1, metadata={"help": "Optimizer passes per step (paper: 1)."})
    logprob_temperature: float | None = field(default=None, metadata={"help": "Temperature of the trained, old and reference log-probs; default: each role's sampling temperature (the authors' trainer: 1.0, 0.7 for tool-use 4B; the presets use theirs)."})


@dataclass
class RunArgs:
    output_dir: str = field(default="runs/spade", metadata={"help": "Run directory: metrics.jsonl, environments, memory, checkpoints."})
    seed: int = field(default=0, metadata={"help": "Seed of models, play seeds and sampling."})
    resume: bool = field(default=False, metadata={"help": "Continue from the latest checkpoint in output_dir."})
    allow_config_change: bool = field(default=False, metadata={"help": "Resume even if the config differs from the run's."})
    overwrite: bool = field(default=False, metadata={"help": "Start afresh even if output_dir holds a run."})
    checkpoint_every: int = field(default=16, metadata={"help": "Steps between checkpoints (and one at the end)."})
    keep_checkpoints: str = field(default="2", metadata={"help": "Newest resumable checkpoints, and newest policy exports, to keep: N or all."})
    export_every: int = field(default=0, metadata={"help": "Steps between Hugging Face exports of the policy to exports/step-<k> (and one at the end); 0 = none. For the paper's best-checkpoint protocol: eval.py --checkpoints <run>."})
    sandbox_workers: int = field(default=8, metadata={"help": "Sandbox worker concurrency."})
    step_timeout: float = field(default=5.0, metadata={"help": "Seconds per environment call."})
    sandbox_memory_mb: int = field(default=1024, metadata={"help": "Address-space limit per environment process."})
    log_with: str | None = field(default=None, metadata={"help": "Accelerate tracker: tensorboard or wandb."})
    transcripts: int = field(default=2, metadata={"help": "Sample transcripts written per step; at a regeneration, per new environment (report.py's cards)."})
    print_config: bool = field(default=False, metadata={"help": "Print the resolved configuration (preset + flags) as one JSON object and exit."})


# The authors' launchers (github spade-rl/spade, cmd/), one per (model, setting); G is their
# global batch over environments per step (192 / 24, 256 / 16). Log-prob temperature: their
# trainer's --rollout-temperature. Thinking: the 8B designer and hint prompts are rendered
# non-thinking, its agent thinks and sees earlier turns without their <think> blocks.
_GAMES = dict(steps=400, regen_interval=4, num_envs=24, plays=8, hint_plays=16, skills_per_regen=3,
              designer_max_tokens=16384, hint_max_tokens=4096, max_turns=25, max_context=32768,
              max_new_tokens=8192, designer_reward="blend", kl_coef=0.0, logprob_temperature=1.0)
_TOOL = dict(_GAMES, regen_interval=8, skills_per_regen=6, hint_max_tokens=2048, kl_coef=0.005)
_THINKING_8B = dict(designer_thinking=False, hint_thinking=False, enable_thinking=True,
                    strip_thinking_history=True)
_NO_THINKING = dict(designer_thinking=False, hint_thinking=False, enable_thinking=False)
PRESETS = {
    ("Qwen3-4B", "games"): ("cmd/games/train_spade_4b.sh", dict(_GAMES)),
    ("Qwen3-8B", "games"): ("cmd/games/train_spade_8b.sh",
                            dict(_GAMES, designer_max_tokens=20000, kl_coef=0.005, **_THINKING_8B)),
    ("Qwen3-30B-A3B", "games"): ("cmd/games/train_spade_30b.sh", dict(_GAMES, **_NO_THINKING)),
    ("Qwen3-4B", "tool"): ("cmd/tool_use/train_spade_4b.sh",
                           dict(_TOOL, steps=500, regen_interval=32, num_envs=16, plays=16,
                                hint_plays=4, hint_max_tokens=512, designer_reward="regret",
                                logprob_temperature=0.7)),
    ("Qwen3-8B", "tool"): ("cmd/tool_use/_train_spade_blend.sh (8b)",
                           dict(_TOOL, designer_max_tokens=20000, **_THINKING_8B)),
    ("Qwen3-30B-A3B", "tool"): ("cmd/tool_use/_train_spade_blend.sh (30b)", dict(_TOOL, **_NO_THINKING)),
}


def explicit_fields(argv: list[str], names) -> set[str]:
    """Config fields named on the command line (`--x v`, `--x=v`, dashed spellings, `--no_x`)."""
    out = set()
    for tok in argv:
        if tok.startswith("--"):
            name = tok[2:].split("=", 1)[0].replace("-", "_")
            out.add(name if name in names or not name.startswith("no_") else name[3:])
    return out


def apply_preset(args, argv: list[str]) -> str | None:
    """Overlay the authors' launcher values for --model + --setting; explicit flags win.
    Returns the launcher's file, or None when the model has no preset (tiny, other models)."""
    import models
    margs, sargs = args[0], args[1]
    hub = {v: k for k, v in models.MODEL_ALIASES.items()}
    model = hub.get(margs.model, margs.model)
    if (model, sargs.setting) not in PRESETS:
        return None
    source, values = PRESETS[(model, sargs.setting)]
    names = {f.name for a in args for f in dataclasses.fields(a)}
    given = explicit_fields(argv, names)
    for key, value in values.items():
        if key not in given:
            setattr(next(a for a in args if hasattr(a, key)), key, value)
    return source


def resolve(margs: ModelArgs, sargs: SpadeArgs, oargs: OptimArgs, rargs: RunArgs) -> None:
    """Fill setting-dependent defaults and fail fast with a clear message on bad values."""
    tool = sargs.setting == "tool"
    if sargs.setting not in ("games", "tool"):
        raise SystemExit(f"--setting must be games or tool, not {sargs.setting!r}")
    n_skills = len(skill_list(sargs))
    defaults = {"regen_interval": 8 if tool else 4, "hint_max_tokens": 2048 if tool else 4096,
                "skills_per_regen": n_skills if tool else min(3, n_skills)}
    for name, value in defaults.items():  # the setting's paper value unless given explicitly
        if getattr(sargs, name) is None:
            setattr(sargs, name, value)
    oargs.kl_coef = (0.005 if tool else 0.0) if oargs.kl_coef is None else oargs.kl_coef
    for name in ("steps", "regen_interval", "num_envs", "plays", "max_attempts", "max_turns",
                 "max_context", "max_new_tokens", "designer_max_tokens", "hint_max_tokens",
                 "skills_per_regen", "memory_capacity"):
        if getattr(sargs, name) <= 0:
            raise SystemExit(f"--{name} must be positive, got {getattr(sargs, name)}")
    if sargs.hint_plays < 0 or oargs.ppo_epochs <= 0 or rargs.checkpoint_every <= 0 or rargs.export_every < 0:
        raise SystemExit("--hint_plays and --export_every must be >= 0, --ppo_epochs and --checkpoint_every > 0")
    if not (rargs.keep_checkpoints == "all" or rargs.keep_checkpoints.isdigit() and int(rargs.keep_checkpoints) > 0):
        raise SystemExit(f"--keep_checkpoints must be a positive number or all, not {rargs.keep_checkpoints!r}")
    for name in ("agent_temperature", "designer_temperature", "hint_temperature"):
        if not getattr(sargs, name) > 0:
            raise SystemExit(f"--{name} must be > 0 (log-probs divide logits by it)")
    if oargs.logprob_temperature is not None and not oargs.logprob_temperature > 0:
        raise SystemExit("--logprob_temperature must be > 0 (log-probs divide logits by it)")
    if sargs.hint_plays == 0 and sargs.designer_reward in ("blend", "regret") and not sargs.fixed_envs:
        raise SystemExit("--hint_plays 0 leaves regret undefined: use --designer_reward solve_rate")
    if sargs.plays < 2:
        print("[spade] warning: --plays < 2 makes every agent group zero-variance (no agent gradient)")
    if sargs.skills_per_regen > n_skills:
        raise SystemExit(f"--skills_per_regen {sargs.skills_per_regen} exceeds the {n_skills} skills")
    if sargs.designer_reward not in regret.DESIGNER_MODES:
        raise SystemExit(f"--designer_reward must be one of {', '.join(regret.DESIGNER_MODES)}")
    if not sargs.no_corpus and not sargs.fixed_envs and not Path(sargs.corpus).is_file():
        raise SystemExit(f"corpus file not found: {sargs.corpus} (see data/README.md)")
    if margs.model not in ("tiny", "tiny-moe") and Path(sargs.corpus) == HERE / "data" / "corpus.jsonl" \
            and not sargs.no_corpus:
        print("[spade] warning: --corpus is the 47-paragraph demo corpus; the paper grounds the "
              "designer in a large web corpus (see data/README.md)", file=sys.stderr)
    if sargs.fixed_envs and not sorted(Path(sargs.fixed_envs).glob("*.py")):
        raise SystemExit(f"--fixed_envs {sargs.fixed_envs}: no *.py environments there")
    import models  # resolve the alias now so a typo fails before any work
    try:
        models.resolve_model_name(margs.model)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def role_temperatures(sargs: SpadeArgs, oargs: OptimArgs) -> dict:
    """Temperature of each role's trained log-probs: --logprob_temperature, else its sampling T."""
    t = oargs.logprob_temperature
    return {"agent": t or sargs.agent_temperature, "designer": t or sargs.designer_temperature}


def skill_list(sargs: SpadeArgs) -> list[str]:
    if sargs.setting == "tool":
        return list(designer.TOOL_SKILLS)
    return list(designer.TWO_SKILLS if sargs.two_skills else designer.GAME_SKILLS)


# ----------------------------------------------------------------------------------------------
# INFRA: small helpers

def derive_seed(*parts) -> int:
    """A stable 31-bit seed from any parts; the same parts give the same seed across resumes."""
    return int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:8], 16) >> 1


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def on_phase(step: int, phase: str) -> None:
    """Called at the start of every phase; a no-op hook that tests use to simulate a crash."""


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
    sample: dict | None = None  # the designer's training sample (tokens, logprobs), if any


class Sampler:
    """Binds engine + tokenizer + sampling params into the callables the leaf modules take."""

    def __init__(self, eng, tokenizer, seed: int):
        self.eng, self.tok, self.seed, self.calls = eng, tokenizer, seed, 0
        self.step, self.phase = 0, ""

    def at(self, step: int, phase: str) -> "Sampler":
        self.step, self.phase, self.calls = step, phase, 0
        return self

    def _seed(self) -> int:
        self.calls += 1
        return derive_seed(self.seed, self.step, self.phase, self.calls)

    def chat(self, *, temperature: float, max_new_tokens: int, top_p: float, top_k: int,
             enable_thinking: bool | None = None):
        """list of chat messages lists -> list[Completion] (designer and hint calls)."""
        def generate(conversations):
            prompts = [self.prompt_ids(m, enable_thinking) for m in conversations]
            return self.eng.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                     top_p=top_p, top_k=top_k, seed=self._seed())
        return generate

    def tokens(self, *, temperature: float, top_p: float, top_k: int):
        """token prompts -> list[Completion] (agent turns)."""
        def generate(prompts, max_new_tokens):
            return self.eng.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                     top_p=top_p, top_k=top_k, seed=self._seed())
        return generate

    def drain(self) -> None:
        """INFRA: end of a phase. Ranks of one vLLM tensor-parallel group keep serving the
        group's requests until every member is done (no-op for other engines)."""
        if hasattr(self.eng, "drain"):
            self.eng.drain()

    def prompt_ids(self, messages, enable_thinking: bool | None = None) -> list[int]:
        """Chat-template tokens in which message contents can never become special tokens.

        Designer and hint prompts carry model-written code and corpus text: a literal
        `<|im_end|><|im_start|>` there must stay text (README, "Running model-written code
        safely"), so contents are rendered as markers and tokenized on their own with
        special-token parsing off."""
        marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
        kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        text = self.tok.apply_chat_template([dict(m, content=k) for m, k in zip(messages, marks)],
                                            add_generation_prompt=True, tokenize=False, **kwargs)
        ids = []
        for i, piece in enumerate(re.split("\ue000(\\d+)\ue001", text)):
            if i % 2:  # a message's content
                ids += self.tok.encode(messages[int(piece)]["content"], add_special_tokens=False,
                                       split_special_tokens=True)
            elif piece:
                ids += self.tok.encode(piece, add_special_tokens=False)
        return ids


# ----------------------------------------------------------------------------------------------
# ALGO: the phases of one step

def regenerate(step, sargs, sampler, design_sampler, sb, mem, pool, corpus, rank=0,
               world=1) -> tuple[list[PoolEnv], dict, list[dict]]:
    """Alg. 1 lines 3-6: active skills, designer proposals validated in the sandbox, hints.
    Returns the new pool, its statistics, and every attempt's log record.

    With several ranks each one designs (and later plays) its own share of the N slots."""
    skills = skill_list(sargs)
    active = designer.active_skills(step, skills, sargs.skills_per_regen, sargs.regen_interval)
    slots = designer.slot_skills(active, sargs.num_envs)[rank::world]  # Sec. 3.1
    n_local = len(slots)
    rng = random.Random(derive_seed("prompts", sargs.corpus_seed, step, rank))
    gen = design_sampler.at(step, "designer").chat(temperature=sargs.designer_temperature,
                                            max_new_tokens=sargs.designer_max_tokens,
                                            enable_thinking=sargs.designer_thinking,
                                            top_p=sargs.top_p, top_k=sargs.top_k)
    block = (lambda skill: "") if sargs.no_memory else mem.prompt_block  # its own seeded, checkpointed rng
    try:
        proposals, stats = designer.regenerate(
            slots, generate=gen, validate=lambda src: sb.validate(src, setting=sargs.setting),
            corpus=corpus, memory_block=block, setting=sargs.setting, rng=rng,
            max_attempts=sargs.max_attempts, concurrency=sb.workers)
    finally:
        design_sampler.drain()
    fresh = []
    for i, p in enumerate(q for q in proposals if q.ok):
        sample = None
        if not sargs.no_designer_training:
            prompt = sampler.prompt_ids(p.messages, sargs.designer_thinking)
            sample = {"prompt": prompt, "reply": list(p.reply.token_ids),
                      "logprobs": list(p.reply.logprobs), "skill": p.skill}
        fresh.append(PoolEnv(f"s{step}-r{rank}-e{i}", p.skill, p.source, p.class_name, "designer",
                             sample=sample))
    # Deviation 1: top up from the previous pool, then (step 0) from the hand-written envs.
    carried = [dataclasses.replace(e, origin="carried", returns=[], regret=None, sample=None,
                                   r_hint=None, r_nohint=None)
               for e in pool if not e.faulty]
    if step == 0 and len(fresh) + len(carried) < n_local:
        carried += load_env_dir(HERE / "data" / "envs", sargs.setting, sb, origin="fallback")[rank::world]
    new_pool = fresh + carried[: max(0, n_local - len(fresh))]
    # only fresh environments get a hinted arm (deviation 5): carried and fallback ones no hint
    missing = [e for e in fresh if e.hint is None] if sargs.hint_plays > 0 else []
    hint_gen = sampler.at(step, "hint").chat(temperature=sargs.hint_temperature,
                                             max_new_tokens=sargs.hint_max_tokens,
                                             top_p=sargs.top_p, top_k=sargs.top_k,
                                             enable_thinking=sargs.hint_thinking)
    try:
        hints = designer.write_hints([designer.Proposal(skill=e.skill, setting=sargs.setting,
                                                        source=e.source) for e in missing], hint_gen)
    finally:
        sampler.drain()
    for e, h in zip(missing, hints):
        e.hint = h
    stats = {f"designer/{k}": v for k, v in stats.items()}
    stats["designer/accepted"] = len(fresh)
    stats["env/from_fallback"] = sum(e.origin == "fallback" for e in new_pool)
    return new_pool, stats, [p.to_log() for p in proposals]


def load_env_dir(path: Path, setting: str, sb, origin: str) -> list[PoolEnv]:
    """The environments (*.py) of one setting in a directory that pass validation.

    A `manifest.json` there (file -> {skill, setting}) names skills and settings; otherwise the
    skill comes from a first docstring line `skill: <name>.` and every file is validated."""
    manifest = Path(path) / "manifest.json"
    meta = json.loads(manifest.read_text()) if manifest.exists() else {}
    envs = []
    for f in sorted(Path(path).glob("*.py")):
        info = meta.get(f.name, {})
        if info.get("setting", setting) != setting:
            continue
        src = f.read_text(encoding="utf-8")
        report = sb.validate(src, setting=setting)
        if not report.ok:
            continue
        first = src.lstrip().strip('"\' ').split("\n", 1)[0]
        skill = info.get("skill") or (first.split(":", 1)[1].split(".")[0].strip()
                                      if first.startswith("skill:") else "unknown")
        envs.append(PoolEnv(f"{origin}:{f.stem}", skill, src, report.class_name, origin))
    return envs


def play_pool(step, pool, sargs, sampler, sb, tokenizer, hinted_arm: bool, seed: int,
              enable_thinking=None, strip_thinking_history=False):
    """Alg. 1 line 7: G unhinted plays per environment, plus H hinted at a regeneration step for
    the freshly designed environments (the ones whose regret scores a designer sample).

    Both arms draw their seeds from one list (common random numbers, our deviation)."""
    seeds = [derive_seed("play", seed, step, i) for i in range(max(sargs.plays, sargs.hint_plays))]
    jobs = []
    for e in pool:
        if e.faulty:
            continue
        jobs += [(e, s, None) for s in seeds[:sargs.plays]]
        if hinted_arm and e.hint and e.origin == "designer":
            jobs += [(e, s, e.hint) for s in seeds[:sargs.hint_plays]]
    gen = sampler.at(step, "agent").tokens(temperature=sargs.agent_temperature,
                                           top_p=sargs.top_p, top_k=sargs.top_k)
    specs = []
    try:  # an infrastructure fault (SandboxInfraError) propagates: it is never the env's fault
        for e, s, hint in jobs:
            specs.append(agent.EpisodeSpec(e.env_id, s, hint, sb.open(e.source, setting=sargs.setting)))
        return agent.play(specs, generate=gen, tokenizer=tokenizer, step_many=sb.step_many,
                          reset_many=sb.reset_many,
                          setting=sargs.setting, max_turns=sargs.max_turns,
                          max_context=sargs.max_context, max_new_tokens=sargs.max_new_tokens,
                          enable_thinking=enable_thinking, strip_thinking_history=strip_thinking_history,
                          mask_malformed=tool_filters(sargs))
    finally:
        sampler.drain()
        for spec in specs:
            spec.handle.close()


def fixed_env_schedule(n: int, k: int, steps: int, seed: int = 42) -> list[list[int]]:
    """The Fixed-env GRPO draw (the authors' static pool without replacement, seed 42): the
    pool's indices shuffled once, k taken per step; when fewer than k remain, the rest are taken
    and the step is filled from a fresh shuffle without repeating them, which then continues."""
    rng, k = random.Random(seed), min(k, n)
    remaining = list(range(n))
    rng.shuffle(remaining)
    out = []
    for _ in range(steps):
        chosen, remaining = remaining[:k], remaining[k:]
        if len(chosen) < k:
            refill = list(range(n))
            rng.shuffle(refill)
            refill = [i for i in refill if i not in set(chosen)]
            chosen, remaining = chosen + refill[:k - len(chosen)], refill[k - len(chosen):]
        out.append(chosen)
    return out


def score_epoch(pool, sargs, lp: dict | None = None) -> list[dict]:
    """Designer samples of the finished epoch with their scores (Sec. 3.3; regret.designer_score).
    `lp` (skill -> [mu_fast, mu_slow]) carries the learning_potential ablation's trackers: each
    skill's is updated with the epoch mean of its scored environments' plays before scoring."""
    mode, out = sargs.designer_reward, []
    scored = [e for e in pool if e.sample is not None]
    if mode == "learning_potential" and lp is not None:
        for skill in sorted({e.skill for e in scored}):
            rets = [r for e in scored if e.skill == skill and not e.faulty for r in e.returns]
            if rets:
                lp[skill] = regret.learning_potential_update(lp.get(skill), sum(rets) / len(rets))
    for e in scored:
        w = sum(e.returns) / len(e.returns) if e.returns else None
        baseline = (lp or {}).get(e.skill, [None, None])[1]
        missing = {"blend": e.regret, "regret": e.r_hint, "learning_potential": baseline}.get(mode, w) is None
        if mode == "regret" and e.timed_out:
            score = regret.STEP_TIMEOUT_PENALTY  # the authors' regret_based penalty
        elif e.faulty or w is None or missing:
            score = 0.0  # deviation 2: a faulty environment scores 0
        else:
            score = regret.designer_score(e.regret, w, mode=mode, r_hint=e.r_hint, baseline=baseline)
        out.append({**e.sample, "score": score, "env_id": e.env_id})
    return out


def epoch_learnable(hist: dict, pool, epoch_start: int, n_slots: int, window: int = 16) -> dict:
    """Fig. 7's learnable share: a finished epoch adds the win rates of its designer environments
    (share of its unhinted plays with return > 0) and its slot count; the share is over the
    epochs of its 16-step window so far (complete at the window's last epoch)."""
    rates = [sum(r > 0 for r in e.returns) / len(e.returns) if e.returns else 0.0
             for e in pool if e.origin == "designer"]
    hist["epochs"] = [x for x in hist["epochs"] if x[0] // window == epoch_start // window]
    hist["epochs"].append([epoch_start, rates, n_slots])
    return {"env/learnable_slot_share": regret.learnable_slot_share([(r, n) for _, r, n in hist["epochs"]])}


def regen_figures(step, new_pool, episodes, hist: dict, steps: int, seed: int, window: int = 40) -> dict:
    """Fig. 9's formula-reveal rate of a regeneration's new environments (their first
    observation), and Fig. 19's diversity over each 40-step window's new environments."""
    m, fresh = {}, {e.env_id: e for e in new_pool if e.origin == "designer"}
    first = {}
    for ep in episodes:
        if ep.env_id in fresh and not ep.hinted and ep.messages:
            first.setdefault(ep.env_id, ep.messages[0]["content"])
    if first:
        m["designer/formula_reveal_rate"] = sum(map(regret.reveals_formula, first.values())) / len(first)
    hist["sources"] += [e.source for e in fresh.values()]
    if (step + 1) % window == 0 or step + 1 == steps:
        if hist["sources"]:
            m["designer/diversity_window"] = regret.windowed_diversity(hist["sources"], random.Random(seed))
        hist["sources"] = []
    return m


def hint_regrets(pool, episodes) -> dict:
    """Alg. 1's regret phase at a regeneration step: Eq. (3) for each fault-free environment that
    has both arms, set in place (regret, r_hint, r_nohint), and the step's regret/* metrics. A
    fresh designer environment without a hint has no hinted arm: hinted = unhinted, regret 0.
    Run it after env_stats, which marks the faulty environments."""
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
        elif e.origin == "designer" and e.hint is None:
            e.regret, hinted = 0.0, plain
        else:
            continue
        e.r_hint, e.r_nohint = sum(hinted) / len(hinted), sum(plain) / len(plain)
        regs.append(e)
    if not regs:
        return {}
    return {"regret/mean": sum(e.regret for e in regs) / len(regs),
            "regret/positive_share": sum(e.regret > 0 for e in regs) / len(regs),
            "regret/r_hint": sum(e.r_hint for e in regs) / len(regs),
            "regret/r_nohint": sum(e.r_nohint for e in regs) / len(regs)}


def env_stats(step, pool, episodes) -> tuple[dict, dict]:
    """Per-step statistics; marks faulty environments and extends their epoch returns in place."""
    by_env = {e.env_id: e for e in pool}
    unhinted, rewards = {}, {}
    for ep in episodes:
        if not ep.hinted:
            rewards.setdefault(ep.env_id, []).extend(ep.rewards)
        if ep.status == "env_error":  # the environment's fault, unless the sandbox itself failed
            by_env[ep.env_id].faulty |= not str(ep.error).startswith("infra")
            by_env[ep.env_id].timed_out |= ep.error in ("timeout", "episode_timeout")
            continue
        if not ep.hinted:
            unhinted.setdefault(ep.env_id, []).append(ep.ret)
    m = {}
    for env_id, rets in unhinted.items():
        by_env[env_id].returns += rets
    wins = {k: sum(r > 0 for r in v) / len(v) for k, v in unhinted.items()}
    means = {k: sum(v) / len(v) for k, v in unhinted.items()}
    if means:
        m["env/learnable_share"] = regret.learnable_share(list(means.values()))
        m["env/win_rate"] = sum(wins.values()) / len(wins)
        m["env/zero_variance_share"] = regret.zero_variance_share(list(unhinted.values()))
        m["env/reward_granularity"] = regret.reward_granularity([rewards[k] for k in unhinted])
        for skill in sorted({by_env[k].skill for k in wins}):
            ks = [k for k in wins if by_env[k].skill == skill]
            m[f"env/win_rate/{skill}"] = sum(wins[k] for k in ks) / len(ks)
    m["env/pool_size"] = len(pool)
    m["env/faulty"] = sum(e.faulty for e in pool)
    return m, wins


def remember(step, pool, wins: dict, mem, setting: str, gather=None) -> None:
    """Alg. 1's memory update: each fault-free freshly designed environment enters the memory with
    its win rate (share of unhinted plays with return > 0) and regret; `gather` collects every
    rank's records so all ranks hold the same memory."""
    recs = [memory_lib.MemoryRecord(skill=e.skill, source=e.source, win_rate=wins.get(e.env_id, 0.0),
                                    regret=e.regret or 0.0, step=step, class_name=e.class_name,
                                    setting=setting)
            for e in pool if e.origin == "designer" and not e.faulty]
    for r in (gather(recs) if gather else recs):
        mem.add(r)


def tool_filters(sargs) -> bool:
    """The authors' tool-use training filters (every tool run): on in --setting tool."""
    return sargs.setting == "tool" and not sargs.no_tool_filters


def agent_samples(episodes, grpo, compact: bool = False) -> list[dict]:
    """Unhinted, fault-free episodes -> training samples with group advantages (Eq. 1).

    compact (the authors' compact filter, tool use): an episode that did not terminate (a reply
    cut by the token cap or the context, the environment's budget, the turn limit) still counts in
    its group's mean and std, but its loss mask is all zero: running out of turns is not a policy
    failure to push down."""
    eps = [ep for ep in episodes if not ep.hinted and ep.status != "env_error"]
    adv = grpo.agent_advantages([ep.ret for ep in eps], [ep.env_id for ep in eps])
    # A stripped-history episode trains one sample per turn, all with the episode's advantage.
    return [{"tokens": t, "mask": [0] * len(m) if compact and ep.status != "terminated" else m,
             "logprobs": lp, "advantage": a, "role": "agent"}
            for ep, a in zip(eps, adv)
            for t, m, lp in (ep.turn_samples or [(list(ep.token_ids), list(ep.mask), list(ep.logprobs))])]


def designer_samples(scored, n_agent_global, sargs, grpo, accelerator) -> tuple[list[dict], dict]:
    """Scored designer samples -> advantages A = S * (score - mean_skill) over all ranks."""
    from accelerate.utils import gather_object
    mine = [(accelerator.process_index, i, s["skill"], s["score"]) for i, s in enumerate(scored)]
    everyone = gather_object(mine) if accelerator.num_processes > 1 else mine
    if not everyone:
        return [], {}
    scale = grpo.role_scale(n_agent_global, len(everyone), sargs.regen_interval,
                            cap=sargs.role_scale_cap)
    adv = grpo.designer_advantages([x[3] for x in everyone], [x[2] for x in everyone], scale)
    mine_adv = {(r, i): a for (r, i, _, _), a in zip(everyone, adv)}
    out = []
    for i, s in enumerate(scored):
        out.append({"tokens": s["prompt"] + s["reply"], "mask": [0] * len(s["prompt"]) + [1] * len(s["reply"]),
                    "logprobs": [0.0] * len(s["prompt"]) + s["logprobs"],
                    "advantage": mine_adv[(accelerator.process_index, i)], "role": "designer"})
    scores = [x[3] for x in everyone]
    return out, {"designer/score_mean": sum(scores) / len(scores), "designer/samples": len(scores),
                 "designer/scale": scale}


def micro_batches(samples, budget: int) -> list[list[dict]]:
    """Split samples into same-role micro-batches of at most `budget` tokens (one sample may exceed)."""
    out = []
    for role in ("agent", "designer"):
        cur, n = [], 0
        for s in sorted((s for s in samples if s["role"] == role), key=lambda s: len(s["tokens"])):
            if cur and n + len(s["tokens"]) > budget:
                out.append(cur)
                cur, n = [], 0
            cur.append(s)
            n += len(s["tokens"])
        out += [cur] if cur else []
    return out


def grpo_update(model, ref_model, optimizer, scheduler, accelerator, samples, *, pad_id,
                temperatures, oargs, margs, grpo, torch) -> dict:
    """One GRPO step (Sec. 3.4): token-mean per sample, mean over all samples of all ranks.

    The model is in train mode only here (transformers checkpoints activations only in train
    mode; rollouts need eval mode, whose layers keep their KV cache), and gradients are freed
    right after the optimizer step, so they never sit in memory through the next rollouts.
    Without a KL term a sample whose advantage is exactly 0 has exactly zero gradient, and so
    has a sample whose loss mask is all zero (the tool-use compact filter): both are counted in
    the mean over samples but never forwarded (zero-variance groups cost nothing)."""
    dev, world = accelerator.device, accelerator.num_processes
    n_global = int(accelerator.gather(torch.tensor([len(samples)], device=dev)).sum())
    if n_global == 0:
        return {}
    trained = [s for s in samples if any(s["mask"]) and (s["advantage"] != 0.0 or oargs.kl_coef > 0)]
    batches = micro_batches(trained, margs.micro_batch_tokens)
    # INFRA: every rank runs the same number of forwards (FSDP collectives), at least one so
    # every parameter gets a (zero) gradient and AdamW steps as it would on zero advantages;
    # extras weigh 0.
    n_mb = max(1, int(accelerator.gather(torch.tensor([len(batches)], device=dev)).max()))
    filler = [dict(_FILLER, tokens=[pad_id, pad_id])]
    model.train()
    try:
        stats_acc, grad_norm = _update_epochs(
            model, ref_model, optimizer, scheduler, accelerator, batches, n_mb, filler, n_global,
            temperatures=temperatures, oargs=oargs, grpo=grpo, torch=torch)
    finally:
        model.eval()
    out = {}
    for k, vals in stats_acc.items():  # sample-weighted means; extremes stay extremes
        if k.endswith("_min") or k.endswith("_max"):
            out[k] = (min if k.endswith("_min") else max)(v for v, _ in vals)
        else:
            out[k] = sum(v * n for v, n in vals) / sum(n for _, n in vals)
    out["losses/grad_norm"] = float(grad_norm)
    out["losses/samples"] = n_global
    return out


def _update_epochs(model, ref_model, optimizer, scheduler, accelerator, batches, n_mb, filler,
                   n_global, *, temperatures, oargs, grpo, torch):
    """The optimizer passes of grpo_update; returns (per-micro-batch stats, last grad norm)."""
    dev, world = accelerator.device, accelerator.num_processes
    stats_acc, old_cache, grad_norm = {}, {}, 0.0
    for epoch in range(oargs.ppo_epochs):
        for b in range(n_mb):
            mb = batches[b] if b < len(batches) else filler
            t = grpo.pad_batch([{"token_ids": s["tokens"], "mask": s["mask"], "logprobs": s["logprobs"]}
                                for s in mb], pad_id=filler[0]["tokens"][0])
            t = {k: v.to(dev) for k, v in t.items()}
            temp = temperatures[mb[0]["role"]]
            with accelerator.autocast():  # bf16 compute under mixed precision, fp32 masters
                logp = grpo.token_logprobs(model, t["input_ids"], t["attention_mask"],
                                           t["completion_mask"], temperature=temp)
            if epoch == 0:  # pi_old = the policy before this step's first optimizer step
                old_cache[b] = logp.detach()
            ref = None
            if ref_model is not None:
                with torch.no_grad(), accelerator.autocast():
                    ref = grpo.token_logprobs(ref_model, t["input_ids"], t["attention_mask"],
                                              t["completion_mask"], temperature=temp)
            adv = torch.tensor([s["advantage"] for s in mb], device=dev)
            loss, st = grpo.policy_loss(logp, old_cache[b], t["rollout_logp"], adv,
                                        t["completion_mask"], ref_logp=ref, kl_coef=oargs.kl_coef,
                                        clip_low=oargs.clip_low, clip_high=oargs.clip_high,
                                        tis_cap=oargs.tis_cap)
            # loss is a mean over this micro-batch; re-weight to a mean over all samples (DDP/FSDP
            # average gradients over ranks, hence the factor `world`).
            weight = len(mb) * world / n_global if mb is not filler else 0.0
            accelerator.backward(loss * weight)
            if mb is not filler:
                for k, v in st.items():
                    stats_acc.setdefault(k, []).append((float(v), len(mb)))
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), oargs.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)  # free the gradients before the next rollouts
    return stats_acc, grad_norm


_FILLER = {"mask": [0, 1], "logprobs": [0.0, 0.0], "role": "agent", "advantage": 0.0}


# ----------------------------------------------------------------------------------------------
# INFRA: run directory, checkpoints

def prune(paths, keep: str) -> None:
    """Delete all but the newest `keep` (a number, or all) of these directories, oldest first."""
    if keep != "all":
        for old in sorted(paths, key=lambda p: p.stat().st_mtime)[:max(len(paths) - int(keep), 0)]:
            shutil.rmtree(old, ignore_errors=True)


def export_policy(accelerator, model, tokenizer, dest: Path, dtype) -> None:
    """The policy in Hugging Face format at `dest` (written beside it, then renamed into place),
    in `dtype`: the one the model shipped in (bf16 for the paper's), not the fp32 masters."""
    state_dict = accelerator.get_state_dict(model)  # every rank takes part (sharded models)
    if accelerator.is_main_process:
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        accelerator.unwrap_model(model).save_pretrained(
            tmp, state_dict={k: v.to(dtype) for k, v in state_dict.items()})
        config = json.loads((tmp / "config.json").read_text())  # it names the live fp32 dtype
        atomic_write(tmp / "config.json", json.dumps({**config, "dtype": str(dtype)[6:]}, indent=2))
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    accelerator.wait_for_everyone()


def save_checkpoint(accelerator, run_dir: Path, step: int, state: dict, keep: str = "2") -> None:
    """Write checkpoint-<step> atomically: save into a temp dir, then rename and repoint `latest`."""
    tmp, final = run_dir / f"checkpoint-{step}.tmp", run_dir / f"checkpoint-{step}"
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    tmp.mkdir(parents=True, exist_ok=True)
    atomic_write(tmp / f"spade_state-{accelerator.process_index}.json", json.dumps(state))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        atomic_write(run_dir / "latest", final.name)
        prune([p for p in run_dir.glob("checkpoint-*") if p.name != final.name and not p.name.endswith(".tmp")],
              "all" if keep == "all" else str(int(keep) - 1))
    accelerator.wait_for_everyone()


def config_dict(*args) -> dict:
    out = {}
    for a in args:
        out.update(dataclasses.asdict(a))
    for k in ("resume", "allow_config_change", "overwrite", "output_dir", "log_with", "print_config"):
        out.pop(k, None)
    return out


def prepare_run_dir(run_dir: Path, cfg: dict, rargs: RunArgs, accelerator) -> Path | None:
    """Return the checkpoint to resume from (or None); refuse a foreign or clobbered run dir."""
    saved = run_dir / "config.json"
    if rargs.resume:
        if not (run_dir / "latest").exists():
            raise SystemExit(f"--resume: no checkpoint in {run_dir}")
        old = json.loads(saved.read_text())
        diff = sorted(k for k in set(old) | set(cfg) if old.get(k) != cfg.get(k))
        if diff and not rargs.allow_config_change:
            raise SystemExit(f"--resume: {run_dir} was run with a different config ({', '.join(diff)}); "
                             "pass --allow_config_change to continue anyway")
        return run_dir / (run_dir / "latest").read_text().strip()
    exists = saved.exists()
    accelerator.wait_for_everyone()  # every rank looked before the main one writes
    if exists and not rargs.overwrite:
        raise SystemExit(f"{run_dir} already holds a run: pass --resume to continue it or --overwrite")
    if accelerator.is_main_process:
        if run_dir.exists() and rargs.overwrite:
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(saved, json.dumps(cfg, indent=2, sort_keys=True))
    accelerator.wait_for_everyone()
    return None


# ----------------------------------------------------------------------------------------------
# The loop: generate -> validate -> play -> score -> update -> sync -> log

def main(argv=None, *, engines: dict | None = None) -> Path:
    """Run SPADE; returns the run directory. `engines` (tests) may replace the rollout engine for
    the "designer" or the "agent" role, e.g. a scripted designer that returns known environments."""
    from transformers import HfArgumentParser
    argv = sys.argv[1:] if argv is None else list(argv)
    args = HfArgumentParser((ModelArgs, SpadeArgs, OptimArgs, RunArgs)).parse_args_into_dataclasses(args=argv)
    apply_preset(args, argv)
    if args[3].print_config:  # the resolved configuration, without loading a model
        resolve(*args)
        print(json.dumps({k: v for a in args for k, v in dataclasses.asdict(a).items()}, sort_keys=True))
        return None
    # INFRA: the sandbox's zygote starts before torch is imported: it is a fresh
    # interpreter that never holds the model, its memory or its secrets.
    sb = sandbox.Sandbox(workers=args[3].sandbox_workers, step_timeout=args[3].step_timeout,
                         memory_mb=args[3].sandbox_memory_mb)
    try:
        resolve(*args)
        if args[1].generate_pool:
            return generate_pool(*args, sb=sb, engines=engines or {})
        return train(*args, sb=sb, engines=engines or {})
    finally:  # never leave the zygote and its workers behind, even on a crash
        sb.close()


def train(margs, sargs, oargs, rargs, *, sb, engines) -> Path:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import gather_object, set_seed
    from tqdm.auto import tqdm

    import grpo
    import models

    accelerator = Accelerator(log_with=rargs.log_with, project_dir=rargs.output_dir)
    run_dir = Path(rargs.output_dir)
    cfg = config_dict(margs, sargs, oargs, rargs)
    resume_from = prepare_run_dir(run_dir, cfg, rargs, accelerator)
    set_seed(rargs.seed)
    rank, world, main_proc = accelerator.process_index, accelerator.num_processes, accelerator.is_main_process
    # Every rank designs and plays its own share of the pool (deviation 6); a vLLM tensor-parallel
    # group merges its ranks' different prompts into one generate call (engine.VLLMEngine).
    if world % margs.tensor_parallel_size:
        raise SystemExit(f"--tensor_parallel_size {margs.tensor_parallel_size} does not divide "
                         f"the {world} processes")
    fp32_gradient_reduce(accelerator, torch)

    # INFRA: model (fp32 master weights; bf16 compute comes from Accelerate's mixed precision),
    # optimizer, engine.
    tiny = models.resolve_model_name(margs.model) in models.TINY_MODELS
    shipped = models.shipped_dtype(margs.model)  # bf16 for the paper's models: reference, export
    model, tokenizer = models.load_model_and_tokenizer(margs.model, dtype=torch.float32,
                                                       seed=rargs.seed)
    model.eval()  # rollouts run in eval mode; grpo_update switches to train mode and back
    fsdp = getattr(accelerator.state, "fsdp_plugin", None)
    if margs.gradient_checkpointing and not tiny and not getattr(fsdp, "activation_checkpointing", False):
        model.gradient_checkpointing_enable()  # FSDP configs checkpoint layers themselves
    ref_model = None
    if oargs.kl_coef > 0:
        import copy
        ref_model = copy.deepcopy(model).to(shipped).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=oargs.lr, betas=grpo.BETAS,
                                  weight_decay=oargs.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)  # constant (paper)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if ref_model is not None:
        ref_model = accelerator.prepare_model(ref_model, evaluation_mode=True)
    # FSDP2 runs the transformers engine too (ranks decode in lockstep); ZeRO-3 / FSDP1 need vLLM
    sharded = accelerator.distributed_type.value == "DEEPSPEED" or (
        fsdp is not None and getattr(fsdp, "fsdp_version", 1) != 2)
    eng = make_engine(margs, sargs, accelerator.unwrap_model(model), tokenizer, rargs.seed, sharded)
    seed = rargs.seed + 7919 * rank
    sampler = Sampler(engines.get("agent", eng), tokenizer, seed)
    design_sampler = Sampler(engines.get("designer", eng), tokenizer, seed)
    temperatures = role_temperatures(sargs, oargs)
    corpus = None
    if not (sargs.no_corpus or sargs.fixed_envs):  # one sampler for the run, seed 42 (Sec. 3.2)
        corpus = designer.Corpus(sargs.corpus, max_words=designer.CORPUS_MAX_WORDS[sargs.setting],
                                 seed=sargs.corpus_seed + rank)
    mem = memory_lib.EnvironmentMemory(capacity=sargs.memory_capacity, path=run_dir / "memory.json",
                                       seed=rargs.seed)
    pool, start, lp = [], 0, {}  # lp: the learning_potential ablation's per-skill trackers
    hist = {"epochs": [], "sources": []}  # window data of the paper's figure metrics
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
        st = json.loads((resume_from / f"spade_state-{rank}.json").read_text())
        if st["world"] != world:
            raise SystemExit(f"--resume: the run used {st['world']} processes, this launch has {world}")
        start = st["step"]
        pool = [PoolEnv(**e) for e in st["pool"]]
        lp = st.get("learning_potential", {})
        hist = st.get("figures", hist)
        mem = memory_lib.EnvironmentMemory.from_dict(st["memory"], path=run_dir / "memory.json")
        if corpus is not None:
            corpus.load_state_dict(st["corpus"])
        if main_proc:  # drop metrics of steps that will be replayed
            lines = (run_dir / "metrics.jsonl").read_text().splitlines()[: st["metrics_lines"]]
            atomic_write(run_dir / "metrics.jsonl", "".join(line + "\n" for line in lines))
        eng.sync_weights(accelerator.unwrap_model(model))
    fixed, schedule = [], []
    if sargs.fixed_envs:  # the Fixed-env GRPO baseline: N environments per step from a static pool
        fixed = load_env_dir(Path(sargs.fixed_envs), sargs.setting, sb, origin="fixed")
        if not fixed:
            raise SystemExit(f"--fixed_envs {sargs.fixed_envs}: no environment passed validation")
        schedule = fixed_env_schedule(len(fixed), sargs.num_envs, sargs.steps)
    if main_proc:
        accelerator.init_trackers("spade", config=cfg)
        print(f"[spade] run dir {run_dir.resolve()}  sandbox level: {sb.level}  world {world}")
    bar = tqdm(range(start, sargs.steps), initial=start, total=sargs.steps, desc="spade",
               disable=not main_proc)
    train_designer = not (sargs.no_designer_training or sargs.fixed_envs)
    n_slots = len(range(rank, sargs.num_envs, world))  # this rank's designer slots
    for step in bar:
        t0, m, logs = time.perf_counter(), {}, []
        is_regen = step % sargs.regen_interval == 0 and not sargs.fixed_envs
        scored = []
        if fixed:  # this step's draw, split over the ranks
            pool = [dataclasses.replace(fixed[i]) for i in schedule[step][rank::world]]
        # ALGO: 1-2. regeneration: score the finished epoch, then design a fresh pool
        if is_regen:
            on_phase(step, "generate")
            scored = score_epoch(pool, sargs, lp)
            if step > 0:
                m.update(epoch_learnable(hist, pool, step - sargs.regen_interval, n_slots))
            pool, gm, logs = regenerate(step, sargs, sampler, design_sampler, sb, mem, pool,
                                        corpus, rank, world)
            fresh = [e.source for e in pool if e.origin == "designer"]  # Vendi of the whole pool
            fresh = [x for part in gather_object([fresh]) for x in part] if world > 1 else fresh
            m.update(gm, **{"designer/diversity": regret.diversity(fresh)})
        t_gen = time.perf_counter() - t0
        # ALGO: 3. play (unhinted G times; hinted H times at a regeneration)
        on_phase(step, "play")
        episodes = play_pool(step, pool, sargs, sampler, sb, tokenizer, seed=rargs.seed,
                             hinted_arm=is_regen and sargs.hint_plays > 0,
                             enable_thinking=margs.enable_thinking,
                             strip_thinking_history=margs.strip_thinking_history)
        t_play = time.perf_counter() - t0 - t_gen
        on_phase(step, "score")
        em, wins = env_stats(step, pool, episodes)
        m.update(em)
        if is_regen:  # ALGO: the regret phase, Eq. (3)
            m.update(hint_regrets(pool, episodes))
        m.update(regen_figures(step, pool if is_regen else [], episodes, hist, sargs.steps,
                               derive_seed("vendi", rargs.seed, step)))
        if step + 1 == sargs.steps and not sargs.fixed_envs:
            scored += score_epoch(pool, sargs, lp)  # deviation 3: the last epoch is trained too
            m.update(epoch_learnable(hist, pool, step - step % sargs.regen_interval, n_slots))
        samples = agent_samples(episodes, grpo, compact=tool_filters(sargs))
        n_agent = sum(gather_object([len(samples)])) if world > 1 else len(samples)
        if train_designer and (is_regen or step + 1 == sargs.steps):  # every rank: a collective
            ds, dm = designer_samples(scored, n_agent, sargs, grpo, accelerator)
            samples += ds
            m.update(dm)
        # ALGO: 4-5. one GRPO update over both roles, then push the weights to the engine
        on_phase(step, "update")
        t1 = time.perf_counter()
        eng.sleep()  # INFRA: colocated vLLM frees its memory for training; sync wakes it
        m.update(grpo_update(model, ref_model, optimizer, scheduler, accelerator, samples,
                             pad_id=tokenizer.pad_token_id, temperatures=temperatures, oargs=oargs,
                             margs=margs, grpo=grpo, torch=torch))
        t_update = time.perf_counter() - t1
        on_phase(step, "sync")
        eng.sync_weights(accelerator.unwrap_model(model))
        # ALGO: 6. memory: a record for every freshly designed environment
        if is_regen and not sargs.no_memory:
            remember(step, pool, wins, mem, sargs.setting, gather_object if world > 1 else None)
        # INFRA: 7. log, checkpoint
        on_phase(step, "log")
        m.update(episode_metrics(episodes))
        m.update({"charts/step": step, "charts/lr": scheduler.get_last_lr()[0],
                  "time/generate_s": t_gen, "time/play_s": t_play, "time/update_s": t_update,
                  "time/step_s": time.perf_counter() - t0})
        m = {**reduce_metrics(m, accelerator, gather_object), "charts/step": step}
        write_step_files(run_dir, step, pool if is_regen else [], episodes, rargs.transcripts,
                         logs, rank, scored)
        if main_proc:
            with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:  # + the sandbox's level
                f.write(json.dumps({**m, "sandbox/level": sb.level}, sort_keys=True) + "\n")
            accelerator.log(m, step=step)
            bar.set_postfix(ret=f"{m.get('agent/return_mean', 0):.2f}",
                            learnable=f"{m.get('env/learnable_share', 0):.2f}")
            if not sargs.no_memory:
                mem.save()
        if (step + 1) % rargs.checkpoint_every == 0 or step + 1 == sargs.steps:
            n_lines = len((run_dir / "metrics.jsonl").read_text().splitlines()) if main_proc else 0
            save_checkpoint(accelerator, run_dir, step + 1, {
                "step": step + 1, "world": world, "pool": [dataclasses.asdict(e) for e in pool],
                "corpus": corpus.state_dict() if corpus is not None else None,
                "memory": mem.to_dict(), "learning_potential": lp, "figures": hist,
                "metrics_lines": n_lines}, rargs.keep_checkpoints)
            if main_proc:  # a live run always has a recent report.html
                write_report(run_dir, final=step + 1 == sargs.steps)
        if rargs.export_every and ((step + 1) % rargs.export_every == 0 or step + 1 == sargs.steps):
            (run_dir / "exports").mkdir(exist_ok=True)
            export_policy(accelerator, model, tokenizer, run_dir / "exports" / f"step-{step + 1}",
                          shipped)
            if main_proc:
                prune([p for p in (run_dir / "exports").glob("step-*") if not p.name.endswith(".tmp")],
                      rargs.keep_checkpoints)
    # INFRA: the final policy in Hugging Face format, for eval.py and for sharing
    export_policy(accelerator, model, tokenizer, run_dir / "final_model", shipped)
    if main_proc:
        print(f"[spade] done: metrics {run_dir / 'metrics.jsonl'}, policy {run_dir / 'final_model'}")
    accelerator.end_training()
    return run_dir


def generate_pool(margs, sargs, oargs, rargs, *, sb, engines) -> Path:
    """The Fixed-env GRPO baseline's pool (Sec. 4): the untrained policy designs environments
    with the same prompts (memory off, skills in turn) until --generate_pool of them validate.
    Each one is written as it validates, with manifest.json (file -> skill, setting) and the
    generator's state, so a killed run continues where it stopped; then `--fixed_envs DIR`."""
    import torch
    from tqdm.auto import tqdm

    import models
    out, n = Path(rargs.output_dir), sargs.generate_pool
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else {}
    state = json.loads((out / "pool_state.json").read_text()) if (out / "pool_state.json").exists() else {}
    model, tok = models.load_model_and_tokenizer(margs.model, dtype=torch.bfloat16 if torch.cuda.is_available()
                                                 else torch.float32, seed=rargs.seed)
    sampler = Sampler(engines.get("designer") or make_engine(margs, sargs, model, tok, rargs.seed, False),
                      tok, rargs.seed)
    corpus = None if sargs.no_corpus else designer.Corpus(
        sargs.corpus, max_words=designer.CORPUS_MAX_WORDS[sargs.setting], seed=sargs.corpus_seed)
    if corpus is not None and state.get("corpus"):
        corpus.load_state_dict(state["corpus"])
    skills, rnd = [s.name for s in skill_list(sargs)], state.get("round", 0)
    bar, dry = tqdm(total=n, initial=min(len(manifest), n), desc="pool"), 0
    while len(manifest) < n:
        if dry == 10:
            raise SystemExit(f"--generate_pool: 10 rounds without a valid environment ({len(manifest)} of {n} in {out})")
        batch = min(sargs.num_envs, n - len(manifest))
        slots = [skills[(rnd * sargs.num_envs + i) % len(skills)] for i in range(batch)]
        gen = sampler.at(rnd, "pool").chat(temperature=sargs.designer_temperature, top_p=sargs.top_p,
                                           max_new_tokens=sargs.designer_max_tokens, top_k=sargs.top_k,
                                           enable_thinking=sargs.designer_thinking)
        proposals, _ = designer.regenerate(
            slots, generate=gen, validate=lambda src: sb.validate(src, setting=sargs.setting),
            corpus=corpus, memory_block=None, setting=sargs.setting,
            rng=random.Random(derive_seed("pool", rargs.seed, rnd)), max_attempts=sargs.max_attempts)
        for p in (p for p in proposals if p.ok):
            name = f"env_{len(manifest):05d}.py"
            atomic_write(out / name, p.source)
            manifest[name] = {"skill": p.skill, "setting": sargs.setting, "class_name": p.class_name}
            bar.update(1)
        rnd, dry = rnd + 1, 0 if any(p.ok for p in proposals) else dry + 1
        atomic_write(out / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
        atomic_write(out / "pool_state.json", json.dumps(
            {"round": rnd, "corpus": corpus.state_dict() if corpus is not None else None}))
    bar.close()
    return out


def make_engine(margs: ModelArgs, sargs: SpadeArgs, model, tokenizer, seed: int, sharded: bool):
    """vLLM colocated on GPU when installed (or asked for); the transformers engine otherwise."""
    import importlib.util

    import torch

    import engine
    import models
    want_vllm = margs.engine == "vllm" or (
        margs.engine == "auto" and torch.cuda.is_available() and importlib.util.find_spec("vllm"))
    stops = [agent.turn_end(tokenizer)[1]]  # a base model's EOS is not its end of turn
    if want_vllm:
        longest = max(sargs.max_context, 16384 + sargs.designer_max_tokens)  # designer prompt + reply
        return engine.VLLMEngine(models.resolve_model_name(margs.model),
                                 tensor_parallel_size=margs.tensor_parallel_size,
                                 gpu_memory_utilization=margs.gpu_memory_utilization,
                                 max_model_len=longest, seed=seed, stop_ids=stops)
    if sharded:  # ranks would generate different token counts through one sharded model
        raise SystemExit("DeepSpeed / FSDP1 runs need the vLLM engine (pip install -r "
                         "requirements-gpu.txt); FSDP2 runs can use either engine")
    if margs.tensor_parallel_size != 1:
        raise SystemExit("--tensor_parallel_size applies to the vLLM engine only")
    # The prefix cache reuses each episode's KV across turns (sync_weights clears it every step).
    # At 4B one 32k-token episode holds ~9.6 GB of KV, so only tiny models keep one.
    tiny = models.resolve_model_name(margs.model) in models.TINY_MODELS
    return engine.TransformersEngine(model, tokenizer, stop_ids=stops,
                                     max_batch_tokens=margs.batch_tokens,
                                     prefix_cache_bytes=PREFIX_CACHE_BYTES if tiny else 0)


PREFIX_CACHE_BYTES = 1 << 30  # the transformers engine's prefix KV cache bound (tiny models)


def fp32_gradient_reduce(accelerator, torch) -> None:
    """INFRA: FSDP2 computes in bf16 but reduce-scatters gradients in fp32 (Accelerate's default
    policy reduces in bf16, too coarse for lr 1e-6 updates); applied before prepare()."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is not None and getattr(plugin, "fsdp_version", 1) == 2:
        from torch.distributed.fsdp import MixedPrecisionPolicy
        param = getattr(plugin.mixed_precision_policy, "param_dtype", None) or torch.bfloat16
        plugin.mixed_precision_policy = MixedPrecisionPolicy(
            param_dtype=param, reduce_dtype=torch.float32, output_dtype=param)


def episode_metrics(episodes) -> dict:
    plain = [ep for ep in episodes if not ep.hinted]
    m = {"agent/episodes": len(plain)}
    if plain:
        m["agent/return_mean"] = sum(ep.ret for ep in plain) / len(plain)
        m["agent/turns_mean"] = sum(ep.turns for ep in plain) / len(plain)
        m["agent/tokens_mean"] = sum(len(ep.token_ids) for ep in plain) / len(plain)
        m["agent/masked_reply_share"] = sum(ep.masked_replies for ep in plain) / max(1, sum(ep.turns for ep in plain))
        for status in sorted({ep.status for ep in plain}):
            m[f"agent/status/{status}"] = sum(ep.status == status for ep in plain) / len(plain)
    hinted = [ep.ret for ep in episodes if ep.hinted]
    if hinted:
        m["agent/hinted_return_mean"] = sum(hinted) / len(hinted)
    return m


def reduce_metrics(m: dict, accelerator, gather_object) -> dict:
    """Mean of every scalar over the ranks that report it (counts are per-rank means too);
    `_min` / `_max` statistics reduce as min / max."""
    if accelerator.num_processes == 1:
        return m
    merged: dict = {}
    for d in gather_object([m]):
        for k, v in d.items():
            merged.setdefault(k, []).append(v)
    reduce = {"_min": min, "_max": max}
    return {k: reduce.get(k[-4:], lambda v: sum(v) / len(v))(v) for k, v in merged.items()}


def write_step_files(run_dir: Path, step: int, new_pool, episodes, n_transcripts: int,
                     proposals: list[dict], rank: int, scored=()) -> None:
    """Per rank: the freshly designed environments with their hints and first returns, every
    designer attempt with its rejection reason and message, the designer scores of the finished
    epoch, and sample transcripts: at a regeneration up to `n_transcripts` per new environment
    (unhinted and hinted alternately, for report.py's cards), else the step's first few."""
    tag = f"step-{step:04d}-rank-{rank}"
    chosen = episodes[:n_transcripts]
    if new_pool:
        d = run_dir / "envs" / tag
        d.mkdir(parents=True, exist_ok=True)
        for e in new_pool:
            atomic_write(d / f"{e.env_id.replace(':', '_')}.py", e.source)
        atomic_write(d / "pool.json", json.dumps(
            [{"env_id": e.env_id, "skill": e.skill, "origin": e.origin, "class_name": e.class_name,
              "hint": e.hint, "regret": e.regret, "r_hint": e.r_hint, "r_nohint": e.r_nohint,
              "returns": e.returns} for e in new_pool], indent=2))
        arms = [[[ep for ep in episodes if ep.env_id == e.env_id and ep.hinted == h] for h in (False, True)]
                for e in new_pool]
        chosen = [ep for plain, hinted in arms for ep in
                  [x for pair in zip_longest(plain, hinted) for x in pair if x][:n_transcripts]]
    for sub, rows in (("designer", proposals), ("transcripts", [
            {"env_id": ep.env_id, "seed": ep.seed, "hinted": ep.hinted, "return": ep.ret,
             "status": ep.status, "error": ep.error, "actions": ep.actions, "messages": ep.messages}
            for ep in chosen])):
        if rows:
            (run_dir / sub).mkdir(exist_ok=True)
            atomic_write(run_dir / sub / f"{tag}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    if scored:
        (run_dir / "designer").mkdir(exist_ok=True)
        atomic_write(run_dir / "designer" / f"scores-{tag}.json",
                     json.dumps([{"env_id": s["env_id"], "score": s["score"]} for s in scored]))


def write_report(run_dir: Path, final: bool = True) -> None:
    """INFRA: refresh RUN_DIR/report.html (report.py), at most once a minute until the final
    one; a failed report is logged, never fatal."""
    page = run_dir / "report.html"
    if not final and page.exists() and time.time() - page.stat().st_mtime < 60:
        return
    try:
        import report
        report.write_report(run_dir)
    except Exception as e:  # the run matters more than its report
        print(f"[spade] report.html not written ({type(e).__name__}: {e})", file=sys.stderr)


if __name__ == "__main__":
    main()
