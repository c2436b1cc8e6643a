"""The whole loop learns: train.py on a trivial fixed environment takes a random tiny model from
mostly failing to mostly winning.

The environment pays 1 for any move, so the only skill is to END the reply (emit the end-of-turn
token) within the 48-token budget; a reply cut by the budget ends the episode with return 0
(deviation 7). A random tiny Qwen3 puts ~1/1000 of its mass on that token, so at first almost every
reply is cut. Everything between is the real loop: the sandbox validates and runs the environment,
the transformers engine samples batched plays from the current policy (weights synced every step),
Eq. (1) advantages, masks, the clipped loss, AdamW. Sampling is untruncated (top-k off, top-p 1,
T 1) so the end token can be drawn at all, and the learning rate suits a 64-wide model (the paper's
1e-6 is for 4B-30B models). Seeded; about a minute on one CPU core.

With --lora_rank (README row 38) the same game is learnt to the same bar, by LoRA adapters on the
attention and MLP projections alone, from a tiny model whose embeddings are 5x the random
init's: at the init's std 0.02 a head row has norm 0.16 and the final norm's output norm
sqrt(64) = 8, so no hidden state lifts the end token's logit above 1.3 (a probability of about
1/300 a token, 15% over 48 tokens) while the embeddings and the norm stay frozen, which only full
fine-tuning trains.
"""
import json

import pytest
import torch

from infra import models
import train

ENV = '''"""skill: Pattern Recognition. Any move wins: the task is to finish a reply."""


class SayAnythingEnv:
    def __init__(self, max_turns: int = 1):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Say anything, then end your turn.", {}

    def step(self, action):
        return "Done.", 1.0, True, False, {}
'''
STEPS = 30  # on CPU the return reaches 1.0 by about step 20; 30 leaves room for numeric drift


def learn(tmp_path, model: str, *flags) -> None:
    """train.py on the game for STEPS steps; asserts the bar."""
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "say_anything.py").write_text(ENV)
    out = train.main(["--model", model, "--seed", "0", "--fixed_envs", str(envs), "--steps", str(STEPS),
                      "--plays", "16", "--max_turns", "1", "--max_new_tokens", "48", "--top_k", "-1",
                      "--top_p", "1.0", "--agent_temperature", "1.0", *flags,
                      "--checkpoint_every", str(STEPS), "--sandbox_workers", "2", "--transcripts", "0",
                      "--output_dir", str(tmp_path / "run")])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    returns = [r["agent/return_mean"] for r in rows]
    assert len(returns) == STEPS and all(r["agent/episodes"] == 16 for r in rows)
    start, end = sum(returns[:2]) / 2, sum(returns[-3:]) / 3
    print(f"mean return: start {start:.3f}, end {end:.3f}; per step {[round(x, 3) for x in returns]}")
    assert start <= 0.3, returns
    assert end >= 0.8, returns
    # what was learnt is ending the turn: replies got shorter, and every win is a terminated play
    assert rows[-1]["agent/tokens_mean"] < rows[0]["agent/tokens_mean"]
    assert rows[-1]["agent/status/terminated"] == pytest.approx(returns[-1])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_loop_learns_a_trivial_environment(tmp_path):
    learn(tmp_path, "tiny", "--lr", "5e-3")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_loop_learns_it_with_lora(tmp_path):
    """LoRA rank 8 at lr 2e-2 (LoRA wants a larger rate than full fine-tuning): on CPU the return
    reaches 1.0 by about step 12 (full fine-tuning of the same model at 5e-3: step 18)."""
    model, tok = models.build_tiny("tiny", seed=0)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(5.0)  # the docstring says why
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    learn(tmp_path, str(tmp_path / "model"), "--lr", "2e-2", "--lora_rank", "8")
