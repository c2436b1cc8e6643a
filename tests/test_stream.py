"""infra/stream.py: the turn barrier over a plain generate function, one property per test."""
import pytest

from infra import stream
from infra.stream import Batched, Completion


def reply(text):
    return Completion(token_ids=[len(text)], logprobs=[-1.0], text=text, finish_reason="stop")


class Recording:
    """generate(prompts, caps): each prompt's reply is its own text; every call is kept."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, caps):
        self.calls.append((list(prompts), caps))
        return [reply(str(p)) for p in prompts]


def test_a_barrier_is_one_generate_call_of_every_pending_request_in_key_order():
    """collect() makes one call of everything pending, sorted by key whatever the order of
    submission, and hands each reply back under its request's key; chats are rendered when
    they are submitted, and on_reply sees every collected reply."""
    gen, told = Recording(), []
    s = Batched(gen, render=lambda chat: f"<{chat}>", on_reply=told.extend)
    for key, chat in [((1, 1), "b"), ((0, 2), "a2"), ((0, 1), "a1")]:
        s.submit(key, chat)
    assert s.pending == 3
    got = s.collect()
    assert gen.calls == [(["<a1>", "<a2>", "<b>"], None)]  # no caps anywhere: the stream's, None
    assert [(key, c.text) for key, c in got] == [((0, 1), "<a1>"), ((0, 2), "<a2>"), ((1, 1), "<b>")]
    assert s.pending == 0 and [c.text for c in told] == ["<a1>", "<a2>", "<b>"]
    assert s.collect() == [] and len(gen.calls) == 1  # nothing pending: no call


def test_a_barrier_of_capped_and_uncapped_requests_gives_each_a_cap():
    """One request submitted with its own cap, one without; the generate call gets a cap for
    each (the stream's for the one without), never None in a list of caps."""
    gen = Recording()
    s = Batched(gen, max_new_tokens=7)
    s.submit((0, 0), [5, 6], max_new_tokens=3)
    s.submit((1, 0), [5, 6])
    assert [key for key, _ in s.collect()] == [(0, 0), (1, 0)]
    s.submit((0, 1), [5])
    s.collect()
    assert [caps for _, caps in gen.calls] == [[3, 7], 7]  # all uncapped: the stream's cap


def test_a_barrier_polled_without_wait_decodes_nothing_and_does_not_spin(monkeypatch):
    """collect(wait=False) never calls generate (a barrier decodes only when waited on): with
    requests queued it sleeps POLL_WAIT_S and returns none; with none queued it returns at once.
    The queued requests are still there for the next collect()."""
    slept = []
    monkeypatch.setattr(stream.time, "sleep", slept.append)
    gen = Recording()
    s = Batched(gen)
    assert s.collect(wait=False) == [] and slept == [0]
    s.submit((0, 1), "x")
    assert s.collect(wait=False) == [] and s.collect(wait=False) == []
    assert gen.calls == [] and slept == [0, stream.POLL_WAIT_S, stream.POLL_WAIT_S]
    assert s.pending == 1 and [key for key, _ in s.collect()] == [(0, 1)]


def test_a_generate_that_drops_a_reply_is_an_error():
    """Replies are matched to requests by position, so a generate must answer every prompt."""
    s = Batched(lambda prompts, caps: [reply("only one")])
    s.submit((0, 1), "a")
    s.submit((1, 1), "b")
    with pytest.raises(ValueError, match="1 replies for 2 prompts"):
        s.collect()


def test_serve_runs_the_callers_work_through_what_it_was_given():
    """serve(fn) is fn() by default, and the given serve otherwise (an engine's: a tensor-parallel
    member keeps decoding for its group while fn runs)."""
    assert Batched(Recording()).serve(lambda: 42) == 42
    served = []
    s = Batched(Recording(), serve=lambda fn: served.append(fn) or fn() + 1)
    assert s.serve(lambda: 41) == 42 and len(served) == 1


def test_per_prompt_caps():
    assert stream.per_prompt_caps(5, 3) == [5, 5, 5]
    assert stream.per_prompt_caps([1, 2], 2) == [1, 2]
