"""The request stream: what agent.play and designer.regenerate / write_hints take (infrastructure).

SPADE (arXiv 2608.19197) samples every designer, hint and agent token from one policy; agent.py
and designer.py import nothing, and ask for those tokens through a `Stream`. To run them on your
own model, copy this file beside them: `Completion` is what a reply is, and `Batched` is a turn
barrier over any batched generate(prompts, caps) -> [Completion], the simplest Stream there is.
infra/engine.py's engines make their streams with it (TransformersEngine; a barrier seeds its
k-th generate call seed(k)) or keep requests in flight across turns (VLLMEngine's Requests).

Dependencies: standard library only.
Test: `pytest tests/test_stream.py`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

# Batched.collect(wait=False) with requests queued: a barrier decodes only when waited on, so a
# caller polling it (designer.regenerate, while validations run) sleeps this long, not spinning
POLL_WAIT_S = 0.005


@dataclass
class Completion:
    """One sampled reply: tokens (EOS included when hit), log p of each under softmax(logits/T)."""
    token_ids: list[int]
    logprobs: list[float]
    text: str             # decoded, special tokens skipped
    finish_reason: str    # "stop" (EOS) | "length" (hit its max_new_tokens)


def per_prompt_caps(max_new_tokens: int | list[int], n: int) -> list[int]:
    """One reply cap per prompt: a generate takes one for all, or one each."""
    return [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)


class Stream(Protocol):
    """One phase's requests of one role, with the role's sampling bound: what agent.play and
    designer.regenerate / write_hints take. infra/engine.py's engines make them,
    engine.stream(sampling, seed, max_new_tokens, render, on_reply) (sampling.Sampler.stream binds
    the seeds): Requests on VLLMEngine, which keeps requests in flight; Batched, a turn barrier,
    on TransformersEngine.

    submit(key, prompt, max_new_tokens=None): one request. key = (i, n), the n-th request
        (1-based) of item i (an episode's turn, a slot's attempt, an environment's hint); prompt:
        tokens, or a chat the stream renders; no cap: the stream's own.
    collect(wait=True) -> [(key, Completion)]: finished requests. With wait at least one while
        any is pending (a turn barrier: all); without, those that finished after one engine step
        (a turn barrier decodes only when waited on: none).
    pending: requests submitted and not yet collected.
    serve(fn): fn() (the caller's sandbox work), while a tensor-parallel member keeps taking part
        in its group's engine steps (VLLMEngine.serve); fn() elsewhere.

    Seeds: seed(n) is round n's seed. VLLMEngine draws request (i, n) from seed(n) + i, its own
    generator, so on CPU a reply never depends on what else is in flight (on GPUs vLLM is not
    batch-invariant: docs/gpu.md, "No turn barrier"); an engine's turn barrier (engine.barrier)
    draws each batch from one generator, its k-th from seed(k)."""

    pending: int

    def submit(self, key: tuple[int, int], prompt, max_new_tokens: int | None = None) -> None: ...

    def collect(self, wait: bool = True) -> list[tuple[tuple[int, int], Completion]]: ...

    def serve(self, fn: Callable): ...


class Batched:
    """A turn barrier over generate(prompts, caps) -> [Completion], one reply per prompt in order.
    collect(wait=True) makes one generate call of every pending request, in key order (a batch
    never depends on the order its requests came in); collect(wait=False) decodes nothing and
    returns no reply after POLL_WAIT_S. caps: one per request when any request brought its own
    (the agent's turns; the stream's max_new_tokens for the others), else the stream's
    max_new_tokens (designer and hint chats: an int, or None when the stream has none).
    max_new_tokens: the cap of a request submitted without one; render: chat -> tokens (None:
    prompts go to generate as submitted); on_reply(completions): told of every collected reply
    (the sampler's token count); serve(fn): runs the caller's sandbox work (None: fn())."""

    def __init__(self, generate: Callable, max_new_tokens: int | None = None,
                 render: Callable | None = None, on_reply: Callable | None = None,
                 serve: Callable | None = None):
        self.generate, self.max_new_tokens = generate, max_new_tokens
        self.render = render or (lambda prompt: prompt)
        self.on_reply = on_reply or (lambda replies: None)
        self._serve = serve or (lambda fn: fn())
        self.queue = []  # (key, rendered prompt, its own cap or None)

    @property
    def pending(self) -> int:
        return len(self.queue)

    def submit(self, key: tuple[int, int], prompt, max_new_tokens: int | None = None) -> None:
        self.queue.append((key, self.render(prompt), max_new_tokens))

    def collect(self, wait: bool = True) -> list[tuple]:
        if not wait or not self.queue:
            time.sleep(POLL_WAIT_S if self.queue else 0)
            return []
        batch, self.queue = sorted(self.queue, key=lambda q: q[0]), []
        own = [self.max_new_tokens if cap is None else cap for _, _, cap in batch]
        capped = any(cap is not None for *_, cap in batch)
        replies = self.generate([prompt for _, prompt, _ in batch],
                                own if capped else self.max_new_tokens)
        if len(replies) != len(batch):
            raise ValueError(f"generate returned {len(replies)} replies for {len(batch)} prompts")
        self.on_reply(replies)
        return [(key, reply) for (key, _, _), reply in zip(batch, replies)]

    def serve(self, fn):
        return self._serve(fn)
