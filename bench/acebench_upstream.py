"""suites/acebench.py against ACEBench's own harness, on ACEBench's data: the Normal checker and the
Agent engine.

    git clone https://github.com/ACEBench/ACEBench /tmp/ACEBench
    python bench/acebench_upstream.py /tmp/ACEBench        # needs openai and python-dotenv (its imports)

1. Normal checker. For every item of the 12 Normal categories (English), replies are built from its possible answers:
the answer itself, answers with one value changed, a parameter dropped or added, a number retyped,
a list turned into a tuple, calls reordered or dropped, the same replies cut short, re-quoted or
padded with whitespace, and a reply that is no call at all. Each reply is scored by
acebench.score_normal and by the checker of the checkout (model_eval.checker.normal_checker after
its decode_ast, with its whitespace removal and any-of-the-answers rule, as its eval_main.py runs
them). Figures: replies, how many ACEBench's checker accepts, disagreements (0 of 21,424).
2. Agent engine. Every Agent item is played 4 times by a scripted agent (its milestone calls with
random prose, repeats, re-quoted and skipped calls, an early "finish conversation") and a scripted
user, once through ACEBench's own loop (APIModelInference.multi_turn_inference /
multi_step_inference, the model client replaced by the script, agent replies stripped after
`</think>` as the authors' patch does) and once through acebench.play_scenarios. Figures per
category: runs, equal final API state, equal milestones, equal dialogue text shown to the agent at
every step (multi-turn 120/120/120/120; multi-step 80/80/80, its dialogue differing only where
ACEBench's fixed reply to a non-call is worded ours). `--errors` adds calls to an unknown API:
the final states and milestones stay equal; the dialogue then differs (acebench.py departure 2).
Imports and runs the checkout's code; run it on a checkout you trust.
"""
import copy
import json
import os
import random
import re
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from suites import acebench as A  # noqa: E402


def render(answer: dict) -> str:
    calls = [re.sub(r"_\d+$", "", k) + "(" + ", ".join(f"{p}={v!r}" for p, v in args.items()) + ")"
             for k, args in answer.items()]
    return "[" + ", ".join(calls) + "]"


def perturb(answer: dict, rng: random.Random) -> dict:
    """One random change to one call of an answer (or none, when the call takes no parameter)."""
    answer = copy.deepcopy(answer)
    key = rng.choice(list(answer))
    args, roll = answer[key], rng.random()
    if roll < 0.1:
        args["extra_param"] = 1
    elif roll < 0.2 and len(answer) > 1:
        del answer[key]
    elif roll < 0.3:
        answer = dict(reversed(list(answer.items())))
    elif args:
        p = rng.choice(list(args))
        v = args[p]
        if roll < 0.45:
            del args[p]
        elif isinstance(v, str):
            args[p] = v + "x" if roll < 0.7 else v.upper()
        elif isinstance(v, bool):
            args[p] = not v if roll < 0.7 else str(v).lower()
        elif isinstance(v, (int, float)):
            args[p] = v + 1 if roll < 0.6 else str(v) if roll < 0.8 else float(v) if isinstance(v, int) else int(v)
        elif isinstance(v, list):
            args[p] = v[:-1] if roll < 0.6 else v + v[:1] if roll < 0.8 else tuple(v)
        elif isinstance(v, dict) and v:
            args[p][rng.choice(list(v))] = "zz" if roll < 0.7 else 7
    return answer


def normal_agreement(repo: str, per_item: int = 6, seed: int = 0):
    from model_eval.checker import normal_checker  # ACEBench's own
    from model_inference.utils import decode_ast

    def theirs(entry, reply, category):
        try:
            calls = decode_ast("prompt-mode", "".join(reply.split()))
        except Exception:
            return False
        truths = entry["answer"]["ground_truth"]
        return any(normal_checker(entry["function"], calls, copy.deepcopy(t), entry["question"], category)["valid"]
                   for t in (truths if isinstance(truths, list) else [truths]))

    rng, total, accepted, disagree = random.Random(seed), 0, 0, []
    data = Path(repo) / "data_all" / "data_en"
    for category in A.CATEGORIES["normal"]:
        for entry in A.load_category(data, category):
            truths = entry["answer"]["ground_truth"]
            for truth in truths if isinstance(truths, list) else [truths]:
                replies = [render(truth), "no call here"]
                for _ in range(per_item):
                    r = render(perturb(truth, rng))
                    replies += [r, r[:-1], r.replace("'", '"'), f" {r} \n"]
                for reply in replies:
                    mine, gold = A.score_normal(entry, reply, category)[0], theirs(entry, reply, category)
                    total, accepted = total + 1, accepted + gold
                    if mine != gold:
                        disagree.append((entry["id"], reply))
    print(f"acebench.normal_checker.replies {total}")
    print(f"acebench.normal_checker.accepted_by_acebench {accepted}")
    print(f"acebench.normal_checker.disagreements {len(disagree)}")
    for item, reply in disagree[:20]:
        print("  ", item, reply[:200])


class Script:
    """Replies line by line, then `tail`; keeps every conversation it was sent."""

    def __init__(self, lines, tail="finish conversation"):
        self.lines, self.tail, self.seen = lines, tail, []

    def __call__(self, messages):
        self.seen.append(messages)
        k = len(self.seen) - 1
        return self.lines[k] if k < len(self.lines) else self.tail

    def chat(self, conversations, n=1, **sampling):  # as a sampler for acebench.py
        return [[self(m)] for m in conversations]


def client(script):
    """An OpenAI client stand-in whose completions come from the script."""
    def create(messages, model, **kw):
        text = types.SimpleNamespace(content=script(messages))
        return types.SimpleNamespace(choices=[types.SimpleNamespace(message=text)])
    return lambda **kw: types.SimpleNamespace(chat=types.SimpleNamespace(completions=types.SimpleNamespace(create=create)))


def scripts(entry, rng, errors):
    stones = entry["answer"]["mile_stone"]
    out = []
    for stone in stones[0] if isinstance(stones[0], list) else stones:
        roll = rng.random()
        if roll < 0.1:
            continue
        out += ["Could you tell me more?"] * (roll < 0.2) + ["[unknown_api(x=1)]"] * (roll < 0.25 and errors)
        out += [stone.replace("'", '"', 2)] * (roll < 0.3) + [stone] * (1 + (rng.random() < 0.1))
    if rng.random() < 0.2:
        out.insert(rng.randrange(len(out) + 1), "finish conversation")
    users = ["Hello, I need help. " + entry["question"][:40]]
    users += [rng.choice(["Yes.", "No.", "Go ahead", "ok", "finish conversation" if rng.random() < 0.2 else "ok"])
              for _ in range(30)]
    return out, users


def agent_agreement(repo: str, reps: int = 4, seed: int = 0, errors: bool = False):
    sys.modules.setdefault("wcwidth", types.SimpleNamespace(wcswidth=len))  # only its log tables use it
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    os.chdir(tempfile.mkdtemp())  # it writes dialogue logs under the working directory
    import model_inference.apimodel_inference as upstream
    import model_inference.multi_step.APIModel_agent as step_agent
    import model_inference.multi_turn.APIModel_agent as turn_agent
    import model_inference.multi_turn.APIModel_user as turn_user

    classes = A.load_api_classes(repo, list(A.CLASS_MODULES))
    markers = {"agent_multi_turn": ("Conversation history 1..t:\n", "Dialogue so far (steps 1..t):\n"),
               "agent_multi_step": ("对话历史：", "Dialogue so far:\n")}  # its API route sends the zh prompt
    rng, run = random.Random(seed), 0
    for category in A.CATEGORIES["agent"]:
        counts = [0, 0, 0, 0]
        for entry in A.load_category(Path(repo) / "data_all" / "data_en", category) * reps:
            agent_lines, user_lines = scripts(entry, rng, errors)
            theirs, user, run = Script(agent_lines), Script(user_lines), run + 1
            stripped = client(lambda m: theirs(m).split("</think>")[-1].strip())
            step_agent.OpenAI = turn_agent.OpenAI = stripped
            turn_user.OpenAI = client(user)
            harness = upstream.APIModelInference(f"gpt-run{run}", language="en")
            play = harness.multi_turn_inference if category == "agent_multi_turn" else harness.multi_step_inference
            state, stones = play(entry["question"], copy.deepcopy(entry["initial_config"]), entry["function"],
                                 entry["involved_classes"], entry["id"].split("_")[-1], "")
            ours = Script(agent_lines)
            sc, = A.play_scenarios([entry], category, classes, sampler=ours, user=Script(user_lines))
            theirs_text = [m[-1]["content"].split(markers[category][0], 1)[1] for m in theirs.seen]
            ours_text = [m[-1]["content"].split(markers[category][1], 1)[1] for m in ours.seen]
            if category == "agent_multi_step":
                theirs_text = [t[:-1] for t in theirs_text]  # its template adds one newline
            counts = [counts[0] + 1, counts[1] + (json.loads(json.dumps(state, default=str)) == sc.final_state()),
                      counts[2] + (stones == sc.milestones), counts[3] + (theirs_text == ours_text)]
        print(f"acebench.{category}.runs {counts[0]}  equal_state {counts[1]}  equal_milestones {counts[2]}  "
              f"equal_dialogue {counts[3]}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.path.insert(0, str(Path(sys.argv[1]).resolve()))
    normal_agreement(sys.argv[1])
    agent_agreement(sys.argv[1], errors="--errors" in sys.argv)
