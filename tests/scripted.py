"""A sampler that replies from a function: the scripted models of the eval and tool-use tests."""


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
        self.sampler.eng = ByPhase(self.sampler, engines.get("designer", self.sampler.eng),
                                   engines.get("agent", self.sampler.eng))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run.Run, "__init__", init)
        if "--generate_pool" in argv and "designer" in engines:
            mp.setattr(run, "make_engine", lambda *args, **kwargs: engines["designer"])
        return train.main(argv)


class ByPhase:
    """An engine that answers the sampler's designer phase from one engine and every other phase
    (hints, agent turns) from another: the run's one Sampler routed by what it is sampling."""

    def __init__(self, sampler, designer, agent):
        self._sampler, self._designer, self._agent = sampler, designer, agent

    def __getattr__(self, name):  # only names ByPhase lacks: the engines' own
        return getattr(self._designer if self._sampler.phase == "designer" else self._agent, name)


def seeded(memory, rng):
    """`memory` drawing its exemplars from `rng` (a test's own random.Random)."""
    memory.rng = rng
    return memory
