"""Scripted models and engines of the tests: ScriptedSampler (eval and tool use), TeacherForced (a
rollout engine with scripted replies and the model's own log-probs) and its reply pickers,
main_with and ByRole (train.py on scripted engines). A scripted generate(prompts, caps) runs
under the loop's own turn barrier, infra/stream.py's Batched, as it is."""
import itertools

import torch

from infra import engine
from infra.stream import Completion


class ScriptedSampler:
    """Replies from a function `fn(messages, sample_index) -> str` (oracles, baselines, garbage).
    Every call's keyword arguments are kept in `calls` (the sampling protocol a suite asked for)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def chat(self, conversations, *, n=1, tools=None, **sampling):
        self.calls.append({"n": n, "prompts": len(conversations), **sampling})
        return [[self.fn(messages, k) for k in range(n)] for messages in conversations]


class TeacherForced(engine.Batching):
    """A rollout engine with scripted replies and the model's own log-probs of them (teacher
    forcing), so the designer and agent paths train with real gradients and honest importance
    weights. `reply(call, i, text, max_new_tokens) -> str` gives the reply to the i-th prompt of
    the call-th generate call (text: that prompt decoded); in_turn, per_prompt and shifted below
    make one from a list. Every call is kept in `calls`: its decoded prompts and sampling."""

    def __init__(self, model, tok, reply):
        self.model, self.tok, self.reply, self.calls = model, tok, reply, []

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, top_k, seed=None):
        call = {"texts": [self.tok.decode(p) for p in prompts], "max_new_tokens": max_new_tokens,
                "temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed}
        self.calls.append(call)
        out = []
        for i, (prompt, text) in enumerate(zip(prompts, call["texts"])):
            reply = self.reply(len(self.calls) - 1, i, text, max_new_tokens)
            ids = self.tok.encode(reply, add_special_tokens=False) + [self.tok.eos_token_id]
            with torch.no_grad():
                logits = self.model(torch.tensor([list(prompt) + ids])).logits  # (1, T, V)
            logits = logits[0, len(prompt) - 1:-1]                                # (R, V)
            lp = torch.log_softmax(logits.float() / temperature, -1)              # (R, V)
            lp = lp.gather(-1, torch.tensor(ids)[:, None])[:, 0]                  # (R,)
            out.append(Completion(token_ids=ids, logprobs=lp.tolist(), text=reply,
                                  finish_reason="stop"))
        return out


def in_turn(replies):
    """The n-th reply over all calls is replies[n mod len] (a script read on across calls, and
    across a resume when the engine is reused)."""
    given = itertools.count()
    return lambda call, i, text, cap: replies[next(given) % len(replies)]


def per_prompt(replies):
    """The i-th prompt of every call gets replies[i mod len] (the same in every call)."""
    return lambda call, i, text, cap: replies[i % len(replies)]


def shifted(replies):
    """The i-th prompt of the c-th call gets replies[(c + i) mod len]."""
    return lambda call, i, text, cap: replies[(call + i) % len(replies)]


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


def seeded(memory, rng):
    """`memory` drawing its exemplars from `rng` (a test's own random.Random)."""
    memory.rng = rng
    return memory
