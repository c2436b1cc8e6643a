"""What the tests that run train.py share (test files never import each other): the small
complete run's flags (BASE) and its scripted designer and agent (coin_script), the export run's
flags (TINY) and agent, the metrics reader, and a spy on activation checkpointing."""
import json
from pathlib import Path

from scripted import TeacherForced, in_turn, per_prompt, shifted

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "data" / "envs"
# Short documents keep the designer's prompts (and so the designer update) small on CPU.
CORPUS = ROOT / "tests" / "fixtures" / "short_corpus.jsonl"

# Small but complete: 2 regenerations (steps 0 and 2), 2 environments x 2 plays, 2 hinted plays.
BASE = ["--model", "tiny", "--steps", "3", "--regen_interval", "2", "--num_envs", "2",
        "--skills_per_regen", "1", "--plays", "4", "--hint_plays", "2", "--max_attempts", "2",
        "--designer_max_tokens", "16", "--hint_max_tokens", "8", "--max_turns", "2",
        "--max_new_tokens", "8", "--sandbox_workers", "2", "--checkpoint_every", "1",
        "--transcripts", "1", "--corpus", str(CORPUS)]

# A fair coin pays "heads", an unfair one never pays; the scripted agent alternates heads and tails,
# so both roles get non-zero advantages (a random tiny model almost never ends a reply with EOS).
COIN = '''
class CoinEnv:
    def __init__(self, max_turns: int = 3):
        self.max_turns, self.seed, self.turn = max_turns, 0, 0

    def reset(self, seed=None):
        self.seed, self.turn = seed or 0, 0
        return "Call the coin: \\\\boxed{heads} or \\\\boxed{tails}.", {}

    def step(self, action):
        self.turn += 1
        won = FAIR and "heads" in action
        return "The coin landed. Play again with \\\\boxed{heads}.", float(won), True, False, {}
'''


def coin_script(model, tok):
    """Engines for main_with: the designer's script (a fair coin, a syntax error, an unfair coin,
    a hanging environment, read on across calls) and an agent that says heads to its first
    prompt of a call and tails to the second."""
    replies = [f"Here is my environment.\n```python\n{COIN.replace('FAIR', 'True')}\n```",
               "```python\nclass BrokenEnv(:\n    pass\n```",
               f"```python\n{COIN.replace('FAIR', 'False')}\n```",
               "```python\nclass HostileEnv:\n    def reset(self, seed=None):\n"
               "        while True: pass\n```"]
    return {"designer": TeacherForced(model, tok, in_turn(replies)),
            "agent": TeacherForced(model, tok, per_prompt(["I call it. \\boxed{heads}",
                                                           "Hmm. \\boxed{tails}"]))}


def metrics(run_dir):
    """The run's metrics rows without wall times and the rates over them (they differ between
    runs)."""
    rows = [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k.startswith("time/") or k.endswith("_per_s"))}
            for r in rows]


# The export tests' run: one regeneration of their own designer script (tests/test_export.py).
TINY = ["--model", "tiny", "--plays", "2", "--max_attempts", "1", "--designer_max_tokens", "16",
        "--hint_max_tokens", "8", "--max_turns", "3", "--max_new_tokens", "8",
        "--sandbox_workers", "2", "--checkpoint_every", "1", "--corpus", str(CORPUS)]


def agent_engine(tiny):
    """The export tests' agent: heads and tails, shifted by one each call."""
    return TeacherForced(*tiny, shifted(["I call it. \\boxed{heads}", "Hmm. \\boxed{tails}"]))


def count_checkpoints(monkeypatch, calls):
    """Count torch.utils.checkpoint.checkpoint calls made by transformers' checkpointed layers
    in calls["checkpoint"]."""
    import transformers.modeling_utils as mu
    checkpoint = mu.checkpoint

    def counting(*a, **k):
        calls["checkpoint"] += 1
        return checkpoint(*a, **k)
    monkeypatch.setattr(mu, "checkpoint", counting)


# Environments whose reward is a reply's length parity (tests/test_fsdp2.py's runs, LoRA's and
# the held-out evaluations'): a random tiny model's plays may differ within a group.
PARITY = '''"""skill: Pattern Recognition. Pays 1 for a reply of {parity} length."""


class {name}:
    def reset(self, seed=None):
        return "Reply with anything.", {{}}

    def step(self, action):
        return "Done.", float(len(action) % 2 == {rest}), True, False, {{}}
'''


def parity_world(root: Path, dtype=None):
    """root/model: the tiny model whose replies end at any of every 8th token (a random model's
    episodes finish, and are paid), saved in `dtype` (None: fp32); root/envs: the two PARITY games.
    Returns the tokenizer."""
    from infra import models
    model, tok = models.build_tiny("tiny", seed=0)
    model.generation_config.eos_token_id = list(range(0, len(tok), 8))
    (model if dtype is None else model.to(dtype)).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    (root / "envs").mkdir()
    for name, parity, rest in (("EvenEnv", "even", 0), ("OddEnv", "odd", 1)):
        (root / "envs" / f"{parity}.py").write_text(PARITY.format(name=name, parity=parity,
                                                                 rest=rest))
    return tok

