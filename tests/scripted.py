"""Scripted models and streams of the tests: ScriptedSampler (eval and tool use), Barrier (a turn
barrier stream over a scripted generate), main_with and ByRole (train.py on scripted engines)."""
import time


class ScriptedSampler:
    """Replies from a function `fn(messages, sample_index) -> str` (oracles, baselines, garbage).
    Every call's keyword arguments are kept in `calls` (the sampling protocol a suite asked for)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def chat(self, conversations, *, n=1, tools=None, **sampling):
        self.calls.append({"n": n, "prompts": len(conversations), **sampling})
        return [[self.fn(messages, k) for k in range(n)] for messages in conversations]


def main_with(engines: dict, argv):
    """train.main(argv) with scripted engines in place of the policy's own: "designer" answers the
    designer calls (and --generate_pool's), "agent" the agent turns and hints. Monkeypatched for
    the call's duration; the library has no hook for it."""
    import pytest

    from infra import run
    import train
    argv = list(argv)
    run_init = run.Run.__init__

    def init(self, *args, **kwargs):
        run_init(self, *args, **kwargs)
        self.sampler.stream = ByRole(self.sampler, engines.get("designer", self.sampler.eng),
                                     engines.get("agent", self.sampler.eng))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run.Run, "__init__", init)
        if "--generate_pool" in argv and "designer" in engines:
            mp.setattr(run, "make_engine", lambda *args, **kwargs: engines["designer"])
        return train.main(argv)


class ByRole:
    """The run's one Sampler with its streams routed by role: the designer role's on one engine,
    every other role's (hints, agent turns) on another (the phase's drain goes to the engine of
    its stream)."""

    def __init__(self, sampler, designer, agent):
        self._sampler, self._designer, self._agent = sampler, designer, agent
        self._stream = sampler.stream

    def __call__(self, step, role, *args, **kwargs):
        self._sampler.eng = self._designer if role == "designer" else self._agent
        return self._stream(step, role, *args, **kwargs)


class Barrier:
    """A request stream (infra/engine.py) over a scripted batched `generate`: every collect() is
    one call for all pending requests, in key order (a turn barrier, as engine.Batched; without
    wait it decodes nothing): generate(prompts, caps) for token requests with their caps,
    generate(chats) for chats."""

    def __init__(self, generate):
        self.generate, self.queue = generate, []

    @property
    def pending(self):
        return len(self.queue)

    def submit(self, key, prompt, max_new_tokens=None):
        self.queue.append((key, prompt, max_new_tokens))

    def collect(self, wait=True):
        if not wait:
            time.sleep(0.001)
            return []
        batch, self.queue = sorted(self.queue, key=lambda q: q[0]), []
        if not batch:
            return []
        caps = [c for _, _, c in batch]
        prompts = [p for _, p, _ in batch]
        replies = self.generate(prompts) if caps[0] is None else self.generate(prompts, caps)
        if len(replies) != len(batch):
            raise ValueError(f"generate returned {len(replies)} replies for {len(batch)} prompts")
        return [(key, reply) for (key, _, _), reply in zip(batch, replies)]

    def serve(self, fn):
        return fn()


def seeded(memory, rng):
    """`memory` drawing its exemplars from `rng` (a test's own random.Random)."""
    memory.rng = rng
    return memory
