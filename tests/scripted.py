"""A sampler that replies from a function: the scripted models of the eval and tool-use tests."""


class ScriptedSampler:
    """Replies from a function `fn(messages, sample_index) -> str` (oracles, baselines, garbage).
    Every call's keyword arguments are kept in `calls` (the sampling protocol a suite asked for)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def chat(self, conversations, *, n=1, tools=None, **sampling):
        self.calls.append({"n": n, "prompts": len(conversations), **sampling})
        return [[self.fn(messages, k) for k in range(n)] for messages in conversations]
