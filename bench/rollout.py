"""Rollout benchmarks: batched multi-turn play, and the weight-sync name map at 30B-A3B shape.

    python bench/rollout.py

1. rollout.batched_turn_speedup: the tiny Qwen3 on CPU plays 16 episodes of 5 turns (replies of
   up to 96 tokens, ~14 on average: the random model's EOS logit gets +0.6) with one engine call
   per turn for all live episodes, versus the same 16 episodes played one at a time. Both arms use
   the same engine (prefix cache on, one thread). Figure: agent turns per second, batched over
   one-at-a-time (target >= 4); the arms alternate twice. Static batching waits for the longest
   reply of each turn (~3.5x the mean for geometric lengths), which bounds this figure on CPU.
2. weightsync.name_map_ms: mapping the trainer's parameter names of a Qwen3-30B-A3B-shaped model
   (fused MoE experts, built on the meta device) to the 18,867 checkpoint names vLLM loads; median
   of 7 runs (target <= 100 ms), checked equal (names and shapes) to what save_pretrained writes.
Prints JSON figures as the last lines; never asserts.
"""
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import agent  # noqa: E402
import engine  # noqa: E402

EPISODES, TURNS, REPLY_TOKENS, REPEATS = 16, 5, 96, 2


class FiveTurnEnv:
    """Any action is fine; the episode is truncated after TURNS steps."""

    def reset(self, seed=None):
        self.t = 0
        return f"Room {seed}. Say a direction.", {}

    def step(self, action):
        self.t += 1
        return f"You moved ({self.t}). Say a direction.", 0.0, False, self.t >= TURNS, {}

    def tools(self):
        return []


def bench_rollout():
    torch.set_num_threads(1)  # tiny matmuls: one thread, same for both arms
    model, tok = engine.build_tiny("tiny", seed=0)
    bias = torch.zeros(model.config.vocab_size)
    bias[tok.eos_token_id] = 0.6  # the random model ends its replies after ~14 tokens
    model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    eng = engine.TransformersEngine(model, tok, prefix_cache=True)
    calls = [0]

    def generate(prompts, caps):
        calls[0] += 1
        return eng.generate(prompts, max_new_tokens=caps, temperature=0.6, top_p=0.95, top_k=20,
                            seed=calls[0])

    def specs():
        return [agent.EpisodeSpec("room", s, None, FiveTurnEnv()) for s in range(EPISODES)]

    def run(batched):
        t0 = time.perf_counter()
        if batched:
            eps = agent.play(specs(), generate=generate, tokenizer=tok,
                             max_new_tokens=REPLY_TOKENS)
        else:
            eps = [ep for s in specs() for ep in agent.play([s], generate=generate, tokenizer=tok,
                                                            max_new_tokens=REPLY_TOKENS)]
        seconds = time.perf_counter() - t0
        turns = sum(e.turns for e in eps)
        tokens = sum(sum(e.mask) for e in eps)
        return turns / seconds, turns, tokens, seconds

    run(True)  # warm-up
    totals = {"batched": [0, 0, 0.0], "one_at_a_time": [0, 0, 0.0]}
    for _ in range(REPEATS):  # alternate the arms so load on a shared machine hits both alike
        for name, batched in (("batched", True), ("one_at_a_time", False)):
            _, turns, tokens, seconds = run(batched)
            totals[name] = [a + b for a, b in zip(totals[name], (turns, tokens, seconds))]
    for name, (turns, tokens, seconds) in totals.items():
        print(f"{name}: {turns} turns, {tokens} reply tokens, {seconds:.2f} s, "
              f"{turns / seconds:.1f} turns/s")
    rate = {name: turns / seconds for name, (turns, _, seconds) in totals.items()}
    return rate["batched"] / rate["one_at_a_time"]


def bench_name_map():
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig
    from transformers.core_model_loading import revert_weight_conversion
    cfg = Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                         moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                         num_key_value_heads=4, head_dim=128, num_experts=128,
                         num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        shapes = engine.checkpoint_shapes(model)
        times.append((time.perf_counter() - t0) * 1000)
    saved = revert_weight_conversion(model, dict(model.state_dict()))  # what save_pretrained writes
    same = shapes == {k: tuple(v.shape) for k, v in saved.items()}
    print(f"name map: {len(shapes)} tensors, runs (ms) {[round(t, 1) for t in times]}, "
          f"equal to save_pretrained's names/shapes: {same}")
    return statistics.median(times), len(shapes), same


if __name__ == "__main__":
    speedup = bench_rollout()
    ms, count, same = bench_name_map()
    print(json.dumps({"metric": "rollout.batched_turn_speedup", "value": round(speedup, 2),
                      "target": ">= 4"}))
    print(json.dumps({"metric": "weightsync.name_map_ms", "value": round(ms, 1),
                      "target": "<= 100", "tensors": count, "equal_to_save_pretrained": same}))
