"""Step benchmark: where the wall time of one end-to-end SPADE training step goes.

    python bench/step.py                        # the definition: warm-up + 2 measured steps
    python bench/step.py --plays 1 --turns 2    # quick look (~2 min here), same breakdown
    python bench/step.py --engine vllm          # the same with vllm_engine.VLLMEngine (vLLM installed)
    python bench/step.py --smoke                # 2 environments x 1 play x 1 turn on a 2-layer
                                                # model, 1 measured step: seconds, shows it runs

step.overhead_share: train.main runs the real loop (sandbox, agent, GRPO update, logging,
checkpoint) on a random-initialised Qwen3 of 10.7M parameters (hidden 384, 6 layers, the tiny
byte-level BPE tokenizer, saved with save_pretrained and loaded back as a local `--model` dir,
fp32, no activation checkpointing), 8 environments x 4 plays x up to 5 turns of up to 48 tokens,
played on the shipped `data/envs` games (`--fixed_envs data/envs`; the two tool environments fail
games validation and are skipped, leaving exactly 8). Nothing in train.py is changed: the bench
wraps, from outside,
  generation    TransformersEngine.generate, or VLLMEngine.generate and .collect (prefill +
                decode + sampling, incl. decoding text)
  fwd/bwd       logprobs.token_logprobs, grpo.policy_loss, Accelerator.backward,
                Accelerator.clip_grad_norm_, AcceleratedOptimizer.step
and everything else inside the step's wall time is overhead, itemised where it is wrapped:
sandbox (open / reset / step_many / close), chat-template tokenizing (agent._Renderer), update
bookkeeping (grpo_update minus its model parts: micro-batching, padding, stats), the weight
sync (`--engine vllm`: VLLMEngine.sync_weights; the transformers engine shares the model), logging
(write_step_files, metrics, memory), the rest (advantages, episode lists, tqdm). A step spans from
its first phase (train.phase, wrapped: "regenerate" starts a step) to the next step's; the final
checkpoint is excluded and printed apart (it runs every --checkpoint_every = 16 steps).

The workload is the maximum the definition allows, and deterministic: a random model almost never
emits EOS, and agent.play ends an EOS-less reply's episode ("truncated") after ONE turn with no
environment step, which would leave the sandbox idle. So while generate runs, a forward hook on
lm_head forces EOS as the 48th token of every reply: every reply is 48 tokens, gets parsed and
stepped, and every episode plays 5 turns (the environments answer the random text with a format
reminder). Rollout log-probs of those EOS tokens (~0) differ from the trainer's recomputation; the
truncated IS weight absorbs it and the timing does not care.

Figure: overhead / step wall time, median over the measured steps (the first step is a warm-up:
lazy imports, first-call allocations); target <= 0.15. Absolute seconds per part are printed for
context, with the overhead per episode-turn (what carries over to a GPU, where model time shrinks).
The JSON line names its workload. Prints JSON as its last lines; never asserts.

Runtime: a step of the definition trains 32 sequences of ~955 tokens and decodes 5 x 48 steps at
batch 32 with a 10.7M model; on the shared 2-core machine (load ~5) the warm-up step took 540 s and
the measured one 361 s (generation 214 s, fwd/bwd 146 s, overhead 0.88 s: chat template 0.63,
sandbox 0.13, update bookkeeping 0.09; 5.5 ms per episode-turn; share 0.0024), so the definition
does NOT fit the two-minute budget of a benchmark; `--plays 1 --turns 2 --steps 1` does (~115 s,
share 0.0024). Only plain (fixed-pool) steps are measured: a regeneration step adds
designer and hint generation (more model time) and hinted plays (the same per-turn overhead).
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.optimizer import AcceleratedOptimizer  # noqa: E402

import agent  # noqa: E402
from infra import engine  # noqa: E402
from infra import vllm_engine  # noqa: E402
import grpo  # noqa: E402
from infra import rundir  # noqa: E402
from infra import logprobs  # noqa: E402
import memory  # noqa: E402
from infra import metrics  # noqa: E402
from infra import models  # noqa: E402
import sandbox  # noqa: E402
import train  # noqa: E402

ENVS, PLAYS, TURNS, REPLY_TOKENS = 8, 4, 5, 48
MODEL = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2,
             head_dim=64, intermediate_size=1152)
SMOKE_MODEL = dict(MODEL, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=32, intermediate_size=128)

MODEL_PARTS = ("generation", "fwd_bwd")
SANDBOX, TOKENIZE, UPDATE, SYNC = "sandbox", "chat_template", "update", "weight_sync"


class Clock:
    """Exclusive timers keyed by (step, part); the current step counts train.phase's first phase."""

    def __init__(self):
        self.step, self.phases = -1, defaultdict(list)  # step -> [(phase, t)]
        self.parts = defaultdict(lambda: defaultdict(float))
        self.checkpoint = []  # (start, seconds)

    def wrap(self, owner, name, part):
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[self.step][part] += time.perf_counter() - t
        setattr(owner, name, timed)

    def on_phase(self, phase):
        self.step += phase == metrics.PHASES[0]
        self.phases[self.step].append((phase, time.perf_counter()))

    def windows(self):
        """step -> (start, end): first phase hook to the next step's (or the last checkpoint)."""
        steps = sorted(self.phases)
        ends = [self.phases[s][0][1] for s in steps[1:]]
        last_ckpt = [t for t, _ in self.checkpoint if t > self.phases[steps[-1]][0][1]]
        ends.append(last_ckpt[0] if last_ckpt else time.perf_counter())
        return {s: (self.phases[s][0][1], e) for s, e in zip(steps, ends)}


def build_model(out_dir: Path, shape: dict) -> int:
    """A random-init Qwen3 (>= 10M parameters) with the tiny tokenizer, saved as a local model."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config
    tok = models.build_tiny_tokenizer()
    config = Qwen3Config(vocab_size=len(tok), max_position_embeddings=40960, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None, **shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters())


def force_vllm_eos(tok) -> None:
    """vLLM's model cannot take the forward hook: its replies that reach 48 tokens get EOS as the
    48th token afterwards (the same replies, prompts and episode lengths as the hook gives), in
    generate() and in the completions collect() hands train.py's request streams."""
    original, completion = vllm_engine.VLLMEngine.generate, vllm_engine.VLLMEngine._completion

    def eos_at_cap(o):
        if o.finish_reason == "length" and len(o.token_ids) == REPLY_TOKENS:
            o.token_ids[-1], o.finish_reason = tok.eos_token_id, "stop"
            o.text = tok.decode(o.token_ids, skip_special_tokens=True)
        return o

    def generate(self, *args, **kwargs):
        return [eos_at_cap(o) for o in original(self, *args, **kwargs)]
    vllm_engine.VLLMEngine.generate = generate
    vllm_engine.VLLMEngine._completion = lambda self, o: eos_at_cap(completion(self, o))


def instrument(clock: Clock) -> None:
    """Wrap the model-bound calls and the itemised overheads; force EOS as each reply's 48th token."""
    forced = {"active": False, "forward": 0}

    def force_eos(module, args, out):
        if not forced["active"]:
            return None
        forced["forward"] += 1  # forward i (0 = prefill) yields the logits of reply token i
        if forced["forward"] == REPLY_TOKENS:
            out = torch.full_like(out, -1e4)
            out[..., module.eos_id] = 0.0
        return out

    original_init, original_generate = engine.TransformersEngine.__init__, \
        engine.TransformersEngine.generate

    def init(self, model, tokenizer, **kw):
        original_init(self, model, tokenizer, **kw)
        head = model.get_output_embeddings()
        head.eos_id = tokenizer.eos_token_id
        head.register_forward_hook(force_eos)

    def generate(self, *args, **kwargs):
        forced.update(active=True, forward=0)
        try:
            return original_generate(self, *args, **kwargs)
        finally:
            forced["active"] = False
    engine.TransformersEngine.__init__ = init
    engine.TransformersEngine.generate = generate

    force_vllm_eos(models.build_tiny_tokenizer())
    clock.wrap(engine.TransformersEngine, "generate", "generation")
    clock.wrap(vllm_engine.VLLMEngine, "generate", "generation")
    clock.wrap(vllm_engine.VLLMEngine, "collect", "generation")  # train.py's request streams
    clock.wrap(vllm_engine.VLLMEngine, "sync_weights", SYNC)  # vLLM only: transformers shares the model
    for owner, name in ((logprobs, "token_logprobs"), (grpo, "policy_loss"), (Accelerator, "backward"),
                        (Accelerator, "clip_grad_norm_"), (AcceleratedOptimizer, "step")):
        clock.wrap(owner, name, "fwd_bwd")
    clock.wrap(train, "grpo_update", UPDATE)
    for owner, name in ((sandbox.Sandbox, "open"), (sandbox.Sandbox, "step_many"),
                        (sandbox.EnvHandle, "reset"), (sandbox.EnvHandle, "close")):
        clock.wrap(owner, name, SANDBOX)
    for name in ("prompt", "delta"):
        clock.wrap(agent._Renderer, name, TOKENIZE)
    clock.wrap(rundir, "write_step_files", "logging")
    clock.wrap(metrics, "episode_metrics", "logging")
    clock.wrap(memory.EnvironmentMemory, "save", "logging")
    for name in ("record_plays", "hint_regrets", "agent_samples"):
        clock.wrap(train, name, "scoring")
    clock.wrap(metrics, "env_metrics", "scoring")
    phase = train.phase

    def timed_phase(name, times):
        clock.on_phase(name)
        phase(name, times)
    train.phase = timed_phase

    original_ckpt = rundir.save_checkpoint

    def save_checkpoint(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original_ckpt(*args, **kwargs)
        finally:
            clock.checkpoint.append((t, time.perf_counter() - t))
    rundir.save_checkpoint = save_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="measured steps after the warm-up step")
    ap.add_argument("--plays", type=int, default=PLAYS, help="plays per environment (definition: 4)")
    ap.add_argument("--turns", type=int, default=TURNS, help="turns per episode (definition: 5)")
    ap.add_argument("--envs", type=int, default=ENVS, help="environments (definition: 8)")
    ap.add_argument("--engine", default="transformers", choices=("transformers", "vllm"))
    ap.add_argument("--smoke", action="store_true", help="a seconds-long run that shows the "
                    "bench works: --envs 2 --plays 1 --turns 1 --steps 1 on a 2-layer model")
    args = ap.parse_args()
    if args.smoke:
        args.envs, args.plays, args.turns, args.steps = 2, 1, 1, 1
    torch.manual_seed(0)
    clock = Clock()
    instrument(clock)
    with tempfile.TemporaryDirectory() as tmp:
        n_params = build_model(Path(tmp) / "model", SMOKE_MODEL if args.smoke else MODEL)
        argv = ["--model", str(Path(tmp) / "model"),
                "--gradient_checkpointing", "false", "--engine", args.engine,
                "--num_envs", str(args.envs), "--plays", str(args.plays),
                "--max_turns", str(args.turns),
                "--max_new_tokens", str(REPLY_TOKENS), "--steps", str(args.steps + 1),
                "--output_dir", str(Path(tmp) / "run"), "--fixed_envs", str(ROOT / "data" / "envs")]
        t0 = time.perf_counter()
        run_dir = train.main(argv)
        total = time.perf_counter() - t0
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    report(clock, rows, args, n_params, total)


def report(clock: Clock, rows: list[dict], args, n_params: int, total: float) -> None:
    """One line per step (absolute seconds per part, for context), then the figure."""
    print(f"workload: {args.envs} environments x {args.plays} plays x {args.turns} turns x "
          f"{REPLY_TOKENS} tokens, plain steps on the data/envs pool")
    print(f"model: random Qwen3, {n_params / 1e6:.1f}M parameters, fp32, "
          f"{torch.get_num_threads()} threads; train.main total {total:.1f} s")
    shares = []
    for step, (start, end) in clock.windows().items():
        wall, parts = end - start, clock.parts[step]
        model = sum(parts[p] for p in MODEL_PARTS)
        overhead = wall - model
        m = rows[step]
        row = {"step": step, "wall_s": wall, "generation_s": parts["generation"],
               "fwd_bwd_s": parts["fwd_bwd"], "overhead_s": overhead,
               "sandbox_s": parts[SANDBOX], "chat_template_s": parts[TOKENIZE],
               "update_bookkeeping_s": parts[UPDATE] - parts["fwd_bwd"],
               "scoring_s": parts["scoring"], "logging_s": parts["logging"],
               "weight_sync_s": parts[SYNC],
               "episodes": m.get("agent/episodes"), "turns_mean": m.get("agent/turns_mean"),
               "tokens_mean": m.get("agent/tokens_mean")}
        row["other_s"] = overhead - sum(row[k] for k in (
            "sandbox_s", "chat_template_s", "update_bookkeeping_s", "scoring_s", "logging_s",
            "weight_sync_s"))
        turns = (row["episodes"] or 0) * (row["turns_mean"] or 0)
        row["overhead_ms_per_episode_turn"] = 1000 * overhead / turns if turns else None
        names = [p for p, _ in clock.phases[step]]
        ts = [t for _, t in clock.phases[step]] + [end]
        row["phases_s"] = {p: round(b - a, 3) for p, a, b in zip(names, ts, ts[1:])}
        if step > 0:
            shares.append(overhead / wall)
        print(("warm-up " if step == 0 else "measured ") + json.dumps(
            {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    for _, s in clock.checkpoint:
        print(f"checkpoint (every 16 steps, excluded): {s:.2f} s")
    print(json.dumps({"metric": "step.overhead_share",
                      "value": round(statistics.median(shares), 4), "target": "<= 0.15",
                      "workload": f"{args.envs}x{args.plays}x{args.turns}x{REPLY_TOKENS}",
                      "engine": args.engine}))


if __name__ == "__main__":
    main()
