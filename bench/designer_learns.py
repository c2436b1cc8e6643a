"""The designer learns: SPADE's own claim, run through the real loop on a laptop.

Every model small enough for a CPU writes no valid environment, so a run of train.py on one never
trains its designer (every attempt is rejected, the pool is the fallback). This experiment builds
the smallest world in which it can: a Qwen3 of about a million parameters (the project's tiny
tokenizer and chat template) warm-started by a short supervised phase, written here and nowhere
in the library, so that for the prompts train.py renders it

  * as the designer writes a complete, valid environment of one parametric family, with a
    difficulty dial drawn from the warm-up's uniform distribution,
  * as the hint writer writes a hint for it,
  * as the agent plays it, with a skill that RL can improve (bench/families/concise.py: the
    dial is a word limit, the agent's move shortens as it learns).

Then `train.main` runs unchanged from that checkpoint, every check on (sandbox validation probes,
determinism, too_slow), in two arms on the same seeds and the same warm start: full SPADE, and the
control --no_designer_training (the designer keeps writing the warm-up's dial distribution);
--arms adds Table 6's designer-reward ablations (--designer_reward solve_rate / regret). The
warm-up does not teach the designer to read the environment memory (its dial is drawn whatever the
prompt holds), so what moves the curriculum here is the designer's GRPO update alone.

Read from each run directory (metrics.jsonl, envs/, designer/, transcripts/), per regeneration:
the designed difficulties (accepted environments' dials), validity (accepted / attempts), the
agent's win rate per difficulty and its frontier (the difficulty where its win rate crosses 0.5:
the family's first observation does not depend on the dial, so every unhinted play says whether
it would have won at every dial), the learnable share of the epoch's designer slots (Fig. 7: slots
whose environment's win rate over the epoch lies in [0.2, 0.8]; an empty slot is not learnable),
regret/mean and regret/positive_share. The claim, checked at the end (exit status 1 if it fails):

  1. learnable slot share over the second half of the run: SPADE - control >= 0.2 on the mean over
     seeds, and > 0 on every seed;
  2. mean |designed difficulty - frontier| over the run: smaller under SPADE than in the control;
  3. validity (accepted / attempts) over the run >= 0.8 in both arms;
  4. regret/mean over the run > 0 under SPADE (the family's hint helps);
  5. the designer's update has the policy gradient's sign on every seed: the environments that
     scored above their regeneration's mean gained probability under SPADE (update_direction;
     the control's figure, where only the agent's updates move the shared weights, is printed
     beside it).

    python bench/designer_learns.py                       # 3 seeds, SPADE vs control, the figure
    python bench/designer_learns.py --seeds 0 --arms spade,control,solve_rate,regret
    python bench/designer_learns.py --family path/to/family.py --steps 40

The figure goes to docs/designer_learns.png (--figure), the per-regeneration table and the
summary to <work>/summary.json; docs/designer_learns.md has the command, the figure and what it
shows. tests/test_designer_learns.py runs a shorter version and asserts the direction.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import agent  # noqa: E402
import designer  # noqa: E402
import memory as memory_lib  # noqa: E402
import regret as regret_lib  # noqa: E402
import sandbox  # noqa: E402
import train  # noqa: E402
from infra import engine, models  # noqa: E402

FAMILY = ROOT / "bench" / "families" / "concise.py"
BAND = (0.2, 0.8)  # the learnable band (Fig. 7; metrics.learnable_slot_share)
ARMS = {"spade": [], "control": ["--no_designer_training"],
        "solve_rate": ["--designer_reward", "solve_rate"],
        "regret": ["--designer_reward", "regret"]}


# ----------------------------------------------------------------------------------------------
# The family


def load_family(path: str | Path):
    """A family file as a module (bench/families/concise.py documents what it defines)."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"--family {path}: no such file (bench/families/ holds the shipped ones)")
    spec = importlib.util.spec_from_file_location(f"family_{path.stem}", path)
    family = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(family)
    needed = ("NAME", "DIALS", "HINT", "designer_source", "environment", "dial_of", "difficulty",
              "wins", "agent_reply")
    missing = [n for n in needed if not hasattr(family, n)]
    if missing:
        raise SystemExit(f"--family {path} lacks {', '.join(missing)} (see bench/families/)")
    return family


def first_observation(source: str) -> str:
    """The first observation of one of the family's own environments (our code, run here)."""
    namespace: dict = {}
    exec(compile(source, "<family>", "exec"), namespace)  # the family's template, not a model's
    cls = namespace[designer.find_env_class(source)]
    obs = cls().reset(seed=0)
    return obs[0] if isinstance(obs, tuple) else obs


def check_family(family, sb) -> str:
    """Every dial's environment validates in the sandbox and reads back its dial, `wins` is what
    its step() pays, and its first observation is the same at every dial; returns it."""
    observations = set()
    for dial in family.DIALS:
        source = family.environment(dial)
        report = sb.validate(source)
        if not report.ok:
            raise SystemExit(f"family {family.NAME}: dial {dial} does not validate: {report.error}")
        if family.dial_of(source) != dial:
            raise SystemExit(f"family {family.NAME}: dial_of does not read back dial {dial}")
        observations.add(first_observation(source))
        namespace: dict = {}
        exec(compile(source, "<family>", "exec"), namespace)
        env = namespace[designer.find_env_class(source)]()
        rng = random.Random(dial)
        for hinted in (False, True, False):
            action = agent.parse_action(family.agent_reply(rng, hinted))
            env.reset(seed=0)
            paid = env.step(action)[1] > 0
            if paid != family.wins(action, dial):
                raise SystemExit(f"family {family.NAME}: wins({action!r}, {dial}) disagrees with "
                                 "the environment's step()")
    if len(observations) != 1:
        raise SystemExit(f"family {family.NAME}: the first observation depends on the dial")
    return observations.pop()


# ----------------------------------------------------------------------------------------------
# The warm-up: supervised cross-entropy on chats rendered as train.py renders them


@dataclass
class WarmUp:
    """The warm start's model and its supervised phase."""
    hidden: int = 128
    layers: int = 4
    intermediate: int = 384
    steps: int = 250
    lr: float = 5e-3
    designer_replies: int = 16  # designer replies per step, all to one rendered designer prompt
    hints: int = 2              # hint chats per step
    plays: int = 16             # agent chats per step, half of them hinted
    corpus: str = str(ROOT / "data" / "corpus.jsonl")

    def key(self, family, seed: int) -> str:
        """What the cached warm start depends on: these fields, the seed, and what the warm-up
        reads of the family (draws of its designer, hint and agent replies, its environments'
        first observation), so an edit of the family's analysis (dial_of, wins) keeps the start."""
        rng = random.Random(1234)
        seen = [family.HINT, first_observation(family.environment(family.DIALS[0]))]
        seen += [family.designer_source(rng) for _ in range(64)]
        seen += [family.agent_reply(rng, hinted) for hinted in (False, True) * 32]
        text = json.dumps([asdict(self), seed, seen], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def build_policy(tok, warm: WarmUp, seed: int):
    """A random Qwen3 (head_dim 32, tied embeddings) sized by `warm`, with the tiny tokenizer."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config
    heads = warm.hidden // 32
    config = Qwen3Config(vocab_size=len(tok), hidden_size=warm.hidden,
                         num_hidden_layers=warm.layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2), head_dim=32,
                         intermediate_size=warm.intermediate, max_position_embeddings=32768,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                             attn_implementation="sdpa")
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    return model


class Chats:
    """The warm-up's chats, each (prompt token ids, reply token ids ending at the end of turn),
    rendered with agent.prompt_ids, the one path train.py renders every prompt with."""

    def __init__(self, family, tok, warm: WarmUp, rng: random.Random, observation: str):
        self.family, self.tok, self.rng, self.observation = family, tok, rng, observation
        self.eot = agent.turn_end(tok)[1]
        self.corpus = designer.Corpus(warm.corpus, seed=rng.randrange(2**31))
        self.skills = [s.name for s in designer.GAME_SKILLS]

    def reply(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False) + [self.eot]

    def memory_block(self, skill: str) -> str:
        """A memory like a run's after a few regenerations: records of the family at random
        draws, win rates and regrets (half the prompts have none, as at step 0)."""
        if self.rng.random() < 0.5:
            return ""
        mem = memory_lib.EnvironmentMemory(seed=self.rng.randrange(2**31))
        for i in range(self.rng.randint(1, 8)):
            source = self.family.designer_source(self.rng)
            mem.add(memory_lib.MemoryRecord(
                skill=skill, source=source, win_rate=round(self.rng.random(), 2),
                regret=round(self.rng.uniform(-0.2, 0.8), 2), step=4 * i,
                class_name=designer.find_env_class(source)))
        return mem.prompt_block(skill)

    def designer_prompt(self) -> list[int]:
        """A designer prompt as designer._attempt draws one: a skill, a document, the memory."""
        skill = self.rng.choice(self.skills)
        messages = designer.designer_messages(skill, setting="games",
                                              document=self.corpus.sample(),
                                              memory_block=self.memory_block(skill))
        return agent.prompt_ids(self.tok, messages)

    def designer_reply(self) -> list[int]:
        """The environment's bare source: designer.code_block takes a reply without a fence
        whole, and a small model miscounts a fence's three backticks (seen here: 13 of 15
        step-0 attempts wrote two)."""
        return self.reply(self.family.designer_source(self.rng))

    def hint(self) -> tuple[list[int], list[int]]:
        source = self.family.designer_source(self.rng)
        return (agent.prompt_ids(self.tok, designer.hint_messages(source, "games")),
                self.reply(self.family.HINT))

    def play(self, hinted: bool) -> tuple[list[int], list[int]]:
        first = agent.first_user_message(self.observation, self.family.HINT if hinted else None,
                                         "games")
        return (agent.prompt_ids(self.tok, [{"role": "user", "content": first}]),
                self.reply(self.family.agent_reply(self.rng, hinted)))


def reply_loss(logits: torch.Tensor, targets: list[list[int]]) -> torch.Tensor:
    """Sum over chats of each chat's token-mean cross-entropy; logits (B, T, V) right-aligned
    to nothing: row b predicts targets[b] from positions 0 .. len - 1."""
    total = logits.new_zeros(())
    for b, ids in enumerate(targets):
        tgt = torch.tensor(ids)
        total = total + torch.nn.functional.cross_entropy(logits[b, :len(ids)].float(), tgt)
    return total


def full_chats_loss(model, chats: list[tuple[list[int], list[int]]], pad: int) -> torch.Tensor:
    """Summed per-chat token-mean cross-entropy on the replies of short chats (one forward)."""
    seqs = [p + r for p, r in chats]
    width = max(map(len, seqs))
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])                   # (B, T)
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])         # (B, T)
    logits = model(input_ids=ids, attention_mask=mask).logits                          # (B, T, V)
    # the logit at position t predicts token t + 1: a reply's first token from the prompt's last
    shifted = [logits[b, len(p) - 1:len(p) - 1 + len(r)] for b, (p, r) in enumerate(chats)]
    return reply_loss(torch.nn.utils.rnn.pad_sequence(shifted, batch_first=True),
                      [r for _, r in chats])


def reply_logits(model, prompt: list[int], replies: list[list[int]], pad: int) -> torch.Tensor:
    """Logits (B, W, V) of several replies to one long prompt: row b, position t predicts
    replies[b][t]. The prompt (bar its last token) is encoded once without gradient and its KV
    cache shared by the replies: the replies' own tokens and their attention to it are trained,
    not the prompt's encoding (the warm-up's one shortcut: a 3,000-token prompt per reply would
    cost ~20x)."""
    from transformers import DynamicCache
    with torch.no_grad():
        cache = model(input_ids=torch.tensor([prompt[:-1]]), use_cache=True,
                      past_key_values=DynamicCache()).past_key_values
    cache.batch_repeat_interleave(len(replies))
    rows = [[prompt[-1]] + r[:-1] for r in replies]  # input: the prompt's last token, the reply
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])                   # (B, W)
    mask = torch.ones(len(rows), len(prompt) - 1 + width, dtype=torch.long)
    return model(input_ids=ids, attention_mask=mask, past_key_values=cache).logits    # (B, W, V)


def designer_loss(model, prompt: list[int], replies: list[list[int]], pad: int) -> torch.Tensor:
    """Summed per-reply token-mean cross-entropy of several replies to one designer prompt."""
    return reply_loss(reply_logits(model, prompt, replies, pad), replies)


def warm_up(family, out: Path, warm: WarmUp, seed: int, sb) -> Path:
    """Train the warm start (or reuse the one cached under `out` for the same inputs) and save it
    as a Hugging Face model directory with the tiny tokenizer and its chat template."""
    from tqdm.auto import tqdm
    target = out / f"warm-{warm.key(family, seed)}"
    if (target / "config.json").is_file():
        print(f"[warm-up] reusing {target}", flush=True)
        return target
    observation = check_family(family, sb)
    tok = models.build_tiny_tokenizer()
    model = build_policy(tok, warm, seed)
    chats = Chats(family, tok, warm, random.Random(seed), observation)
    opt = torch.optim.AdamW(model.parameters(), lr=warm.lr, weight_decay=0.0)
    ramp = max(1, warm.steps // 15)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / ramp) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / warm.steps)))))
    model.train()
    bar = tqdm(range(warm.steps), desc=f"warm-up seed {seed}", unit="step")
    for _ in bar:
        n = warm.designer_replies + warm.hints + warm.plays
        loss = designer_loss(model, chats.designer_prompt(),
                             [chats.designer_reply() for _ in range(warm.designer_replies)],
                             tok.pad_token_id)
        # two forwards: the hint chats (~700 tokens) would pad the plays (~50) to their length
        loss = loss + full_chats_loss(model, [chats.hint() for _ in range(warm.hints)],
                                      tok.pad_token_id)
        loss = loss + full_chats_loss(model, [chats.play(hinted=i % 2 == 1)
                                              for i in range(warm.plays)], tok.pad_token_id)
        loss = loss / n
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.4f}")
    model.eval()
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(target)  # a killed warm-up never leaves a half-written start
    return target


def probe(model_dir: Path, family, sb, *, n: int, seed: int, args) -> dict:
    """A policy (the warm start, or a run's final_model/) under the run's sampling, outside the
    loop: n designer replies to rendered designer prompts (validity, the histogram of their
    dials), the hints it writes, and the agent's win rate at every dial, unhinted and hinted."""
    model, tok = models.load_model_and_tokenizer(str(model_dir), dtype=torch.float32)
    model.eval()
    eng = engine.TransformersEngine(model, tok, stop_ids=[agent.turn_end(tok)[1]])
    chats = Chats(family, tok, WarmUp(), random.Random(seed + 1), check_family(family, sb))
    sampling = dict(top_p=args.top_p, top_k=args.top_k)
    replies = eng.generate([chats.designer_prompt() for _ in range(n)],
                           max_new_tokens=args.designer_max_tokens, temperature=0.6, seed=seed,
                           **sampling)
    sources = [designer.code_block(designer.strip_thinking(c.text)) for c in replies]
    dials = [family.dial_of(s) for s, ok in zip(sources, (sb.validate(s).ok for s in sources))
             if ok]
    hints = eng.generate([chats.hint()[0] for _ in range(4)], max_new_tokens=args.hint_max_tokens,
                         temperature=0.3, seed=seed, **sampling)
    curves = {}
    for hinted in (False, True):
        plays = eng.generate([chats.play(hinted)[0] for _ in range(64)],
                             max_new_tokens=args.max_new_tokens,
                             temperature=args.agent_temperature, seed=seed,
                             **sampling)
        actions = [agent.parse_action(c.text) for c in plays if c.finish_reason == "stop"]
        curves["hinted" if hinted else "unhinted"] = {
            d: sum(family.wins(a, d) for a in actions) / len(plays) for d in family.DIALS}
    return {"validity": len(dials) / n,
            "dials": {d: dials.count(d) for d in family.DIALS if d in dials},
            "hints": sorted({designer.parse_hint(c) or "" for c in hints}), "win_rate": curves}


def sequence_logprobs(model, prompt: list[int], replies: list[list[int]], pad: int,
                      chunk: int = 16) -> list[float]:
    """log p(reply | prompt) of each reply (its tokens and end of turn), summed over tokens."""
    out = []
    with torch.no_grad():
        for i in range(0, len(replies), chunk):
            part = replies[i:i + chunk]
            logp = torch.log_softmax(reply_logits(model, prompt, part, pad).float(), -1)
            out += [logp[b, torch.arange(len(r)), torch.tensor(r)].sum().item()
                    for b, r in enumerate(part)]
    return out


def epoch_scores(run_dir: Path, regen_interval: int) -> list[tuple[int, str, float]]:
    """(regeneration step, env_id, blend score) of every designed environment, recomputed from
    the run directory as train.score_epoch scores it (regret.blend on the environment's
    regret at its regeneration and its mean unhinted return over the epoch): the control does not
    score its designs, and under SPADE the recomputation is checked against the loop's own
    designer/scores-*.json (update_direction's `score_gap`)."""
    plays = {}  # step -> env_id -> unhinted returns
    for path in (run_dir / "transcripts").glob("step-*-rank-0.jsonl"):
        step = int(path.name.split("-")[1])
        for t in read_jsonl(path):
            if not t["hinted"] and t["status"] != "env_error":
                plays.setdefault(step, {}).setdefault(t["env_id"], []).append(t["return"])
    out = []
    for pool_path in sorted((run_dir / "envs").glob("step-*-rank-0/pool.json")):
        start = int(pool_path.parent.name.split("-")[1])
        for e in json.loads(pool_path.read_text()):
            if e["origin"] != "designer":
                continue
            rets = [r for s in range(start, start + regen_interval)
                    for r in plays.get(s, {}).get(e["env_id"], [])]
            w = statistics.fmean(rets) if rets else None
            faulty = e["faulty"] or w is None or e["regret"] is None
            out.append((start, e["env_id"], regret_lib.fault_score("blend") if faulty
                        else regret_lib.blend(e["regret"], w)))
    return out


def update_direction(run_dir: Path, start_dir: Path, family, sb, *, seed: int,
                     regen_interval: int, prompts: int = 2) -> dict:
    """Which way the run moved its designer: for every designed environment, the change of
    log p(its source | a designer prompt) from the warm start to final_model/, against its blend
    score (epoch_scores) centred on its regeneration's mean (GRPO's advantage up to the scale):
    cov > 0 is the policy gradient's direction, the sources that scored above their group's mean
    gained probability. A sign error in the designer's advantage makes it negative; designer
    samples trained on the wrong tokens, or a score that never reaches the loss, leave it at the
    control's (where only the agent's updates move the shared weights). The prompts are rendered
    as the warm-up's (a skill, a document, a memory), not the run's own: the warm-up taught the
    designer to write its dial whatever the prompt holds."""
    tok = models.build_tiny_tokenizer()
    recomputed = epoch_scores(run_dir, regen_interval)
    by_step = {}
    for start, env_id, score in recomputed:
        by_step.setdefault(start, []).append((env_id, score))
    scored = []  # (env_id, centred score, source)
    for start, rows in sorted(by_step.items()):
        if len(rows) < 2:
            continue
        mean = statistics.fmean(sc for _, sc in rows)
        tag = f"step-{start:04d}-rank-0"
        scored += [(env_id, sc - mean, (run_dir / "envs" / tag / f"{env_id}.py").read_text())
                   for env_id, sc in rows]
    logged = {r["env_id"]: r["score"] for path in (run_dir / "designer").glob("scores-*.json")
              for r in json.loads(path.read_text())}
    by_id = {env_id: sc for _, env_id, sc in recomputed}
    gap = max((abs(logged[k] - by_id[k]) for k in logged if k in by_id), default=None)
    if not scored:
        return {"n": 0, "cov": None, "corr": None, "score_gap": gap}
    chats = Chats(family, tok, WarmUp(), random.Random(seed + 2), check_family(family, sb))
    rendered = [chats.designer_prompt() for _ in range(prompts)]
    replies = [chats.reply(source) for _, _, source in scored]
    deltas = [0.0] * len(scored)
    for sign, model_dir in ((-1, start_dir), (1, run_dir / "final_model")):
        model, _ = models.load_model_and_tokenizer(str(model_dir), dtype=torch.float32)
        model.eval()
        for prompt in rendered:
            for i, lp in enumerate(sequence_logprobs(model, prompt, replies, tok.pad_token_id)):
                deltas[i] += sign * lp / prompts
    adv = [a for _, a, _ in scored]
    cov = statistics.fmean(a * d for a, d in zip(adv, deltas))  # adv has mean 0 in every group
    sd_a, sd_d = statistics.pstdev(adv), statistics.pstdev(deltas)
    return {"n": len(scored), "cov": cov,
            "corr": cov / (sd_a * sd_d) if sd_a > 0 and sd_d > 0 else None,
            "delta_mean": statistics.fmean(deltas), "score_gap": gap}


# ----------------------------------------------------------------------------------------------
# The runs: train.main, unchanged, from the warm start


def run_flags(args) -> list[str]:
    """The loop's flags shared by every arm (docs/designer_learns.md says why each)."""
    return ["--steps", str(args.steps), "--regen_interval", str(args.regen_interval),
            "--num_envs", str(args.num_envs), "--plays", str(args.plays),
            "--hint_plays", str(args.hint_plays), "--skills_per_regen", "1",
            "--max_attempts", str(args.max_attempts),
            "--designer_max_tokens", str(args.designer_max_tokens),
            "--hint_max_tokens", str(args.hint_max_tokens), "--max_turns", "1",
            "--max_new_tokens", str(args.max_new_tokens), "--max_context", "4096",
            "--top_k", str(args.top_k), "--top_p", str(args.top_p),
            "--agent_temperature", str(args.agent_temperature), "--lr", str(args.lr),
            "--gradient_checkpointing", "false", "--checkpoint_every", str(args.steps),
            "--keep_checkpoints", "1", "--sandbox_workers", "2",
            "--transcripts", str(args.num_envs * args.plays)]


def run_arm(model_dir: Path, arm: str, seed: int, out: Path, args) -> Path:
    """One arm of one seed through train.main; returns its run directory. A run that finished
    with the same command (bench_argv.json, written last) is read, not run again: a bench killed
    in its third seed restarts there."""
    argv = ["--model", str(model_dir), "--seed", str(seed), *run_flags(args), *ARMS[arm],
            "--output_dir", str(out), "--overwrite"]
    done = out / "bench_argv.json"
    if done.is_file() and json.loads(done.read_text()) == argv:
        print(f"[run] {arm} seed {seed}: reusing {out} (finished with the same command)")
        return out
    print(f"[run] {arm} seed {seed}: python train.py {' '.join(argv)}", flush=True)
    run_dir = train.main(argv)
    done.write_text(json.dumps(argv))
    return run_dir


# ----------------------------------------------------------------------------------------------
# What the runs show, read from their run directories


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def frontier(curve: dict, family) -> float:
    """The difficulty where the win rate crosses 0.5, linear between dials (win rates by dial;
    difficulty 1 is the easiest dial): 0.5 below the easiest when even it is lost more often than
    won, K + 0.5 past the hardest when even it is won."""
    levels = [(family.difficulty(d), curve[d]) for d in family.DIALS]
    levels.sort()
    if levels[0][1] < 0.5:
        return 0.5
    for (k0, w0), (k1, w1) in zip(levels, levels[1:]):
        if w1 < 0.5 <= w0:
            return k0 + (w0 - 0.5) / (w0 - w1) * (k1 - k0)
    return levels[-1][0] + 0.5


def analyse(run_dir: Path, family, regen_interval: int, num_envs: int) -> dict:
    """Per regeneration epoch: designed dials and difficulties, validity, the agent's win-rate
    curve and frontier over the epoch's steps, each designed environment's win rate over the
    epoch, the learnable slot share, regret; then the run's summaries."""
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "agent/return_mean" in r]
    steps = len(rows)
    plays = {}  # step -> its unhinted plays (env_id, return, action)
    for path in sorted((run_dir / "transcripts").glob("step-*-rank-0.jsonl")):
        step = int(path.name.split("-")[1])
        plays[step] = [(t["env_id"], t["return"], (t["actions"] or [""])[-1])
                       for t in read_jsonl(path) if not t["hinted"] and t["status"] != "env_error"]
    epochs = []
    for start in range(0, steps, regen_interval):
        tag = f"step-{start:04d}-rank-0"
        attempts = read_jsonl(run_dir / "designer" / f"{tag}.jsonl") \
            if (run_dir / "designer" / f"{tag}.jsonl").is_file() else []
        pool = json.loads((run_dir / "envs" / tag / "pool.json").read_text())
        designed = [e for e in pool if e["origin"] == "designer"]
        span = range(start, min(start + regen_interval, steps))
        actions = [a for s in span for _, _, a in plays.get(s, [])]
        curve = {d: sum(family.wins(a, d) for a in actions) / len(actions) if actions else 0.0
                 for d in family.DIALS}
        front = frontier(curve, family)
        env_rates = {}
        for e in designed:
            rets = [r for s in span for env_id, r, _ in plays.get(s, []) if env_id == e["env_id"]]
            env_rates[e["env_id"]] = sum(r > 0 for r in rets) / len(rets) if rets else None
        dials = [family.dial_of(Path(run_dir / "envs" / tag / f"{e['env_id']}.py").read_text())
                 for e in designed]
        levels = [family.difficulty(d) for d in dials if d is not None]
        m = rows[start]
        epochs.append({
            "step": start, "attempts": len(attempts), "accepted": len(designed),
            "validity": len(designed) / len(attempts) if attempts else 0.0,
            "dials": dials, "difficulties": levels,
            "difficulty_mean": statistics.fmean(levels) if levels else None,
            "frontier": front, "win_rate_by_dial": curve,
            "env_win_rates": [env_rates[e["env_id"]] for e in designed],
            "distance": statistics.fmean(abs(k - front) for k in levels) if levels else None,
            "learnable_slot_share": sum(w is not None and BAND[0] <= w <= BAND[1]
                                        for w in env_rates.values()) / num_envs,
            "regret_mean": m.get("regret/mean"), "regret_positive_share":
                m.get("regret/positive_share"),
            "logged_learnable_slot_share": m.get("env/learnable_slot_share"),
            "return_mean": statistics.fmean(r["agent/return_mean"] for r in rows[start:span[-1] + 1]
                                            if "agent/return_mean" in r)})
    return {"epochs": epochs, **summarise(epochs, steps),
            "seconds": sum(r.get("time/step_s", 0.0) for r in rows)}


def summarise(epochs: list[dict], steps: int) -> dict:
    """The run's figures: the second half's learnable slot share, the run's mean distance,
    validity (accepted / attempts) and regret."""
    def mean(xs):
        xs = [x for x in xs if x is not None]
        return statistics.fmean(xs) if xs else None
    second = [e for e in epochs if e["step"] >= steps / 2]
    attempts = sum(e["attempts"] for e in epochs)
    return {"learnable_second_half": mean(e["learnable_slot_share"] for e in second),
            "learnable_run": mean(e["learnable_slot_share"] for e in epochs),
            "distance": mean(e["distance"] for e in epochs),
            "validity": sum(e["accepted"] for e in epochs) / attempts if attempts else 0.0,
            "regret_mean": mean(e["regret_mean"] for e in epochs),
            "regret_positive_share": mean(e["regret_positive_share"] for e in epochs),
            "frontier_first": epochs[0]["frontier"], "frontier_last": epochs[-1]["frontier"]}


def fmt(x) -> str:
    return "-" if x is None else f"{x:+.3f}"


def verdict(results: dict) -> tuple[bool, list[str]]:
    """The claim (the module docstring's 1-4) over results[seed][arm]; (holds, one line each)."""
    seeds = sorted(results)
    gaps = [results[s]["spade"]["learnable_second_half"] -
            results[s]["control"]["learnable_second_half"] for s in seeds]
    closer = [results[s]["spade"]["distance"] < results[s]["control"]["distance"] for s in seeds]
    valid = {arm: statistics.fmean(results[s][arm]["validity"] for s in seeds)
             for arm in ("spade", "control")}
    regret = statistics.fmean(results[s]["spade"]["regret_mean"] for s in seeds)
    checks = [
        (statistics.fmean(gaps) >= 0.2 and all(g > 0 for g in gaps),
         f"learnable slot share, second half, SPADE - control: mean {statistics.fmean(gaps):+.3f} "
         f"(>= 0.2), per seed {', '.join(f'{g:+.3f}' for g in gaps)} (each > 0)"),
        (all(closer), "mean |designed difficulty - frontier| smaller under SPADE on "
                      f"{sum(closer)} of {len(seeds)} seeds"),
        (min(valid.values()) >= 0.8, f"validity SPADE {valid['spade']:.3f}, control "
                                     f"{valid['control']:.3f} (each >= 0.8)"),
        (regret > 0, f"regret/mean under SPADE {regret:+.3f} (> 0)"),
        (all((results[s]["spade"]["update"]["cov"] or 0) > 0 for s in seeds),
         "the designer's update: cov(centred score, change of log p(source))" + "".join(
             f", seed {s} SPADE {fmt(results[s]['spade']['update']['cov'])} control "
             f"{fmt(results[s]['control']['update']['cov'])}" for s in seeds) + " (SPADE > 0)")]
    return all(ok for ok, _ in checks), [("PASS " if ok else "FAIL ") + line
                                         for ok, line in checks]


def figure(results: dict, family, path: Path) -> None:
    """Per arm, the designed difficulties of each regeneration (dots, seed 0; the mean over seeds
    as a line) against the agent's frontier; the learnable slot share per epoch; validity."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    arms = [a for a in ARMS if all(a in results[s] for s in results)]
    seeds = sorted(results)
    fig, axes = plt.subplots(1, len(arms) + 2, figsize=(4.2 * (len(arms) + 2), 3.6))
    colors = dict(zip(ARMS, ("tab:red", "tab:gray", "tab:blue", "tab:green")))
    top = len(family.DIALS)
    for ax, arm in zip(axes, arms):
        for i, seed in enumerate(seeds):
            ep = results[seed][arm]["epochs"]
            xs = [e["step"] for e in ep]
            ax.plot(xs, [e["frontier"] for e in ep], color="black", lw=1.5 if i == 0 else 0.6,
                    alpha=1 if i == 0 else 0.4, label="agent's frontier" if i == 0 else None)
            ax.plot(xs, [e["difficulty_mean"] for e in ep], color=colors[arm],
                    lw=1.5 if i == 0 else 0.6, alpha=1 if i == 0 else 0.4,
                    label="designed (mean)" if i == 0 else None)
            if i == 0:
                jitter = random.Random(0)
                pts = [(e["step"] + jitter.uniform(-0.4, 0.4), k) for e in ep
                       for k in e["difficulties"]]
                ax.scatter(*zip(*pts), s=6, color=colors[arm], alpha=0.35)
        ax.set(title=f"{arm}: designed difficulty", xlabel="step", ylim=(0, top + 1),
               ylabel=f"difficulty (1 easiest .. {top} hardest)")
        ax.legend(fontsize=7, loc="upper left")
    for ax, key, title in ((axes[-2], "learnable_slot_share", "learnable slot share (Fig. 7)"),
                           (axes[-1], "validity", "validity (accepted / attempts)")):
        for arm in arms:
            ep = [results[s][arm]["epochs"] for s in seeds]
            xs = [e["step"] for e in ep[0]]
            ys = [statistics.fmean(run[j][key] for run in ep if j < len(run))
                  for j in range(len(xs))]
            ax.plot(xs, ys, color=colors[arm], label=f"{arm} (mean of {len(seeds)} seeds)")
        ax.set(title=title, xlabel="step", ylim=(-0.02, 1.02))
        ax.legend(fontsize=7)
    fig.suptitle(f"bench/designer_learns.py, family {family.NAME}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default=str(FAMILY), help="a family file (bench/families/)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated; one warm start per seed")
    p.add_argument("--arms", default="spade,control", help=f"of {', '.join(ARMS)}")
    p.add_argument("--work", default=str(ROOT / "runs" / "designer_learns"),
                   help="run directories, cached warm starts, summary.json")
    p.add_argument("--figure", default=str(ROOT / "docs" / "designer_learns.png"))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--regen_interval", type=int, default=2)
    p.add_argument("--num_envs", type=int, default=8)
    p.add_argument("--plays", type=int, default=8)
    p.add_argument("--hint_plays", type=int, default=8)
    p.add_argument("--max_attempts", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--top_p", type=float, default=0.95)
    p.add_argument("--top_k", type=int, default=20)
    p.add_argument("--agent_temperature", type=float, default=1.0)
    p.add_argument("--designer_max_tokens", type=int, default=200)
    p.add_argument("--hint_max_tokens", type=int, default=24)
    p.add_argument("--max_new_tokens", type=int, default=24)
    p.add_argument("--warm_seed", type=int, default=0,
                   help="the one warm start every seed's pair starts from (same warm start)")
    p.add_argument("--warm_per_seed", action="store_true",
                   help="a warm start of each seed's own instead (one warm-up per seed)")
    p.add_argument("--probe", type=int, default=48,
                   help="designer replies drawn outside the loop from the warm start and from "
                        "each arm's final policy")
    for f in ("hidden", "layers", "intermediate", "steps", "lr"):
        default = getattr(WarmUp, f)
        p.add_argument(f"--warm_{f}", type=type(default), default=default,
                       help=f"the warm-up's {f} (WarmUp.{f})")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # one thread: on 2 shared cores it is several times faster than two for these shapes (the
    # test suite's conftest.py sets the same); the sandbox's workers take the other core
    torch.set_num_threads(1)
    arms = args.arms.split(",")
    if not {"spade", "control"} <= set(arms) or not set(arms) <= set(ARMS):
        raise SystemExit(f"--arms must include spade and control, and be among {', '.join(ARMS)}")
    family = load_family(args.family)
    warm = WarmUp(**{f: getattr(args, f"warm_{f}")
                     for f in ("hidden", "layers", "intermediate", "steps", "lr")})
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results, timing, checks = {}, {}, {}
    warm_seconds = 0.0
    for seed in map(int, args.seeds.split(",")):
        with sandbox.Sandbox(workers=2) as sb:
            t0 = time.perf_counter()
            warm_seed = seed if args.warm_per_seed else args.warm_seed
            model_dir = warm_up(family, work, warm, warm_seed, sb)
            warm_seconds += time.perf_counter() - t0
            t0 = time.perf_counter()
            checks[seed] = probe(model_dir, family, sb, n=args.probe, seed=seed, args=args)
            print(f"[warm-up] seed {seed}: {json.dumps(checks[seed])}", flush=True)
            results[seed] = {}
            for arm in arms:
                run_dir = run_arm(model_dir, arm, seed, work / f"seed-{seed}" / arm, args)
                results[seed][arm] = analyse(run_dir, family, args.regen_interval, args.num_envs)
                results[seed][arm]["probe"] = probe(run_dir / "final_model", family, sb,
                                                    n=args.probe, seed=seed, args=args)
                results[seed][arm]["update"] = update_direction(
                    run_dir, model_dir, family, sb, seed=seed, regen_interval=args.regen_interval)
            timing[seed] = time.perf_counter() - t0
    print(f"[warm-up] {warm_seconds / 60:.1f} min in all (a cached warm start costs nothing)")
    return report(results, timing, checks, family, arms, args, work)


def report(results, timing, checks, family, arms, args, work: Path) -> int:
    """Print the per-seed table, the ratios to the control and the verdict; write summary.json
    and the figure; the exit status is 0 only if the claim holds."""
    keys = ("learnable_second_half", "distance", "validity", "regret_mean",
            "regret_positive_share", "frontier_first", "frontier_last")
    print("\nseed arm        " + " ".join(f"{k[:14]:>14}" for k in keys))
    for seed, by_arm in results.items():
        for arm in arms:
            vals = [by_arm[arm][k] for k in keys]
            print(f"{seed:<4} {arm:<10} " + " ".join(
                f"{v:14.3f}" if v is not None else f"{'-':>14}" for v in vals))
        print(f"     seed pair wall time {timing[seed] / 60:.1f} min")
        print(f"     the designer's dials, {args.probe} draws outside the loop: warm start "
              f"{checks[seed]['dials']}")
        for arm in arms:
            print(f"     ... after {arm}: {by_arm[arm]['probe']['dials']}")
    holds, lines = verdict(results)
    print("\n".join(lines))
    (work / "summary.json").write_text(json.dumps(
        {"args": vars(args), "warm_checks": checks, "seconds": timing, "holds": holds,
         "verdict": lines, "results": results}, indent=1))
    figure(results, family, Path(args.figure))
    for key in ("learnable_second_half", "distance"):
        ratios = [results[s]["spade"][key] / results[s]["control"][key]
                  for s in results if results[s]["control"][key]]
        if ratios:
            print(json.dumps({"metric": f"designer_learns.{key}_spade_over_control",
                              "value": round(statistics.fmean(ratios), 4)}))
    print(json.dumps({"metric": "designer_learns.claim_holds", "value": int(holds)}))
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
