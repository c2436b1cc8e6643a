"""train.py's wiring of Algorithm 1: one scripted run whose every count is worked out by hand
below, spies on what the loop hands to the sampler, the loss, the optimizer and the memory, and
one run per ablation flag showing that the flag took effect. Plus the paper's constants where the
loop reads them.

The script (3 steps, R = 2, N = 3 slots, G = 4 unhinted plays, H = 2 hinted plays, k = 6 skills, so
slots 0, 1, 2 are Mathematical Reasoning, Logical Deduction, Spatial Reasoning at steps 0 and 2):
  designer call 0: [FAIR, BROKEN, FAULTY]   call 1 (slot 1 again): [HARD]
  designer call 2: [EASY, BROKEN, BROKEN]   call 3 (slots 1, 2 again): [BROKEN, BROKEN]
  FAIR pays 1 for "heads"; HARD pays 1 only for "heads please"; EASY always pays 1 but raises on
  the seed of step 2's fourth play (a fault in its own regeneration step); FAULTY is FAIR but
  raises on the seed of step 1's second play (an environment fault after its regret was taken).
  The agent says "heads" on play seeds 0 and 2 of a step, "tails" on 1 and 3, and "heads please"
  when its prompt holds a hint; every episode is one turn.
"""
import json
import re

import pytest
import torch

from infra import config
import grpo
from infra.sampling import derive_seed
from infra import logprobs as logprobs_lib
from infra import metrics as metrics_lib
from infra import models
import train
from runs import CORPUS, ENVS
from scripted import TeacherForced, main_with, seeded

MATH, LOGIC, SPATIAL, PATTERN = ("Mathematical Reasoning", "Logical Deduction", "Spatial Reasoning",
                                 "Pattern Recognition")

# Every knob the loop passes on gets a value that is nobody's default, so a swapped or
# hard-coded argument shows.
ARGS = ["--model", "tiny", "--steps", "3", "--regen_interval", "2", "--num_envs", "3",
        "--skills_per_regen", "6", "--plays", "4", "--hint_plays", "2", "--max_attempts", "2",
        "--designer_temperature", "0.61", "--hint_temperature", "0.31", "--agent_temperature", "0.62",
        "--top_p", "0.93", "--top_k", "19", "--designer_max_tokens", "24", "--hint_max_tokens", "12",
        "--max_new_tokens", "40", "--max_turns", "2", "--clip_low", "0.21", "--clip_high", "0.29",
        "--tis_cap", "2.5", "--lr", "3e-6", "--weight_decay", "0.05", "--grad_clip", "0.9",
        "--micro_batch_tokens", "700", "--sandbox_workers", "2", "--checkpoint_every", "100",
        "--transcripts", "1", "--corpus", str(CORPUS)]

EVEN = {derive_seed("play", 0, s, i) for s in range(3) for i in (0, 2)}  # "heads" plays
BAD_SEED = derive_seed("play", 0, 1, 1)  # step 1, play 1: FAULTY raises
EASY_BAD_SEED = derive_seed("play", 0, 2, 3)  # step 2, play 3: EASY raises

COIN = '''
class NAMEEnv:
    def __init__(self, max_turns: int = 3):
        self.seed = 0

    def reset(self, seed=None):
        self.seed = seed or 0
        return "Seed %d. Call the coin: \\\\boxed{heads} or \\\\boxed{tails}." % self.seed, {}

    def step(self, action):
        if self.seed == BAD:
            raise RuntimeError("a bug only this seed reaches")
        return "The coin landed.", float(PAYS), True, False, {}
'''


def coin(name, pays, bad=-1):
    src = COIN.replace("NAME", name).replace("PAYS", pays).replace("BAD", str(bad))
    return f"My environment.\n```python\n{src}```"


FAIR, HARD, EASY = coin("Fair", '"heads" in action'), coin("Hard", '"please" in action'), coin("Easy", "True", EASY_BAD_SEED)
FAULTY = coin("Faulty", '"heads" in action', BAD_SEED)
BROKEN = "```python\nclass BrokenEnv(:\n    pass\n```"
DESIGNS = [[FAIR, BROKEN, FAULTY], [HARD], [EASY, BROKEN, BROKEN], [BROKEN, BROKEN]]
# EASY, but its bad seed hangs: a step timeout in its own regeneration step (the regret ablation's
# -0.5) instead of a crash
EASY_HANGS = EASY.replace('raise RuntimeError("a bug only this seed reaches")', "while True: pass")



# ----------------------------------------------------------------------------------------------
# the paper's constants, where the loop reads them


def resolved(*argv):
    from transformers import HfArgumentParser
    cfg = config.Config(*HfArgumentParser(config.GROUPS).parse_args_into_dataclasses(args=list(argv)))
    train.resolve(cfg)
    return cfg.flat()


@pytest.mark.parametrize("setting", ["games", "tool"])
def test_loop_defaults_are_the_papers(setting):
    """Sec. 4 and Appendix values for a model without an authors' preset (the presets have their
    own test); everything the loop passes to the sampler, the loss and the optimizer."""
    c = resolved("--setting", setting)
    tool = setting == "tool"
    assert {k: c[k] for k in ("steps", "regen_interval", "num_envs", "plays", "hint_plays", "skills_per_regen",
                              "max_attempts", "corpus_seed", "memory_capacity", "role_scale_cap",
                              "designer_reward")} == \
        {"steps": 400, "regen_interval": 8 if tool else 4, "num_envs": 24, "plays": 8, "hint_plays": 16,
         "skills_per_regen": 6 if tool else 3, "max_attempts": 5, "corpus_seed": 42, "memory_capacity": 200,
         "role_scale_cap": 50.0, "designer_reward": "blend"}
    assert {k: c[k] for k in ("designer_temperature", "designer_max_tokens", "hint_temperature", "hint_max_tokens",
                              "agent_temperature", "top_p", "top_k", "max_turns", "max_context",
                              "max_new_tokens")} == \
        {"designer_temperature": 0.6, "designer_max_tokens": 16384, "hint_temperature": 0.3,
         "hint_max_tokens": 2048 if tool else 4096, "agent_temperature": 0.6, "top_p": 0.95, "top_k": 20,
         "max_turns": 25, "max_context": 32768, "max_new_tokens": 8192}
    assert {k: c[k] for k in ("lr", "weight_decay", "grad_clip", "clip_low", "clip_high", "tis_cap", "kl_coef",
                              "ppo_epochs")} == \
        {"lr": 1e-6, "weight_decay": 0.1, "grad_clip": 1.0, "clip_low": 0.2, "clip_high": 0.28, "tis_cap": 2.0,
         "kl_coef": 0.005 if tool else 0.0, "ppo_epochs": 1}
    assert grpo.BETAS == (0.9, 0.98)
    assert not any(c[k] for k in ("no_corpus", "no_memory", "no_designer_training", "two_skills", "fixed_envs"))


def test_paper_limits_in_the_leaf_modules():
    """The hint's 100 words and the exemplar's first 2,000 characters, checked on outputs."""
    import random

    import designer
    import memory
    words = [f"w{i}" for i in range(150)]
    hint = designer.parse_hint(" ".join(words))
    assert hint == " ".join(words[:100]) + " ..."
    assert designer.parse_hint(" ".join(words[:100])) == " ".join(words[:100])
    assert designer.CORPUS_MAX_WORDS == {"games": 6000, "tool": 4000}
    src = "".join(chr(ord("a") + i % 26) for i in range(2600))
    mem = memory.EnvironmentMemory()
    mem.add(memory.MemoryRecord(skill=MATH, source=src, win_rate=0.5, regret=0.3, step=0, class_name="XEnv"))
    block = seeded(mem, random.Random(0)).prompt_block(MATH)
    assert src[:2000] in block and src[:2001] not in block
    assert mem.capacity == 200


# ----------------------------------------------------------------------------------------------
# the scripted run (tests/scripted.py's TeacherForced engines: the model's own log-probs)

def agent_reply(call, i, text, max_new_tokens):
    if isinstance(max_new_tokens, int):  # a hint call (agent turns get one cap per prompt)
        return "Say heads please."
    if "HINT:" in text:
        return "\\boxed{heads please}"
    seed = re.search(r"Seed (\d+)\. Call the coin", text)
    if seed is None:  # another environment (the Fixed-env baseline's)
        return "\\boxed{1}"
    return "\\boxed{heads}" if int(seed.group(1)) in EVEN else "\\boxed{tails}"


@pytest.fixture(scope="module")
def policy():
    return models.build_tiny("tiny", seed=0)


def run(tmp_path, policy, monkeypatch, extra=(), designs=DESIGNS):
    """The scripted run with spies; returns (run dir, metrics rows, spy records, engines)."""
    import accelerate
    rec = {"samples": [], "batches": [], "loss_kw": [], "temps": [], "weights": [], "clip": [], "adamw": []}
    real_update, real_batches = train.grpo_update, train.micro_batches
    real_loss, real_logprobs = grpo.policy_loss, logprobs_lib.token_logprobs
    real_backward, real_clip, real_adamw = (accelerate.Accelerator.backward,
                                            accelerate.Accelerator.clip_grad_norm_, torch.optim.AdamW)

    def grpo_update(trainer, samples, **kw):
        rec["samples"].append(list(samples))  # the step's whole batch, both roles
        return real_update(trainer, samples, **kw)

    def micro_batches(samples, budget):  # what is forwarded (zero advantages are not)
        out = real_batches(samples, budget)
        rec["batches"].append(out)
        return out

    def policy_loss(*a, **kw):
        rec["loss_kw"].append(kw)
        loss, stats = real_loss(*a, **kw)
        # same gradient; the value is the micro-batch's total sample weight, which backward records
        return loss - loss.detach() + float(kw["weights"].sum()), stats

    def token_logprobs(*a, temperature, **kw):
        rec["temps"].append(temperature)
        return real_logprobs(*a, temperature=temperature, **kw)

    def backward(self, loss, **kw):
        rec["weights"].append(float(loss.detach()))
        return real_backward(self, loss, **kw)

    def clip_grad_norm_(self, parameters, max_norm, *a, **kw):
        rec["clip"].append(max_norm)
        return real_clip(self, parameters, max_norm, *a, **kw)

    def adamw(params, **kw):
        rec["adamw"].append(kw)
        return real_adamw(params, **kw)

    monkeypatch.setattr(train, "grpo_update", grpo_update)
    monkeypatch.setattr(train, "micro_batches", micro_batches)
    monkeypatch.setattr(grpo, "policy_loss", policy_loss)
    monkeypatch.setattr(logprobs_lib, "token_logprobs", token_logprobs)
    monkeypatch.setattr(accelerate.Accelerator, "backward", backward)
    monkeypatch.setattr(accelerate.Accelerator, "clip_grad_norm_", clip_grad_norm_)
    monkeypatch.setattr(torch.optim, "AdamW", adamw)
    model, tok = policy
    engines = {"designer": TeacherForced(model, tok, lambda c, i, text, cap: designs[c][i]),
               "agent": TeacherForced(model, tok, agent_reply)}
    out = main_with(engines, ARGS + ["--output_dir", str(tmp_path / "run")] + list(extra))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, rows, rec, engines


def pool(run_dir, step):
    return json.loads((run_dir / "envs" / f"step-{step:04d}-rank-0" / "pool.json").read_text())


def by_role(samples, role):
    return [s for s in samples if s.role == role]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory, policy):
    mp = pytest.MonkeyPatch()
    try:
        yield run(tmp_path_factory.mktemp("wiring"), policy, mp)
    finally:
        mp.undo()


@pytest.mark.slow
def test_counts_regret_scores_and_scale_by_hand(scripted):
    out, rows, rec, engines = scripted
    r0, r1, r2 = rows
    approx = pytest.approx
    # step 0: FAIR u [1,0,1,0] h [1,1] (regret 0.5); FAULTY the same; HARD u [0]*4 h [1,1] (regret 1)
    assert {k: r0[k] for k in ("designer/slots", "designer/attempts", "designer/valid", "designer/accepted",
                               "designer/rejected/syntax", "designer/empty_slots", "env/pool_size",
                               "env/faulty", "env/from_fallback", "agent/episodes", "losses/samples")} == \
        {"designer/slots": 3, "designer/attempts": 4, "designer/valid": 3, "designer/accepted": 3,
         "designer/rejected/syntax": 1, "designer/empty_slots": 0, "env/pool_size": 3, "env/faulty": 0,
         "env/from_fallback": 0, "agent/episodes": 12, "losses/samples": 12}
    assert r0["designer/validity_rate"] == approx(3 / 4) and r0["designer/first_attempt_validity_rate"] == approx(2 / 3)
    assert r0["regret/mean"] == approx(2 / 3) and r0["regret/positive_share"] == 1.0
    assert r0["regret/r_hint"] == approx(1.0) and r0["regret/r_nohint"] == approx(1 / 3)
    assert r0["agent/return_mean"] == approx(1 / 3) and r0["agent/hinted_return_mean"] == approx(1.0)
    assert r0["env/win_rate"] == approx(1 / 3) and r0["env/learnable_share"] == approx(2 / 3)
    assert r0["env/zero_variance_share"] == approx(1 / 3) and r0["env/win_rate/" + LOGIC] == 0.0
    assert "designer/samples" not in r0 and "designer/scale" not in r0  # nothing scored yet
    # step 1: no regeneration; FAULTY faults once (its tails play) and leaves the pool
    assert "designer/attempts" not in r1 and "regret/mean" not in r1 and "agent/hinted_return_mean" not in r1
    assert (r1["agent/episodes"], r1["losses/samples"], r1["env/faulty"]) == (12, 11, 1)
    assert r1["agent/status/env_error"] == approx(1 / 12) and r1["agent/return_mean"] == approx(1 / 3)
    # step 2: EASY fresh (u [1,1,1,fault], h [1,1]: faulty, so no regret), FAIR and HARD carried;
    # FAULTY dropped
    assert [(p["class_name"], p["origin"]) for p in pool(out, 2)] == \
        [("EasyEnv", "designer"), ("FairEnv", "carried"), ("HardEnv", "carried")]
    assert (r2["designer/attempts"], r2["designer/valid"], r2["designer/rejected/syntax"],
            r2["designer/empty_slots"], r2["env/faulty"]) == (5, 1, 4, 2, 1)
    assert "regret/mean" not in r2 and r2["agent/return_mean"] == approx(5 / 12)
    assert r2["agent/status/env_error"] == approx(1 / 12) and r2["agent/hinted_return_mean"] == 1.0
    # scores (blend 0.4 * clip(regret / 0.15, 0, 1) + 0.6 * plateau(w), w over the epoch):
    # FAIR 0.4 + 0.6 = 1.0, FAULTY 0 (faulted, though its regret was 0.5), HARD 0.4 + 0 = 0.4, and
    # EASY (the last epoch, deviation 3) 0 (faulted); S = min(50, 11 agent / 4 designer * R=2) = 5.5
    assert (r2["designer/samples"], r2["losses/samples"]) == (4, 15)
    assert r2["designer/score_mean"] == approx(1.4 / 4) and r2["designer/scale"] == approx(5.5)
    # advantages = S * (score - mean of its skill): MATH {FAIR 1.0, EASY 0} -> +-2.75; others alone -> 0
    assert sorted(float(s.advantage) for s in by_role(rec["samples"][2], "designer")) == \
        approx([-2.75, 0, 0, 2.75])
    assert [len(by_role(b, "designer")) for b in rec["samples"]] == [0, 0, 4]
    tok = engines["designer"].tok
    trained = sorted(tok.decode([t for t, m in zip(s.token_ids, s.mask) if m])
                     for s in by_role(rec["samples"][2], "designer"))
    assert trained == sorted(d + "<|im_end|>" for d in (FAIR, FAULTY, HARD, EASY))  # the replies only


@pytest.mark.slow
def test_agent_batch_holds_unhinted_fault_free_plays_only(scripted, policy):
    _, _, rec, _ = scripted
    tok = policy[1]
    agent = [by_role(b, "agent") for b in rec["samples"]]
    assert [len(a) for a in agent] == [12, 11, 11]  # 18, 12 and 14 episodes were played
    for samples in agent:
        texts = [tok.decode(s.token_ids) for s in samples]
        assert not any("HINT:" in t for t in texts)
        assert all(t.count("Call the coin") == 1 for t in texts)
    # Eq. (1) per environment: [1,0,1,0] -> +-1; HARD's zeros -> 0; FAULTY at step 1 [1,1,0] ->
    # (1 - 2/3) / sqrt(2/9) and (0 - 2/3) / sqrt(2/9)
    advs = [sorted(round(float(s.advantage), 4) for s in a) for a in agent]
    assert advs[0] == [-1.0] * 4 + [0.0] * 4 + [1.0] * 4
    assert advs[1] == sorted([-1.0, -1.0, 1.0, 1.0] + [0.0] * 4 + [round(-(2 / 3) / (2 / 9) ** 0.5, 4)]
                             + [round((1 / 3) / (2 / 9) ** 0.5, 4)] * 2)
    assert advs[2] == [-1.0] * 2 + [0.0] * 7 + [1.0] * 2  # EASY's [1,1,1] and HARD's zeros: 0
    for s in (s for a in agent for s in a):  # the trained tokens are the reply, prompt masked
        reply = [t for t, m in zip(s.token_ids, s.mask) if m]
        assert tok.decode(reply) in ("\\boxed{heads}<|im_end|>", "\\boxed{tails}<|im_end|>")


@pytest.mark.slow
def test_memory_holds_fresh_envs_with_win_rate_and_regret(scripted):
    out, _, _, _ = scripted
    mem = json.loads((out / "memory.json").read_text())
    assert [(r["class_name"], r["skill"], r["win_rate"], r["regret"], r["step"]) for r in mem["records"]] == [
        ("FairEnv", MATH, 0.5, 0.5, 0), ("FaultyEnv", SPATIAL, 0.5, 0.5, 0), ("HardEnv", LOGIC, 0.0, 1.0, 0),
        ("EasyEnv", MATH, 0.75, 0.0, 2)]
    # EASY crashed on 1 of its 4 plays in its own regeneration step: remembered as the authors do,
    # the crash a lost play, no regret (a faulty environment has none); carried FAIR and HARD not again
    assert mem["capacity"] == 200


@pytest.mark.slow
def test_loss_weights_are_one_mean_over_samples(scripted):
    _, rows, rec, _ = scripted
    """Each sample of a micro-batch weighs 1 / n (one turn per episode here), len(mb) / n in all:
    with the zero-advantage samples (counted, never forwarded: their gradient is exactly 0) the
    weights sum to one mean over all n samples."""
    assert len(rec["weights"]) == sum(len(b) for b in rec["batches"])
    i = 0
    for samples, batches, row in zip(rec["samples"], rec["batches"], rows):
        n, zero = len(samples), sum(float(s.advantage) == 0.0 for s in samples)
        assert n == row["losses/samples"] and len(batches) >= 2  # the budget splits every step
        assert sum(len(mb) for mb in batches) == n - zero and 0 < zero < n
        weights = rec["weights"][i:i + len(batches)]
        assert weights == pytest.approx([len(mb) / n for mb in batches])
        assert sum(weights) + zero / n == pytest.approx(1.0)
        i += len(batches)


@pytest.mark.slow
def test_update_statistics_and_phase_times_by_hand(scripted):
    """losses/tokens is the mean over the forwarded samples of their trained tokens (the budget
    splits every step into micro-batches of unequal size, so a mean of micro-batch totals would
    differ); every phase of Algorithm 1 has its time/<phase>_s, together at most time/step_s."""
    _, rows, rec, _ = scripted
    for batches, row in zip(rec["batches"], rows):
        forwarded = [s for mb in batches for s in mb]
        assert len({len(mb) for mb in batches}) > 1 or len(batches) > 1
        assert row["losses/tokens"] == pytest.approx(
            sum(sum(s.mask) for s in forwarded) / len(forwarded))
        spans = [row[f"time/{p}_s"] for p in metrics_lib.PHASES]
        assert all(t >= 0 for t in spans) and sum(spans) <= row["time/step_s"]
        assert {k for k in row if k.startswith("time/")} == \
            {f"time/{p}_s" for p in metrics_lib.PHASES} | {"time/log_s", "time/step_s"}
        assert row["time/step_s"] == pytest.approx(sum(spans) + row["time/log_s"])


@pytest.mark.slow
def test_loop_passes_its_own_settings_on(scripted):
    """Each role samples with its own settings; the loss, log-probs and optimizer get the flags."""
    _, _, rec, engines = scripted
    design, agent_eng = engines["designer"].calls, engines["agent"].calls
    assert [len(c["texts"]) for c in design] == [3, 1, 3, 2]
    assert all((c["temperature"], c["top_p"], c["top_k"], c["max_new_tokens"]) == (0.61, 0.93, 19, 24)
               for c in design)
    hints = [c for c in agent_eng if isinstance(c["max_new_tokens"], int)]
    turns = [c for c in agent_eng if not isinstance(c["max_new_tokens"], int)]
    assert [len(c["texts"]) for c in hints] == [3, 1]  # fresh environments only
    assert all((c["temperature"], c["top_p"], c["top_k"], c["max_new_tokens"]) == (0.31, 0.93, 19, 12)
               for c in hints)
    assert [len(c["texts"]) for c in turns] == [18, 12, 14]
    assert all((c["temperature"], c["top_p"], c["top_k"]) == (0.62, 0.93, 19) and max(c["max_new_tokens"]) == 40
               for c in turns)
    assert len({c["seed"] for c in design + agent_eng}) == len(design) + len(agent_eng)
    # common random numbers: each environment's hinted plays reuse its first H unhinted seeds
    step0 = [(t.count("HINT:"), re.search(r"Seed (\d+)\.", t).group(1)) for t in turns[0]["texts"]]
    for env in range(3):
        plays = step0[6 * env:6 * env + 6]
        assert [h for h, _ in plays] == [0, 0, 0, 0, 1, 1]
        assert [s for _, s in plays[4:]] == [s for _, s in plays[:2]] != [s for _, s in plays[2:4]]
    assert {int(s) for _, s in step0} == {derive_seed("play", 0, 0, i) for i in range(4)}
    assert all({k: kw[k] for k in ("clip_low", "clip_high", "tis_cap", "kl_coef")} ==
               {"clip_low": 0.21, "clip_high": 0.29, "tis_cap": 2.5, "kl_coef": 0.0} for kw in rec["loss_kw"])
    roles = [mb[0].role for b in rec["batches"] for mb in b]
    assert [{"agent": 0.62, "designer": 0.61}[r] for r in roles] == rec["temps"]
    assert rec["clip"] == [0.9] * 3
    # fused only on CUDA (one kernel, no parameter-sized temporary)
    assert rec["adamw"] == [{"lr": 3e-6, "betas": (0.9, 0.98), "weight_decay": 0.05,
                             "fused": False}]


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["baseline", "--no_corpus", "--no_memory", "--no_designer_training",
                                  "--two_skills", "regret", "solve_rate", "learning_potential",
                                  "--fixed_envs"])
def test_each_ablation_takes_effect(tmp_path, policy, monkeypatch, flag, scripted):
    """Every ablation flag (README, "Ablations") runs the whole script, trains every step, and
    takes effect; each runs once here (no other file repeats these runs)."""
    extra = {"baseline": [], "--two_skills": ["--two_skills", "--skills_per_regen", "2"],
             "regret": ["--designer_reward", "regret"], "solve_rate": ["--designer_reward", "solve_rate"],
             "learning_potential": ["--designer_reward", "learning_potential"],
             "--fixed_envs": ["--fixed_envs", str(ENVS)]}.get(flag, [flag])
    designs = [[EASY_HANGS if d == EASY else d for d in c] for c in DESIGNS] if flag == "regret" else DESIGNS
    out, rows, rec, engines = scripted if flag == "baseline" else run(tmp_path, policy, monkeypatch, extra, designs)
    assert len(rows) == 3 and all(r["losses/samples"] > 0 for r in rows)
    prompts = [t for c in engines["designer"].calls for t in c["texts"]]
    later = [t for c in engines["designer"].calls[2:] for t in c["texts"]]  # step 2's prompts
    if flag == "baseline":  # what each flag turns off is there without it
        assert all("<REFERENCE_DOCUMENT>" in t for t in prompts)
        assert sum("<REFERENCE_ENVIRONMENTS>" in t for t in later) == 3  # MATH (FAIR) once, SPATIAL (FAULTY) twice
        assert sum("Avoid environments like HardEnv" in t for t in later) == 2  # LOGIC, both attempts
        assert {p["skill"] for p in pool(out, 0)} == {MATH, LOGIC, SPATIAL}
    elif flag == "--no_corpus":
        assert len(prompts) == 9 and not any("<REFERENCE_DOCUMENT>" in t for t in prompts)
        assert all("at most 2 turns" in t for t in prompts)  # --max_turns, as the authors pass it
    elif flag == "--no_memory":
        assert len(later) == 5 and not any("<REFERENCE_ENVIRONMENTS>" in t or "Avoid environments" in t
                                           for t in later)
        assert not (out / "memory.json").exists()
    elif flag == "--no_designer_training":
        assert [len(by_role(b, "designer")) for b in rec["samples"]] == [0, 0, 0]
        assert rows[2]["losses/samples"] == 11 and "designer/samples" not in rows[2]
    elif flag == "--two_skills":  # slots MATH, PATTERN, MATH at both regenerations
        assert [p["skill"] for p in pool(out, 0)] == [MATH, MATH, PATTERN]
        assert {p["skill"] for p in pool(out, 2)} == {MATH, PATTERN}
    elif flag == "regret":  # max(0, regret): FAIR 0.5, FAULTY 0 (a crash at step 1), HARD 1.0, and
        # EASY -0.5: its play timed out in its own regeneration step (step 2)
        assert rows[2]["agent/status/env_error"] == pytest.approx(1 / 12)
        assert rows[2]["designer/score_mean"] == pytest.approx(1.0 / 4)
        assert sorted(float(s.advantage) for s in by_role(rec["samples"][2], "designer")) == \
            pytest.approx([-2.75, 0, 0, 2.75])  # MATH: 5.5 * (+-0.5 - 0)
    elif flag == "solve_rate":  # plateau(w): FAIR 1, FAULTY 0, HARD 0, EASY 0
        assert rows[2]["designer/score_mean"] == pytest.approx(1 / 4)
    elif flag == "learning_potential":  # |w - mu_slow(skill)|, the trackers' first update setting
        # each skill's to the mean of its fault-free environments' plays: FAIR alone in MATH (EASY
        # faulted), HARD alone in LOGIC, so |w - w| = 0; FAULTY and EASY faulted: 0
        assert rows[2]["designer/samples"] == 4 and rows[2]["designer/score_mean"] == 0.0
        assert [float(s.advantage) for s in by_role(rec["samples"][2], "designer")] == [0.0] * 4
    else:  # Fixed-env GRPO: the directory's environments, never a designer call, a hint or a designer sample
        assert engines["designer"].calls == [] and not any(isinstance(c["max_new_tokens"], int)
                                                           for c in engines["agent"].calls)
        assert all(r["env/pool_size"] == 3 and "designer/attempts" not in r for r in rows)  # N per step
        assert [len(by_role(b, "designer")) for b in rec["samples"]] == [0, 0, 0]
        sizes = [len(c["texts"]) for c in engines["agent"].calls]  # N x G unhinted plays, turn by turn
        assert sizes[0] == 12 and max(sizes) == 12 and sizes.count(12) >= 3
