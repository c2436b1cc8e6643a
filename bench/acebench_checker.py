"""Agreement of acebench.py's Normal checker with ACEBench's own, on ACEBench's data.

    git clone https://github.com/ACEBench/ACEBench /tmp/ACEBench
    python bench/acebench_checker.py /tmp/ACEBench

For every item of the 12 Normal categories (English), replies are built from its possible answers:
the answer itself, answers with one value changed, a parameter dropped or added, a number retyped,
a list turned into a tuple, calls reordered or dropped, the same replies cut short, re-quoted or
padded with whitespace, and a reply that is no call at all. Each reply is scored by
acebench.score_normal and by the checker of the checkout (model_eval.checker.normal_checker after
its decode_ast, with its whitespace removal and any-of-the-answers rule, as its eval_main.py runs
them). Prints the number of replies, how many of them ACEBench's checker accepts, and the
disagreements (the figure: 0). Imports the checkout's code; run it on a checkout you trust.
"""
import copy
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import acebench as A  # noqa: E402


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


def main(repo: str, per_item: int = 6, seed: int = 0):
    sys.path.insert(0, str(Path(repo).resolve()))
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
