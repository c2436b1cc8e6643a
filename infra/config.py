"""train.py's configuration: one Config whose groups follow the modules they configure (model,
loop, designer, agent, regret, grpo, pools, run; every paper default cites the paper), the
authors' launcher presets, and the checks that stop a bad run before any work.

Each group is a dataclass, each field one flag of the same name (`cfg.designer.corpus` is
--corpus), parsed by transformers.HfArgumentParser. A phase of train.py takes its own group or
explicit keyword arguments, never the whole Config. `python train.py --help` lists every field;
`--print_config` prints the resolved configuration (preset, then explicit flags, then the
setting's defaults) as one flat JSON object. Standard library and transformers only: train.py
passes in what the other modules define (skills, designer reward modes, model aliases, whether
the model is a tiny one).
Test: `pytest tests/test_recipe.py tests/test_wiring.py -m ""` (-m "": the runs too).
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEMO_CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus.jsonl"


@dataclass
class ModelArgs:
    """The policy and its rollout engine (infra/run.py, infra/engine.py,
    infra/vllm_engine.py, infra/offload.py)."""
    model: str = field(default="tiny", metadata={
        "help": "Alias (Qwen3-4B, Qwen3-8B, Qwen3-30B-A3B), hub id, local dir, or tiny / tiny-moe "
                "(random, offline)."})
    engine: str = field(default="auto", metadata={
        "help": "Rollout engine: auto (vLLM on GPU when installed, else transformers), vllm, "
                "transformers."})
    gradient_checkpointing: bool = field(default=True, metadata={
        "help": "Activation checkpointing for real models."})
    tensor_parallel_size: int = field(default=1, metadata={
        "help": "vLLM tensor parallel size within a node (the ranks of a group share one engine; "
                "each plays its own environments)."})
    gpu_memory_utilization: float = field(default=0.35, metadata={
        "help": "vLLM's whole share of each GPU's memory when colocated with training: its "
                "weights (1/TP of them), activation profile and KV cache; the run stops at "
                "start-up when the weights alone fill it, and --preflight prints the largest "
                "share that fits."})
    batch_tokens: int = field(default=65536, metadata={
        "help": "Transformers engine: prompts batched by length up to rows x (longest prompt + "
                "reply cap) tokens, a bound on its KV cache."})
    process_group_timeout: float = field(default=7200.0, metadata={
        "help": "Seconds a collective waits for the slowest rank (default process group and vLLM "
                "tensor-parallel groups) before the run fails; NCCL's own default is 600."})
    offload_trainer: bool = field(default=False, metadata={
        "help": "vLLM engine: the trainer's fp32 parameters and AdamW moments wait in host RAM "
                "while vLLM generates and come back for the update (offload.py; --preflight "
                "shows the memory it frees)."})
    lora_rank: int = field(default=0, metadata={
        "help": "LoRA rank r: train low-rank adapters on the frozen policy instead of every weight "
                "(infra/lora.py; README deviation 38). 0 (default, the paper's recipe): off."})
    lora_alpha: float = field(default=32.0, metadata={
        "help": "LoRA alpha: an adapter adds (alpha / r) B A x to its weight's output."})
    lora_dropout: float = field(default=0.0, metadata={
        "help": "Dropout on a LoRA adapter's input in training (0: the trainer's log-probs are "
                "the rollout engine's)."})
    lora_targets: str = field(default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                              metadata={
        "help": "Comma-separated modules that get adapters: attention and MLP projections; on "
                "Qwen3-MoE the MLP names adapt every routed expert (vLLM's CPU build runs no LoRA "
                "on MoE models: infra/lora.py)."})
    lora_merge: bool = field(default=False, metadata={
        "help": "LoRA: final_model/ and exports/step-<k>/ also hold merged/, the base model with "
                "the adapter merged into its weights (for tools that take no adapter)."})


@dataclass
class LoopArgs:
    """Algorithm 1's loop and what its phases share: the setting, S, R, N, G, H, and the
    sampling and turn limits both roles use (train.py)."""
    setting: str = field(default="games", metadata={
        "help": "games (cognitive games, Sec. 4.1) or tool (multi-turn tool use, Sec. 4.2)."})
    steps: int = field(default=400, metadata={"help": "Training steps (paper: 400)."})
    regen_interval: int | None = field(default=None, metadata={
        "help": "R, steps between regenerations (paper: 4 games, 8 tool use)."})
    num_envs: int = field(default=24, metadata={
        "help": "N, environments per regeneration (paper: 24)."})
    plays: int = field(default=8, metadata={
        "help": "G, unhinted plays per environment per step (paper: 8)."})
    hint_plays: int = field(default=16, metadata={
        "help": "H, hinted plays per environment at a regeneration step (paper: 16)."})
    top_p: float = field(default=0.95, metadata={
        "help": "Top-p for designer and agent (paper: 0.95)."})
    top_k: int = field(default=20, metadata={"help": "Top-k for designer and agent (paper: 20)."})
    max_turns: int = field(default=25, metadata={"help": "Agent turns per episode (paper: 25)."})


@dataclass
class DesignerArgs:
    """The designer role: proposals, hints, the corpus, the environment memory and the fallback
    pool of a thin first regeneration (designer.py, memory.py; train.regenerate)."""
    skills_per_regen: int | None = field(default=None, metadata={
        "help": "k, active skills per regeneration (paper: 3 of 6 games, all 6 tool use)."})
    max_attempts: int = field(default=5, metadata={
        "help": "Designer attempts per slot (paper: 5)."})
    corpus: str = field(default=str(DEMO_CORPUS), metadata={
        "help": "Grounding corpus, JSONL with `text` (or `orig_doc`) per line."})
    corpus_seed: int = field(default=42, metadata={
        "help": "Seed of the document sampler (paper: 42)."})
    memory_capacity: int = field(default=200, metadata={
        "help": "Environment memory FIFO capacity (paper: 200)."})
    designer_temperature: float = field(default=0.6, metadata={
        "help": "Designer sampling temperature (paper: 0.6)."})
    designer_thinking: bool | None = field(default=None, metadata={
        "help": "enable_thinking for designer prompts (authors' 8B: off); default: the "
                "template's."})
    designer_max_tokens: int = field(default=16384, metadata={
        "help": "Designer max new tokens (paper: 16,384)."})
    hint_temperature: float = field(default=0.3, metadata={
        "help": "Hint sampling temperature (paper: 0.3)."})
    hint_thinking: bool | None = field(default=None, metadata={
        "help": "enable_thinking for hint prompts (authors' 8B: off); default: the template's."})
    hint_max_tokens: int | None = field(default=None, metadata={
        "help": "Hint max new tokens (paper: 4,096 games, 2,048 tool use)."})
    two_skills: bool = field(default=False, metadata={
        "help": "Ablation: two-skill curriculum {Math, Pattern}."})
    no_corpus: bool = field(default=False, metadata={
        "help": "Ablation: designer prompts without a reference document."})
    no_memory: bool = field(default=False, metadata={"help": "Ablation: no environment memory."})
    no_designer_training: bool = field(default=False, metadata={
        "help": "Ablation: the designer role is never trained."})
    fallback_envs: str | None = field(default=None, metadata={
        "help": "The pool that tops up a thin first regeneration (train.py's deviation 1), in "
                "--fixed_envs' form; default: the hand-written data/envs/."})


@dataclass
class AgentArgs:
    """The agent role: its sampling, context and thinking switches (agent.py; train.play_pool)."""
    agent_temperature: float = field(default=0.6, metadata={
        "help": "Agent sampling temperature (paper: 0.6)."})
    max_context: int = field(default=32768, metadata={
        "help": "Agent context in tokens (paper: 32,768)."})
    max_new_tokens: int = field(default=8192, metadata={
        "help": "Agent new tokens per turn (paper: 8,192)."})
    enable_thinking: bool | None = field(default=None, metadata={
        "help": "Passed to the chat template for agent turns (hybrid Qwen3 models); default: the "
                "template's."})
    hinted_thinking: bool | None = field(default=None, metadata={
        "help": "enable_thinking for the hinted plays of the regret arm (the authors' 8B games: "
                "off); default: as --enable_thinking."})
    strip_thinking_history: bool = field(default=False, metadata={
        "help": "Agent: drop earlier turns' <think> blocks from the context (re-rendered each "
                "turn, one training sample per turn, the episode weighing as one in the loss), as "
                "the authors' thinking 8B games agent."})
    no_tool_filters: bool = field(default=False, metadata={
        "help": "Tool use: keep episodes that did not terminate (reply cut by the token cap, turn "
                "limit, budget) and malformed tool-call replies in the loss (the authors mask them "
                "in every tool run)."})


@dataclass
class RegretArgs:
    """The designer's score (regret.py; train.score_epoch)."""
    designer_reward: str = field(default="blend", metadata={
        "help": "blend (paper runs); ablations: regret (the authors' regret_based), solve_rate, "
                "learning_potential (regret.SCORES)."})
    plateau_lo: float = field(default=0.4, metadata={
        "help": "plateau(w) is 1 from plateau_lo (paper: 0.4; the authors' later 4B phase: 0.2)."})
    plateau_hi: float = field(default=0.6, metadata={
        "help": "... to plateau_hi (paper: 0.6; the authors' later 4B phase: 0.4)."})
    plateau_ramp: float = field(default=0.25, metadata={
        "help": "... and falls to 0 over plateau_ramp on each side (paper: 0.25; the authors' "
                "later 4B phase: 0.2)."})


@dataclass
class GRPOArgs:
    """The GRPO update: AdamW, the clipped loss, the role scale, micro-batches (grpo.py;
    train.grpo_update, train.designer_samples)."""
    lr: float = field(default=1e-6, metadata={
        "help": "AdamW learning rate, constant (paper: 1e-6)."})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay (paper: 0.1)."})
    grad_clip: float = field(default=1.0, metadata={"help": "Gradient norm clip (paper: 1.0)."})
    clip_low: float = field(default=0.2, metadata={"help": "PPO clip epsilon low (paper: 0.2)."})
    clip_high: float = field(default=0.28, metadata={
        "help": "PPO clip epsilon high, clip-higher (paper: 0.28)."})
    tis_cap: float = field(default=2.0, metadata={
        "help": "Truncated importance-sampling cap (paper: 2)."})
    kl_coef: float | None = field(default=None, metadata={
        "help": "k3 KL to the initial policy (paper: 0 games, 0.005 tool use)."})
    ppo_epochs: int = field(default=1, metadata={"help": "Optimizer passes per step (paper: 1)."})
    logprob_temperature: float | None = field(default=None, metadata={
        "help": "Temperature of the trained, old and reference log-probs; default: each role's "
                "sampling temperature (the authors' trainer: 1.0, 0.7 for tool-use 4B; the presets "
                "use theirs)."})
    micro_batch_tokens: int = field(default=16384, metadata={
        "help": "Tokens per forward/backward micro-batch (gradient accumulation over the step's "
                "samples)."})
    role_scale_cap: float = field(default=50.0, metadata={
        "help": "Cap of the role scale S_role = min(cap, N_agent / N_designer * R) (paper: "
                "50)."})


@dataclass
class PoolArgs:
    """The pools the designer did not write: the Fixed-env GRPO baseline's (--generate_pool writes
    one) and another run's memory (infra/baseline.py, infra/imported.py)."""
    fixed_envs: str | None = field(default=None, metadata={
        "help": "Fixed-env GRPO baseline: the agent trains on --num_envs environments per step "
                "drawn without replacement (seed 42) from this pool: comma-separated directories "
                "of *.py (validated in the sandbox), gem:ID (e.g. gem:rg:basic_arithmetic) and "
                "gymnasium:ID text environments, or patterns such as gem:rg:* (imported.py)."})
    memory_from: str | None = field(default=None, metadata={
        "help": "Seed a new run's environment memory with another run's records "
                "(RUN_DIR/memory.json) or an export's environments (tools/export.py's "
                "EXPORT_DIR/manifest.json)."})
    generate_pool: int | None = field(default=None, metadata={
        "help": "Write this many validated environments into --output_dir with the designer "
                "(memory off, no training; resumable) and exit: the Fixed-env GRPO pool."})


@dataclass
class RunArgs:
    """The run directory, the sandbox, logging and --preflight (infra/rundir.py, sandbox.py)."""
    output_dir: str = field(default="runs/spade", metadata={
        "help": "Run directory: metrics.jsonl, environments, memory, checkpoints."})
    seed: int = field(default=0, metadata={"help": "Seed of models, play seeds and sampling."})
    resume: bool = field(default=False, metadata={
        "help": "Continue from the latest checkpoint in output_dir."})
    allow_config_change: bool = field(default=False, metadata={
        "help": "Resume even if the config differs from the run's."})
    overwrite: bool = field(default=False, metadata={
        "help": "Start afresh even if output_dir holds a run."})
    checkpoint_every: int = field(default=16, metadata={
        "help": "Steps between checkpoints (and one at the end)."})
    keep_checkpoints: str = field(default="2", metadata={
        "help": "Newest resumable checkpoints, and newest policy exports, to keep: N or all."})
    export_every: int = field(default=0, metadata={
        "help": "Steps between Hugging Face exports of the policy to exports/step-<k> (and one at "
                "the end); 0 = none. For the paper's best-checkpoint protocol: eval.py "
                "--checkpoints <run>."})
    sandbox_workers: int = field(default=8, metadata={"help": "Sandbox worker concurrency."})
    step_timeout: float = field(default=5.0, metadata={"help": "Seconds per environment call."})
    sandbox_memory_mb: int = field(default=1024, metadata={
        "help": "Address-space limit per environment process."})
    log_with: str | None = field(default=None, metadata={
        "help": "Accelerate trackers, comma-separated: tensorboard, wandb (offline with "
                "WANDB_MODE=offline), trackio (its local store, TRACKIO_DIR); each tested."})
    eval_every: int = field(default=0, metadata={
        "help": "Run --eval_suites at step 0, every this many steps and after the last, on the "
                "run's engine and current weights (infra/evaluation.py): eval/<suite>/<metric> "
                "rows, RUN_DIR/eval/; 0 = never."})
    eval_suites: str = field(default="aime2025", metadata={
        "help": "--eval_every: eval.py's suites, comma-separated (eval.py --suites)."})
    eval_args: str = field(default="", metadata={
        "help": "--eval_every: eval.py's other flags as one string, e.g. \"--data_dir data/eval "
                "--aime_samples 4 --limit 30\" (per-suite sample counts, token budgets; not "
                "--model, --engine or --output_dir: the run's own)."})
    transcripts: int = field(default=2, metadata={
        "help": "Sample transcripts written per step; at a regeneration, per new environment "
                "(tools/report.py's cards)."})
    print_config: bool = field(default=False, metadata={
        "help": "Print the resolved configuration (preset + flags) as one JSON object and exit."})
    preflight: bool = field(default=False, metadata={
        "help": "Print this run's memory plan per GPU (rollout, update, optimizer step, sync; KV "
                "tokens; host RAM) on --gpus cards of --gpu, measured without weights or a GPU "
                "(preflight.py), and exit: 0 when it fits, else 1 and the change that fits."})
    gpu: str = field(default="h100-80gb", metadata={
        "help": "--preflight: the card, h100-80gb, h200-141gb or its memory in GiB."})
    gpus: int = field(default=1, metadata={
        "help": "--preflight: the launch's GPUs (FSDP2 ranks; 1: one GPU, no sharding)."})


# The authors' launchers (github spade-rl/spade, cmd/), one per (model, setting), where they differ
# from the defaults above (their G is the global batch over environments per step: 192 / 24,
# 256 / 16). Log-prob temperature: their trainer's --rollout-temperature. Thinking: the 8B designer
# and hint prompts are rendered non-thinking and its agent thinks. In games the agent sees earlier
# turns without their <think> blocks and its hinted plays do not think (they render with the
# adapter's enable_thinking false); their tool path keeps one accumulated sequence, hinted or not.
_THINKING_8B = dict(designer_thinking=False, hint_thinking=False, enable_thinking=True)
_NO_THINKING = dict(designer_thinking=False, hint_thinking=False, enable_thinking=False)
PRESETS = {
    ("Qwen3-4B", "games"): ("cmd/games/train_spade_4b.sh", dict(logprob_temperature=1.0)),
    ("Qwen3-8B", "games"): ("cmd/games/train_spade_8b.sh",
                            dict(logprob_temperature=1.0, designer_max_tokens=20000, kl_coef=0.005,
                                 strip_thinking_history=True, hinted_thinking=False,
                                 **_THINKING_8B)),
    ("Qwen3-30B-A3B", "games"): ("cmd/games/train_spade_30b.sh",
                                 dict(logprob_temperature=1.0, **_NO_THINKING)),
    ("Qwen3-4B", "tool"): ("cmd/tool_use/train_spade_4b.sh",
                           dict(logprob_temperature=0.7, steps=500, regen_interval=32, num_envs=16,
                                plays=16, hint_plays=4, hint_max_tokens=512,
                                designer_reward="regret")),
    ("Qwen3-8B", "tool"): ("cmd/tool_use/_train_spade_blend.sh (8b)",
                           dict(logprob_temperature=1.0, designer_max_tokens=20000,
                                **_THINKING_8B)),
    ("Qwen3-30B-A3B", "tool"): ("cmd/tool_use/_train_spade_blend.sh (30b)",
                                dict(logprob_temperature=1.0, **_NO_THINKING)),
}
# The setting's paper values of the fields left None above (Sec. 4.1, 4.2); k = all tool skills.
SETTING_DEFAULTS = {"games": dict(regen_interval=4, hint_max_tokens=4096, kl_coef=0.0),
                    "tool": dict(regen_interval=8, hint_max_tokens=2048, kl_coef=0.005)}


@dataclass
class Config:
    """train.py's whole configuration, one group per module it configures, read by name
    (`cfg.designer.corpus`); every field of every group is a flag of the same name."""
    model: ModelArgs = field(default_factory=ModelArgs)
    loop: LoopArgs = field(default_factory=LoopArgs)
    designer: DesignerArgs = field(default_factory=DesignerArgs)
    agent: AgentArgs = field(default_factory=AgentArgs)
    regret: RegretArgs = field(default_factory=RegretArgs)
    grpo: GRPOArgs = field(default_factory=GRPOArgs)
    pools: PoolArgs = field(default_factory=PoolArgs)
    run: RunArgs = field(default_factory=RunArgs)

    def groups(self) -> tuple:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def group_of(self, name: str):
        """The group that holds the field `name`."""
        return next(g for g in self.groups() if hasattr(g, name))

    def flat(self) -> dict:
        """Every field by its flag's name (the groups' fields never share a name)."""
        return {k: v for g in self.groups() for k, v in dataclasses.asdict(g).items()}


# The groups' dataclasses in Config's order: the command line's (HfArgumentParser) order too.
GROUPS = tuple(f.default_factory for f in dataclasses.fields(Config))


def parse(argv: list[str], aliases: dict) -> Config:
    """The Config of a command line. The authors' preset for --model (an alias, or its hub id in
    `aliases`) + --setting becomes the parser's defaults, so every flag given on the command line
    wins, however it is spelled (an argparse abbreviation such as --designer_max included)."""
    from transformers import HfArgumentParser
    parser = HfArgumentParser(GROUPS)
    first = Config(*parser.parse_args_into_dataclasses(args=argv))
    model = {hub: alias for alias, hub in aliases.items()}.get(first.model.model, first.model.model)
    parser.set_defaults(**PRESETS.get((model, first.loop.setting), ("", {}))[1])
    return Config(*parser.parse_args_into_dataclasses(args=argv))


def resolve(cfg: Config, *, skills: int, designer_modes, tiny: bool) -> None:
    """Fill the setting's defaults and fail fast with a clear message on bad values; `skills` is
    the number of skills of the setting, `designer_modes` the --designer_reward choices, `tiny`
    whether --model is a tiny offline model (models.is_tiny)."""
    loop, d, a, g, r = cfg.loop, cfg.designer, cfg.agent, cfg.grpo, cfg.run
    if loop.setting not in SETTING_DEFAULTS:
        raise SystemExit(f"--setting must be games or tool, not {loop.setting!r}")
    skills_per_regen = min(3, skills) if loop.setting == "games" else skills
    defaults = dict(SETTING_DEFAULTS[loop.setting], skills_per_regen=skills_per_regen)
    for name, value in defaults.items():  # the setting's paper value unless given explicitly
        if getattr(cfg.group_of(name), name) is None:
            setattr(cfg.group_of(name), name, value)
    for name in ("steps", "regen_interval", "num_envs", "plays", "max_attempts", "max_turns",
                 "max_context", "max_new_tokens", "designer_max_tokens", "hint_max_tokens",
                 "skills_per_regen", "memory_capacity"):
        if getattr(cfg.group_of(name), name) <= 0:
            raise SystemExit(f"--{name} must be positive, got {getattr(cfg.group_of(name), name)}")
    negative = loop.hint_plays < 0 or r.export_every < 0 or r.eval_every < 0
    if negative or g.ppo_epochs <= 0 or r.checkpoint_every <= 0:
        raise SystemExit("--hint_plays, --export_every and --eval_every must be >= 0, "
                         "--ppo_epochs and --checkpoint_every > 0")
    keep = r.keep_checkpoints
    if not (keep == "all" or keep.isdigit() and int(keep) > 0):
        raise SystemExit(f"--keep_checkpoints must be a positive number or all, not {keep!r}")
    for group, name in ((a, "agent_temperature"), (d, "designer_temperature"),
                        (d, "hint_temperature")):
        if not getattr(group, name) > 0:
            raise SystemExit(f"--{name} must be > 0 (log-probs divide logits by it)")
    if g.logprob_temperature is not None and not g.logprob_temperature > 0:
        raise SystemExit("--logprob_temperature must be > 0 (log-probs divide logits by it)")
    if not (cfg.regret.plateau_lo <= cfg.regret.plateau_hi and cfg.regret.plateau_ramp > 0):
        raise SystemExit("--plateau_lo must be <= --plateau_hi and --plateau_ramp > 0")
    needs_regret = cfg.regret.designer_reward in ("blend", "regret") and not cfg.pools.fixed_envs
    if loop.hint_plays == 0 and needs_regret:
        raise SystemExit("--hint_plays 0 leaves regret undefined: use --designer_reward solve_rate")
    check_lora(cfg.model)
    if loop.plays < 2:
        print("[spade] warning: --plays < 2 makes every agent group zero-variance "
              "(no agent gradient)", file=sys.stderr)
    if d.skills_per_regen > skills:
        raise SystemExit(f"--skills_per_regen {d.skills_per_regen} exceeds the {skills} skills")
    if cfg.regret.designer_reward not in designer_modes:
        raise SystemExit(f"--designer_reward must be one of {', '.join(designer_modes)}")
    if not d.no_corpus and not cfg.pools.fixed_envs and not Path(d.corpus).is_file():
        raise SystemExit(f"corpus file not found: {d.corpus} (see data/README.md)")
    demo_corpus = Path(d.corpus) == DEMO_CORPUS and not d.no_corpus
    if not tiny and demo_corpus:
        print("[spade] warning: --corpus is the 47-paragraph demo corpus; the paper grounds the "
              "designer in a large web corpus (see data/README.md)", file=sys.stderr)


def check_lora(m: ModelArgs) -> None:
    """The LoRA flags' checks (--lora_rank 0: none apply)."""
    if m.lora_rank < 0:
        raise SystemExit(f"--lora_rank must be >= 0 (0: off), got {m.lora_rank}")
    if not m.lora_rank:
        return
    if not (m.lora_alpha > 0 and 0 <= m.lora_dropout < 1):
        raise SystemExit("--lora_alpha must be > 0 and --lora_dropout in [0, 1)")
    if not [t for t in m.lora_targets.split(",") if t.strip()]:
        raise SystemExit("--lora_targets names no module")
    if m.offload_trainer:  # offload.py moves fp32 masters and AdamW moments of every weight
        raise SystemExit("--offload_trainer is for full fine-tuning: a LoRA run's trainer state "
                         "is its frozen base and an adapter (--preflight shows it)")


def role_temperatures(cfg: Config) -> dict:
    """Temperature of each role's trained log-probs: --logprob_temperature, else its sampling T."""
    t = cfg.grpo.logprob_temperature
    return {"agent": t or cfg.agent.agent_temperature,
            "designer": t or cfg.designer.designer_temperature}


def config_dict(cfg: Config) -> dict:
    """The run's configuration as saved in config.json (a resume compares against it): what
    decides the training, not how it is logged or looked at (the held-out evaluation's flags are
    in each eval/step-<k>/results.json, so a resumed run may add or change them)."""
    out = cfg.flat()
    for k in ("resume", "allow_config_change", "overwrite", "output_dir", "log_with",
              "print_config", "process_group_timeout", "preflight", "gpu", "gpus",
              "eval_every", "eval_suites", "eval_args"):
        out.pop(k, None)
    return out
