"""The tool-use setting: the ToolEnv turn contract, the designer's task rotation, and the two
training filters (compact filter, malformed tool-call masking), on scripted agents and
hand-built episodes. Offline and in-process (the sandbox round trip is in test_sandbox.py)."""
import json
import random
import re
from collections import Counter

import pytest
import torch

import agent
from infra import config
import designer
import grpo
from infra import logprobs as logprobs_lib
import toolenv
import train
from agent import Episode, EpisodeSpec, play
from infra.stream import Batched


class DeskEnv(toolenv.ToolEnv):
    """Three instructions: look up order 17, cancel it, note the customer's reason."""
    TOOLS = [{"name": n, "description": n, "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}
        for n in ("lookup_order", "cancel_order", "add_note")]

    def setup(self, rng):
        self.state = {"seen": False, "status": "open", "note": False}
        self.instructions = [("Find order 17.", lambda s: s["seen"]),
                             ("Cancel that order.", lambda s: s["status"] == "cancelled"),
                             ("Note that the customer moved.", lambda s: s["note"])]

    def tool_lookup_order(self, order_id):
        if order_id != "17":
            return "Error: no such order."
        self.state["seen"] = True
        return "order 17: open"

    def tool_cancel_order(self, order_id):
        self.state["status"] = "cancelled"
        return "cancelled"

    def tool_add_note(self, order_id):
        self.state["note"] = True
        return "noted"

    def solution(self):
        return [{"name": n, "arguments": {"order_id": "17"}}
                for n in ("lookup_order", "cancel_order", "add_note")]


def call(name, order_id="17"):
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"order_id": order_id}}) + "</tool_call>"


DONE = "<answer>done</answer>"


# ----------------------------------------------------------------------------------------------
# the ToolEnv contract


def test_completion_marker_then_done_pays():
    env = DeskEnv()
    assert env.reset(seed=0)[0] == "Find order 17."
    outs = [env.step(call(c["name"]))[0] for c in env.solution()]
    assert outs[0] == "order 17: open\n\nNext instruction: Cancel that order."
    assert outs[1] == "cancelled\n\nNext instruction: Note that the customer moved."
    assert outs[2] == f"noted\n\n{toolenv.ALL_DONE}" and "<answer>done</answer>" in toolenv.ALL_DONE
    assert env.step(DONE)[1:4] == (1.0, True, False)


def test_premature_done_names_the_pending_step_and_play_continues():
    env = DeskEnv()
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step(DONE)
    assert (r, term, trunc, info["tool_outputs"]) == (0.0, False, False, [])
    assert "instruction 1 of 3" in obs and '"Find order 17."' in obs
    env.step(call("lookup_order"))
    obs = env.step("<answer>DONE</answer>")[0]
    assert "instruction 2 of 3" in obs and '"Cancel that order."' in obs
    env.step(call("cancel_order") + call("add_note"))
    obs, r, term, _, _ = env.step("<answer>finished</answer>")  # everything done, wrong answer
    assert (r, term) == (0.0, False) and toolenv.ALL_DONE in obs
    assert env.step(DONE)[1:3] == (1.0, True)


def test_tool_calls_are_free_answers_and_malformed_turns_use_the_budget():
    env = DeskEnv()                                             # max_turns 10, the authors'
    env.reset(seed=0)
    assert env.max_turns == 10
    for k in range(40):                                         # right, wrong and unknown tools
        _, r, term, trunc, _ = env.step(call(("lookup_order", "nope")[k % 2], str(k)))
        assert (r, term, trunc) == (0.0, False, False)
    for k in range(9):                                          # 9 counted turns: still open
        action = DONE if k % 2 else ("no call here", "<tool_call>{broken</tool_call>")[k % 4 // 2]
        _, r, term, trunc, _ = env.step(action)
        assert (r, term, trunc) == ((0.0 if k % 2 else -0.1), False, False)
    assert env.step(call("lookup_order"))[3] is False           # a call after them: still free
    assert env.step(DONE)[1:4] == (0.0, False, True)            # the 10th counted turn truncates


def test_answer_outranks_tool_calls_in_the_same_action():
    env = DeskEnv()
    env.reset(seed=0)
    obs, r, term, _, info = env.step(call("lookup_order") + DONE)
    assert (r, term, info["tool_outputs"]) == (0.0, False, []) and not env.state["seen"]
    assert agent.tool_action("<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"
                             "<answer> done </answer>") == DONE


def test_self_check_replays_the_solution_and_names_each_breach():
    """toolenv.self_check, what validation runs in the worker: the transcript of a sound
    environment, a ContractError naming the first breach otherwise."""
    trace = toolenv.self_check(DeskEnv(), seed=0)
    assert trace[0] == "Find order 17." and len(trace) == 1 + 3 + 1
    assert trace[3] == [f"noted\n\n{toolenv.ALL_DONE}", 0.0]
    assert trace[-1] == ["All instructions completed.", 1.0]

    class Short(DeskEnv):                                              # 2 instructions
        def setup(self, rng):
            super().setup(rng)
            self.instructions = self.instructions[:2]

    class DoneAtReset(DeskEnv):                                        # a predicate already holds
        def setup(self, rng):
            super().setup(rng)
            self.state["seen"] = True

    class Raising(DeskEnv):                                            # a predicate raises
        def setup(self, rng):
            super().setup(rng)
            self.instructions[2] = ("Note it.", lambda s: s["missing"])

    class Incomplete(DeskEnv):                                         # the note is never added
        def solution(self):
            return super().solution()[:2]

    class NotACall(DeskEnv):
        def solution(self):
            return ["lookup_order"]

    for cls, why in [(Short, "2 instructions (need 3-5)"), (DoneAtReset, "predicates true [0]"),
                     (Raising, "raising [2] at reset"), (Incomplete, "ends with reward 0.0"),
                     (NotACall, "is not a call")]:
        with pytest.raises(toolenv.ContractError, match=re.escape(why)):
            toolenv.self_check(cls(), seed=1)


# ----------------------------------------------------------------------------------------------
# the designer's task rotation and prompt


def test_task_variants_follow_the_authors_rotation_over_many_seeds():
    n = 7000
    counts = Counter(designer.tool_task(random.Random(seed))[1] for seed in range(n))
    expected = {"execute": 3 / 7, "read_then_write": 2 / 7, "missing_parameter": 1 / 7, "decline": 1 / 7}
    for variant, p in expected.items():                          # a uniform draw would give 1/4 each
        assert counts[variant] / n == pytest.approx(p, abs=0.02), (variant, counts)
    domains = Counter(designer.tool_task(random.Random(seed))[0] for seed in range(n))
    assert len(domains) == 10 and min(domains.values()) / n > 0.07


def test_tool_designer_prompt_has_no_system_message_and_asks_for_distractors_and_enums():
    for variant in designer.TOOL_VARIANTS:
        msgs = designer.designer_messages("Tool Selection", setting="tool",
                                          task=(designer.TOOL_DOMAINS[0], variant))
        assert [m["role"] for m in msgs] == ["user"]
        text = msgs[0]["content"]
        assert "DISTRACTOR" in text and '"enum"' in text and designer.TOOL_VARIANTS[variant] in text
    assert designer.designer_messages("Logical Deduction", setting="games")[0]["role"] == "system"


# ----------------------------------------------------------------------------------------------
# the training filters


class Scripted:
    """generate(prompts, caps) -> one scripted reply per live prompt, + EOS; cut at the cap."""

    def __init__(self, tok, replies):
        self.tok, self.replies, self.turn, self.outputs = tok, replies, 0, []

    def __call__(self, prompts, caps):
        text, self.turn = self.replies[self.turn], self.turn + 1
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        self.outputs.append(ids[:caps[0]])
        cut = len(ids) > caps[0]

        class Reply:
            token_ids, finish_reason = ids[:caps[0]], "length" if cut else "stop"
            logprobs = [-0.5] * len(ids[:caps[0]])
        return [Reply()]


def reply_masks(ep, outputs):
    """The mask of each reply, in order, found where its tokens sit in the episode."""
    masks, at = [], 0
    for ids in outputs:
        at = next(i for i in range(at, len(ep.token_ids)) if ep.token_ids[i:i + len(ids)] == ids)
        masks.append(ep.mask[at:at + len(ids)])
        at += len(ids)
    return masks


BROKEN = '<tool_call>{"name": "lookup_order", "arguments": {order_id: 17}}</tool_call>'


@pytest.mark.parametrize("mask_malformed", [True, False])
def test_scripted_agent_malformed_call_is_masked_and_told_the_format(tokenizer, mask_malformed):
    replies = [DONE, BROKEN, call("lookup_order"), call("cancel_order"), call("add_note"), DONE]
    eng = Scripted(tokenizer, replies)
    [ep] = play([EpisodeSpec("desk", 0, None, DeskEnv())], stream=Batched(eng), tokenizer=tokenizer,
                setting="tool", mask_malformed=mask_malformed)
    assert (ep.status, ep.ret, ep.turns) == ("terminated", 1.0, 6)
    assert ep.rewards == [0.0, -0.1, 0.0, 0.0, 0.0, 1.0]
    roles = [m["role"] for m in ep.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user"] + ["assistant", "tool"] * 3 + ["assistant"]
    assert "instruction 1 of 3" in ep.messages[2]["content"]          # premature done: feedback
    assert ep.messages[-2]["content"].endswith(toolenv.ALL_DONE)      # completion marker
    told = agent.FORMAT_HINT in ep.messages[4]["content"]
    masks = reply_masks(ep, eng.outputs)
    assert len(masks) == 6 and all(all(m) for k, m in enumerate(masks) if k != 1)
    assert told == mask_malformed and all(masks[1]) != mask_malformed
    assert ep.masked_replies == int(mask_malformed)
    assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.mask) if m == 0)


def test_malformed_tool_call_detection():
    assert agent.malformed_tool_call(BROKEN) and agent.malformed_tool_call("<tool_call>{\"name\": ")
    assert not agent.malformed_tool_call(call("x")) and not agent.malformed_tool_call("plain text")
    assert not agent.malformed_tool_call(BROKEN + DONE)               # an answer turn, not a call
    assert not agent.malformed_tool_call("<think><tool_call>{oops</think>" + call("x"))


def episode(env_id, ret, status, hinted=False, n=6):
    return Episode(env_id=env_id, seed=0, hinted=hinted, turns=1, token_ids=list(range(n)),
                   prompt_len=2, mask=[0, 0] + [1] * (n - 2), logprobs=[0.0, 0.0] + [-0.1] * (n - 2),
                   ret=ret, status=status)


def test_compact_filter_zeroes_non_terminated_episodes_after_normalisation():
    eps = [episode("a", 1.0, "terminated"), episode("a", 0.0, "truncated"),
           episode("a", 0.0, "turn_limit"), episode("a", 0.0, "context"),
           episode("b", 0.0, "terminated"), episode("b", 1.0, "terminated"),
           episode("a", 1.0, "terminated", hinted=True), episode("b", 0.0, "env_error")]
    on = train.agent_samples(eps, compact=True)
    off = train.agent_samples(eps, compact=False)
    assert len(on) == len(off) == 6                               # hinted and env_error left out
    # group a: returns (1, 0, 0, 0): mean 0.25, population std sqrt(0.1875) = 0.4330127
    assert [float(s.advantage) for s in on] == pytest.approx(
        [1.7320508, -0.5773503, -0.5773503, -0.5773503, -1.0, 1.0], abs=1e-6)
    assert [float(s.advantage) for s in on] == [float(s.advantage) for s in off]
    assert [any(s.mask) for s in on] == [True, False, False, False, True, True]
    assert all(s.mask == [0, 0, 1, 1, 1, 1] for s in off)
    assert [len(s.mask) for s in on] == [6] * 6


def test_tool_filters_default_on_for_tool_use_only():
    args = config.AgentArgs()
    assert train.tool_filters(args, "tool")
    assert not train.tool_filters(config.AgentArgs(no_tool_filters=True), "tool")
    assert not train.tool_filters(config.AgentArgs(), "games")


def test_compact_filter_on_played_episodes_cut_by_the_token_cap(tokenizer):
    long_reply = call("lookup_order") * 20
    cut = play([EpisodeSpec("desk", 0, None, DeskEnv())], stream=Batched(Scripted(tokenizer, [long_reply])),
               tokenizer=tokenizer, setting="tool", max_new_tokens=16)[0]
    won = play([EpisodeSpec("desk", 1, None, DeskEnv())], tokenizer=tokenizer, setting="tool",
               stream=Batched(Scripted(tokenizer, [call(c["name"]) for c in DeskEnv().solution()] + [DONE])))[0]
    assert (cut.status, won.status, won.ret) == ("truncated", "terminated", 1.0)
    assert any(cut.mask)                                          # play itself keeps the cut reply
    on = train.agent_samples([cut, won], compact=True)
    assert not any(on[0].mask) and on[1].mask == won.mask
    assert [float(s.advantage) for s in on] == pytest.approx([-1.0, 1.0])


def test_compact_filter_covers_every_turn_record_of_a_stripped_history_episode():
    ep = episode("a", 0.0, "turn_limit")
    ep.turn_samples = [([1, 2, 3], [0, 1, 1], [0.0, -0.1, -0.1]), ([1, 2, 3, 4], [0, 0, 0, 1], [0.0] * 3 + [-0.1])]
    won = episode("a", 1.0, "terminated")
    on = train.agent_samples([ep, won], compact=True)
    assert [s.mask for s in on] == [[0, 0, 0], [0, 0, 0, 0], won.mask]
    assert [float(s.advantage) for s in on] == pytest.approx([-1.0, -1.0, 1.0])


@pytest.mark.parametrize("off", [False, True])
def test_play_pool_wires_the_malformed_mask_from_the_setting(tokenizer, off):
    class Box:  # a sandbox stand-in that opens in-process DeskEnvs
        step_many = reset_many = None

        def open(self, source, setting):
            env = DeskEnv()
            env.close = lambda: None
            return env

    class Sampler:
        def stream(self, step, role, sampling):
            return Batched(Scripted(tokenizer, [BROKEN] + [call(c["name"]) for c in DeskEnv().solution()] + [DONE]))

        def drain(self):
            pass
    loop = config.LoopArgs(setting="tool", plays=1, hint_plays=0)
    pool = [train.PoolEnv("e0", "Tool Selection", "source", "DeskEnv", "fallback")]
    [ep] = train.play_pool(0, pool, Sampler(), Box(), tokenizer,
                           config.AgentArgs(no_tool_filters=off), loop, hinted_arm=False, seed=0)
    assert (ep.status, ep.ret, ep.masked_replies) == ("terminated", 1.0, 0 if off else 1)


def test_grpo_update_never_forwards_a_compact_filtered_sample(tiny, monkeypatch):
    """An all-zero loss mask has zero gradient even with a KL term: counted, never forwarded."""
    import copy

    from accelerate import Accelerator
    seen = []
    logprobs = logprobs_lib.token_logprobs

    def spy(m, input_ids, attention_mask, *a, **k):
        seen.append(int(attention_mask.sum()))
        return logprobs(m, input_ids, attention_mask, *a, **k)
    monkeypatch.setattr(logprobs_lib, "token_logprobs", spy)
    model = copy.deepcopy(tiny[0]).eval()
    ref = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    samples = [grpo.Sample([5 + i] * 12, [0] * 4 + [1] * 8 if i != 1 else [0] * 12,
                           [-7.0] * 12, advantage=a, role="agent", weight=1.0)
               for i, a in enumerate([1.0, -1.0])]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    out = train.grpo_update(train.Trainer(model, opt, sched, Accelerator(cpu=True), ref_model=ref),
                            samples, pad_id=tiny[1].pad_token_id,
                            temperatures={"agent": 1.0}, gargs=config.GRPOArgs(kl_coef=0.1))
    assert out["losses/samples"] == 2 and seen == [12, 12]      # policy + reference: sample 0 only
