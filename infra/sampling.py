"""Seeds and the sampler: every designer, hint and agent request of the loop gets its sampling
and its seed here (infrastructure, and README row 4: the seed rule).

A seed is derive_seed(parts): stable across processes and resumes, so a resumed run samples what
the uninterrupted one would have. The run's Sampler binds one engine and tokenizer; each phase
asks it for one role's request stream, stream(step, role, sampling), whose round n is seeded
derive_seed(seed, step, role, n) (stream.py's Stream says how an engine draws a request from it).
Test: `pytest tests/test_train.py -k seed`.
"""
from __future__ import annotations

import hashlib

import agent


def derive_seed(*parts) -> int:
    """A stable 31-bit seed from any parts; the same parts give the same seed across resumes."""
    return int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:8], 16) >> 1


class Sampler:
    """Binds engine + tokenizer + the run's seed into the request streams agent.play and
    designer.regenerate / write_hints take."""

    def __init__(self, eng, tokenizer, seed: int):
        self.eng, self.tok, self.seed = eng, tokenizer, seed
        self.generated = 0  # sampled tokens since the last step's log (perf/generated_tokens)

    def stream(self, step: int, role: str, sampling: dict, render=None,
               max_new_tokens: int | None = None):
        """One phase's requests of `role` ("designer", "hint", "agent", "pool") at `step`, with
        `sampling` (temperature, top_p, top_k): the engine's request stream whose round n is
        seeded derive_seed(seed, step, role, n). render: chat -> tokens (the designer and hint
        streams take chats); max_new_tokens: the cap of a request submitted without one."""
        def seed(n: int) -> int:
            return derive_seed(self.seed, step, role, n)
        return self.eng.stream(sampling, seed, max_new_tokens=max_new_tokens, render=render,
                               on_reply=self._count)

    def _count(self, replies) -> None:
        self.generated += sum(len(c.token_ids) for c in replies)

    def drain(self) -> None:
        """INFRA: end of a phase. The engine waits for the ranks it decodes with: a vLLM
        tensor-parallel group's, or FSDP2's (no-op on one process)."""
        self.eng.drain()

    def prompt_ids(self, messages, enable_thinking: bool | None = None) -> list[int]:
        """Chat-template tokens in which message contents can never become special tokens
        (designer and hint prompts carry model-written code and corpus text): agent.prompt_ids."""
        return agent.prompt_ids(self.tok, messages, enable_thinking=enable_thinking)

    def chats(self, enable_thinking: bool | None = None):
        """The render of a chat stream: messages -> prompt_ids(messages, enable_thinking)."""
        return lambda messages: self.prompt_ids(messages, enable_thinking)
